"""`llmgw serve` (and ``Services``) refuses settings it cannot run with before it starts anything."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.bundled import read_security_policy
from llmgw.cli import event_loop
from llmgw.cli.dev_run import dev_control_settings, dev_render_settings
from llmgw.cli.event_loop import EventLoop
from llmgw.cli.serving import Role, Services, ServiceSettings
from llmgw.control import ControlSettings, ControlSettingsError, lost_node_problem
from llmgw.gateway.settings import RouterSettings
from llmgw.render import RenderSettings
from llmgw.settings import ConsulConnection, NomadConnection

REPO = Path(__file__).resolve().parents[3]


def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return llmgw("serve", *args, **env)


def llmgw(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "NOMAD_", "CONSUL_"))}
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**clean, **env},
    )


def test_an_admin_api_beyond_loopback_without_a_token_is_refused_up_front() -> None:
    result = serve("--admin-host", "0.0.0.0")
    assert result.returncode == 2
    assert "the admin API will not start" in result.stderr and "LLMGW_ADMIN_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr


def test_unusable_connection_settings_name_their_variable() -> None:
    result = serve(NOMAD_ADDR="ftp://nomad:4646")
    assert result.returncode == 2 and "NOMAD_ADDR" in result.stderr and "Traceback" not in result.stderr
    result = serve(LLMGW_ALLOWED_IMAGES="not a ref")
    assert result.returncode == 2 and "LLMGW_ALLOWED_IMAGES" in result.stderr
    result = serve(LLMGW_ENGINE_KEY_SECRET="short")
    assert result.returncode == 2 and "LLMGW_ENGINE_KEY_SECRET must be at least 32" in result.stderr
    assert "short" not in result.stderr.replace("LLMGW_ENGINE_KEY_SECRET", "")  # the secret is not echoed
    result = serve(LLMGW_HF_TOKEN_VARIABLE="nomad/jobs/x")
    assert result.returncode == 2 and "LLMGW_HF_TOKEN_VARIABLE" in result.stderr


def test_a_bad_variable_fails_only_the_command_that_reads_it() -> None:
    for other in (("catalog", "--help"), ("serve", "--help"), ("--version",)):
        result = llmgw(*other, LLMGW_CONTROL_METRICS_PORT="abc", LLMGW_LOG_LEVEL="loud")
        assert result.returncode == 0, (other, result.stderr)
        assert "Traceback" not in result.stderr
    result = serve(LLMGW_CONTROL_METRICS_PORT="abc")
    assert result.returncode == 2
    assert "LLMGW_CONTROL_METRICS_PORT='abc' is not a port number, 0 to 65535" in result.stderr
    assert "Traceback" not in result.stderr
    result = serve(LLMGW_LOG_LEVEL="loud")
    assert (
        result.returncode == 2
        and "LLMGW_LOG_LEVEL='loud' is not DEBUG, INFO, WARNING or ERROR" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_bad_flag_value_says_the_form_expected() -> None:
    result = serve("--control-metrics-port", "70000")
    assert result.returncode == 2
    assert "--control-metrics-port: '70000' is not a port number, 0 to 65535" in result.stderr


def test_the_long_running_commands_run_on_uvloop_unless_told_otherwise() -> None:
    assert event_loop.resolve("auto") is EventLoop.UVLOOP  # a dependency wherever llmgw installs
    assert event_loop.run(_loop_name(), event_loop.resolve("auto")) == "uvloop"
    assert event_loop.run(_loop_name(), event_loop.resolve("asyncio")) == "asyncio"
    assert event_loop.resolve("auto", uvloop_installed=False) is EventLoop.ASYNCIO
    with pytest.raises(event_loop.EventLoopError, match="pip install uvloop"):
        event_loop.resolve("uvloop", uvloop_installed=False)


async def _loop_name() -> str:
    return event_loop.running_loop_name()


def test_an_unknown_event_loop_is_refused_up_front_from_the_flag_or_the_environment() -> None:
    result = serve("--event-loop", "trio")
    assert result.returncode == 2 and "invalid choice: 'trio'" in result.stderr
    result = serve(LLMGW_EVENT_LOOP="trio")
    assert result.returncode == 2 and "LLMGW_EVENT_LOOP" in result.stderr and "'trio'" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_consul_namespace_on_consul_ce_stops_serve_at_start_with_one_clear_error() -> None:
    """Consul CE refuses every request naming a namespace (the stand-in answers as CE does):
    `llmgw serve` says so once, names CONSUL_NAMESPACE and what to do, and exits 2."""
    import asyncio

    from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn

    async with ConsulStandIn(ConsulSettings.for_tests()) as consul:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "NOMAD_", "CONSUL_"))}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmgw",
            "serve",
            "--role",
            "router",
            "--port",
            "0",
            cwd=REPO,
            env={**clean, "CONSUL_HTTP_ADDR": consul.url, "CONSUL_NAMESPACE": "team-a"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 60)
    text = err.decode()
    assert process.returncode == 2, text
    assert "CONSUL_NAMESPACE='team-a'" in text and "Unset CONSUL_NAMESPACE" in text
    assert "Traceback" not in text


async def test_the_control_plane_refuses_a_lost_after_that_lets_nomad_replace_a_shard_first() -> None:
    # Nomad replaces a disconnected allocation on its own once lost_after runs out, whatever
    # replace = false says: llmgw must have rebuilt the replica whole before that.
    settings = ServiceSettings(
        role=Role.CONTROL_PLANE,
        nomad=NomadConnection(address="http://127.0.0.1:9"),
        consul=ConsulConnection.from_env({"CONSUL_HTTP_ADDR": "http://127.0.0.1:9"}),
        policy=read_security_policy(),
        render=RenderSettings(lost_after_s=300),
    )
    with pytest.raises(ControlSettingsError) as refused:
        async with Services(settings):
            pass
    message = str(refused.value)
    assert message.startswith("the control plane will not start: the jobs' disconnect lost_after (300s")
    assert "node_lost_grace (600s) plus action_timeout (30s), 630s" in message
    assert "Raise lost_after_s or lower node_lost_grace" in message
    # A router alone does not care; the shipped defaults and `llmgw dev`'s agree.
    async with Services(replace(settings, role=Role.ROUTER, router=RouterSettings(port=0, no_auth=True))):
        pass
    assert lost_node_problem(ControlSettings(), RenderSettings().lost_after_s) is None
    assert lost_node_problem(dev_control_settings(), dev_render_settings().lost_after_s) is None
