"""ops/DEPLOY.md, run as written: its own command blocks, in order, against the stand-ins
with ACLs on and nothing made yet (an empty cluster: the two bootstrap tokens only).

The test holds no copy of the guide's commands: it reads the guide's fenced blocks and
runs each ``sh`` block with ``sh -eu`` in one working directory, HOME a temporary
directory, PATH starting with this checkout's ``llmgw``. What it gives in place of an
operator, and why:

- step 0 (export the real servers' addresses and tokens) is not run: the stand-ins'
  addresses and bootstrap tokens are in the environment instead;
- step 3's client agent config (``hcl client``) cannot be loaded by a stand-in, which
  has no agent config file: it is parsed with llmgw's HCL parser, every key is held to
  Nomad 2.0.5's agent config (``CLIENT_CONFIG_KEYS``, each with its source), and the
  simulated node is built from it (host volumes, meta, drivers) and its agents given
  its Consul token, as a restart with that file does;
- step 4's variables file gets this host's settings appended (the stand-in's nodes are
  all this one machine: one control plane and one router, or a second would clash on its
  loopback ports; free ports; this checkout's llmgw; the stand-ins' plain-HTTP
  addresses; the guide runs no mirror, whose store the stand-in could not mount anyway);
- step 7's nginx file cannot run (no nginx here, no TLS certificate): its ``upstream``
  block is rendered with the stand-in's consul-template subset against the running
  routers, and must list exactly the router that answered step 6.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.apispec.jobspec import parse_jobspec
from llmgw.apispec.jobspec.expressions import Context, Literal, Template, TupleCons
from llmgw.apispec.jobspec.syntax import Body, parse
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import StandInConfig
from llmgw.devcluster.nomad import template as tmpl
from llmgw.devcluster.nomad.config import DockerPlugin, HostVolume, NodeSpec

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "ops" / "DEPLOY.md"
LLMGW = Path(sys.executable).parent / "llmgw"

# Every key the guide's client config may use, where Nomad 2.0.5 reads it:
# command/agent/config.go (Config: client, plugin; ClientConfig: enabled, meta,
# max_kill_timeout, host_volume), command/agent/config_parse.go (the consul blocks) and
# nomad/structs/config/consul.go (token), nomad/structs/volumes.go (ClientHostVolumeConfig:
# path, read_only), drivers/docker/config.go (configSpec: volumes { enabled }),
# drivers/rawexec/driver.go (configSpec: enabled).
CLIENT_CONFIG_KEYS = {
    ("consul",): {"token"},
    ("client",): {"enabled", "max_kill_timeout"},
    ("client", "meta"): None,  # a map: any key
    ("client", "host_volume"): {"path", "read_only"},
    ("plugin",): set(),
    ("plugin", "config"): {"enabled"},
    ("plugin", "config", "volumes"): {"enabled"},
}
CLIENT_CONFIG_BLOCKS = {
    (): {"consul", "client", "plugin"},
    ("client",): {"meta", "host_volume"},
    ("plugin",): {"config"},
    ("plugin", "config"): {"volumes"},
}


def guide_steps() -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(step heading, [(info string, block text), ...]), ...]`` in the guide's order."""
    steps: list[tuple[str, list[tuple[str, str]]]] = []
    for section in re.split(r"^## ", GUIDE.read_text(encoding="utf-8"), flags=re.M)[1:]:
        heading = section.splitlines()[0]
        blocks = re.findall(r"^```([^\n]*)\n(.*?)^```$", section, flags=re.M | re.S)
        steps.append((heading, [(info.strip(), text) for info, text in blocks]))
    return steps


def step(number: int) -> list[tuple[str, str]]:
    found = [blocks for heading, blocks in guide_steps() if heading.startswith(f"{number}. ")]
    assert len(found) == 1, f"DEPLOY.md has no single step {number}"
    return found[0]


def blocks(number: int, info: str) -> list[str]:
    return [text for kind, text in step(number) if kind == info]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _value(expr: object) -> object:
    context = Context({}, {}, unknown_as_text=False)
    if isinstance(expr, (Literal, Template)):
        return expr.eval(context)
    if isinstance(expr, TupleCons):
        return [item.eval(context) for item in expr.items]
    raise AssertionError(f"client config: a value llmgw's check does not read: {expr!r}")


