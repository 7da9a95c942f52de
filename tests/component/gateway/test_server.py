"""The details that bite aiohttp proxies, each with a test: backlog, no total timeout but
an idle one, no connector cap at 100, slow clients, slowloris, access logs; and the limits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.gateway.app import RouterServer, runner_options
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.settings import RouterSettings
from tests.support.conversations import owned_by
from tests.support.waiting import awaited

from .conftest import Cluster, OpenAIFor, StartRouter, eventually, metric_value

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


async def _metrics(http: aiohttp.ClientSession, router: RouterServer) -> str:
    async with http.get(router.url + "/metrics") as response:
        return await response.text()


# --- listening --------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read a listen backlog")
async def test_the_listen_backlog_is_larger_than_aiohttps_128(start_router: StartRouter) -> None:
    assert RouterSettings().backlog > 128
    router = await start_router(backlog=1000)
    process = await asyncio.create_subprocess_exec(
        "ss", "-ltnH", f"sport = :{router.port}", stdout=asyncio.subprocess.PIPE
    )
    out = (await process.communicate())[0].decode()
    # For a listening socket ss shows the backlog as Send-Q (the third column).
    assert out.split()[2] == "1000", out


def test_the_runner_cancels_handlers_on_disconnect_and_logs_no_access_by_default() -> None:
    options = runner_options(RouterSettings())
    assert options["handler_cancellation"] is True
    assert options["access_log"] is None
    assert options["keepalive_timeout"] < 3630  # aiohttp's default lets slowloris hold sockets an hour


async def test_no_access_log_lines_on_the_hot_path(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    router = await start_router()
    with caplog.at_level(logging.DEBUG):
        async with http.get(router.url + "/v1/models") as response:
            assert response.status == 200
    assert not [r for r in caplog.records if "access" in r.name]


async def test_slowloris_connections_are_closed(start_router: StartRouter) -> None:
    router = await start_router(keepalive_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    closed = False
    try:
        for _ in range(50):  # one header byte every 0.05 s: a request head that never ends
            writer.write(b"X")
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(1024), 0.05)
            except TimeoutError:
                continue
            if data == b"":
                closed = True
                break
    except ConnectionError:
        closed = True
    finally:
        writer.close()
    assert closed, "the router kept a connection whose request head never ended"


async def test_a_body_sent_a_byte_at_a_time_gets_408_after_the_body_read_timeout(
    start_router: StartRouter,
) -> None:
    router = await start_router(body_read_timeout=0.5)
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    started = loop.time()

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(1000):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)  # the drip is the point: a body a byte at a time

    dripping = asyncio.create_task(drip())
    try:
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
    finally:
        dripping.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert 0.5 <= loop.time() - started < 5.0


async def test_idle_keep_alive_connections_are_closed(start_router: StartRouter) -> None:
    router = await start_router(keepalive_timeout=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    rest = await asyncio.wait_for(reader.read(), 3.0)  # returns at EOF: the router closed it
    assert b"ok" in rest
    writer.close()


# --- upstream timeouts and limits ---------------------------------------------------------------------


async def test_long_streams_are_not_cut_by_a_total_timeout(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat", token_rate=40.0)
    # Both upstream timeouts far shorter than the stream: only idleness may end it.
    router = await start_router(upstream_first_byte_timeout=0.3, upstream_idle_timeout=0.3)
    session = router.app[CONTEXT].upstream._session
    assert session is not None and session.timeout.total is None
    stream = await openai_for(router).chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=40, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert len(text.split()) == 40  # about a second of generation, all of it


async def test_an_engine_going_silent_mid_stream_ends_it_with_an_error_event(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat", token_rate=20.0)
    router = await start_router(upstream_idle_timeout=0.3)
    received = []
    with pytest.raises(openai.APIError) as caught:
        stream = await openai_for(router).chat.completions.create(
            model="sim-chat", messages=MESSAGES, max_tokens=100, stream=True
        )
        async for chunk in stream:
            received.append(chunk)
            if len(received) == 2:
                await engine.fault(http, hang=True)
    assert "went silent midway" in caught.value.message
    assert len(received) >= 2
    await engine.fault(http, hang=False)
    assert (
        metric_value(await _metrics(http, router), "llmgw_router_stream_errors_total", reason="upstream-idle")
        == 1
    )


async def test_a_slow_first_token_is_a_504_and_not_retried(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    slow = await cluster.add_sim("sim-chat", token_rate=1000.0)
    await slow.fault(http, first_token_delay=5.0)
    other = await cluster.add_sim("sim-chat")
    client = openai_for(await start_router(upstream_first_byte_timeout=0.3))
    # A conversation the slow replica owns: it is tried first.
    messages: Any = owned_by(slow.endpoint.service_id, [slow.endpoint.service_id, other.endpoint.service_id])
    with pytest.raises(openai.APIStatusError) as caught:
        stream = await client.chat.completions.create(model="sim-chat", messages=messages, stream=True)
        async for _ in stream:
            pass
    assert caught.value.status_code == 504 and caught.value.code == "upstream_timeout"
    assert (await other.stats(http))["requests_total"] == 0
    await slow.fault(http, first_token_delay=0.0)


class _HoldingEngine:
    """An engine that holds every stream open, after its first chunk, until ``streams``
    are open at once, then ends them all: the test waits on that, not on a clock."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.open = 0
        self.peak = 0
        self.all_open = asyncio.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = (
            '{"id":"c","object":"chat.completion.chunk","created":1,"model":"chat-a",'
            '"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
        )
        await response.write(f"data: {chunk}\n\n".encode())
        self.open += 1
        self.peak = max(self.peak, self.open)
        if self.open >= self.streams:
            self.all_open.set()
        try:
            await self.all_open.wait()
            await response.write(b"data: [DONE]\n\n")
        finally:
            self.open -= 1
        return response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


