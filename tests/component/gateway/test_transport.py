"""The router's HTTP/1.1 client for engines (``llmgw.gateway.transport``) against raw
TCP engines that do exactly what each test needs: body framings split at awkward
places, keep-alive reuse and expiry, a pooled connection the engine closed, a reset
mid-body, a client that leaves, a reader slower than the engine, answers that are not
HTTP. The last tests put the router in front of such engines."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from llmgw.core.routing import Api
from llmgw.gateway.calls import parse_call
from llmgw.gateway.transport import (
    BodyBroken,
    ConnectFailed,
    ConnectionLost,
    EnginePool,
    EngineResponse,
    MalformedAnswer,
)

from .conftest import Cluster, StartRouter, endpoint_for, eventually

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawEngine"], Awaitable[None]]
HEADERS = (("Content-Type", "application/json"), ("x-request-id", "req-1"))


class RawEngine:
    """A TCP server on loopback that runs ``script`` on every connection and keeps
    what it saw: connections, request heads and bodies, how each connection ended."""

    def __init__(self, script: Script) -> None:
        self._script = script
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.ended: list[str] = []  # per finished connection: "eof", "reset", "done"
        self.sent = 0  # body bytes a streaming script managed to write
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> RawEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:  # scripts still waiting on something
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._script(reader, writer, self)
            self.ended.append("done")
        except (asyncio.IncompleteReadError, EOFError):
            self.ended.append("eof")
        except ConnectionError:
            self.ended.append("reset")
        except asyncio.CancelledError:
            self.ended.append("cancelled")
        finally:
            writer.close()
            self._tasks.discard(task)

    async def request(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        """The next request on a connection (raises IncompleteReadError at EOF)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append((head, body))
        return head, body


def pool(**changes: Any) -> EnginePool:
    options: dict[str, Any] = {"connect_timeout": 2.0, "idle_timeout": 30.0, **changes}
    return EnginePool(**options)


async def read_all(response: EngineResponse) -> bytes:
    parts = []
    while chunk := await response.read():
        parts.append(chunk)
    return b"".join(parts)