def check_client_config(body: Body, where: tuple[str, ...] = ()) -> list[str]:
    """Every key and block of the client config that Nomad 2.0.5's agent would not read."""
    problems = []
    allowed = CLIENT_CONFIG_KEYS.get(where, set())
    for name in body.attributes:
        if allowed is not None and name not in allowed:
            problems.append(f"{'.'.join(where) or 'top level'}: {name} is not a Nomad 2.0.5 agent setting")
    for block in body.blocks:
        if block.type not in CLIENT_CONFIG_BLOCKS.get(where, set()):
            problems.append(f"{'.'.join(where) or 'top level'}: block {block.type} is not Nomad's")
            continue
        problems += check_client_config(block.body, (*where, block.type))
    return problems


def node_from_client_config(body: Body, volume_root: Path) -> tuple[NodeSpec, str]:
    """The simulated node a client with this config is, and its agents' Consul token."""
    consul_token = ""
    meta: dict[str, str] = {}
    volumes = []
    raw_exec = docker_volumes = False
    for block in body.blocks:
        if block.type == "consul":
            consul_token = str(_value(block.body.attributes["token"].expr))
        elif block.type == "client":
            for inner in block.body.blocks:
                if inner.type == "meta":
                    meta = {k: str(_value(a.expr)) for k, a in inner.body.attributes.items()}
                elif inner.type == "host_volume":
                    attrs = inner.body.attributes
                    read_only = bool(_value(attrs["read_only"].expr)) if "read_only" in attrs else False
                    # The volume's directory under this test's temporary root.
                    path = volume_root / str(_value(attrs["path"].expr)).lstrip("/")
                    path.mkdir(parents=True)
                    volumes.append(HostVolume(inner.labels[0], str(path), read_only))
        elif block.type == "plugin":
            config = next(b for b in block.body.blocks if b.type == "config")
            if block.labels[0] == "raw_exec":
                raw_exec = bool(_value(config.body.attributes["enabled"].expr))
            if block.labels[0] == "docker":
                volume_block = next(b for b in config.body.blocks if b.type == "volumes")
                docker_volumes = bool(_value(volume_block.body.attributes["enabled"].expr))
    node = NodeSpec(
        name="deploy-node-1",
        meta={k: v for k, v in meta.items() if k != "llmgw_fabric"},
        fabric=meta.get("llmgw_fabric", ""),
        raw_exec=raw_exec,
        exec=True,  # on by default on Linux clients (the guide's step 3 says so)
        docker=DockerPlugin(volumes_enabled=docker_volumes),
        host_volumes=tuple(volumes),
    )
    return node, consul_token


async def run_block(text: str, env: dict[str, str], cwd: Path, within: float = 240.0) -> str:
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "-eu",
        "-c",
        text,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        raise
    assert proc.returncode == 0, f"block failed ({proc.returncode}):\n{text}\n--- stderr:\n{err.decode()}"
    return out.decode()


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


class ConsulHealth:
    """A consul-template data source over Consul's health answers (what a real one reads)."""

    def __init__(self, services: dict[str, list[dict[str, Any]]]) -> None:
        self.services = services

    def service(self, query: tmpl.ServiceQuery) -> list[dict[str, Any]] | None:
        entries = self.services.get(query.name)
        return None if entries is None else [tmpl.service_record(e) for e in entries]

    def key(self, key: str) -> tuple[bool, str] | None:
        return None

    def env(self, name: str) -> str:
        return ""

    def variable(self, path: str, namespace: str | None) -> dict[str, str] | None:
        return None


def test_the_guide_has_its_steps_in_order_with_blocks() -> None:
    headings = [heading for heading, _ in guide_steps()]
    numbered = [h for h in headings if re.match(r"\d+\. ", h)]
    assert [int(h.split(".")[0]) for h in numbered] == list(range(8))
    for number in (1, 2, 4, 5, 6):
        assert blocks(number, "sh"), f"step {number} has no sh block"
    assert blocks(3, "hcl client") and blocks(7, "nginx")


def test_the_client_config_has_only_nomad_settings() -> None:
    (text,) = blocks(3, "hcl client")
    assert check_client_config(parse(text, "client.hcl")) == []
    # The check can fail: a key Nomad does not read is named.
    wrong = parse(text.replace("max_kill_timeout", "max_kill_timout"), "client.hcl")
    assert check_client_config(wrong) == ["client: max_kill_timout is not a Nomad 2.0.5 agent setting"]


