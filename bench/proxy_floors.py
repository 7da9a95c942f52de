"""The least a Python proxy in front of an engine can cost: reference targets for
``router_proxy.py``, measured in the same run as the router and nginx.

Two proxies with none of the router's features (no keys, limits, guard, metrics,
retries, fallbacks, error shapes), each reading the request body, decoding its JSON
(as any proxy that routes on ``model`` must) and forwarding it over llmgw's own
engine client (``gateway/transport.py``):

- ``asyncio``: a bare ``asyncio.Protocol`` with a hand-split request head (trusting
  the load generator: no validation at all) writing responses straight to the socket.
  No Python proxy does less per request; what it adds over direct is the floor for
  any router written on asyncio on this machine.
- ``aiohttp``: aiohttp's server with one handler doing the same. Its difference to
  the ``asyncio`` floor is what aiohttp's server costs; the router's difference to it
  is what the router's own work costs.

    .venv/bin/python bench/proxy_floors.py asyncio ENGINE_PORT [LOOP]   # prints "router listening port=N"

LOOP is the event loop, as ``llmgw serve --event-loop`` takes it (default auto: uvloop
when installed, as the router runs).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from typing import cast

from aiohttp import web

from llmgw.cli import event_loop
from llmgw.gateway.transport import EnginePool, EngineResponse

TARGET = "/v1/chat/completions"
JSON_HEADERS = (("Content-Type", "application/json"),)
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


async def _whole(response: EngineResponse) -> bytes:
    parts = []
    while chunk := await response.read():
        parts.append(chunk)
    response.release()
    return b"".join(parts)


class _BareProxy(asyncio.Protocol):
    def __init__(self, pool: EnginePool, engine_port: int) -> None:
        self._pool = pool
        self._port = engine_port
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            found = _CONTENT_LENGTH.search(self._buffer, 0, end + 2)
            length = int(found.group(1)) if found else 0
            if len(self._buffer) < end + 4 + length:
                return
            body = self._buffer[end + 4 : end + 4 + length]
            self._buffer = self._buffer[end + 4 + length :]
            asyncio.get_running_loop().create_task(self._forward(body))

    async def _forward(self, body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        stream = json.loads(body).get("stream")
        response = await self._pool.post("127.0.0.1", self._port, TARGET, JSON_HEADERS, body)
        if not stream:
            data = await _whole(response)
            transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(data), data)
            )
            return
        first = await response.read()
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n" % (len(first), first)
        )
        done = asyncio.get_running_loop().create_future()

        def feed(data: bytes) -> None:
            if data:
                transport.write(b"%x\r\n%s\r\n" % (len(data), data))

        def end(last: bytes, error: object) -> None:
            feed(last)
            transport.write(b"0\r\n\r\n")
            done.set_result(None)

        response.relay(feed, end)
        await done
        response.release()


async def _serve_bare(pool: EnginePool, engine_port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _BareProxy(pool, engine_port), "127.0.0.1", 0, backlog=4096)


async def _serve_aiohttp(pool: EnginePool, engine_port: int) -> web.AppRunner:
    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        stream = json.loads(body).get("stream")
        response = await pool.post("127.0.0.1", engine_port, TARGET, JSON_HEADERS, body)
        if not stream:
            return web.Response(body=await _whole(response), content_type="application/json")
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        while chunk := await response.read():
            await out.write(chunk)
        response.release()
        await out.write_eof()
        return out

    app = web.Application()
    app.router.add_post(TARGET, forward)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    return runner


async def main(kind: str, engine_port: int) -> None:
    pool = EnginePool(connect_timeout=5.0, idle_timeout=60.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if kind == "asyncio":
        server = await _serve_bare(pool, engine_port)
        port = server.sockets[0].getsockname()[1]
    else:
        runner = await _serve_aiohttp(pool, engine_port)
        port = runner.addresses[0][1]
    print(f"router listening port={port}", flush=True)
    await stop.wait()
    await pool.close()


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("asyncio", "aiohttp"):
        sys.exit(__doc__)
    event_loop.run(
        main(sys.argv[1], int(sys.argv[2])), event_loop.resolve(sys.argv[3] if len(sys.argv) > 3 else "auto")
    )
