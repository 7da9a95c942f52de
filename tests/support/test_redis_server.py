"""The tests' redis-server dies with the process that started it: a test run killed
mid-test (a timeout, Ctrl-C twice, a CI job cancelled) leaves no server behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import MISSING, REDIS_SERVER
from tests.support.waiting import eventually_sync

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)

STARTER = """
import asyncio, sys
from pathlib import Path
from tests.support.redis_server import RedisServer

async def main() -> None:
    server = RedisServer(Path(sys.argv[1]))
    await server.start()
    print(server._process.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def test_a_killed_starter_takes_its_redis_server_with_it(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "redis")],
        stdout=subprocess.PIPE, text=True, cwd=repo,
    )  # fmt: skip
    try:
        assert starter.stdout is not None
        redis_pid = int(starter.stdout.readline())
        assert _alive(redis_pid)
        os.kill(starter.pid, signal.SIGKILL)  # no cleanup of its own runs
        starter.wait(timeout=10)
        eventually_sync(lambda: not _alive(redis_pid), 10, "redis-server gone with its starter")
    finally:
        if starter.poll() is None:
            starter.kill()
