"""The mirror end to end on the dev stand-in: a replica fetches and verifies its weights before it starts.

A real mirror server (``llmgw.mirror.server``) serves two versions of a small model from a
store directory. The control plane (the same ``Services`` ``llmgw serve`` runs) places one
replica of each of two simulated models whose catalog source is ``mirror:NAME@VERSION``,
rendered with the mirror's address, so each replica's job runs ``llmgw mirror fetch`` as a
prestart task on the stand-in's node before the engine. One version is intact: its replica
fetches every file into the node's model cache and becomes healthy. The other was tampered
with in the mirror's store (same size, one byte changed, after it was verified): its fetch
fails verification, so its engine never starts, and ``llmgw status`` says why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.adapters.consul import StatusPublisher
from llmgw.bundled import read_security_policy
from llmgw.cli import main
from llmgw.cli.dev_run import dev_control_settings, dev_render_settings
from llmgw.cli.serving import Role, Services, ServiceSettings, publish_catalog
from llmgw.core.planning.status import ModelStatus, StatusReport, from_json
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.nomad import NodeSpec, StandInConfig
from llmgw.mirror.server import create_app
from llmgw.mirror.store import DirectoryStore
from llmgw.settings import ConsulConnection, NomadConnection
from tests.support.mirror import put_version
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

# Sim-sized weights: the simulator ignores them, the fetch hashes every byte.
FILES = {
    "config.json": b'{"architectures": ["SimForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 64,
    "tokenizer.json": b'{"model": {"type": "BPE"}}' * 20,
}
SHARD = "model.safetensors"

CATALOG = """
models:
  sim-mirrored:
    roles: [chat]
    profiles:
      - engine: sim
        source: mirror:tiny@v1
        sim: {load_seconds: 0.2}
    scaling: {min: 1, max: 1}
  sim-tampered:
    roles: [chat]
    profiles:
      - engine: sim
        source: mirror:tiny@v2
        sim: {load_seconds: 0.2}
    scaling: {min: 1, max: 1}