def answer(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


async def send_slowly(writer: asyncio.StreamWriter, data: bytes, cuts: list[int]) -> None:
    """``data`` in pieces cut at ``cuts``, each its own packet."""
    start = 0
    for cut in [*cuts, len(data)]:
        writer.write(data[start:cut])
        await writer.drain()
        await asyncio.sleep(0.01)  # the pause is the point: the reader gets each piece on its own
        start = cut


# --- hooks on the connection's callbacks ------------------------------------------------------------


async def test_on_head_sees_the_head_and_the_body_that_came_with_it_before_post_returns() -> None:
    body = b'{"ok": true}'

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            writer.write(answer(body))  # head and body in one packet
            await writer.drain()

    async with RawEngine(script) as engine:
        engines = pool()
        seen: list[tuple[int, bytes | None]] = []
        try:
            response = await engines.post(
                "127.0.0.1",
                engine.port,
                "/v1/x",
                HEADERS,
                b"{}",
                on_head=lambda r: seen.append((r.status, r.peek_whole())),
            )
            assert seen == [(200, body)]  # called from the callback, before post returned
            assert await read_all(response) == body  # peeking took nothing away
            response.release()
            again = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert await read_all(again) == body
            again.release()
            assert seen == [(200, body)]  # a hook is for one exchange only
            assert engine.connections == 1
        finally:
            await engines.close()


async def test_call_when_ready_fires_from_the_callback_on_the_first_body_bytes() -> None:
    release = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        await release.wait()
        writer.write(b"8\r\ndata: 1\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"0\r\n\r\n")

    async with RawEngine(script) as engine:
        engines = pool()
        fired: list[bytes] = []
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            response.call_when_ready(lambda r: fired.append(r.peek()))
            assert fired == []  # no body yet
            release.set()
            first = await response.read()
            assert fired == [b"data: 1\n"]  # seen by the hook, and still there for read
            assert first == b"data: 1\n"
            assert await response.read() == b""
            response.call_when_ready(lambda r: fired.append(b"at once"))  # ready: called now
            assert fired == [b"data: 1\n", b"at once"]
            response.release()
        finally:
            await engines.close()


# --- framings ----------------------------------------------------------------------------------------


async def test_a_chunked_body_split_anywhere_is_decoded_and_the_connection_reused() -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'e\r\ndata: {"a":1}\n\r\n'  # 14 bytes
        b'E;name=value\r\ndata: {"b":2}\n\r\n'  # an extension, upper-case hex
        b"0\r\nX-Trailer: yes\r\n\r\n"
    )
    head_end = wire.index(b"\r\n\r\n") + 4

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            # Cut inside the head, inside a size line, between data and its CRLF, inside the trailer.
            await send_slowly(writer, wire, [10, head_end + 1, head_end + 17, head_end + 19, len(wire) - 5])

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            for _ in range(2):
                response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
                assert response.status == 200
                assert response.headers["content-type"] == "text/event-stream"
                assert response.content_length is None
                assert await read_all(response) == b'data: {"a":1}\ndata: {"b":2}\n'
                assert response.at_eof()
                response.release()
            assert engine.connections == 1  # the second request went on the first connection
        finally:
            await engines.close()


async def test_a_content_length_body_in_pieces_and_connection_close_honoured() -> None:
    body = json.dumps({"text": "x" * 3000}).encode()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            close = len(engine.requests) == 2
            wire = answer(body, b"Connection: close") if close else answer(body)
            await send_slowly(writer, wire, [5, 100, 1500])
            if close:
                return

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            for _ in range(3):
                response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
                assert response.content_length == len(body)
                assert await read_all(response) == body
                response.release()
            # 1st and 2nd on one connection; the 2nd said close, so the 3rd needed a new one.
            assert engine.connections == 2
        finally:
            await engines.close()


async def test_a_body_without_length_runs_until_the_engine_closes_and_is_not_pooled() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        await send_slowly(writer, b"HTTP/1.1 200 OK\r\n\r\npart one, part two", [25])

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert await read_all(response) == b"part one, part two"
            response.release()
            assert engines.idle_count("127.0.0.1", engine.port) == 0
        finally:
            await engines.close()


async def test_interim_answers_are_skipped_and_a_204_has_no_body() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX-A: 1\r\nX-A: 2\r\n\r\n")
        await engine.request(reader)  # the connection is reused: the 204 had no body
        writer.write(answer(b"{}"))

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert (response.status, response.headers["x-a"]) == (204, "1, 2")
            assert await response.read() == b""
            response.release()
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert await read_all(response) == b"{}"
            response.release()
            assert engine.connections == 1
        finally:
            await engines.close()


async def test_a_flood_of_interim_answers_is_read_in_a_loop_not_by_recursion() -> None:
    # Tens of thousands of 100s in one read once recursed per answer: a RecursionError
    # inside the protocol callback, a fatal transport error and a traceback in the log.
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 20_000 + answer(b"{}"))
        await reader.read()

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert (response.status, await read_all(response)) == (200, b"{}")
            response.release()
        finally:
            await engines.close()


async def test_the_request_is_one_well_formed_message() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(answer(b"{}"))
        await engine.request(reader)

    body = b'{"model":"m","messages":[]}' * 5000  # over 64 KiB: head and body go separately
    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/chat/completions", HEADERS, body)
            await read_all(response)
            response.release()
            head, received = engine.requests[0]
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert f"\r\nHost: 127.0.0.1:{engine.port}\r\n".encode() in head
            assert (
                b"\r\nx-request-id: req-1\r\n" in head and b"\r\nContent-Type: application/json\r\n" in head
            )
            assert received == body
            with pytest.raises(ValueError):
                await engines.post("127.0.0.1", engine.port, "/v1/x", (("x-a", "1\r\nx-b: 2"),), b"{}")
            # An engine address (from a Consul registration) cannot add header lines either.
            for host in ("127.0.0.1\r\nX-Injected: 1", "127.0.0.1 evil", "127.0.0.1/x"):
                with pytest.raises(ConnectFailed):
                    await engines.post(host, engine.port, "/v1/x", HEADERS, b"{}")
            assert len(engine.requests) == 1 and engines.in_use == 0
        finally:
            await engines.close()


# --- the pool ----------------------------------------------------------------------------------------


async def test_idle_connections_are_closed_after_the_idle_timeout() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            writer.write(answer(b"{}"))

    async with RawEngine(script) as engine:
        engines = pool(idle_timeout=0.1)
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            await read_all(response)
            response.release()
            assert engines.idle_count("127.0.0.1", engine.port) == 1
            assert await eventually(lambda: engine.ended == ["eof"], within=2.0)  # the engine saw it close
            assert engines.idle_count("127.0.0.1", engine.port) == 0
        finally:
            await engines.close()


