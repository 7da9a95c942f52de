"""Running simulated engines from tests: in-process servers and real processes.

Owns: `fast_settings` (timings that keep a test within seconds),
`SimProcess` / `start_sim_process` (a real ``python -m llmgw.sim`` on a free
loopback port, its port read from the listening line).
Meant for llmgw's own tests (the sim's, the router's, the end-to-end ones).

Must not: import pytest or an HTTP client library beyond aiohttp, or leave a
process running: `SimProcess.stop` kills what is still alive and reaps it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw.devcluster.nomad.processes import die_with_parent
from llmgw.sim.settings import SimSettings

TEST_MODEL = "sim/greek-test"

# How long a starting process gets to print its listening line (a cold Python import on a busy CI box).
STARTUP_TIMEOUT = 20.0

_LISTENING = re.compile(rb"llmgw-sim listening host=(\S+) port=(\d+)")


def fast_settings(**changes: Any) -> SimSettings:
    """Settings for tests: no load time, 2000 tokens/s, heartbeats of 0.1 s, short backoffs."""
    base = SimSettings(
        host="127.0.0.1",
        port=0,
        served_model_name=TEST_MODEL,
        token_rate=2000.0,
        load_time=0.0,
        heartbeat_interval=0.1,
        heartbeat_timeout=1.0,
        join_backoff_initial=0.05,
        join_backoff_max=0.2,
        head_file_poll_interval=0.05,
        shutdown_timeout=2.0,
    )
    return replace(base, **changes)


# The command-line twin of fast_settings(); later flags override these.
FAST_FLAGS: tuple[str, ...] = (
    "--host", "127.0.0.1",
    "--port", "0",
    "--load-time", "0",
    "--token-rate", "2000",
    "--served-model-name", TEST_MODEL,
    "--heartbeat-interval", "0.1",
    "--heartbeat-timeout", "1.0",
    "--shutdown-timeout", "2",
)  # fmt: skip


@dataclass
class SimProcess:
    """A real simulated engine process and the loopback port it listens on."""

    process: asyncio.subprocess.Process
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    async def wait(self, within: float) -> int:
        """The exit code, once the process has ended by itself within `within` seconds."""
        return await asyncio.wait_for(self.process.wait(), within)

    def send_signal(self, signum: signal.Signals) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signum)

    async def stop(self) -> int:
        """Kill it if it still runs, and reap it."""
        if self.process.returncode is None:
            self.process.kill()
        return await self.process.wait()


# The two ways to start the sim: the module, and the `llmgw sim` command.
MODULE_ENTRY: tuple[str, ...] = ("-m", "llmgw.sim")
CLI_ENTRY: tuple[str, ...] = ("-m", "llmgw", "sim")


async def start_sim_process(
    flags: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    entry: Sequence[str] = MODULE_ENTRY,
) -> SimProcess:
    """Start ``python -m llmgw.sim FAST_FLAGS... flags...``; return once it listens.

    stderr (its log) goes to `log_path`; stdout carries only the listening line.
    """
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *entry,
            *FAST_FLAGS,
            *flags,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env={**os.environ, **(env or {})},
            preexec_fn=die_with_parent,  # a killed test run leaves no engine behind
        )
    sim = SimProcess(process, port=0, log_path=log_path)
    assert process.stdout is not None  # stdout=PIPE above
    try:
        line = await asyncio.wait_for(process.stdout.readline(), STARTUP_TIMEOUT)
    except BaseException:
        await sim.stop()
        raise
    match = _LISTENING.search(line)
    if match is None:
        code = await sim.stop()
        raise RuntimeError(f"sim exited with {code} before listening: {line!r}\n{sim.log()}")
    sim.port = int(match.group(2))
    return sim
