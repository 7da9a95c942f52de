"""Choosing endpoints, retrying before the first byte only, and falling back, with real sims."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.core.records import HealthStatus
from tests.support.conversations import owned_by

from .conftest import (
    CATALOG,
    Cluster,
    OpenAIFor,
    StartRouter,
    endpoint_for,
    eventually,
    metric_value,
    replicas_answering,
)

MESSAGES: Any = [{"role": "user", "content": "hello there"}]
# The test catalog with sim-chat routed by least outstanding requests alone.
WITHOUT_AFFINITY = CATALOG.replace(
    "  sim-chat:\n    roles: [chat, completion]\n",
    "  sim-chat:\n    roles: [chat, completion]\n    routing: {prefix_affinity: false}\n",
)


async def _metrics(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as response:
        return await response.text()


async def test_least_outstanding_spreads_concurrent_streams(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(WITHOUT_AFFINITY)
    a = await cluster.add_sim("sim-chat", token_rate=50.0)
    b = await cluster.add_sim("sim-chat", token_rate=50.0)
    client = openai_for(await start_router())

    # One conversation (an answer in its history) sent eight times at once: a hot key.
    hot: Any = [*MESSAGES, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Again."}]

    async def one() -> str:
        stream = await client.chat.completions.create(
            model="sim-chat", messages=hot, max_tokens=10, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    await asyncio.gather(*(one() for _ in range(8)))
    counts = [(await e.stats(http))["requests_total"] for e in (a, b)]
    assert counts == [4, 4]


async def test_a_busy_endpoint_gets_the_next_requests_elsewhere(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(WITHOUT_AFFINITY)
    a = await cluster.add_sim("sim-chat", token_rate=20.0)
    b = await cluster.add_sim("sim-chat")
    client = openai_for(await start_router())
    long_stream = await client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=100, stream=True
    )
    await anext(long_stream)  # it runs on the first endpoint (ties start from the first in order)
    for _ in range(3):
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
    assert [(await e.stats(http))["requests_total"] for e in (a, b)] == [1, 3]
    await long_stream.close()


async def test_a_conversations_turns_stay_on_the_replica_that_owns_it(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engines = [await cluster.add_sim("sim-chat") for _ in range(3)]
    router = await start_router()
    client = openai_for(router)
    conversation: Any = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    answered = []
    for turn in range(6):
        raw = await client.chat.completions.with_raw_response.create(
            model="sim-chat", messages=conversation, max_tokens=3
        )
        answered.append(raw.headers["x-llmgw-replica"])
        reply = raw.parse().choices[0].message.content or ""
        conversation = [
            *conversation,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"Tool output {turn}: still failing"},
        ]
    # The first turn has nothing cached anywhere: it goes where the load is least. Every
    # turn after it (an answer in its history) goes to the one replica that owns it.
    assert len(set(answered[1:])) == 1
    served = sorted([(await e.stats(http))["requests_total"] for e in engines])
    assert served in ([0, 0, 6], [0, 1, 5])
    text = await _metrics(http, router.url)
    decisions = "llmgw_router_routing_decisions_total"
    assert metric_value(text, decisions, model="sim-chat", outcome="no-history") == 1
    assert metric_value(text, decisions, model="sim-chat", outcome="affinity") == 5


async def test_a_hot_prefix_spreads_past_its_owners_load_bound(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    a = await cluster.add_sim("sim-chat", token_rate=50.0)
    b = await cluster.add_sim("sim-chat", token_rate=50.0)
    router = await start_router()
    client = openai_for(router)

    # One conversation (an answer in its history) sent eight times at once: a hot key.
    hot: Any = [*MESSAGES, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Again."}]

    async def one() -> str:
        stream = await client.chat.completions.create(
            model="sim-chat", messages=hot, max_tokens=10, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    await asyncio.gather(*(one() for _ in range(8)))
    # Eight at once of one key: its owner takes them up to ceil(1.25 * mean) (the bound
    # of a key with requests in flight), the next in the key's order the rest (5 and
    # 3), instead of all 8 on one replica.
    counts = sorted([(await e.stats(http))["requests_total"] for e in (a, b)])
    assert counts == [3, 5]
    text = await _metrics(http, router.url)
    assert (
        metric_value(text, "llmgw_router_routing_decisions_total", model="sim-chat", outcome="overflow") == 3
    )


async def test_draining_and_failing_replicas_get_no_traffic(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    a = await cluster.add_sim("sim-chat")
    b = await cluster.add_sim("sim-chat")
    c = await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    cluster.drain(a)
    cluster.set_status(b, HealthStatus.CRITICAL)
    await cluster.seen_by(router)
    for _ in range(4):
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
    assert [(await e.stats(http))["requests_total"] for e in (a, b, c)] == [0, 0, 4]


async def test_503_before_the_first_byte_is_retried_on_another_endpoint(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    broken = await cluster.add_sim("sim-chat")
    await broken.fault(http, fail_rate=1.0, fail_status=503)
    good = await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    # A conversation the broken replica owns: every request tries it first.
    messages = owned_by(broken.endpoint.service_id, [broken.endpoint.service_id, good.endpoint.service_id])
    assert await replicas_answering(client, 3, messages=messages) == {good.endpoint.replica}
    assert (await good.stats(http))["requests_total"] == 3
    retried = metric_value(
        await _metrics(http, router.url), "llmgw_router_retries_total", reason="unavailable"
    )
    assert retried is not None and retried >= 1


async def test_a_500_from_the_engine_is_passed_through_not_retried(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    broken = await cluster.add_sim("sim-chat")
    await broken.fault(http, fail_rate=1.0, fail_status=500)
    client = openai_for(await start_router())
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
    assert (await broken.stats(http))["requests_total"] == 1


async def test_connection_refused_is_retried_elsewhere(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, unused_tcp_port: int
) -> None:
    cluster.add_endpoint(endpoint_for("sim-chat", unused_tcp_port, 7))
    good = await cluster.add_sim("sim-chat")
    client = openai_for(await start_router())
    assert await replicas_answering(client, 3) == {good.endpoint.replica}


async def test_an_endpoint_that_refused_a_connection_is_tried_last_until_consul_catches_up(
    cluster: Cluster,
    start_router: StartRouter,
    openai_for: OpenAIFor,
    http: aiohttp.ClientSession,
    unused_tcp_port: int,
) -> None:
    # A dead engine still passing in Consul has nothing outstanding: without the
    # suspect mark, least-outstanding sends it every other request, each spending a try.
    dead = cluster.add_endpoint(endpoint_for("sim-chat", unused_tcp_port, 7))
    good = await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    # A conversation the dead replica owns: once suspect, it is not its owner any more.
    messages = owned_by(dead.endpoint.service_id, [dead.endpoint.service_id, good.endpoint.service_id])
    assert await replicas_answering(client, 10, messages=messages) == {good.endpoint.replica}
    text = await _metrics(http, router.url)
    assert metric_value(text, "llmgw_router_retries_total", model="sim-chat", reason="connect") == 1
    assert (await good.stats(http))["requests_total"] == 10


async def test_every_try_failing_is_a_502_after_a_bounded_number_of_tries(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engines = [await cluster.add_sim("sim-chat") for _ in range(4)]
    for engine in engines:
        await engine.fault(http, fail_rate=1.0, fail_status=503)
    client = openai_for(await start_router(attempts_per_model=3))
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
    assert caught.value.status_code == 502
    assert caught.value.response.headers["Retry-After"]
    tried = [(await e.stats(http))["requests_total"] for e in engines]
    assert sum(tried) == 3 and max(tried) == 1  # three different endpoints, then no more


async def test_fallbacks_are_tried_in_order(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    # chat-a falls back to chat-b, then sim-chat. chat-a has no endpoint at all.
    await cluster.add_sim("sim-chat")
    b = await cluster.add_sim("chat-b")
    router = await start_router()
    client = openai_for(router)
    raw = await client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=MESSAGES, max_tokens=2
    )
    assert raw.parse().model == "chat-b" and raw.headers["x-llmgw-model"] == "chat-b"
    # chat-b failing every try: the next fallback answers.
    await b.fault(http, fail_rate=1.0, fail_status=503)
    raw = await client.chat.completions.with_raw_response.create(
        model="chat-a", messages=MESSAGES, max_tokens=2
    )
    assert raw.parse().model == "sim-chat"
    text = await _metrics(http, router.url)
    assert metric_value(text, "llmgw_router_fallbacks_total", requested="chat-a", served="chat-b") == 1
    assert metric_value(text, "llmgw_router_fallbacks_total", requested="chat-a", served="sim-chat") == 1


async def test_no_healthy_replica_is_a_503_that_says_so(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router())
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES)
    assert caught.value.status_code == 503
    assert caught.value.code == "no_healthy_replica"
    assert caught.value.response.headers["Retry-After"] == "5"


def _stream_then_reset_engine(resets: list[int]) -> web.Application:
    """Streams two chunks, then drops the connection (an engine dying mid-answer)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in ("alpha", " beta"):
            chunk = (
                '{"id":"c","object":"chat.completion.chunk","created":1,"model":"chat-a",'
                f'"choices":[{{"index":0,"delta":{{"content":"{word}"}},"finish_reason":null}}]}}'
            )
            await response.write(f"data: {chunk}\n\n".encode())
        transport = request.transport
        assert transport is not None
        # An abort drops what is still buffered: reset once both chunks have left.
        await eventually(lambda: transport.get_write_buffer_size() == 0)
        resets.append(1)
        transport.abort()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_a_reset_after_the_first_byte_ends_the_stream_with_an_error_not_a_retry(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    resets: list[int] = []
    resetting = await cluster.add_app("chat-a", _stream_then_reset_engine(resets))
    spare = await cluster.add_sim("chat-a")
    client = openai_for(await start_router())
    received: list[str] = []
    # A conversation the resetting engine owns: it is tried first.
    messages: Any = owned_by(
        resetting.endpoint.service_id, [resetting.endpoint.service_id, spare.endpoint.service_id]
    )
    with pytest.raises(openai.APIError) as caught:
        stream = await client.chat.completions.create(model="chat-a", messages=messages, stream=True)
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "stopped answering midway" in caught.value.message
    assert resets == [1]
    assert received == ["alpha", " beta"]  # what was sent stays sent; nothing was retried
    assert (await spare.stats(http))["requests_total"] == 0


class _StaleKeepAlive:
    """A raw HTTP/1.1 engine that keeps connections alive, then closes one just as the
    router reuses it: the race every pooled proxy meets when an engine's keep-alive expires."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served_here = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if served_here == 1:  # the second request on a connection: close without answering
                    writer.close()
                    return
                served_here += 1
                self.requests += 1
                body = (
                    b'{"id":"c","object":"chat.completion","created":1,"model":"chat-a","choices":[{"index":0,'
                    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
                    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
                )
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_a_stale_pooled_connection_is_retried_before_the_first_byte(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engine = _StaleKeepAlive()
    port = await engine.start()
    try:
        cluster.add_endpoint(endpoint_for("chat-a", port, 0, simulated=False))
        router = await start_router()
        client = openai_for(router)
        for _ in range(3):
            completion = await client.chat.completions.create(model="chat-a", messages=MESSAGES)
            assert completion.choices[0].message.content == "ok"
        assert engine.requests == 3
        stale = metric_value(
            await _metrics(http, router.url), "llmgw_router_retries_total", reason="stale-connection"
        )
        assert stale is not None and stale >= 1
    finally:
        await engine.close()


async def test_an_engine_that_drops_new_connections_is_left_for_another_endpoint(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    # It accepts and closes at once: not a stale pooled connection (no retry on it),
    # an engine failure like a 503 (the next try goes elsewhere).
    accepted = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.transport.abort()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    try:
        dropping = cluster.add_endpoint(endpoint_for("sim-chat", server.sockets[0].getsockname()[1], 7))
        good = await cluster.add_sim("sim-chat")
        router = await start_router()
        client = openai_for(router)
        ids = [dropping.endpoint.service_id, good.endpoint.service_id]
        messages = owned_by(dropping.endpoint.service_id, ids)  # it is tried first
        assert await replicas_answering(client, 4, messages=messages) == {good.endpoint.replica}
        text = await _metrics(http, router.url)
        assert metric_value(text, "llmgw_router_retries_total", reason="stale-connection") is None
        dropped = metric_value(text, "llmgw_router_retries_total", reason="unavailable")
        assert dropped is not None and dropped == accepted >= 1
    finally:
        server.close()
        await server.wait_closed()


async def test_the_router_sends_each_replica_its_engine_key_and_never_relays_an_engines_401(
    cluster: Cluster, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    from dataclasses import replace

    from llmgw.core.engine_keys import EngineKeys
    from llmgw.gateway.app import RouterServer

    from .conftest import router_settings

    keys = EngineKeys("r" * 40)
    # First in order (tried first): a replica keyed from another secret, as when a router
    # and the control plane are set differently. Its 401 sends the request on.
    stranger = await cluster.add_sim("sim-chat", api_key=EngineKeys("x" * 40).for_replica("sim-chat-r0"))
    good = await cluster.add_sim("sim-chat", api_key=keys.for_replica(f"sim-chat-r{len(cluster.engines)}"))
    router = RouterServer(router_settings(), replace(cluster.deps(), engine_keys=keys))
    await router.start()
    try:
        client = openai_for(router)
        for _ in range(4):
            answer = await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
            assert answer.choices[0].message.content
        assert (await good.stats(http))["requests_total"] == 4
        assert (await stranger.stats(http))["requests_total"] == 0
    finally:
        await router.stop()
    # A router without the secret: an engine's 401 is not the client's error.
    cluster.remove(good)
    keyless = RouterServer(router_settings(), cluster.deps())
    await keyless.start()
    try:
        with pytest.raises(openai.APIStatusError) as raised:
            await openai_for(keyless).chat.completions.create(
                model="sim-chat", messages=MESSAGES, max_tokens=2
            )
        assert raised.value.status_code in (502, 503), raised.value
    finally:
        await keyless.stop()
