"""What ``llmgw.gateway.aiohttp_private`` relies on in aiohttp still holds: the private
fields are where it sets them, and a real aiohttp server, answering through each of
its responses, puts on the wire what the router needs (a head sent with the first
chunk; an answer written around aiohttp with nothing added after it and the
connection kept; a stream left unended closing its connection; chunks written
straight to the transport between aiohttp's own). An aiohttp that changes any of it
fails here, before a client sees a doubled or truncated answer."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from llmgw.gateway.aiohttp_private import HeadWithFirstWrite, SentDirectly, http_date
from llmgw.gateway.upstream import http_chunk
from llmgw.http_server import bound_port

WHOLE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_the_private_fields_are_where_the_module_sets_them() -> None:
    fresh = web.StreamResponse()
    assert (fresh._eof_sent, fresh._keep_alive, fresh._body_length) == (False, None, 0)
    assert web.StreamResponse._send_headers_immediately is True
    assert web.Response._send_headers_immediately is False  # aiohttp's own use of it
    # The public faces read them: aiohttp's finish_response and access log go by these.
    fresh._keep_alive, fresh._body_length, fresh._eof_sent = True, 7, True
    assert (fresh.keep_alive, fresh.body_length, fresh.prepared) == (True, 7, True)


def test_http_date_is_an_http_date_of_now() -> None:
    value = http_date()
    assert value.endswith(" GMT")
    assert abs(email.utils.parsedate_to_datetime(value).timestamp() - time.time()) < 5


@dataclass
class Server:
    port: int
    # path: the writer's output after prepare, after the first write
    written: dict[str, tuple[int, int]] = field(default_factory=dict)
    # the access log's: path, body_length, keep_alive
    logged: list[tuple[str, int, bool | None]] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server(0)

    class AccessLog(AbstractAccessLogger):
        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            state.logged.append((request.path, response.body_length, response.keep_alive))

    async def head_with_first_write(request: web.Request) -> web.StreamResponse:
        response = HeadWithFirstWrite(status=200, headers={"Content-Type": "text/event-stream"})
        writer = await response.prepare(request)
        assert writer is not None
        after_prepare = writer.output_size
        await response.write(b"data: 1\n\n")
        state.written[request.path] = (after_prepare, writer.output_size)
        await response.write_eof()
        return response

    async def relayed(request: web.Request) -> web.StreamResponse:
        # As ``upstream.pump``: the first chunk through aiohttp, the next straight to the
        # transport, the end through aiohttp again.
        response = HeadWithFirstWrite(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"one ")
        assert request.transport is not None
        request.transport.write(http_chunk(b"two "))
        await response.write_eof(b"three")
        return response

    async def whole(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.write(WHOLE)
        return SentDirectly(200).ended(5)

    async def stream(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.write(STREAM_HEAD + http_chunk(b"first "))
        response = SentDirectly(200, request.transport)
        await response.write(b"second ")
        await response.write_eof(b"last")
        return response

    async def unended(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.write(STREAM_HEAD + http_chunk(b"first"))
        return SentDirectly(200, request.transport)

    async def plain(request: web.Request) -> web.StreamResponse:
        return web.Response(text="plain")

    app = web.Application()
    for path, handler in {
        "/head-with-first-write": head_with_first_write, "/relayed": relayed, "/whole": whole,
        "/stream": stream, "/unended": unended, "/plain": plain,
    }.items():  # fmt: skip
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log_class=AccessLog)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.port = bound_port(runner, 0)
    try:
        yield state
    finally:
        await runner.cleanup()


class Connection:
    """One HTTP/1.1 connection, read byte-exactly: bytes aiohttp added after an answer
    show up where the next status line should be."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, path: str) -> tuple[str, dict[str, str], bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        head = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        status, *lines = head[:-4].split("\r\n")
        headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
        if "content-length" in headers:
            return status, headers, await self.reader.readexactly(int(headers["content-length"]))
        body = b""
        while size := int((await asyncio.wait_for(self.reader.readuntil(b"\r\n"), 10))[:-2], 16):
            body += (await self.reader.readexactly(size + 2))[:-2]
        assert await self.reader.readexactly(2) == b"\r\n"
        return status, headers, body

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 10) == b""


@pytest.fixture
async def connection(server: Server) -> AsyncIterator[Connection]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    yield Connection(reader, writer)
    writer.close()


async def test_a_head_with_first_write_goes_out_with_the_first_chunk(
    server: Server, connection: Connection
) -> None:
    status, headers, body = await connection.get("/head-with-first-write")
    assert (status, headers["content-type"], body) == ("HTTP/1.1 200 OK", "text/event-stream", b"data: 1\n\n")
    after_prepare, after_write = server.written["/head-with-first-write"]
    assert after_prepare == 0  # nothing went at prepare: the head waited for the chunk
    assert after_write > len(b"HTTP/1.1 200 OK\r\n\r\n") + len(http_chunk(b"data: 1\n\n"))


async def test_chunks_written_to_the_transport_between_aiohttps_stay_in_order(
    server: Server, connection: Connection
) -> None:
    assert (await connection.get("/relayed"))[2] == b"one two three"
    assert (await connection.get("/plain"))[2] == b"plain"  # the body ended where aiohttp said


async def test_a_whole_answer_sent_directly_gets_nothing_added_and_keeps_the_connection(
    server: Server, connection: Connection
) -> None:
    status, headers, body = await connection.get("/whole")
    assert (status, headers, body) == (
        "HTTP/1.1 200 OK",
        {"content-type": "text/plain", "content-length": "5"},
        b"hello",
    )
    assert (await connection.get("/plain"))[2] == b"plain"
    assert server.logged[0] == ("/whole", 5, True)


async def test_a_stream_sent_directly_is_chunked_to_its_end_and_keeps_the_connection(
    server: Server, connection: Connection
) -> None:
    status, headers, body = await connection.get("/stream")
    assert (status, headers["transfer-encoding"]) == ("HTTP/1.1 200 OK", "chunked")
    assert body == b"first second last"
    assert (await connection.get("/plain"))[2] == b"plain"
    path, length, keep_alive = server.logged[0]
    assert (path, keep_alive) == ("/stream", True)
    assert length == len(http_chunk(b"second ") + http_chunk(b"last") + b"0\r\n\r\n")  # what it wrote itself


async def test_a_stream_left_unended_closes_its_connection(server: Server, connection: Connection) -> None:
    connection.writer.write(b"GET /unended HTTP/1.1\r\nHost: localhost\r\n\r\n")
    sent = STREAM_HEAD + http_chunk(b"first")
    assert await asyncio.wait_for(connection.reader.readexactly(len(sent)), 10) == sent
    assert await connection.closed()  # no end of the body, and no second answer
    assert server.logged == [("/unended", 0, False)]


async def test_writing_to_a_closed_client_says_so_and_closes(server: Server) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.close()
    await writer.wait_closed()
    response = SentDirectly(200, writer.transport)  # type: ignore[arg-type]
    with pytest.raises(ConnectionResetError):
        await response.write(b"late")
    assert response.keep_alive is False