async def test_the_deploy_guide_runs_from_an_empty_cluster_to_the_first_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (client_config,) = blocks(3, "hcl client")
    node, agent_token_placeholder = node_from_client_config(
        parse(client_config, "client.hcl"), tmp_path / "root"
    )
    assert agent_token_placeholder == "<nomad_agent_consul_token>"
    config = DevClusterConfig(
        nomad=StandInConfig(nodes=(node,), strict=True),
        consul=ConsulSettings.for_tests(),
        provision_acl=False,
    )
    router_port, admin_port = free_port(), free_port()
    async with DevCluster(config) as dev:
        env = {
            "PATH": f"{LLMGW.parent}:{os.environ['PATH']}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "NOMAD_ADDR": dev.nomad_addr,
            "NOMAD_TOKEN": dev.nomad_token,
            "CONSUL_HTTP_ADDR": dev.consul_addr.removeprefix("http://"),
            "CONSUL_HTTP_TOKEN": dev.consul_token,
            "NOMAD_JWKS_URL": dev.nomad_jwks_url,
            "HF_TOKEN": "hf_deploy_guide_test",
            "LLMGW_ADMIN_URL": f"http://127.0.0.1:{admin_port}",
            "ROUTER_URL": f"http://127.0.0.1:{router_port}",
        }
        state = home / ".llmgw-deploy"

        # 1. Policies and tokens.
        for text in blocks(1, "sh"):
            await run_block(text, env, REPO)
        tokens = read_env_file(state / "tokens.env")
        assert set(tokens) == {
            "control_nomad_token", "router_nomad_token", "ci_nomad_token", "control_consul_token",
            "router_consul_token", "status_consul_token", "nomad_agent_consul_token",
            "prometheus_consul_token",
        }  # fmt: skip
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        # The Nomad agents restart with step 3's config, its token filled in.
        dev.configure_nomad_agents(tokens["nomad_agent_consul_token"])

        # 2. The Variables.
        for text in blocks(2, "sh"):
            await run_block(text, env, REPO)
        tokens = read_env_file(state / "tokens.env")
        job_var = dev.nomad.variables.get("default", "nomad/jobs/llmgw")  # type: ignore[union-attr]
        assert job_var is not None
        assert job_var.items["admin_token"] == tokens["admin_token"]
        assert job_var.items["control_nomad_token"] == tokens["control_nomad_token"]
        assert len(job_var.items["engine_key_secret"]) >= 32
        hf_var = dev.nomad.variables.get("default", "llmgw/hf-token")  # type: ignore[union-attr]
        assert hf_var is not None and hf_var.items == {"HF_TOKEN": "hf_deploy_guide_test"}

        # 4. The llmgw job: the guide's variables file, then this host's settings.
        vars_block, register_block, wait_block = blocks(4, "sh")
        await run_block(vars_block, env, REPO)
        vars_file = state / "llmgw.vars.hcl"
        with vars_file.open("a") as f:
            f.write(
                f'llmgw_command = "{LLMGW}"\ncontrol_plane_count = 1\nrouter_count = 1\n'
                f"router_port = {router_port}\nadmin_port = {admin_port}\n"
                f'consul_addr = "{env["CONSUL_HTTP_ADDR"]}"\n'
            )
        variables = vars_file.read_text()
        assert (
            'datacenters       = ["dc1"]' in variables
            and f'nomad_addr        = "{dev.nomad_addr}"' in variables
        )
        await run_block(register_block, env, REPO)
        job = parse_jobspec((REPO / "ops" / "llmgw.nomad.hcl").read_text(), variables_file=variables)
        groups = {g["Name"]: g for g in job["TaskGroups"]}
        (control_service,) = groups["control-plane"]["Services"]
        assert control_service["Name"] == "llmgw-control-metrics"
        assert [(c["Type"], c["Path"]) for c in control_service["Checks"]] == [("http", "/health")]
        await run_block(wait_block, env, REPO)

        # Every component got its secrets, in its environment (the running processes').
        nomad = dev.nomad
        assert nomad is not None
        running = {}
        for alloc in nomad.store.allocs.values():
            if alloc.job_id == "llmgw" and alloc.client_status == "running":
                running[alloc.task_group] = alloc.id
        assert set(running) == {"control-plane", "router"}
        envs = {}
        for group, alloc_id in running.items():
            proc = nomad.runners[alloc_id].tasks["serve"].proc
            assert proc is not None
            envs[group] = process_env(proc.pid)
        control, router = envs["control-plane"], envs["router"]
        assert control["NOMAD_TOKEN"] == tokens["control_nomad_token"]
        assert control["CONSUL_HTTP_TOKEN"] == tokens["control_consul_token"]
        assert control["LLMGW_ADMIN_TOKEN"] == tokens["admin_token"]
        assert control["LLMGW_ENGINE_KEY_SECRET"] == job_var.items["engine_key_secret"]
        assert control["LLMGW_HF_TOKEN_VARIABLE"] == "llmgw/hf-token"
        assert router["NOMAD_TOKEN"] == tokens["router_nomad_token"]
        assert router["CONSUL_HTTP_TOKEN"] == tokens["router_consul_token"]
        assert router["LLMGW_ENGINE_KEY_SECRET"] == control["LLMGW_ENGINE_KEY_SECRET"]
        assert "LLMGW_ADMIN_TOKEN" not in router

        # 5. The first catalog through the admin API; 6. the first answer.
        for text in blocks(5, "sh"):
            await run_block(text, env, REPO, within=120)
        (answer_block,) = blocks(6, "sh")
        answer = await run_block(answer_block, env, REPO, within=240)
        assert answer.strip(), "the first answer is empty"

        # 7. The load balancer's upstreams, rendered from Consul as consul-template would.
        (nginx,) = blocks(7, "nginx")
        upstream = re.search(r"^upstream .*?^}", nginx, flags=re.M | re.S)
        assert upstream is not None
        async with (
            aiohttp.ClientSession(headers={"X-Consul-Token": dev.consul_token}) as http,
            http.get(f"{dev.consul_addr}/v1/health/service/llmgw-router?passing=true") as reply,
        ):
            routers = await reply.json()
        rendered = tmpl.render(tmpl.parse(upstream.group(0)), ConsulHealth({"llmgw-router": routers})).output
        assert re.findall(r"server (\S+) ", rendered) == [f"127.0.0.1:{router_port}"]

        # Every refusal a component met on the way: none of the guide's tokens lacked a rule.
        # (The Nomad agents' sync reads /v1/agent/checks, which Consul answers without the
        # node's own Serf check for want of node:read: Nomad only reads its own checks there,
        # command/agent/consul/service_client.go, so that filtering is no refusal.)
        denied = {
            (d.who, d.request, d.lacked)
            for d in [*nomad.tokens.denials, *dev.consul.state.tokens.denials]
            if d.who != "anonymous" and d.request != "GET /v1/agent/checks"
        }
        assert denied == set()


