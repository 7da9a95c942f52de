"""A real ``redis-server`` (Debian's) for the tests of the limits routers share.

``RedisServer`` runs one on a Unix socket in a temporary folder (no port to race
for), without persistence unless asked for its AOF (``appendonly``, fsynced at every
write), and can pause it (SIGSTOP: a Redis that accepts and never
answers, as a partitioned one looks) or stop and start it again on the same socket.
Tests skip with the reason where ``redis-server`` is not installed.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

import redis.asyncio as aioredis

from llmgw.devcluster.nomad.processes import die_with_parent
from tests.support.waiting import eventually

REDIS_SERVER = shutil.which("redis-server")
MISSING = "needs Debian's redis-server (apt-get install redis-server; .ci/run installs it)"


class RedisServer:
    def __init__(self, folder: Path, *, appendonly: bool = False) -> None:
        self.folder = folder
        self.appendonly = appendonly
        self.socket = folder / "redis.sock"
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def start(self) -> None:
        assert REDIS_SERVER is not None, MISSING
        self.folder.mkdir(parents=True, exist_ok=True)
        self._process = await asyncio.create_subprocess_exec(
            REDIS_SERVER,
            "--port", "0",
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--dir", str(self.folder),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a killed test run leaves no redis-server behind
        )  # fmt: skip
        client = aioredis.Redis.from_url(self.url)
        try:
            await eventually(client.ping, what="redis-server answering PING", retry_on=(OSError, Exception))
        finally:
            await client.aclose()

    def pause(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
        process.terminate()
        await process.wait()
        self.socket.unlink(missing_ok=True)

    async def restart(self) -> None:
        """Stopped (SIGTERM: a clean shutdown) and started again on the same folder."""
        await self.stop()
        await self.start()
