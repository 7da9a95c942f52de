"""The second attack pass (issue #28), each attack tried again against its fix: a body
that made the guard's reading quadratic, bodies nested past what any code here walks,
values of the wrong type where a set is consulted, a Responses stream whose client
stops reading, structured-output schemas the judge never read."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.core.records import ApiKeyRecord
from llmgw.core.routing import Api
from llmgw.gateway.calls import parse_call
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.errors import ApiError
from llmgw.gateway.handlers import STATIC_DIR
from llmgw.gateway.keys import RateLimiter
from tests.support.waiting import eventually

from .conftest import Cluster, StartRouter
from .test_guard import ScreeningJudge, _screening, guard_catalog

_BIG = 64 * 1024 * 1024  # what the fakes below read: more than any body the router sends


def _chat_answer(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class ArrivalJudge:
    """A judge that answers safe, keeps what it was shown, and sets ``arrived`` when
    the router's judge call comes."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.seen: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            self.arrived.set()
            self.seen.append(await request.json())
            return web.json_response(_chat_answer("judge", "safe"))

        app = web.Application(client_max_size=_BIG)
        app.router.add_post("/v1/chat/completions", chat)
        return app


def _engine_app() -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(_chat_answer("guarded", "ok"))

    app = web.Application(client_max_size=_BIG)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _one_letter_turns(size: int) -> bytes:
    """A chat body of one-letter user turns, as many as fit in ``size`` bytes: the shape
    that made the guard's joining of same-role turns quadratic."""
    turn = b'{"role":"user","content":"a"},'
    head, tail = b'{"model":"guarded","messages":[', b'{"role":"user","content":"a"}]}'
    count = (size - len(head) - len(tail)) // len(turn)
    return head + turn * count + tail