async def test_a_pooled_connection_the_engine_closed_is_reported_as_lost_and_reused_flagged() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        if engine.connections == 1:
            await engine.request(reader)
            writer.write(answer(b"{}"))
        await engine.request(reader)  # the second request (the first on a new connection): no answer
        transport = writer.transport
        transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        transport.abort()

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            await read_all(response)
            response.release()
            with pytest.raises(ConnectionLost) as lost:
                await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert lost.value.reused
            assert engines.in_use == 0
            # A fresh connection that is closed before answering is not flagged as reused.
            with pytest.raises(ConnectionLost) as fresh:
                await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert not fresh.value.reused and engine.connections == 2
        finally:
            await engines.close()


async def test_connecting_to_nothing_fails_as_connect() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        engines = pool()
        with pytest.raises(ConnectFailed):
            await engines.post("127.0.0.1", port, "/v1/x", HEADERS, b"{}")
        assert engines.in_use == 0
        await engines.close()


@pytest.mark.parametrize(
    "wire",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n X-Folded: 1\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000,
    ],
)
async def test_an_answer_that_is_not_http_is_malformed(wire: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(wire)
        await reader.read()

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            with pytest.raises(MalformedAnswer):
                await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert engines.in_use == 0
        finally:
            await engines.close()


async def test_the_connection_cap_makes_requests_wait_for_a_free_connection() -> None:
    release_first = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            if len(engine.requests) == 1:
                await release_first.wait()
            writer.write(answer(b"{}"))

    async with RawEngine(script) as engine:
        engines = pool(limit=1)
        try:
            task = asyncio.create_task(engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}"))
            await eventually(lambda: len(engine.requests) == 1)
            second = asyncio.create_task(engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}"))
            await eventually(lambda: len(engines._slot_waiters) == 1)  # waiting for the one slot
            assert len(engine.requests) == 1 and not second.done()
            release_first.set()
            first = await task
            await read_all(first)
            first.release()
            response = await asyncio.wait_for(second, 2.0)
            await read_all(response)
            response.release()
            assert engine.connections == 1 and engines.in_use == 0
        finally:
            await engines.close()


# --- streams: breakage, cancellation, backpressure -----------------------------------------------------


async def test_a_reset_mid_body_is_body_broken() -> None:
    first_part_read = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await writer.drain()
        await first_part_read.wait()  # a reset drops what the reader has not taken yet
        writer.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.transport.abort()

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert await response.read() == b"data: "
            first_part_read.set()
            with pytest.raises(BodyBroken):
                await response.read()
            response.close()
            assert engines.in_use == 0
        finally:
            await engines.close()


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n",  # no last chunk
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: ",  # 6 of 100 bytes
    ],
)
async def test_a_body_cut_short_by_a_clean_close_is_body_broken(wire: bytes) -> None:
    first_part_read = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(wire)
        await writer.drain()
        await first_part_read.wait()  # then FIN, no reset

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert await response.read() == b"data: "
            first_part_read.set()
            with pytest.raises(BodyBroken):
                await response.read()
            response.close()
        finally:
            await engines.close()


async def test_closing_a_response_mid_stream_closes_the_engines_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(200):
            writer.write(b"6\r\ntoken \r\n")
            await writer.drain()
            await asyncio.sleep(0.01)  # a paced stream, still going when the client closes it
        writer.write(b"0\r\n\r\n")

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert (await response.read()).startswith(b"token")
            response.close()
            assert await eventually(lambda: engine.ended in (["reset"], ["eof"]), within=3.0)
            assert engines.in_use == 0 and engines.idle_count("127.0.0.1", engine.port) == 0
        finally:
            await engines.close()


async def test_a_request_cancelled_before_the_head_closes_its_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        await reader.read()  # never answers; returns when the router closes
        raise EOFError

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            assert await eventually(lambda: engine.ended == ["eof"], within=2.0)
            assert engines.in_use == 0
        finally:
            await engines.close()


async def test_a_slow_reader_stops_the_socket_being_read_so_the_engine_waits() -> None:
    event = b"data: " + b"x" * 1000 + b"\n\n"
    total = 4000  # about 4 MiB: more than the high-water mark and the socket buffers

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(total):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            engine.sent += 1
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with RawEngine(script) as engine:
        engines = pool(high_water=64 * 1024)
        try:
            response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
            # A reader that reads nothing for a while is what is under test: these sleeps are it.
            await asyncio.sleep(0.5)
            stalled_at = engine.sent
            await asyncio.sleep(0.3)
            assert engine.sent == stalled_at < total  # the engine is held back, not drained into memory
            body = await read_all(response)
            assert body == event * total
            assert engine.sent == total
            response.release()
        finally:
            await engines.close()


