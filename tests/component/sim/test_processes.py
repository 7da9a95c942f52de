"""The sim as real processes: exit codes, signals, and multi-rank replicas living and dying together."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from llmgw.sim.settings import ExitCode
from tests.support.sim import CLI_ENTRY, TEST_MODEL, SimProcess
from tests.support.waiting import eventually

from .conftest import ClientFor, StartProcess

# Generous bound for a process to notice and exit; never a speed assertion, only a hang guard.
EXIT_WITHIN = 10.0


async def _health(http: aiohttp.ClientSession, sim: SimProcess) -> int:
    try:
        async with http.get(f"{sim.base_url}/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status
    except aiohttp.ClientError:
        return -1


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_crash_after_n_requests_kills_the_process(
    start_process: StartProcess, client_for: ClientFor
) -> None:
    sim = await start_process("--crash-after-requests", "2")
    client = client_for(sim)
    for _ in range(2):
        await client.completions.create(model=TEST_MODEL, prompt="fine", max_tokens=2)
    with pytest.raises(openai.APIConnectionError):
        await client.completions.create(model=TEST_MODEL, prompt="fatal", max_tokens=2)
    assert await sim.wait(EXIT_WITHIN) == ExitCode.CRASH_FAULT
    assert "crash fault" in sim.log()


async def test_crash_requested_at_runtime(start_process: StartProcess, http: aiohttp.ClientSession) -> None:
    sim = await start_process()
    async with http.post(f"{sim.base_url}/sim/fault", json={"crash": True}) as response:
        assert response.status == 200
    assert await sim.wait(EXIT_WITHIN) == ExitCode.CRASH_FAULT


async def test_sigterm_lets_an_in_flight_stream_finish_then_exits_zero(
    start_process: StartProcess, client_for: ClientFor
) -> None:
    sim = await start_process("--token-rate", "100")
    stream = await client_for(sim).chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=40, stream=True
    )
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 2:
            sim.send_signal(signal.SIGTERM)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(chunks) == 1 + 40 + 1
    assert await sim.wait(EXIT_WITHIN) == ExitCode.OK


async def test_sigterm_cancels_what_outlives_the_shutdown_timeout(
    start_process: StartProcess, client_for: ClientFor
) -> None:
    sim = await start_process("--token-rate", "100", "--shutdown-timeout", "0.3")
    stream = await client_for(sim).chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4000, stream=True
    )
    received = 0
    with pytest.raises(openai.APIError):  # the stream is cut, not finished
        async for _ in stream:
            received += 1
            if received == 2:
                sim.send_signal(signal.SIGINT)
    assert await sim.wait(EXIT_WITHIN) == ExitCode.OK


async def test_two_rank_replica_lives_and_dies_together(
    start_process: StartProcess, http: aiohttp.ClientSession, client_for: ClientFor
) -> None:
    head = await start_process("--world-size", "2", "--rank", "0", name="head")
    assert await _health(http, head) == 503
    worker = await start_process(
        "--world-size", "2", "--rank", "1", "--head", f"127.0.0.1:{head.port}", name="worker"
    )

    async def both_healthy() -> bool:
        return await _health(http, head) == 200 and await _health(http, worker) == 200

    assert await eventually(both_healthy, within=EXIT_WITHIN)
    reply = await client_for(head).chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "replica"}], max_tokens=2
    )
    assert reply.choices[0].finish_reason == "length"

    worker.process.kill()  # like a GPU node dying: NCCL takes the whole replica down
    assert await worker.wait(EXIT_WITHIN) == -signal.SIGKILL
    assert await head.wait(EXIT_WITHIN) == ExitCode.PEER_LOST
    assert _gone(head.pid) and _gone(worker.pid)
    assert "worker rank 1 left the replica" in head.log()


async def test_worker_exits_when_its_head_dies(
    start_process: StartProcess, http: aiohttp.ClientSession
) -> None:
    head = await start_process("--world-size", "2", name="head")
    worker = await start_process(
        "--world-size", "2", "--rank", "1", "--head", f"127.0.0.1:{head.port}", name="w"
    )

    async def joined() -> bool:
        return await _health(http, worker) == 200

    assert await eventually(joined, within=EXIT_WITHIN)
    head.process.kill()
    assert await worker.wait(EXIT_WITHIN) == ExitCode.PEER_LOST
    await head.wait(EXIT_WITHIN)
    assert _gone(head.pid) and _gone(worker.pid)


async def test_worker_started_first_finds_its_head_through_the_head_file(
    start_process: StartProcess, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    head_file = tmp_path / "head.addr"
    head_file.write_text("")  # a template that has not rendered the address yet
    worker = await start_process("--world-size", "2", "--rank", "1", "--head-file", str(head_file), name="w")
    assert await _health(http, worker) == 503
    head = await start_process("--world-size", "2", name="head")
    head_file.write_text(f"127.0.0.1:{head.port}\n")

    async def head_healthy() -> bool:
        return await _health(http, head) == 200

    assert await eventually(head_healthy, within=EXIT_WITHIN)
    worker.send_signal(signal.SIGTERM)  # a worker stopped on purpose exits 0 ...
    assert await worker.wait(EXIT_WITHIN) == ExitCode.OK
    assert await head.wait(EXIT_WITHIN) == ExitCode.PEER_LOST  # ... and still takes its replica down


async def test_llmgw_sim_command_reads_env_settings(
    start_process: StartProcess, client_for: ClientFor
) -> None:
    sim = await start_process(entry=CLI_ENTRY, env={"LLMGW_SIM_SERVED_MODEL_NAME": "from-env"}, name="cli")
    # FAST_FLAGS pass --served-model-name, and a flag wins over its env twin.
    models = [model.id async for model in client_for(sim).models.list()]
    assert models == [TEST_MODEL]
    sim.send_signal(signal.SIGTERM)
    assert await sim.wait(EXIT_WITHIN) == ExitCode.OK


async def test_invalid_settings_exit_with_usage_code() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.sim",
        "--rank",
        "1",
        "--world-size",
        "2",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), EXIT_WITHIN)
    assert process.returncode == ExitCode.USAGE
    assert b"--head HOST:PORT or --head-file" in stderr
