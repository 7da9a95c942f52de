"""SGLang ranks listen only on ports Nomad gave them; its health check waits for the engine's verdict.

SGLang 0.5.3: a worker rank (``--node-rank`` >= 1) starts a stand-in health server
on ``--host``/``--port`` (default 127.0.0.1:30000, ``entrypoints/engine.py``), and
``/health`` polls once a second for up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s)
before answering 503 (``entrypoints/http_server.py``).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.conventions import ENGINE_SERVICE
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

SECOND_NS = 10**9


def _catalog(policy: SecurityPolicy, profile: str) -> Catalog:
    text = f"models:\n  m:\n    profiles: [{profile}]\n"
    loaded = load_catalog(text, filename="c", policy=policy)
    assert loaded.catalog is not None, loaded.diagnostics
    return loaded.catalog


def _job(policy: SecurityPolicy, profile: str, settings: RenderSettings | None = None) -> dict[str, Any]:
    renderer = Renderer(settings or RenderSettings(), policy)
    rendered = renderer.render(_catalog(policy, profile), ReplicaRequest("m", 0, "0", "f"), catalog_hash="h")
    return renderer.check(rendered, model="m")


def _engine_args(group: dict[str, Any]) -> list[str]:
    engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
    return [*engine["Config"]["entrypoint"], *engine["Config"]["args"]]


def _allocated_ports(group: dict[str, Any]) -> set[str]:
    return {p["Label"] for n in group["Networks"] for p in (n.get("DynamicPorts") or [])}


def _value_of(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _engine_check(job: dict[str, Any]) -> dict[str, Any]:
    rank0 = job["TaskGroups"][0]
    [service] = [s for s in rank0["Services"] if s["Name"] == ENGINE_SERVICE]
    [check] = service["Checks"]
    return check


def _assert_nomad_port(group: dict[str, Any], value: str | None, what: str) -> None:
    assert value is not None, f"{group['Name']}: {what} is left to SGLang's default"
    label = re.fullmatch(r"\$\{NOMAD_PORT_(\w+)\}", value)
    assert label is not None and label.group(1) in _allocated_ports(group), (group["Name"], what, value)


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_every_sglang_rank_listens_on_a_port_nomad_allocated_to_its_group(
    shipped_policy: SecurityPolicy, nodes: int
) -> None:
    job = _job(shipped_policy, f"{{engine: sglang, source: org/m, tp: {4 * nodes}, nodes: {nodes}}}")
    groups = job["TaskGroups"]
    assert len(groups) == nodes
    for group in groups:
        argv = _engine_args(group)
        # SGLang's default (30000) is no Nomad port: the flag must be there, naming one of the group's.
        _assert_nomad_port(group, _value_of(argv, "--port"), "--port")
        # Every other port flag rendered names one of the group's too.
        for flag in (word for word in argv if word.startswith("--") and word.endswith("-port")):
            _assert_nomad_port(group, _value_of(argv, flag), flag)
    if nodes == 1:
        # torch's rendezvous store of a one-node replica: unset, a port probed near --port.
        _assert_nomad_port(groups[0], _value_of(_engine_args(groups[0]), "--nccl-port"), "--nccl-port")
    for worker in groups[1:]:
        argv = _engine_args(worker)
        # Nothing routes to a worker's stand-in health server: it stays on loopback.
        assert _value_of(argv, "--host") == "127.0.0.1"
        assert _value_of(argv, "--port") == "${NOMAD_PORT_health}"
        assert _value_of(argv, "--node-rank") == worker["Name"].removeprefix("rank-")


def test_two_workers_of_two_replicas_on_one_node_get_distinct_ports_from_nomad(
    shipped_policy: SecurityPolicy,
) -> None:
    # The port is Nomad's to choose per allocation, not a number baked into the job.
    job = _job(shipped_policy, "{engine: sglang, source: org/m, tp: 8, nodes: 2}")
    worker = job["TaskGroups"][1]
    [network] = worker["Networks"]
    assert not network.get("ReservedPorts")
    assert [p["Label"] for p in network["DynamicPorts"]] == ["health"]
    assert "30000" not in _engine_args(worker)


def test_sglang_health_check_outlasts_the_engines_own_verdict(shipped_policy: SecurityPolicy) -> None:
    check = _engine_check(_job(shipped_policy, "{engine: sglang, source: org/m}"))
    assert check["Path"] == "/health"
    # 20 s of SGLang's polling plus its last poll: a busy engine answers, a wedged one says 503.
    assert check["Timeout"] >= 21 * SECOND_NS, check["Timeout"]
    assert check["Timeout"] == 22 * SECOND_NS
    # The rendezvous port's TCP check answers at once: it keeps the operator's timeout.
    two_nodes = _job(shipped_policy, "{engine: sglang, source: org/m, tp: 8, nodes: 2}")
    [rank_service] = [s for s in two_nodes["TaskGroups"][0]["Services"] if s["Name"] != ENGINE_SERVICE]
    assert [c["Timeout"] for c in rank_service["Checks"]] == [2 * SECOND_NS]
    assert _engine_check(two_nodes)["Timeout"] == 22 * SECOND_NS


def test_sglang_health_check_follows_the_engines_timeout_from_the_profile(
    shipped_policy: SecurityPolicy,
) -> None:
    profile = '{engine: sglang, source: org/m, env: {SGLANG_HEALTH_CHECK_TIMEOUT: "45"}}'
    assert _engine_check(_job(shipped_policy, profile))["Timeout"] == 47 * SECOND_NS


def test_a_longer_operator_timeout_still_wins_and_other_engines_keep_it(
    shipped_policy: SecurityPolicy,
) -> None:
    slow = RenderSettings(check_timeout_s=30)
    assert _engine_check(_job(shipped_policy, "{engine: sglang, source: org/m}", slow))["Timeout"] == (
        30 * SECOND_NS
    )
    # vLLM's and llama.cpp's /health answer without generating: the operator's 2 s holds.
    for engine in ("vllm", "llamacpp"):
        source = "org/m" if engine == "vllm" else "https://example.com/m.gguf"
        check = _engine_check(_job(shipped_policy, f"{{engine: {engine}, source: {source!r}}}"))
        assert check["Timeout"] == 2 * SECOND_NS, engine


@pytest.mark.parametrize("dp", ['["--dp-size", "2"]', '["--dp-size=2"]', '["--data-parallel-size", "2"]'])
def test_data_parallel_ranks_keep_their_own_store_ports(shipped_policy: SecurityPolicy, dp: str) -> None:
    # Each data parallel rank binds a store port of its own (launch_dp_schedulers):
    # one fixed --nccl-port would be bound twice and the engine would not start.
    loaded = load_catalog(
        f"models:\n  m:\n    profiles: [{{engine: sglang, source: org/m, tp: 1, args: {dp}}}]\n",
        filename="c",
        policy=shipped_policy,
    )
    assert loaded.catalog is not None, loaded.diagnostics
    renderer = Renderer(RenderSettings(), shipped_policy)
    rendered = renderer.render(loaded.catalog, ReplicaRequest("m", 0, "0", "f"), catalog_hash="h")
    [group] = renderer.check(rendered, model="m")["TaskGroups"]
    assert "--nccl-port" not in _engine_args(group)
    assert _allocated_ports(group) == {"http"}
