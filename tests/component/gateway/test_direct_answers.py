"""Answers written to the client from the engine connection's callbacks
(``dispatch._DirectAnswer``: whole answers, and a stream's head with its first
chunk): on the wire they are the same HTTP as aiohttp's, one answer per request on
a kept-alive connection, a failure after them closes the connection rather than
send a second answer, and anything that is not final as it arrives (a retryable
status, a client that asked to close or speaks HTTP/1.0) still goes the handler's
way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from llmgw.gateway import dispatch
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT

from .conftest import Cluster, StartRouter, eventually

CHAT = {"model": "sim-chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


@pytest.fixture
def direct_sends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``_DirectAnswer`` wrote from the engine's callbacks, in order: "whole" for
    a whole answer, "stream" for a stream's head and first chunk."""
    sent: list[str] = []
    original = dispatch._DirectAnswer._send

    def send(self: Any, start: str, payload: bytes) -> None:
        original(self, start, payload)
        sent.append("stream" if self._stream else "whole")

    monkeypatch.setattr(dispatch._DirectAnswer, "_send", send)
    return sent


class RawClient:
    """HTTP/1.x on one connection, read byte-exactly: a second answer to one request,
    or a wrong length, shows up as garbage where the next status line should be."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, router: RouterServer) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        return cls(reader, writer)

    async def post(
        self, body: dict[str, Any], *, version: str = "1.1", extra: str = ""
    ) -> tuple[str, dict[str, str], bytes]:
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST /v1/chat/completions HTTP/{version}\r\nHost: localhost\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode()
            + data
        )
        head = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        status, *lines = head[:-4].split("\r\n")
        headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
        if "content-length" in headers:
            payload = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            payload = b""
            while size := int((await self.reader.readuntil(b"\r\n"))[:-2], 16):
                payload += (await self.reader.readexactly(size + 2))[:-2]
            await self.reader.readexactly(2)
        else:
            payload = await self.reader.read()  # until the router closes
        return status, headers, payload

    async def closed_by_router(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 5) == b""

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def test_whole_answers_on_one_kept_alive_connection_are_sent_once_each(
    cluster: Cluster, start_router: StartRouter, direct_sends: list[str]
) -> None:
    engine = await cluster.add_sim("sim-chat")
    client = await RawClient.open(await start_router())
    request_ids = set()
    for stream in (False, False, True, False):
        status, headers, payload = await client.post({**CHAT, "stream": stream})
        assert status == "HTTP/1.1 200 OK"
        assert headers["x-llmgw-model"] == "sim-chat"
        assert headers["x-llmgw-replica"] == engine.endpoint.replica
        assert headers["date"].endswith(" GMT")
        request_ids.add(headers["x-request-id"])
        if stream:
            assert headers["content-type"] == "text/event-stream"
            assert payload.rstrip().endswith(b"data: [DONE]")
        else:
            assert headers["content-type"].startswith("application/json")
            assert "connection" not in headers  # kept alive, as HTTP/1.1 is by default
            answer = json.loads(payload)
            assert answer["model"] == "sim-chat" and answer["usage"]["completion_tokens"] == 3
    assert len(request_ids) == 4
    assert direct_sends == ["whole", "whole", "stream", "whole"]
    await client.close()


async def test_a_client_that_asks_to_close_or_speaks_http_1_0_is_answered_by_the_handler(
    cluster: Cluster, start_router: StartRouter, direct_sends: list[str]
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()

    closing = await RawClient.open(router)
    status, headers, payload = await closing.post(CHAT, extra="Connection: close\r\n")
    assert status == "HTTP/1.1 200 OK" and json.loads(payload)["model"] == "sim-chat"
    assert headers["connection"] == "close"
    assert await closing.closed_by_router()
    await closing.close()

    old = await RawClient.open(router)
    status, headers, payload = await old.post(CHAT, version="1.0")
    assert status.endswith("200 OK") and json.loads(payload)["model"] == "sim-chat"
    assert await old.closed_by_router()  # HTTP/1.0 without keep-alive
    await old.close()
    assert direct_sends == []  # never armed for either


async def test_a_retryable_answer_is_not_sent_and_the_retry_is(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, direct_sends: list[str]
) -> None:
    failing = await cluster.add_sim("sim-chat")
    healthy = await cluster.add_sim("sim-chat")
    await failing.fault(http, fail_rate=1.0, fail_status=503)
    client = await RawClient.open(await start_router())
    replicas = set()
    for _ in range(4):
        status, headers, payload = await client.post(CHAT)
        assert status == "HTTP/1.1 200 OK" and json.loads(payload)["model"] == "sim-chat"
        replicas.add(headers["x-llmgw-replica"])
    assert replicas == {healthy.endpoint.replica}
    # One answer sent per request: none of the 503s tried first (ties go round-robin).
    assert direct_sends == ["whole"] * 4
    await client.close()


async def test_an_engine_error_is_sent_as_the_engine_said_it(
    cluster: Cluster, start_router: StartRouter, direct_sends: list[str]
) -> None:
    await cluster.add_sim("sim-chat")
    client = await RawClient.open(await start_router())
    status, headers, payload = await client.post({**CHAT, "max_tokens": 10**9})
    assert status == "HTTP/1.1 400 Bad Request"
    assert headers["x-llmgw-model"] == "sim-chat"
    assert json.loads(payload)["error"]["message"]
    status, _, payload = await client.post(CHAT)  # the connection is still good
    assert status == "HTTP/1.1 200 OK"
    assert direct_sends == ["whole", "whole"]
    await client.close()


async def test_a_stream_that_breaks_after_its_first_chunk_ends_in_an_error_event_and_the_connection_goes_on(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, direct_sends: list[str]
) -> None:
    engine = await cluster.add_sim("sim-chat", token_rate=20.0)
    client = await RawClient.open(await start_router(upstream_idle_timeout=0.3))

    async def hang_soon() -> None:
        async def tokens_out() -> bool:
            return int((await engine.stats(http))["generation_tokens"]) >= 2

        await eventually(tokens_out)  # a few tokens in (20 a second)
        await engine.fault(http, hang=True)

    hanging = asyncio.create_task(hang_soon())
    status, headers, payload = await client.post({**CHAT, "max_tokens": 100, "stream": True})
    await hanging
    assert status == "HTTP/1.1 200 OK" and headers["transfer-encoding"] == "chunked"
    events = [e for e in payload.decode().split("\n\n") if e.strip()]
    assert events[0].startswith("data: {") and '"went silent midway' not in events[0]
    assert "went silent midway" in events[-1]  # OpenAI's way: an error event, then the end
    await engine.fault(http, hang=False)
    status, _, payload = await client.post(CHAT)  # the connection still serves
    assert status == "HTTP/1.1 200 OK" and json.loads(payload)["model"] == "sim-chat"
    assert direct_sends == ["stream", "whole"]
    await client.close()


async def test_a_failure_after_the_answer_went_closes_the_connection_instead_of_a_second_answer(
    cluster: Cluster, start_router: StartRouter, monkeypatch: pytest.MonkeyPatch, direct_sends: list[str]
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()

    def broken_bookkeeping(model: str) -> None:
        raise RuntimeError("a bug after the answer went")

    monkeypatch.setattr(router.app[CONTEXT].demand, "record_use", broken_bookkeeping)
    client = await RawClient.open(router)
    status, _, payload = await client.post(CHAT)
    assert status == "HTTP/1.1 200 OK" and json.loads(payload)["model"] == "sim-chat"
    assert await client.closed_by_router()  # and nothing after the answer: no 500 behind it
    assert direct_sends == ["whole"]
    await client.close()