async def test_health_is_answered_while_the_largest_guarded_body_is_screened(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(guard_catalog())
    judge = ArrivalJudge()
    await cluster.add_app("judge", judge.app())
    await cluster.add_app("guarded", _engine_app())
    router = await start_router()
    body = _one_letter_turns(router.settings.guard_max_body_bytes)
    answered = 0

    async def poll_health() -> None:
        nonlocal answered
        while not judge.arrived.is_set():
            async with http.get(router.url + "/health") as response:
                assert response.status in (200, 503)
            if not judge.arrived.is_set():
                answered += 1

    async with http.post(
        router.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as sent:
        assert sent.status == 200, await sent.text()
    assert judge.seen[0]["messages"][0]["content"].count("a") == body.count(b'"a"')
    # ... and again with /health polled from the moment the request is on its way: the
    # screening (its reading of every turn) must leave the loop free to answer it.
    judge.arrived.clear()
    poller = asyncio.create_task(poll_health())
    async with http.post(
        router.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as sent:
        assert sent.status == 200
    await poller
    print(f"/health answered {answered} times while a {len(body):,}-byte guarded body was read and screened")
    # While the body still arrives a few answers go out whatever the router does with it
    # (3 here, before the fix); while it is read off the loop, hundreds.
    assert answered >= 20


class ArrivalEngine:
    """A chat engine that sets ``arrived`` when a request comes, and answers ok."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            self.arrived.set()
            await request.read()
            return web.json_response(_chat_answer("open", "ok"))

        app = web.Application(client_max_size=_BIG)
        app.router.add_post("/v1/chat/completions", chat)
        return app


async def _health_answers_until(http: aiohttp.ClientSession, url: str, done: asyncio.Event) -> int:
    answered = 0
    while not done.is_set():
        async with http.get(url + "/health") as response:
            assert response.status in (200, 503)
        if not done.is_set():
            answered += 1
    return answered


async def test_health_is_answered_while_the_largest_responses_body_is_translated(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(guard_catalog())
    engine = ArrivalEngine()
    await cluster.add_app("open", engine.app())
    limit = 8 * 1024 * 1024
    router = await start_router(max_body_bytes=limit)
    item = b'{"type":"message","role":"user","content":"a"},'
    head, tail = b'{"model":"open","store":false,"input":[', b'{"role":"user","content":"a"}]}'
    body = head + item * ((limit - len(head) - len(tail)) // len(item)) + tail
    poller = asyncio.create_task(_health_answers_until(http, router.url, engine.arrived))
    async with http.post(
        router.url + "/v1/responses", data=body, headers={"Content-Type": "application/json"}
    ) as sent:
        assert sent.status == 200, await sent.text()
        assert (await sent.json())["output"][0]["content"][0]["text"] == "ok"
    answered = await poller
    print(f"/health answered {answered} times while a {len(body):,}-byte Responses body was translated")
    # While the body still arrives a few answers go out whatever the router does with it
    # (3 here, before the fix); while it is read off the loop, hundreds.
    assert answered >= 20


_DEEP = b"[" * 100 + b"]" * 100


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (path, body)
        for path in (
            "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
            "/v1/messages", "/v1/messages/count_tokens",
        )
        for body in (
            b'{"model": "open", "messages": [{"role": "user", "content": "hi"}], "x": ' + _DEEP + b"}",
            b'{"model": "open", "input": "hi", "prompt": "hi", "max_tokens": 5, "messages": '
            + b"[" * 975 + b"]" * 975 + b"}",
        )
    ]
    + [
        ("/v1/responses", b'{"model": "open", "input": "hi", "include": [[]]}'),
        ("/v1/responses", b'{"model": "open", "input": [{"role": [], "content": "hi"}]}'),
        ("/v1/responses", b'{"model": "open", "input": [{"role": "user", "content": [{"type": []}]}]}'),
        (
            "/v1/responses",
            b'{"model": "open", "input": [{"type": "reasoning", "summary": [{"type": {}}]}]}',
        ),
        (
            "/v1/messages",
            b'{"model": "guarded", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],'
            b' "output_config": {"effort": []}}',
        ),
    ],
)  # fmt: skip
async def test_a_body_of_the_wrong_shape_is_a_400_on_every_api(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, path: str, raw: bytes
) -> None:
    cluster.set_catalog(guard_catalog())
    await cluster.add_sim("open")
    router = await start_router()
    async with http.post(router.url + path, data=raw, headers={"Content-Type": "application/json"}) as reply:
        assert reply.status == 400, await reply.text()
        body = await reply.json()
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]


def _text_firehose(progress: dict[str, Any]) -> web.Application:
    """A chat engine that streams 64 KiB text deltas as fast as it may write them: what
    every API's stream (translated or not) turns into as many bytes for the client."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"choices": [{"index": 0, "delta": {"content": "x" * 65_000}, "finish_reason": None}]}
        event = (
            b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", **delta}).encode() + b"\n\n"
        )
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


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/messages", {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
    ],
    ids=["chat", "responses", "messages"],
)
async def test_a_stream_whose_client_stops_reading_is_cut_on_every_api(
    cluster: Cluster, start_router: StartRouter, path: str, body: dict[str, Any]
) -> None:
    progress: dict[str, Any] = {"sent": 0, "cut": False}
    await cluster.add_app("chat-a", _text_firehose(progress))
    router = await start_router(client_write_timeout=0.3)
    context = router.app[CONTEXT]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", router.port))
    raw = json.dumps({"model": "chat-a", "stream": True, **body}).encode()
    await loop.sock_sendall(
        sock,
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
        + b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw,
    )  # fmt: skip
    try:
        # Never read: the router's writes block (backpressure), then its write timeout fires.
        assert await eventually(lambda: bool(progress["cut"]), within=10.0)
        assert progress["sent"] < 640  # the engine was stopped, not drained into memory
        assert await eventually(lambda: not context.book.in_flight())
    finally:
        sock.close()


_SCHEMA = {"type": "object", "properties": {"EVIL": {"type": "string", "enum": ["x"]}}}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "a", "schema": _SCHEMA}}}),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "EVIL", "schema": {}}}}),
        ("/v1/chat/completions", {"guided_choice": ["EVIL", "good"]}),
        ("/v1/chat/completions", {"guided_json": _SCHEMA}),
        ("/v1/chat/completions", {"guided_regex": "EVIL|good"}),
        ("/v1/chat/completions", {"guided_grammar": 'root ::= "EVIL"'}),
        ("/v1/chat/completions", {"structured_outputs": {"choice": ["EVIL"]}}),
        ("/v1/chat/completions", {"regex": "EVIL"}),
        ("/v1/chat/completions", {"ebnf": 'root ::= "EVIL"'}),
        ("/v1/completions", {"prompt": "hi", "guided_choice": ["EVIL"]}),
        ("/v1/completions", {"prompt": "hi", "response_format": {
            "type": "json_schema", "json_schema": {"name": "a", "schema": _SCHEMA}}}),
        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "a",
                                                              "schema": _SCHEMA}}}),
        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "EVIL",
                                                              "schema": {"type": "object"}}}}),
        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "a",
                                                              "schema": {"enum": ["EVIL"]}}}}),
    ],
)  # fmt: skip
async def test_the_guard_reads_what_structured_outputs_force_the_model_to_write(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    messages = {} if path != "/v1/chat/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    sent = {"model": "guarded", **messages, **body}
    async with http.post(router.url + path, json=sent) as reply:
        assert reply.status == 400, await reply.text()
        assert (await reply.json())["error"]["code"] == "content_policy_violation"
    assert engine.bodies == []


def _token_limited_key(tokens_per_minute: int) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id="k-0000000000000001",
        name="t",
        secret_sha256="0" * 64,
        models=None,
        requests_per_minute=None,
        tokens_per_minute=tokens_per_minute,
        created_at=0.0,
        revoked_at=None,
    )


