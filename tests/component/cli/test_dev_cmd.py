"""The `llmgw dev` fault subcommands against stand-ins started here: messages, exit codes, help."""

from __future__ import annotations

import asyncio
import json
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from llmgw.bundled import read_security_policy
from llmgw.cli import main
from llmgw.cli.dev_run import answering_model, write_secret
from llmgw.core.catalog import load_catalog
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig

CONSUL_TOKEN = "consul-secret"
NOMAD_TOKEN = "nomad-secret"


@pytest.fixture
async def consul() -> AsyncIterator[ConsulStandIn]:
    async with ConsulStandIn(ConsulSettings.for_tests(acl_token=CONSUL_TOKEN)) as standin:
        yield standin


@pytest.fixture
async def hung_nomad() -> AsyncIterator[str]:
    """A Nomad address that accepts requests and does not answer."""

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)  # a Nomad that does not answer is what the test needs
        return web.json_response([])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def fault(capsys: pytest.CaptureFixture[str], state_dir: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["dev", *args, "--state-dir", str(state_dir)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def point_at(state_dir: Path, nomad: str, consul: str, consul_token: str = CONSUL_TOKEN) -> None:
    """What a running llmgw dev leaves in its state folder: dev.json and the two tokens."""
    (state_dir / "dev.json").write_text(json.dumps({"nomad_addr": nomad, "consul_addr": consul}))
    (state_dir / "nomad.token").write_text(NOMAD_TOKEN)
    (state_dir / "consul.token").write_text(consul_token)


NOBODY = "http://127.0.0.1:9"  # the discard port: nothing listens there


async def test_slow_checks_says_when_the_delay_is_cleared(
    consul: ConsulStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await consul.add_node("gpu-3")
    point_at(tmp_path, NOBODY, consul.url)
    delayed = await fault(capsys, tmp_path, "slow-checks", "gpu-3", "5")
    assert delayed == (0, "health checks of gpu-3 delayed by 5s\n", "")
    cleared = await fault(capsys, tmp_path, "slow-checks", "gpu-3", "0")
    assert cleared == (0, "health checks of gpu-3 are no longer delayed\n", "")


async def test_exit_codes_follow_the_convention(
    consul: ConsulStandIn,
    hung_nomad: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = await fault(capsys, tmp_path, "fail-node", "gpu-1")
    assert code == 3 and "no running llmgw dev found" in err  # no dev.json
    point_at(tmp_path, NOBODY, consul.url)
    code, _, err = await fault(capsys, tmp_path, "restore-node", "gpu-1")
    assert code == 3 and "no running llmgw dev answers" in err  # a dev.json left behind
    code, _, err = await fault(capsys, tmp_path, "slow-checks", "gpu-9", "5")
    assert code == 1 and "answered 500: Unknown node 'gpu-9'" in err  # refused, in the stand-in's words
    code, _, err = await fault(capsys, tmp_path, "consul-outage", "nan")
    assert code == 1 and "answered 400" in err
    monkeypatch.setattr("llmgw.cli.dev_run.FAULT_TIMEOUT", 0.5)
    point_at(tmp_path, hung_nomad, consul.url)
    code, _, err = await fault(capsys, tmp_path, "fail-node", "gpu-1")
    assert code == 3 and "did not answer in 0.5s" in err  # hung: it cannot answer now


async def test_the_faults_send_the_stand_ins_tokens(
    consul: ConsulStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = StandInConfig(
        nodes=(NodeSpec(name="gpu-1"),), state_dir=tmp_path / "nomad", acl_token=NOMAD_TOKEN
    )
    async with NomadServer(NomadStandIn(config)) as nomad:
        await consul.add_node("gpu-3")
        point_at(tmp_path, nomad.address, consul.url, consul_token="stale")
        code, _, err = await fault(capsys, tmp_path, "slow-checks", "gpu-3", "5")
        assert code == 1 and "answered 403: ACL not found" in err
        assert consul.state.faults.check_latency.get("gpu-3", 0) == 0, "nothing changed"
        (tmp_path / "nomad.token").write_text("stale")
        code, _, err = await fault(capsys, tmp_path, "fail-node", "gpu-1")
        assert code == 1 and "answered 403: ACL token not found" in err
        (tmp_path / "consul.token").unlink()
        code, _, err = await fault(capsys, tmp_path, "slow-checks", "gpu-3", "5")
        assert code == 3 and "consul.token" in err and "is llmgw dev running from this folder?" in err

        point_at(tmp_path, nomad.address, consul.url)
        assert (await fault(capsys, tmp_path, "slow-checks", "gpu-3", "5"))[0] == 0
        code, out, _ = await fault(capsys, tmp_path, "fail-node", "gpu-1")
        assert (code, out) == (0, "node gpu-1 failed: its processes are killed and its heartbeat stopped\n")


def test_a_token_file_is_this_users_only_whatever_an_earlier_run_left(tmp_path: Path) -> None:
    old = tmp_path / "consul.token"
    old.write_text("old")
    old.chmod(0o644)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not a token")
    planted = tmp_path / "nomad.token"
    planted.symlink_to(elsewhere)  # a link planted where the token goes is replaced, not followed
    write_secret(old, "consul-new")
    write_secret(planted, "nomad-new")
    for path, secret in ((old, "consul-new"), (planted, "nomad-new")):
        assert not path.is_symlink() and path.read_text() == secret
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert elsewhere.read_text() == "not a token"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["consul.token", "elsewhere", "nomad.token"]


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit):
        main([*args, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_fault_help_says_what_each_refuses_and_the_real_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    outage = help_of(capsys, "dev", "consul-outage")
    assert "node" not in outage.split("Exit 0")[1] and "allocation" not in outage
    assert "1 refused (a duration the Consul stand-in refuses)" in outage
    restore = help_of(capsys, "dev", "restore-node")
    assert "1 refused (no such node)" in restore and "or allocation" not in restore
    for name in ("fail-node", "restore-node", "crash", "consul-outage", "slow-checks"):
        assert "3 no llmgw dev answers" in help_of(capsys, "dev", name)
    dev = help_of(capsys, "dev")
    assert "[--log-level LOG_LEVEL] [FAULT ...]" in dev
    assert "FAULT optional: act on the llmgw dev already running" in dev


def test_the_readmes_try_it_block_exports_every_variable_it_uses() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    block = readme.split("### Trying `llmgw dev`", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    used = set(re.findall(r"\$([A-Z_]+)", block))
    exported = set(re.findall(r"^export ([A-Z_]+)=", block, flags=re.MULTILINE))
    assert used and used <= exported, f"used but not exported: {sorted(used - exported)}"


ANSWERING = """
models:
  real-only:   {roles: [chat], profiles: [{engine: vllm, source: org/m}], scaling: {min: 1, max: 1}}
  off-sim:     {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 0}}
  embed:       {roles: [embedding], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  screened:
    roles: [chat]
    profiles: [{engine: vllm, source: org/m}, {engine: sim}]
    scaling: {min: 1, max: 1}
  falls-back:  {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  lazy:        {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
  mine:        {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  real-judge:  {roles: [guard], profiles: [{engine: vllm, source: org/guard}], scaling: {min: 0, max: 1}}
fallbacks:
  falls-back: [screened]
guard_policies:
  real:
    judge: real-judge
    models: [screened]
"""


MINE = "mine:        {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}"
LAZY = "lazy:        {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}"


def _switched_off(text: str, *lines: str) -> str:
    for line in lines:
        text = text.replace(line, line.replace("scaling: {min: 1, max: 1}", "scaling: {min: 0, max: 0}"))
    return text


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # Not real-only (no GPUs), off-sim, embed; not those a judge that cannot run screens
        # (screened, and falls-back through its fallback); kept running before lazy.
        (lambda text: text, "mine"),
        (lambda text: _switched_off(text, MINE), "lazy"),
        (lambda text: _switched_off(text, MINE).replace(LAZY, LAZY.split(", scaling")[0] + "}"), None),
        (lambda text: text + "    on_error: allow\n", "screened"),  # a judge that is down lets it through
        (lambda text: text.replace("org/guard}]", "org/guard}, {engine: sim}]"), "screened"),
    ],
)
def test_the_banner_names_a_chat_model_that_answers_on_dev(edit: Any, named: str | None) -> None:
    loaded = load_catalog(edit(ANSWERING), filename="catalog.yaml", policy=read_security_policy())
    assert loaded.catalog is not None, [d.format() for d in loaded.diagnostics]
    assert answering_model(loaded.catalog) == named


CPU_CATALOG = """
models:
  mine:
    roles: [chat]
    profiles: [{engine: llamacpp, source: "https://models.example.com/m.gguf", gpus_per_node: 0}]
  gpu-gguf:
    roles: [chat]
    profiles: [{engine: llamacpp, source: "https://models.example.com/g.gguf", gpus_per_node: 2}]
"""


def test_a_cpu_llamacpp_profile_gets_a_cpu_node_that_runs_the_local_llama_server(tmp_path: Path) -> None:
    import argparse

    from llmgw.bundled import read_security_policy
    from llmgw.cli.dev_run import dev_nodes, local_llama_server, wants_cpu_node
    from llmgw.core.catalog import load_catalog

    catalog = load_catalog(CPU_CATALOG, filename="mine.yaml", policy=read_security_policy()).catalog
    assert catalog is not None and wants_cpu_node(catalog)
    gpu_only = load_catalog(
        CPU_CATALOG.split("  gpu-gguf")[0].replace("0}", "1}"),
        filename="x.yaml",
        policy=read_security_policy(),
    ).catalog
    assert gpu_only is not None and not wants_cpu_node(gpu_only)
    args = argparse.Namespace(nodes=2, gpus=8, gpu_model="H100")
    nodes = dev_nodes(args, cpu_nodes=1, llama_server="/opt/llama-server")
    assert [(n.name, n.gpus, n.docker is not None) for n in nodes] == [
        ("gpu-1", 8, False),
        ("gpu-2", 8, False),
        ("cpu-1", 0, True),
    ]
    assert nodes[2].docker is not None and nodes[2].docker.llama_server == "/opt/llama-server"
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert local_llama_server({"PATH": str(binary.parent)}) == str(binary)
    assert (
        local_llama_server({"PATH": str(binary.parent), "LLMGW_LLAMA_SERVER": "/x/llama-server"})
        == "/x/llama-server"
    )
    assert local_llama_server({"PATH": str(tmp_path)}) is None


def test_artifact_pairs_name_a_url_and_an_existing_file(tmp_path: Path) -> None:
    from llmgw.cli.dev_run import artifact_files

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert artifact_files([f"https://models.example.com/m.gguf={gguf}"]) == {
        "https://models.example.com/m.gguf": str(gguf)
    }
    for bad, words in (
        ("https://x/m.gguf", "write URL=FILE"),
        (f"https://x/m.gguf={tmp_path}/no.gguf", "is not a file"),
    ):
        with pytest.raises(ValueError, match=words):
            artifact_files([bad])


def test_the_banner_names_a_local_gguf_model_when_a_llama_server_runs_it() -> None:
    # `llmgw dev --catalog mine.yaml` with only a CPU llama.cpp model: with a local
    # llama-server the CPU node serves it, so the curl line names it; without one nothing answers.
    text = """
models:
  mine:
    roles: [chat]
    profiles: [{engine: llamacpp, source: "https://models.example.com/m.gguf", gpus_per_node: 0}]
    scaling: {min: 1, max: 1}
  on-gpus:
    roles: [chat]
    profiles: [{engine: llamacpp, source: "https://models.example.com/g.gguf", gpus_per_node: 1}]
    scaling: {min: 1, max: 1}
"""
    loaded = load_catalog(text, filename="mine.yaml", policy=read_security_policy())
    assert loaded.catalog is not None, [d.format() for d in loaded.diagnostics]
    assert answering_model(loaded.catalog, llama_server=True) == "mine"
    assert answering_model(loaded.catalog, llama_server=False) is None


# Two replicas of one model, the first spanning two nodes, and an allocation that ended;
# the fields as Nomad's /v1/allocations lists them (AllocListStub).
ALLOCS = [
    {"ID": "5d1b7c3e-0f4a-4e9b-9a7d-2c8e6f1a3b40", "JobID": "llmgw-big-r1", "TaskGroup": "rank-0",
     "NodeName": "gpu-1", "DesiredStatus": "run", "ClientStatus": "running"},
    {"ID": "a93e0d42-7b16-4c85-b3f9-e1d2c4a6b870", "JobID": "llmgw-big-r1", "TaskGroup": "rank-1",
     "NodeName": "gpu-2", "DesiredStatus": "run", "ClientStatus": "running"},
    {"ID": "c0ffee00-1111-4222-8333-444455556666", "JobID": "llmgw-small-r1", "TaskGroup": "rank-0",
     "NodeName": "gpu-3", "DesiredStatus": "run", "ClientStatus": "running"},
    {"ID": "c0ffee99-1111-4222-8333-444455556666", "JobID": "llmgw-small-r0", "TaskGroup": "rank-0",
     "NodeName": "gpu-3", "DesiredStatus": "stop", "ClientStatus": "complete"},
]  # fmt: skip
MODELS = {"llmgw-big-r1": "big", "llmgw-small-r1": "small", "llmgw-small-r0": "small"}


@pytest.fixture
async def nomad_with_allocs() -> AsyncIterator[tuple[str, list[str]]]:
    """A Nomad answering the reads `llmgw dev crash` makes; the allocations it was told to crash."""
    crashed: list[str] = []

    async def allocations(request: web.Request) -> web.Response:
        return web.json_response(ALLOCS)

    async def job(request: web.Request) -> web.Response:
        return web.json_response(
            {"ID": request.match_info["id"], "Meta": {"llmgw_model": MODELS[request.match_info["id"]]}}
        )

    async def crash(request: web.Request) -> web.Response:
        crashed.append(request.match_info["id"])
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v1/allocations", allocations)
    app.router.add_get("/v1/job/{id}", job)
    app.router.add_post("/_dev/alloc/{id}/crash", crash)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", crashed
    await runner.cleanup()


async def test_crash_takes_a_model_or_replica_name_and_lists_the_candidates_when_ambiguous(
    nomad_with_allocs: tuple[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nomad, crashed = nomad_with_allocs
    point_at(tmp_path, nomad, NOBODY)
    code, out, _ = await fault(capsys, tmp_path, "crash", "small")  # the model: one running allocation
    assert (
        code == 0
        and out == "task engine of allocation c0ffee00 (llmgw-small-r1, group rank-0 on gpu-3) killed\n"
    )
    assert crashed == ["c0ffee00-1111-4222-8333-444455556666"]
    code, out, err = await fault(capsys, tmp_path, "crash", "llmgw-big-r1")  # a replica on two nodes
    assert code == 1 and "'llmgw-big-r1' matches 2 allocations, name one by its id" in err
    assert "5d1b7c3e (llmgw-big-r1, group rank-0 on gpu-1)" in err
    assert "a93e0d42 (llmgw-big-r1, group rank-1 on gpu-2)" in err
    assert crashed == ["c0ffee00-1111-4222-8333-444455556666"], "nothing crashed"
    code, out, _ = await fault(capsys, tmp_path, "crash", "a93e0d42")  # the id as `llmgw status` shows it
    assert code == 0 and crashed[-1] == "a93e0d42-7b16-4c85-b3f9-e1d2c4a6b870"
    code, out, _ = await fault(capsys, tmp_path, "crash", ALLOCS[0]["ID"], "--task", "fetch")  # the whole id
    assert code == 0 and out.startswith("task fetch of allocation 5d1b7c3e ")
    code, _, err = await fault(capsys, tmp_path, "crash", "c0ffee")  # a prefix of two ids
    assert code == 1 and "matches 2 allocations" in err
    code, _, err = await fault(capsys, tmp_path, "crash", "nope")
    assert code == 1 and "no allocation, replica or model 'nope'" in err
    assert "(running replicas: llmgw-big-r1, llmgw-small-r1)" in err
    assert len(crashed) == 3