async def test_more_than_100_concurrent_streams_pass(cluster: Cluster, start_router: StartRouter) -> None:
    engine = _HoldingEngine(streams=150)
    await cluster.add_app("chat-a", engine.app())
    router = await start_router()
    body = {"model": "chat-a", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> bytes:
            async with session.post(router.url + "/v1/chat/completions", json=body) as response:
                return await response.read()

        tasks = [asyncio.create_task(one()) for _ in range(150)]
        try:
            # A cap at 100 anywhere between client and engine leaves the rest waiting for ever.
            await awaited(
                engine.all_open.wait(), lambda: f"150 streams open at once (at most {engine.peak} were)", 60
            )
        finally:
            engine.all_open.set()  # lets every stream end, so a failure does not leave them hanging
        answers = await asyncio.gather(*tasks)
    assert engine.peak == 150
    assert all(a.rstrip().endswith(b"data: [DONE]") for a in answers)


def _firehose(progress: dict[str, Any]) -> web.Application:
    """An engine that streams 64 KiB events as fast as it may write them."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b"data: " + b'{"choices":[],"pad":"' + b"x" * 65_000 + b'"}\n\n'
        try:
            for _ in range(640):  # 40 MiB: more than every buffer between here and the client
                await response.write(event)
                progress["sent"] += 1
        except (ConnectionError, asyncio.CancelledError):
            progress["cut"] = True
            raise
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_a_client_that_stops_reading_is_dropped_and_the_engine_released(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    progress: dict[str, Any] = {"sent": 0, "cut": False}
    await cluster.add_app("chat-a", _firehose(progress))
    router = await start_router(client_write_timeout=0.3)
    context = router.app[CONTEXT]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", router.port))
    body = b'{"model":"chat-a","messages":[{"role":"user","content":"hi"}],"stream":true}'
    await loop.sock_sendall(
        sock,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
    )
    try:
        # Never read: the router's writes block (backpressure), then its write timeout fires.
        assert await eventually(lambda: bool(progress["cut"]), within=10.0)
        assert progress["sent"] < 640  # the engine was stopped, not drained into memory
        assert await eventually(lambda: not context.book.in_flight())
        text = await _metrics(http, router)
        assert metric_value(text, "llmgw_router_stream_errors_total", reason="client-stalled") == 1
    finally:
        sock.close()


async def test_request_bodies_over_the_limit_get_413(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router(max_body_bytes=1000)
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x" * 2000}]}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 413
        assert (await response.json())["error"]["code"] == "request_too_large"


async def test_a_full_model_queue_answers_429_with_retry_after(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat", token_rate=20.0)
    client = openai_for(await start_router(max_concurrency_per_model=1, max_queue_per_model=0))
    busy = await client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=30, stream=True
    )
    await anext(busy)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    assert caught.value.code == "model_queue_full"
    assert caught.value.response.headers["Retry-After"] == "1"
    await busy.close()


async def test_queued_requests_get_the_slot_in_turn_or_429_after_the_queue_timeout(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat", token_rate=100.0)
    router = await start_router(max_concurrency_per_model=1, max_queue_per_model=5, queue_timeout=2.0)
    client = openai_for(router)
    done = await asyncio.gather(
        *(client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=5) for _ in range(4))
    )
    assert [c.model for c in done] == ["sim-chat"] * 4

    short = openai_for(
        await start_router(max_concurrency_per_model=1, max_queue_per_model=5, queue_timeout=0.2)
    )
    busy = await short.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=60, stream=True
    )
    await anext(busy)
    with pytest.raises(openai.RateLimitError):
        await short.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    await busy.close()


async def test_the_router_tests_run_on_the_production_event_loop() -> None:
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
