"""API keys and their limits, as the official client sees them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.gateway.app import RouterServer, create_app
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.keys import KeyRing, new_api_key
from llmgw.gateway.settings import RouterSettingsError

from .conftest import Cluster, Engine, OpenAIFor, StartRouter, eventually, router_settings

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


async def test_a_new_key_is_shown_once_and_stored_hashed(cluster: Cluster) -> None:
    issued = new_api_key("ci", now=5.0, models=["sim-chat"], requests_per_minute=10)
    assert issued.key.startswith("sk-llmgw-" + issued.record.key_id + ".")
    assert issued.key not in repr(issued) and issued.key not in str(issued.record)
    assert issued.record.secret_sha256 != issued.key and len(issued.record.secret_sha256) == 64
    assert KeyRing({issued.record.key_id: issued.record}).find(issued.key) == issued.record
    assert new_api_key("ci", now=5.0).key != issued.key


async def test_requests_need_a_valid_key(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key()
    router = await start_router(with_keys=True)
    completion = await openai_for(router, api_key=key).chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=1
    )
    assert completion.model == "sim-chat"

    async with http.post(router.url + "/v1/chat/completions", json={"model": "sim-chat"}) as response:
        assert response.status == 401
        error = (await response.json())["error"]
    assert error["code"] is None and "didn't provide an API key" in error["message"]

    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    for bad in (wrong, "sk-something-else", key + "x"):
        with pytest.raises(openai.AuthenticationError) as caught:
            await openai_for(router, api_key=bad).chat.completions.create(model="sim-chat", messages=MESSAGES)
        assert caught.value.code == "invalid_api_key"
        assert bad not in caught.value.message  # the key is never echoed back


async def test_a_revoked_key_is_refused(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    key, record = cluster.issue_key()
    router = await start_router(with_keys=True)
    client = openai_for(router, api_key=key)
    assert (await client.models.list()).data
    cluster.keys.publish({record.key_id: replace(record, revoked_at=cluster.clock.now)})
    await cluster.seen_by(router)
    with pytest.raises(openai.AuthenticationError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES)
    assert caught.value.code == "invalid_api_key"


async def test_a_model_outside_the_keys_list_looks_unknown(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    await cluster.add_sim("chat-b")
    key, _ = cluster.issue_key(models=["sim-chat"])
    client = openai_for(await start_router(with_keys=True), api_key=key)
    await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    await client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=1)  # its alias
    with pytest.raises(openai.NotFoundError) as hidden:
        await client.chat.completions.create(model="chat-b", messages=MESSAGES)
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert hidden.value.body == {
        **unknown.value.body,  # type: ignore[dict-item]
        "message": "The model `chat-b` does not exist or you do not have access to it.",
    }
    assert [m.id for m in (await client.models.list()).data] == ["sim-chat", "fast"]


async def test_a_fallback_outside_the_keys_list_never_answers(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # chat-a has no replica; its fallbacks are chat-b and sim-chat, and sim-chat serves.
    await cluster.add_sim("sim-chat")
    only_chat_a, _ = cluster.issue_key("only-chat-a", models=["chat-a"])
    with_fast, _ = cluster.issue_key("chat-a-and-fast", models=["chat-a", "fast"])
    router = await start_router(with_keys=True)
    body = {"model": "chat-a", "messages": MESSAGES, "max_tokens": 1}

    async with http.post(
        router.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {only_chat_a}"}
    ) as response:
        assert response.status == 503, await response.text()
        assert "x-llmgw-model" not in response.headers
        assert (await response.json())["error"]["code"] == "no_healthy_replica"
    async with http.post(
        router.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {with_fast}"}
    ) as response:
        assert response.status == 200, await response.text()
        assert response.headers["x-llmgw-model"] == "sim-chat"  # granted by its alias


async def test_a_router_without_keys_refuses_other_sites_pages(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # --no-auth on loopback (how `llmgw dev` runs): a page on another site must not
    # use the models, neither blind (a text/plain POST needs no preflight) nor by
    # DNS rebinding (its own name resolving to 127.0.0.1, so it reads the answers).
    await cluster.add_sim("sim-chat")
    router = await start_router()
    own = f"127.0.0.1:{router.port}"
    body = json.dumps({"model": "sim-chat", "messages": MESSAGES, "max_tokens": 1})
    url = router.url + "/v1/chat/completions"
    for headers in (
        {"Host": f"rebound.example:{router.port}", "Origin": f"http://rebound.example:{router.port}"},
        {"Host": f"rebound.example:{router.port}", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "https://evil.example", "Content-Type": "text/plain"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": f"http://127.0.0.1:{router.port + 1}"},
    ):
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 403, headers
            assert (await response.json())["error"]["code"] == "cross_site_request"
    rebound = {"Host": "rebound.example", "Sec-Fetch-Site": "same-origin"}
    async with http.get(router.url + "/v1/models", headers=rebound) as response:
        assert response.status == 403
    assert (await cluster.engines[0].stats(http))["requests_total"] == 0

    # Its own chat page (same origin) under an address or localhost, and other clients.
    for headers in (
        {"Origin": f"http://{own}", "Sec-Fetch-Site": "same-origin"},
        {"Host": f"localhost:{router.port}", "Sec-Fetch-Site": "same-origin"},
        {"Host": f"[::1]:{router.port}", "Sec-Fetch-Site": "none"},
        {},
    ):
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 200, (headers, await response.text())


# Every path a router without keys serves without a key. A browser that sends no
# Sec-Fetch-* headers (Safari before 16.4, Firefox before 90) and no Origin (a
# same-origin GET) looks like any other client: only Host tells the attack apart.
PUBLIC_PATHS = (
    "/metrics",
    "/health",
    "/v1/models",
    "/v1/models/sim-chat",
    "/",
    "/favicon.ico",
    "/static/chat.js",
)


async def test_a_dns_rebinding_page_reads_no_path_of_a_router_without_keys(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()
    for path in PUBLIC_PATHS:
        for headers in (
            {"Host": f"attacker.example:{router.port}"},
            {"Host": "attacker.example", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"},
            {"Host": f"127.0.0.1.attacker.example:{router.port}"},
            {"Host": f"[::1:{router.port}"},
        ):
            async with http.get(router.url + path, headers=headers) as response:
                assert response.status == 403, (path, headers)
                text = await response.text()
            assert json.loads(text)["error"]["code"] == "cross_site_request"
            assert (
                "--allowed-hosts" in text
                and "sim-chat" not in text
                and cluster.engines[0].endpoint.replica not in text
            )
    # Prometheus on the same host scrapes by address or localhost (Host: <ip>:<port>).
    for host in (f"127.0.0.1:{router.port}", f"localhost:{router.port}", f"[::1]:{router.port}", "127.0.0.1"):
        for path in PUBLIC_PATHS:
            async with http.get(router.url + path, headers={"Host": host}) as response:
                assert response.status == 200, (host, path)


async def test_names_in_allowed_hosts_are_answered_and_routers_with_keys_answer_any_name(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    # A scraper or a container reaching the host under a name the operator lists.
    named = await start_router(allowed_hosts=("prometheus.internal", "host.docker.internal"))
    for host in ("prometheus.internal:9", "PROMETHEUS.internal", "host.docker.internal"):
        async with http.get(named.url + "/metrics", headers={"Host": host}) as response:
            assert response.status == 200, host
    async with http.get(named.url + "/metrics", headers={"Host": "attacker.example"}) as response:
        assert response.status == 403
    # With keys the key is the guard: /metrics and /health are public by design and a
    # scrape may use any name (the router listens beyond loopback).
    keyed = await start_router(with_keys=True)
    async with http.get(keyed.url + "/metrics", headers={"Host": "router.prod.example:8080"}) as response:
        assert response.status == 200


async def test_requests_per_minute_limit(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(requests_per_minute=2)
    client = openai_for(await start_router(with_keys=True), api_key=key)
    for _ in range(2):
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.body["type"] == "requests"  # type: ignore[index]
    assert int(caught.value.response.headers["Retry-After"]) >= 1


async def test_tokens_per_minute_counts_usage_even_of_streams_that_did_not_ask(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(tokens_per_minute=30)
    client = openai_for(await start_router(with_keys=True), api_key=key)
    # A stream without include_usage: the router asks the engine for usage on the
    # key's behalf and takes that chunk out again, so the client sees what it asked for.
    stream = await client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=40, stream=True
    )
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks)  # no usage-only chunk reached the client
    assert len("".join(c.choices[0].delta.content or "" for c in chunks).split()) == 40
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    assert caught.value.body["type"] == "tokens"  # type: ignore[index]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# A stream that asks for 400 tokens at 20 tokens/s: it holds ~430 of a key's budget.
SLOW_STREAM = {"model": "sim-chat", "messages": MESSAGES, "max_tokens": 400, "stream": True}


async def _slow_streams(
    cluster: Cluster, start_router: StartRouter, *, tokens_per_minute: int
) -> tuple[Engine, str, RouterServer]:
    """A slow simulated engine, a key with this token limit, and a router that checks keys."""
    engine = await cluster.add_sim("sim-chat", token_rate=20.0)
    key, _ = cluster.issue_key(tokens_per_minute=tokens_per_minute)
    return engine, key, await start_router(with_keys=True)


async def test_concurrent_requests_cannot_all_start_on_one_positive_token_balance(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # The dodge: with tokens charged only after answers, every request sent at once
    # got in while the balance was still positive. Each now holds its prompt's
    # estimate plus max_tokens (~430 here) until its usage comes.
    engine, key, router = await _slow_streams(cluster, start_router, tokens_per_minute=1000)
    responses = [
        await http.post(router.url + "/v1/chat/completions", json=SLOW_STREAM, headers=_auth(key))
        for _ in range(4)
    ]
    try:
        assert [r.status for r in responses] == [200, 200, 429, 429]
        for refused in responses[2:]:
            error = (await refused.json())["error"]
            assert error["type"] == "tokens" and error["code"] == "rate_limit_exceeded"
            assert "Limit 1000, Requested 4" in error["message"]  # the hold, ~430
            assert int(refused.headers["Retry-After"]) >= 1
        assert (await engine.stats(http))["running"] == 2
    finally:
        for response in responses:
            response.close()


async def test_leaving_a_stream_midway_pays_what_it_held(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # The dodge: a client that reads what it wants and hangs up before the usage
    # event was charged nothing. Now it pays its hold (prompt estimate + max_tokens).
    engine, key, router = await _slow_streams(cluster, start_router, tokens_per_minute=500)
    async with http.post(
        router.url + "/v1/chat/completions", json=SLOW_STREAM, headers=_auth(key)
    ) as response:
        assert response.status == 200
        await response.content.readline()
    assert await eventually(lambda: not router.app[CONTEXT].book.in_flight())
    assert (await engine.stats(http))["completed"] == 0
    async with http.post(
        router.url + "/v1/chat/completions", json=SLOW_STREAM, headers=_auth(key)
    ) as response:
        assert response.status == 429
        assert (await response.json())["error"]["type"] == "tokens"


USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


def _short_answers_engine(usage: dict[str, int] | None = USAGE) -> web.Application:
    """Answers every chat request with one word and ``usage`` (None: no usage at all)."""

    def message(kind: str, choices: list[Any], **more: Any) -> dict[str, Any]:
        return {"id": "x", "object": kind, "created": 0, "model": "chat-a", "choices": choices, **more}

    with_usage = {} if usage is None else {"usage": usage}

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            return web.json_response(message("chat.completion", [choice], **with_usage))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}
        events = [message("chat.completion.chunk", [delta])]
        if with_usage and (body.get("stream_options") or {}).get("include_usage"):
            events.append(message("chat.completion.chunk", [], **with_usage))
        for event in events:
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    return app


async def test_an_answer_charges_its_usage_not_its_hold(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_app("chat-a", _short_answers_engine())
    key, _ = cluster.issue_key(tokens_per_minute=400)
    client = openai_for(await start_router(with_keys=True), api_key=key)
    # Each holds ~230 tokens and uses 12: without settling by usage the second would
    # be refused; with it, ten use 120 and the last still finds its 230.
    for stream in (False, True) * 5:
        if stream:
            chunks = await client.chat.completions.create(
                model="chat-a", messages=MESSAGES, max_tokens=200, stream=True
            )
            assert [c.choices[0].delta.content async for c in chunks] == ["hi"]
        else:
            answer = await client.chat.completions.create(model="chat-a", messages=MESSAGES, max_tokens=200)
            assert answer.choices[0].message.content == "hi"


async def test_requests_no_engine_generated_for_give_their_hold_back(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        error = {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}
        return web.json_response({"error": error, "object": "error"}, status=400)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    await cluster.add_app("chat-a", app)
    key, _ = cluster.issue_key(tokens_per_minute=500)
    client = openai_for(await start_router(with_keys=True), api_key=key)
    for _ in range(4):  # each holds ~430: only a released hold lets the next one in
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="chat-a", messages=MESSAGES, max_tokens=400)


async def test_an_engine_that_reports_no_usage_is_charged_the_hold(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_app("chat-a", _short_answers_engine(usage=None))
    key, _ = cluster.issue_key(tokens_per_minute=500)
    client = openai_for(await start_router(with_keys=True), api_key=key)
    await client.chat.completions.create(model="chat-a", messages=MESSAGES, max_tokens=400)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="chat-a", messages=MESSAGES, max_tokens=400)


def test_serving_without_keys_is_refused_off_loopback(cluster: Cluster) -> None:
    with pytest.raises(RouterSettingsError, match="loopback"):
        create_app(router_settings(host="0.0.0.0", no_auth=True), cluster.deps())
    with pytest.raises(RouterSettingsError, match="no API key source"):
        create_app(router_settings(no_auth=False), cluster.deps())


async def test_the_favicon_browsers_ask_for_is_served_without_a_key_and_cached(
    start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router(with_keys=True)
    async with http.get(router.url + "/favicon.ico") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "image/x-icon"
        cache = response.headers["Cache-Control"]
        body = await response.read()
    assert "public" in cache
    max_age = int(cache.split("max-age=")[1].split(",")[0])
    assert max_age >= 86400, "the icon is not asked for again on every page load"
    # An ICO directory with one 32x32 image (a PNG inside), as browsers read it.
    assert body[:6] == b"\x00\x00\x01\x00\x01\x00"
    assert (body[6], body[7]) == (32, 32)
    assert body[22:30] == b"\x89PNG\r\n\x1a\n"
    assert len(body) < 2048
    async with http.head(router.url + "/favicon.ico") as response:
        assert response.status == 200


async def test_public_paths_need_no_key_and_traversal_does_not_reach_the_api(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router(with_keys=True)
    for path in ("/", "/health", "/metrics", "/static/chat.js"):
        async with http.get(router.url + path) as response:
            assert response.status == 200, path
    for path in ("/static/../v1/models", "/static/%2e%2e/v1/models", "//v1/models", "/v1/models/"):
        async with http.get(router.url + path, headers={"Host": "127.0.0.1"}) as response:
            assert response.status in (401, 404), (path, response.status)
            assert response.status != 200