def test_answers_without_max_tokens_cannot_overshoot_a_keys_budget_together() -> None:
    # 10 parallel requests without max_tokens on a 5,000 TPM key, each answered 3,000
    # tokens, were served 12,004 tokens (each held 1,024 and its prompt). An answer
    # without a bound holds what the key has left: the next waits for its usage.
    limiter, key = RateLimiter(), _token_limited_key(5_000)
    call = parse_call(Api.CHAT, b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    admitted = []
    for _ in range(10):
        try:
            admitted.append(limiter.admit(key, 0.0, call.tokens_to_hold(1024), unbounded=call.unbounded))
        except ApiError as exc:
            assert exc.refusal.status == 429 and exc.refusal.code == "rate_limit_exceeded"
    assert len(admitted) == 1
    first = admitted[0]
    assert first is not None
    first.settle(3_000)
    second = limiter.admit(key, 0.0, call.tokens_to_hold(1024), unbounded=call.unbounded)
    assert second is not None and second.held == 2_000  # what is left, all of it
    with pytest.raises(ApiError):
        limiter.admit(key, 0.0, call.tokens_to_hold(1024), unbounded=call.unbounded)
    # A bounded request holds its bound, as before.
    bounded = parse_call(
        Api.CHAT, b'{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
    )
    assert not bounded.unbounded
    second.settle(0)
    third = limiter.admit(key, 0.0, bounded.tokens_to_hold(1024), unbounded=bounded.unbounded)
    assert third is not None and third.held == bounded.tokens_to_hold(1024)


async def test_a_token_count_is_charged_to_the_key(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # Five counts of a 2 MB prompt on a 1,000 TPM key charged nothing and the next
    # request passed: a count is the engine's work (it tokenizes the whole prompt).
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(tokens_per_minute=1_000)
    router = await start_router(with_keys=True)
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    prompt = {"model": "sim-chat", "messages": [{"role": "user", "content": "word " * 1_000}]}
    async with http.post(router.url + "/v1/messages/count_tokens", json=prompt, headers=headers) as counted:
        assert counted.status == 200, await counted.text()
        assert (await counted.json())["input_tokens"] > 0
    message = {"model": "sim-chat", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(router.url + "/v1/messages", json=message, headers=headers) as after:
        assert after.status == 429, await after.text()
        assert (await after.json())["error"]["type"] == "rate_limit_error"


async def test_the_model_list_does_not_name_a_judge_the_key_may_not_use(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(guard_catalog())
    await cluster.add_sim("guarded")
    await cluster.add_app("judge", ArrivalJudge().app())
    scoped, _ = cluster.issue_key(models=("guarded",))
    both, _ = cluster.issue_key(name="both", models=("guarded", "judge"))
    router = await start_router(with_keys=True)
    seen = {}
    for key in (scoped, both):
        async with http.get(router.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as reply:
            assert reply.status == 200
            text = await reply.text()
        [guarded] = [m for m in json.loads(text)["data"] if m["id"] == "guarded"]
        seen[key] = guarded["llmgw"]["guard"]
    assert "judge" not in json.dumps(seen[scoped]["judges"]).replace('"judges"', "")
    assert seen[scoped]["available"] is True  # what the page needs is still said
    assert seen[both]["judges"][0]["model"] == "judge"


@pytest.mark.parametrize("path", ["/", "/static/chat.js", "/static/chat.css", "/favicon.ico"])
async def test_the_chat_page_cannot_be_framed_sniffed_or_made_to_run_another_sites_script(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, path: str
) -> None:
    router = await start_router()
    async with http.get(router.url + path) as reply:
        assert reply.status == 200
        headers = reply.headers
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Frame-Options"] == "DENY"
    policy = {part.split()[0]: part.split()[1:] for part in headers["Content-Security-Policy"].split("; ")}
    assert policy["frame-ancestors"] == ["'none'"] and policy["script-src"] == ["'self'"]
    assert policy["default-src"] == ["'self'"] and policy["object-src"] == ["'none'"]


async def test_only_the_pages_own_files_are_served_from_static(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    for path in ("/static/", "/static/index.html", "/static/nothing.js", "/static/../pyproject.toml"):
        async with http.get(router.url + path) as reply:
            assert reply.status == 404, path


def test_the_chat_page_keeps_the_api_key_for_the_tab_only() -> None:
    script = (STATIC_DIR / "chat.js").read_text()
    assert "localStorage" not in script and "sessionStorage.getItem" in script


def _message_with(**changes: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": "hi"}
    body: dict[str, Any] = {
        "model": "guarded",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [block]}],
    }
    for name, value in changes.items():
        if name in ("citations", "cache_control"):
            block[name] = value
        elif name == "thinking":
            body["messages"] = [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "hm", "signature": value}],
                },
                {"role": "user", "content": "go on"},
            ]
        else:
            body[name] = value
    return body


@pytest.mark.parametrize(
    "body",
    [
        _message_with(citations=[{"type": "char_location", "cited_text": "EVIL", "document_index": 0,
                                  "start_char_index": 0, "end_char_index": 4}]),
        _message_with(cache_control={"type": "EVIL"}),
        _message_with(thinking="EVIL"),
        _message_with(metadata={"user_id": "EVIL"}),
        _message_with(stop_sequences=["EVIL"]),
    ],
    ids=["citations", "cache_control", "signature", "metadata", "stop_sequences"],
)  # fmt: skip
async def test_a_native_messages_engine_gets_no_field_the_judge_did_not_read(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, body: dict[str, Any]
) -> None:
    # The sim serves Messages natively: it gets the client's body, so every field in
    # it must have been read by the judge (which reads the chat translation).
    cluster.set_catalog(guard_catalog())
    await cluster.add_app("judge", ScreeningJudge("EVIL").app())
    await cluster.add_sim("guarded")
    router = await start_router()
    headers = {"anthropic-version": "2023-06-01"}
    async with http.post(router.url + "/v1/messages", json=body, headers=headers) as reply:
        assert reply.status == 400, await reply.text()
        assert "content" in (await reply.json())["error"]["message"]


async def test_a_guarded_body_over_the_guards_limit_is_a_413_before_the_judge(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(guard_catalog())
    judge = ArrivalJudge()
    await cluster.add_app("judge", judge.app())
    await cluster.add_sim("guarded")
    await cluster.add_sim("open")
    router = await start_router(guard_max_body_bytes=100_000)
    long = {"messages": [{"role": "user", "content": "x" * 100_000}], "max_tokens": 1}
    async with http.post(router.url + "/v1/chat/completions", json={"model": "guarded", **long}) as reply:
        assert reply.status == 413
        error = (await reply.json())["error"]
    assert error["code"] == "request_too_large" and "100000 bytes" in error["message"]
    assert not judge.seen
    async with http.post(router.url + "/v1/chat/completions", json={"model": "open", **long}) as reply:
        assert reply.status == 200  # the router's own limit is the rest's


class HeldEngine:
    """A chat engine that answers only once ``release`` is set; ``arrived`` counts requests."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = 0

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            await request.read()
            self.arrived += 1
            await self.release.wait()
            return web.json_response(_chat_answer("chat-a", "ok"))

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


async def test_one_key_cannot_hold_more_than_its_share_of_requests(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = HeldEngine()
    await cluster.add_app("chat-a", engine.app())
    key, _ = cluster.issue_key()
    other, _ = cluster.issue_key(name="other")
    router = await start_router(with_keys=True, max_concurrent_per_key=2)
    chat = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]}

    async def post(path: str, body: dict[str, Any], api_key: str) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {api_key}", "anthropic-version": "2023-06-01"}
        async with http.post(router.url + path, json=body, headers=headers) as reply:
            return reply.status, await reply.json()

    held = [asyncio.create_task(post("/v1/chat/completions", chat, key)) for _ in range(2)]
    try:
        assert await eventually(lambda: engine.arrived == 2)
        status, body = await post("/v1/chat/completions", chat, key)
        assert (status, body["error"]["code"]) == (429, "concurrency_limit_exceeded")
        status, body = await post("/v1/responses", {"model": "chat-a", "input": "hi"}, key)
        assert (status, body["error"]["code"]) == (429, "concurrency_limit_exceeded")
        status, body = await post("/v1/messages", {**chat, "max_tokens": 5}, key)
        assert (status, body["type"], body["error"]["type"]) == (429, "error", "rate_limit_error")
        # Another key is not held back by this one's.
        held.append(asyncio.create_task(post("/v1/chat/completions", chat, other)))
        assert await eventually(lambda: engine.arrived == 3)
    finally:
        engine.release.set()
        results = await asyncio.gather(*held)
    assert [status for status, _ in results] == [200, 200, 200]
    assert (await post("/v1/chat/completions", chat, key))[0] == 200  # the slots came back
