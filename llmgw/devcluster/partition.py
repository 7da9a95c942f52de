"""A loopback TCP proxy a test can freeze: a network partition between one client and
one server (Consul, in the tests of leader election and watches).

``freeze()`` swallows every byte both ways and leaves new connections unanswered
(requests hang, as behind a partition or in front of a dead machine); ``thaw()``
drops the connections that lost bytes and forwards again.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.frozen = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        """Listen on ``port`` (0: any free one)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def freeze(self) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False
        for writer in list(self._writers):
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.frozen:  # nothing answers: the connection is accepted by nobody
            self._writers.add(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                if self.frozen:
                    continue  # swallowed
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()
            self._writers.discard(dst)
