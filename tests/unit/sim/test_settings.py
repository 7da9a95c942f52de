"""Sim settings: flags win over LLMGW_SIM_* env, which wins over defaults; bad values are refused."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from llmgw.sim.settings import (
    ExitCode,
    FailStatus,
    FaultSettings,
    SettingsError,
    SimSettings,
    add_sim_arguments,
    flag_destinations,
    parse_host_port,
    settings_from_namespace,
    validate,
)


def _settings(argv: list[str], env: dict[str, str] | None = None) -> SimSettings:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    return settings_from_namespace(parser.parse_args(argv), env or {})


def test_defaults_without_flags_or_env() -> None:
    settings = _settings([])
    assert settings == SimSettings()
    assert settings.served_name == settings.model


def test_flag_wins_over_env_and_env_over_default() -> None:
    env = {"LLMGW_SIM_PORT": "9001", "LLMGW_SIM_TOKEN_RATE": "7.5", "LLMGW_SIM_SERVED_MODEL_NAME": "from-env"}
    settings = _settings(["--port", "9002"], env)
    assert settings.port == 9002
    assert settings.token_rate == 7.5
    assert settings.served_name == "from-env"


def test_the_api_key_comes_from_vllms_variable_as_vllm_reads_it() -> None:
    """A rendered job gives the sim its key as it gives vLLM's: VLLM_API_KEY, never argv."""
    assert _settings([], {"VLLM_API_KEY": "k-env"}).api_key == "k-env"
    assert _settings(["--api-key", "k-flag"], {"VLLM_API_KEY": "k-env"}).api_key == "k-flag"
    assert _settings([], {"LLMGW_SIM_API_KEY": "k-ours", "VLLM_API_KEY": "k-env"}).api_key == "k-ours"
    assert _settings([], {"VLLM_API_KEY": ""}).api_key is None


def test_fault_flags_and_env_fill_the_fault_settings() -> None:
    env = {"LLMGW_SIM_HANG": "true", "LLMGW_SIM_FAIL_STATUS": "503"}
    settings = _settings(["--crash-after-requests", "3", "--fail-rate", "0.5"], env)
    assert settings.faults == FaultSettings(
        crash_after_requests=3, hang=True, fail_rate=0.5, fail_status=FailStatus.SERVICE_UNAVAILABLE
    )


def test_switch_flag_turns_on_without_a_value() -> None:
    assert _settings(["--access-log"]).access_log is True
    assert _settings([], {"LLMGW_SIM_ACCESS_LOG": "0"}).access_log is False


def test_head_file_is_a_path() -> None:
    settings = _settings(["--rank", "1", "--world-size", "2", "--head-file", "/tmp/head"])
    assert settings.head_file == Path("/tmp/head")


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--token-rate", "0"], {}, "--token-rate"),
        (["--rank", "2", "--world-size", "2"], {}, "--rank"),
        (["--rank", "1", "--world-size", "2"], {}, "--head HOST:PORT or --head-file"),
        (["--rank", "1", "--world-size", "2", "--head", "nohost"], {}, "--head must be HOST:PORT"),
        (["--fail-rate", "1.5"], {}, "--fail-rate"),
        (["--heartbeat-interval", "3", "--heartbeat-timeout", "2"], {}, "--heartbeat-timeout"),
        ([], {"LLMGW_SIM_PORT": "eighty"}, "LLMGW_SIM_PORT"),
        ([], {"LLMGW_SIM_HANG": "maybe"}, "LLMGW_SIM_HANG"),
        (["--judge-unsafe-phrase", "  "], {}, "--judge-unsafe-phrase"),
        (["--reasoning-tokens", "-1"], {}, "--reasoning-tokens must be >= 0"),
        ([], {"LLMGW_SIM_TOOL_CALLS": "Bash"}, "a JSON object of tool names"),
        ([], {"LLMGW_SIM_TOOL_CALLS": "[]"}, "a non-empty JSON object"),
        ([], {"LLMGW_SIM_TOOL_CALLS": "{}"}, "a non-empty JSON object"),
        (
            [],
            {"LLMGW_SIM_TOOL_CALLS": '{"Bash": "echo hi"}'},
            "arguments of tool 'Bash' must be a JSON object",
        ),
        ([], {"LLMGW_SIM_TOOL_CALLS": '{" ": {}}'}, "a tool name must not be empty"),
    ],
)
def test_unusable_settings_are_refused_naming_what_to_fix(
    argv: list[str], env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(SettingsError, match=fragment.replace("-", r"\-").replace("+", r"\+")):
        _settings(argv, env)


def test_every_flag_fills_a_settings_field() -> None:
    plain = {f.name for f in fields(SimSettings)}
    fault = {f.name for f in fields(FaultSettings)}
    for flag, dest, is_fault in flag_destinations():
        assert dest in (fault if is_fault else plain), flag


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.1:8000", ("10.0.0.1", 8000)),
        ("head.service.consul:31000\n", ("head.service.consul", 31000)),
        ("[::1]:9000", ("::1", 9000)),
        ("", None),
        ("host", None),
        ("host:0", None),
        (":80", None),
    ],
)
def test_head_addresses(text: str, parsed: tuple[str, int] | None) -> None:
    assert parse_host_port(text) == parsed


def test_exit_codes_are_distinct() -> None:
    assert len({int(code) for code in ExitCode}) == len(ExitCode)


def test_a_join_backoff_that_shrinks_is_refused() -> None:
    problems = validate(SimSettings(join_backoff_initial=3.0, join_backoff_max=1.0))
    assert any("join_backoff_max must be at least join_backoff_initial" in p for p in problems)


def test_tool_calls_are_read_in_order_with_their_arguments_as_vllm_writes_them() -> None:
    given = '{"exec_command": {"cmd": "echo \u00e9"}, "Bash": {}}'
    assert _settings(["--tool-calls", given]).tool_calls == (
        ("exec_command", '{"cmd": "echo é"}'),  # not ASCII-escaped
        ("Bash", "{}"),
    )
    assert _settings([]).tool_calls == ()