"""


@dataclass
class Running:
    consul_addr: str
    nomad_addr: str
    cache: Path
    status: StatusPublisher
    consul_token: str
    nomad_token: str


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[str]:
    """A mirror server over a store with tiny@v1 intact and tiny@v2 tampered after verification."""
    store = DirectoryStore(tmp_path / "store")
    put_version(store, "tiny@v1", FILES)
    v2 = put_version(store, "tiny@v2", FILES)
    stored = store.version_dir(v2) / "files" / SHARD
    data = stored.read_bytes()
    stored.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # same size: only the hash can tell
    runner = web.AppRunner(create_app(store))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()  # the kernel's free port, taken as it binds
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def running(tmp_path: Path, mirror: str) -> AsyncIterator[Running]:
    cache = tmp_path / "node-cache"
    nodes = tuple(NodeSpec(name=f"gpu-{i}", gpus=2, fabric="fabric-a") for i in (1, 2))
    config = DevClusterConfig(nomad=StandInConfig(nodes=nodes), state_dir=tmp_path / "nomad")
    async with DevCluster(config) as cluster:
        settings = ServiceSettings(
            role=Role.CONTROL_PLANE,
            # The control plane's own tokens (ops/acl), as llmgw dev runs it.
            nomad=NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_tokens["control-plane"]),
            consul=ConsulConnection.from_env(
                {
                    "CONSUL_HTTP_ADDR": cluster.consul_addr,
                    "CONSUL_HTTP_TOKEN": cluster.consul_tokens["control-plane"],
                }
            ),
            policy=read_security_policy(),
            render=replace(
                dev_render_settings(),
                mirror_url=mirror,
                model_cache_dir=str(cache),
                # A failed fetch fails the allocation at once (a real cluster retries a few
                # times first; the outcome is the same, only later).
                restart_attempts=0,
            ),
            control=dev_control_settings(),
            admin=None,
            instance_id="e2e-mirror",
        )
        async with Services(settings) as services:
            assert services.consul is not None
            await publish_catalog(services.consul, CATALOG, applied_by="e2e")
            yield Running(
                cluster.consul_addr,
                cluster.nomad_addr,
                cache,
                StatusPublisher(services.consul),
                cluster.consul_tokens["status"],  # llmgw status runs with the status reader's token
                cluster.nomad_token,
            )


async def model_status(running: Running, model: str) -> ModelStatus | None:
    document = await running.status.read()
    if document is None:
        return None
    report: StatusReport = from_json(document.text)
    return next((m for m in report.models if m.model == model), None)


async def llmgw_status(
    running: Running, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    """``llmgw status ARGS`` as an operator runs it, with CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN
    set for the stand-in."""
    for name in list(os.environ):
        if name.startswith("CONSUL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CONSUL_HTTP_ADDR", running.consul_addr)
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", running.consul_token)
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["status", *args])
    return code, capsys.readouterr().out


async def nomad_job(running: Running, job_id: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{running.nomad_addr}/v1/job/{job_id}", headers={"X-Nomad-Token": running.nomad_token}
        ) as response,
    ):
        response.raise_for_status()
        job: dict[str, Any] = await response.json()
        return job


async def test_an_intact_version_is_fetched_verified_and_served_and_a_tampered_one_never_starts(
    running: Running, mirror: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def healthy() -> ModelStatus | None:
        status = await model_status(running, "sim-mirrored")
        return status if status is not None and status.healthy == 1 else None

    good = await eventually(healthy, 90, "the replica of the intact version is healthy")

    # Its job fetched before the engine started, from the mirror, into the node's model cache.
    [replica] = good.replicas
    job = await nomad_job(running, replica.job_id)
    [group] = job["TaskGroups"]
    fetch, engine = group["Tasks"]
    assert fetch["Name"] == "fetch-model" and fetch["Lifecycle"]["Hook"] == "prestart"
    dest = running.cache / "tiny" / "v1"
    assert fetch["Config"]["args"][-6:] == ["--mirror", mirror, "--ref", "tiny@v1", "--dest", str(dest)]
    assert str(dest) in engine["Config"]["args"]
    for path, data in FILES.items():
        assert hashlib.sha256((dest / path).read_bytes()).digest() == hashlib.sha256(data).digest()
    assert json.loads((dest / ".llmgw-manifest.json").read_text())["version"] == "v1"

    # The tampered version: the fetch refuses the shard, the allocation fails, nothing serves.
    async def failed() -> ModelStatus | None:
        status = await model_status(running, "sim-tampered")
        return status if status is not None and status.backoff is not None else None

    bad = await eventually(failed, 90, "the tampered version's replica failed and the model backs off")
    assert bad.healthy == 0
    reason = bad.backoff.last_failure if bad.backoff else ""
    assert "fetch-model" in reason, reason
    assert "the model's files failed to fetch or verify" in reason, reason
    tampered = running.cache / "tiny" / "v2"
    assert not (tampered / SHARD).exists()  # the bad bytes were deleted, never left for an engine
    assert not (tampered / ".llmgw-manifest.json").exists()

    # What an operator sees.
    code, text = await llmgw_status(running, monkeypatch, capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("sim-")}
    assert rows["sim-mirrored"].split()[2:4] == ["1", "1"]
    assert rows["sim-tampered"].split()[2:4] == ["1", "0"]
    assert "fetch-model" in rows["sim-tampered"]
    assert "failed to fetch or verify" in rows["sim-tampered"]

    code, as_json = await llmgw_status(running, monkeypatch, capsys, "--json", "--model", "sim-tampered")
    assert code == 0
    [entry] = json.loads(as_json)["models"]
    assert entry["healthy"] == 0
    assert "failed to fetch or verify" in entry["backoff"]["last_failure"]