async def test_only_a_management_token_makes_acl_objects() -> None:
    """The ACL APIs the guide's step 1 calls refuse a component's token, as acl:write does."""
    config = DevClusterConfig(nomad=StandInConfig(nodes=(), strict=True), consul=ConsulSettings.for_tests())
    async with DevCluster(config) as dev, aiohttp.ClientSession() as http:
        policy = {"Name": "llmgw-escape", "Rules": 'namespace "default" { policy = "write" }'}
        nomad_refusals = [
            ("/v1/acl/policy/llmgw-escape", policy),
            ("/v1/acl/token", {"Name": "mine", "Type": "management"}),
        ]
        for path, body in nomad_refusals:
            headers = {"X-Nomad-Token": dev.nomad_tokens["control-plane"]}
            async with http.post(f"{dev.nomad_addr}{path}", json=body, headers=headers) as reply:
                assert (reply.status, await reply.text()) == (403, "Permission denied")
        for path in ("/v1/acl/policy", "/v1/acl/token", "/v1/acl/auth-method", "/v1/acl/binding-rule"):
            headers = {"X-Consul-Token": dev.consul_tokens["control-plane"]}
            async with http.put(f"{dev.consul_addr}{path}", json={"Name": "x"}, headers=headers) as reply:
                assert reply.status == 403, path
        # The management token makes them; a client token must name a policy.
        headers = {"X-Nomad-Token": dev.nomad_token}
        async with http.post(
            f"{dev.nomad_addr}/v1/acl/token", json={"Type": "client"}, headers=headers
        ) as reply:
            assert reply.status == 400 and "client token missing policies or roles" in await reply.text()