# --- the router on this client ------------------------------------------------------------------------------


def _sse_answer(events: list[bytes]) -> bytes:
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    for event in events:
        wire += b"%x\r\n%s\r\n" % (len(event), event)
    return wire


CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
)


async def test_through_the_router_a_reset_mid_stream_ends_it_with_an_error_event(
    cluster: Cluster, start_router: StartRouter
) -> None:
    both_chunks_read = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        await engine.request(reader)
        writer.write(_sse_answer([CHUNK, CHUNK]))
        await writer.drain()
        await both_chunks_read.wait()  # by the client: a reset drops what is still on the way
        writer.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.transport.abort()

    async with RawEngine(script) as engine:
        cluster.add_endpoint(endpoint_for("chat-a", engine.port, 0, simulated=False))
        router = await start_router()
        body = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with (
            aiohttp.ClientSession() as http,
            http.post(router.url + "/v1/chat/completions", json=body) as response,
        ):
            assert response.status == 200
            raw = await response.content.readuntil(b"\n\n") + await response.content.readuntil(b"\n\n")
            both_chunks_read.set()
            text = (raw + await response.read()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[:2] == [CHUNK.decode().strip()] * 2
    error = json.loads(events[2].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_stream_broken"
    assert engine.connections == 1  # once a byte is out, nothing is retried


async def test_through_the_router_the_engine_gets_the_clients_bytes_unless_they_must_change(
    cluster: Cluster, start_router: StartRouter
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            body = b'{"id":"c","object":"chat.completion","model":"chat-a","choices":[]}'
            writer.write(answer(body))

    async with RawEngine(script) as engine:
        cluster.add_endpoint(endpoint_for("chat-a", engine.port, 0, simulated=False))
        router = await start_router()
        url = router.url + "/v1/chat/completions"
        as_sent = b'{"model": "chat-a",  "messages": [{"role": "user", "content": "caf\\u00e9"}], "x": 1.50}'
        aliased = as_sent.replace(b'"chat-a"', b'"gpt-4o-mini"')
        with_key = as_sent.replace(b'"x"', b'"api_key": "sk-secret", "x"')
        async with aiohttp.ClientSession() as http:
            for sent in (as_sent, aliased, with_key):
                async with http.post(
                    url, data=sent, headers={"Content-Type": "application/json"}
                ) as response:
                    assert response.status == 200, await response.text()
        received = [body for _, body in engine.requests]
        assert received[0] == as_sent  # byte for byte: spacing, escapes, number spelling
        assert json.loads(received[1]) == {**json.loads(as_sent), "model": "chat-a"}
        assert json.loads(received[2]) == json.loads(as_sent)  # the credential is gone
        assert b"sk-secret" not in received[2]
        assert engine.connections == 1  # and all three went over one kept-alive connection


def test_the_client_runs_on_uvloop_too() -> None:
    """uvloop's transports are not asyncio.Transport subclasses (bench/router_proxy.py
    can run the router on uvloop)."""
    uvloop = pytest.importorskip("uvloop")

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            writer.write(_sse_answer([CHUNK]) + b"0\r\n\r\n")

    async def exchange() -> None:
        async with RawEngine(script) as engine:
            engines = pool()
            try:
                for _ in range(2):
                    response = await engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}")
                    assert await read_all(response) == CHUNK
                    response.release()
                assert engine.connections == 1
            finally:
                await engines.close()

    uvloop.run(exchange())


# --- the relay: after its first chunk a stream goes from the engine's callback to the client ---------


def _numbered_events(count: int, pad: int) -> list[bytes]:
    return [b'data: {"n":%d,"pad":"%s"}\n\n' % (n, b"x" * pad) for n in range(count)]


def _streaming_engine(events: list[bytes], *, pause: float = 0.0) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                engine.sent += 1
                if pause:
                    await asyncio.sleep(pause)  # a paced engine: its events come apart
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return script


async def _raw_post(port: int, body: bytes, *, version: bytes = b"1.1", rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(
        sock,
        b"POST /v1/chat/completions HTTP/" + version + b"\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
    )
    return sock


async def _read_to_close(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    received = bytearray()
    while data := await asyncio.wait_for(loop.sock_recv(sock, 65536), 10.0):
        received += data
    return bytes(received)


STREAM_BODY = b'{"model":"chat-a","messages":[{"role":"user","content":"hi"}],"stream":true}'


async def test_an_http_1_0_client_gets_the_stream_unframed_and_then_the_close(
    cluster: Cluster, start_router: StartRouter
) -> None:
    events = _numbered_events(30, 10)
    async with RawEngine(_streaming_engine(events, pause=0.005)) as engine:
        cluster.add_endpoint(endpoint_for("chat-a", engine.port, 0, simulated=False))
        router = await start_router()
        sock = await _raw_post(router.port, STREAM_BODY, version=b"1.0")
        try:
            received = await _read_to_close(sock)
        finally:
            sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert body == b"".join(events)


async def test_a_slow_client_holds_the_engine_back_and_then_gets_every_event_in_order(
    cluster: Cluster, start_router: StartRouter
) -> None:
    # About 40 MB: more than the kernel's socket buffers on both sides can absorb.
    events = _numbered_events(600, 65_000)
    async with RawEngine(_streaming_engine(events)) as engine:
        cluster.add_endpoint(endpoint_for("chat-a", engine.port, 0, simulated=False))
        router = await start_router(client_write_timeout=5.0)
        sock = await _raw_post(router.port, STREAM_BODY, rcvbuf=16384)
        try:
            # Not reading for a while is what is under test (the router must stop reading the
            # engine): these sleeps are the slow client, not a wait for something.
            await asyncio.sleep(0.5)
            held_at = engine.sent
            await asyncio.sleep(0.3)
            assert engine.sent == held_at < len(events)
            received = await asyncio.wait_for(_read_chunked_response(sock), 20.0)
        finally:
            sock.close()
    assert received == b"".join(events)  # each event once, in order, none cut
    assert engine.sent == len(events)


async def _read_chunked_response(sock: socket.socket) -> bytes:
    """The body of one chunked response, read slowly from a small socket buffer."""
    loop = asyncio.get_running_loop()
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        buffer += await loop.sock_recv(sock, 4096)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    pending = bytearray(rest)
    body = bytearray()
    while True:
        while b"\r\n" not in pending:
            pending += await loop.sock_recv(sock, 65536)
        line, _, after = bytes(pending).partition(b"\r\n")
        size = int(line, 16)
        pending = bytearray(after)
        while len(pending) < size + 2:
            pending += await loop.sock_recv(sock, 65536)
        if size == 0:
            return bytes(body)
        assert pending[size : size + 2] == b"\r\n"
        body += pending[:size]
        del pending[: size + 2]


async def test_a_stale_report_drops_the_engines_other_idle_connections() -> None:
    release = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, engine: RawEngine) -> None:
        while True:
            await engine.request(reader)
            await release.wait()
            writer.write(answer(b"{}"))

    async with RawEngine(script) as engine:
        engines = pool()
        try:
            posts = [
                asyncio.create_task(engines.post("127.0.0.1", engine.port, "/v1/x", HEADERS, b"{}"))
                for _ in range(2)
            ]
            await eventually(lambda: len(engine.requests) == 2)  # two connections, both busy
            release.set()
            for response in await asyncio.gather(*posts):
                await read_all(response)
                response.release()
            assert engines.idle_count("127.0.0.1", engine.port) == 2
            engines.stale("127.0.0.1", engine.port)
            assert engines.idle_count("127.0.0.1", engine.port) == 0
            assert await eventually(lambda: engine.ended == ["eof", "eof"], within=2.0)
        finally:
            await engines.close()


@pytest.mark.parametrize(
    ("raw", "served", "force_usage", "passed_as_is"),
    [
        (b'{"model":"m","messages":[{"role":"user","content":"hi"}]}', "m", False, True),
        (b'{"model":"alias","messages":[{"role":"user","content":"hi"}]}', "m", False, False),
        (b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}', "m", True, False),
        (b'{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}]}', "m", True, True),
        (b'{"model":"m","api_key":"k","messages":[{"role":"user","content":"hi"}]}', "m", False, False),
        (b'\xef\xbb\xbf{"model":"m","messages":[{"role":"user","content":"hi"}]}', "m", False, False),
        ('{"model":"m","messages":[{"role":"user","content":"hi"}]}'.encode("utf-16-le"), "m", False, False),
    ],
)
def test_the_engine_gets_the_clients_bytes_only_when_nothing_must_change(
    raw: bytes, served: str, force_usage: bool, passed_as_is: bool
) -> None:
    call = parse_call(Api.CHAT, raw)
    sent = call.upstream_body(served, force_usage=force_usage)
    assert (sent is raw) is passed_as_is
    body = json.loads(sent)
    assert body["model"] == served and "api_key" not in body
    if force_usage and call.stream:
        assert body["stream_options"] == {"include_usage": True}
