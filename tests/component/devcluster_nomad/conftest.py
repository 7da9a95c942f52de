"""Fixtures for the Nomad stand-in's component tests: a served stand-in, a python-nomad client."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nomad
import pytest

from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig
from llmgw.devcluster.nomad.apishape import response_problems
from tests.support.waiting import eventually

TASK_SERVER = str(Path(__file__).with_name("task_server.py"))
PY = sys.executable


def fast_config(tmp_path: Path, **overrides: Any) -> StandInConfig:
    nodes = tuple(
        NodeSpec(name=f"node-{i}", gpus=2, gpu_model="H100", fabric=f"ib-{i % 2}") for i in range(3)
    )
    base = StandInConfig(
        nodes=nodes,
        state_dir=tmp_path,
        strict=True,
        heartbeat_grace_s=0.3,
        event_heartbeat_s=0.3,
    )
    return base.with_overrides(**overrides)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[NomadServer]:
    async with NomadServer(NomadStandIn(fast_config(tmp_path))) as srv:
        yield srv


@pytest.fixture
def client(server: NomadServer) -> nomad.Nomad:
    return nomad.Nomad(host="127.0.0.1", port=server.port, timeout=10)


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """python-nomad is synchronous; the stand-in runs on this loop, so call it from a thread."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def wait_for(probe: Callable[[], Any], what: str, limit_s: float = 45.0) -> Any:
    """Poll ``probe`` (sync, run in a thread) until it returns something truthy.

    The deadline is generous: CI machines are shared, and a deadline is a hang guard, not a timing test.
    """
    return await eventually(lambda: asyncio.to_thread(probe), limit_s, what)


def assert_shape(doc: Any, struct: str) -> None:
    """Key-exact against Nomad's API field list."""
    docs = doc if isinstance(doc, list) else [doc]
    for item in docs:
        problems = response_problems(item, struct)
        assert not problems, f"{struct} has keys real Nomad does not send: {problems}"


def server_task(
    name: str,
    *,
    port_label: str = "http",
    extra_args: list[str] | None = None,
    devices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "Name": name,
        "Driver": "raw_exec",
        "Config": {
            "command": PY,
            "args": [TASK_SERVER, f"${{NOMAD_PORT_{port_label}}}", *(extra_args or [])],
        },
        "Env": {"GREETING": "hello from ${NOMAD_ALLOC_NAME} on ${node.unique.name}"},
        "KillTimeout": 2_000_000_000,
        "Resources": {"CPU": 100, "MemoryMB": 64, "Devices": devices},
    }


def group(
    name: str, *, count: int = 1, devices: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "Name": name,
        "Count": count,
        "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
        "Tasks": [server_task("server", devices=devices)],
        "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
    }
    doc.update(extra)
    return doc


async def read_alloc_file(client: nomad.Nomad, alloc_id: str, path: str) -> str:
    """The file once the task has written it (through /v1/client/fs/cat)."""

    def probe() -> str | None:
        try:
            return str(client.client.cat.read_file(alloc_id, path))
        except nomad.api.exceptions.URLNotFoundNomadException:
            return None

    return str(await wait_for(probe, f"{path} in alloc {alloc_id}"))
