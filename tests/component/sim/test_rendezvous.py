"""The multi-rank rendezvous with head and workers in this process (exit codes read from the lifecycle)."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from llmgw.sim.app import STATE
from llmgw.sim.settings import ExitCode
from tests.support.sim import fast_settings
from tests.support.waiting import eventually

from .conftest import StartServer


def _address(server: TestServer) -> str:
    return f"127.0.0.1:{server.port}"


async def _health(http: aiohttp.ClientSession, server: TestServer) -> int:
    async with http.get(server.make_url("/health")) as response:
        return response.status


def _exit_code(server: TestServer) -> ExitCode | None:
    assert server.app is not None
    return server.app[STATE].lifecycle.exit_code


async def _stopped_with(server: TestServer, code: ExitCode) -> bool:
    async def check() -> bool:
        return _exit_code(server) == code

    return await eventually(check, within=5.0)


async def test_head_is_healthy_only_once_every_worker_joined(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    head = await start_server(fast_settings(world_size=3))
    assert await _health(http, head) == 503
    first = await start_server(fast_settings(world_size=3, rank=1, head=_address(head)))

    async def first_healthy() -> bool:
        return await _health(http, first) == 200

    assert await eventually(first_healthy)
    assert await _health(http, head) == 503  # one of two workers is not enough
    await start_server(fast_settings(world_size=3, rank=2, head=_address(head)))

    async def head_healthy() -> bool:
        return await _health(http, head) == 200

    assert await eventually(head_healthy)
    async with http.get(head.make_url("/sim/stats")) as response:
        assert (await response.json())["workers_joined"] == 2


async def test_a_taken_rank_and_a_wrong_world_size_are_refused(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    head = await start_server(fast_settings(world_size=2))
    await start_server(fast_settings(world_size=2, rank=1, head=_address(head)))

    async def joined() -> bool:
        return await _health(http, head) == 200

    assert await eventually(joined)
    async with http.get(head.make_url("/sim/rendezvous?rank=1&world_size=2")) as response:
        assert response.status == 409
    async with http.get(head.make_url("/sim/rendezvous?rank=1&world_size=4")) as response:
        assert response.status == 400
        assert "world size mismatch" in (await response.json())["error"]["message"]
    misconfigured = await start_server(fast_settings(world_size=3, rank=2, head=_address(head)))
    assert await _stopped_with(misconfigured, ExitCode.REFUSED)
    assert _exit_code(head) is None  # a refused stranger does not hurt the replica


async def test_head_stops_with_peer_lost_when_a_joined_worker_leaves(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    head = await start_server(fast_settings(world_size=2))
    worker = await start_server(fast_settings(world_size=2, rank=1, head=_address(head)))

    async def joined() -> bool:
        return await _health(http, head) == 200

    assert await eventually(joined)
    await worker.close()
    assert await _stopped_with(head, ExitCode.PEER_LOST)
    assert await _health(http, head) == 503


async def test_worker_stops_with_peer_lost_when_the_head_goes_away(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    head = await start_server(fast_settings(world_size=2))
    worker = await start_server(fast_settings(world_size=2, rank=1, head=_address(head)))

    async def joined() -> bool:
        return await _health(http, worker) == 200

    assert await eventually(joined)
    await head.close()
    assert await _stopped_with(worker, ExitCode.PEER_LOST)


async def test_head_gives_up_when_workers_do_not_come(start_server: StartServer) -> None:
    head = await start_server(fast_settings(world_size=2, join_timeout=0.2))
    assert await _stopped_with(head, ExitCode.JOIN_TIMEOUT)


async def test_worker_gives_up_when_no_head_answers(start_server: StartServer) -> None:
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = await start_server(
        fast_settings(world_size=2, rank=1, head=f"127.0.0.1:{port}", join_timeout=0.3)
    )
    assert await _stopped_with(worker, ExitCode.JOIN_TIMEOUT)


async def test_worker_waits_for_the_head_file_then_joins(
    start_server: StartServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    head_file = tmp_path / "head.addr"  # missing at first, then empty, as a Nomad template renders it
    worker = await start_server(fast_settings(world_size=2, rank=1, head_file=head_file))
    head_file.write_text("")
    async with http.get(worker.make_url("/health")) as response:
        assert response.status == 503
    head = await start_server(fast_settings(world_size=2))
    head_file.write_text(f"{_address(head)}\n")

    async def both_healthy() -> bool:
        return await _health(http, head) == 200 and await _health(http, worker) == 200

    assert await eventually(both_healthy)
    assert _exit_code(worker) is None
