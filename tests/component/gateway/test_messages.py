"""Anthropic's Messages API through the router, as the official ``anthropic`` client sees it.

``sim-chat`` runs on the sim, which serves /v1/messages itself (passed through);
``chat-a`` and ``chat-b`` are vLLM models (here backed by sim processes), whose pinned
release does not, so the router asks them a chat completion and translates back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp import web

from .conftest import Cluster, StartRouter, eventually, metric_value
from .test_guard import FakeJudge, guard_catalog

USER: Any = [{"role": "user", "content": "hello there"}]
# A user turn whose only block is a document: a chat completion cannot carry it and the
# guard's screen cannot read it, so the router refuses it rather than drop it.
USER_DOCUMENT: Any = [
    {
        "role": "user",
        "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
        ],
    }
]

AnthropicFor = Callable[..., anthropic.AsyncAnthropic]


@pytest.fixture
async def anthropic_for() -> AsyncIterator[AnthropicFor]:
    """The official client pointed at a router (no retries, so every answer reaches the test)."""
    clients: list[anthropic.AsyncAnthropic] = []

    def make(router: Any, api_key: str | None = "sk-none", **options: Any) -> anthropic.AsyncAnthropic:
        client = anthropic.AsyncAnthropic(
            base_url=router.url,
            api_key=api_key,
            max_retries=0,
            timeout=options.pop("timeout", 15.0),
            **options,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def _metrics(http: aiohttp.ClientSession, router: Any) -> str:
    async with http.get(router.url + "/metrics") as response:
        return await response.text()


@pytest.mark.parametrize("model", ["sim-chat", "chat-a"])
async def test_a_message_whole_and_streamed(
    model: str,
    cluster: Cluster,
    start_router: StartRouter,
    anthropic_for: AnthropicFor,
    http: aiohttp.ClientSession,
) -> None:
    await cluster.add_sim(model)
    router = await start_router()
    client = anthropic_for(router)

    message = await client.messages.create(model=model, max_tokens=5, messages=USER, system="be brief")
    assert message.type == "message" and message.role == "assistant"
    assert message.model == model
    assert message.id.startswith("msg_") and "r0" not in message.id  # no replica in the id
    [block] = message.content
    assert block.type == "text" and len(block.text.split()) == 5
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5 and message.usage.input_tokens == 4  # "be brief" + "hello there"

    events = []
    async with client.messages.stream(model=model, max_tokens=6, messages=USER) as stream:
        async for item in stream:
            events.append(item.type)
        final = await stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(
        events
    )
    assert len(final.content[0].text.split()) == 6  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 6 and final.usage.input_tokens == 2

    # Both answers' usage reaches the same counters chat completions use.
    text = await _metrics(http, router)
    assert metric_value(text, "llmgw_router_tokens_total", model=model, kind="prompt") == 6
    assert metric_value(text, "llmgw_router_tokens_total", model=model, kind="completion") == 11
    assert metric_value(text, "llmgw_router_requests_total", model=model, status="200") == 2


@pytest.mark.parametrize("model", ["sim-chat", "chat-a"])
async def test_counting_tokens(
    model: str, cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    await cluster.add_sim(model)
    client = anthropic_for(await start_router())
    counted = await client.messages.count_tokens(
        model=model, messages=[{"role": "user", "content": "one two three"}], system="four"
    )
    assert counted.input_tokens == 4


async def test_a_field_the_translation_cannot_carry_is_refused_by_name(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    await cluster.add_sim("chat-a")
    client = anthropic_for(await start_router())
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="chat-a", max_tokens=5, messages=USER_DOCUMENT)
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert "messages.0.content.0.type" in error["message"] and "document" in error["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model="chat-a", max_tokens=50, messages=USER, thinking={"type": "enabled", "budget_tokens": 10}
        )
    assert "thinking" in caught.value.message


async def test_tool_calls_are_translated_both_ways(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    """A vLLM model's chat answer with a tool call comes back as a tool_use block, and
    the conversation's tool_use/tool_result blocks reach the engine as a chat's."""
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
        }
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for chunk in (
                {
                    "id": "chatcmpl-1",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me see."}}],
                },
                {
                    "id": "chatcmpl-1",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {"index": 0, **call, "function": {"name": "weather", "arguments": ""}}
                                ]
                            },
                        }
                    ],
                },
                {
                    "id": "chatcmpl-1",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]
                            },
                        }
                    ],
                },
                {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
            ):
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    await cluster.add_app("chat-a", app)
    client = anthropic_for(await start_router())
    tools: Any = [{"name": "weather", "description": "the weather", "input_schema": {"type": "object"}}]
    messages: Any = [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t0", "name": "weather", "input": {"city": "Bergen"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "rain"}]},
    ]
    message = await client.messages.create(model="chat-a", max_tokens=20, messages=messages, tools=tools)
    assert message.stop_reason == "tool_use"
    [use] = message.content
    assert use.type == "tool_use" and use.name == "weather" and use.input == {"city": "Oslo"}
    assert seen[0]["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "parameters": {"type": "object"}, "description": "the weather"},
        }
    ]
    assert seen[0]["messages"][1]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "Bergen"}',
    }
    assert seen[0]["messages"][2] == {"role": "tool", "tool_call_id": "t0", "content": "rain"}

    async with client.messages.stream(
        model="chat-a", max_tokens=20, messages=messages, tools=tools
    ) as stream:
        final = await stream.get_final_message()
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Oslo"}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 3


async def test_errors_are_in_anthropics_shape(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()
    client = anthropic_for(router)
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client.messages.create(model="no-such-model", max_tokens=5, messages=USER)
    assert caught.value.body == {  # type: ignore[comparison-overlap]
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "The model `no-such-model` does not exist or you do not have access to it.",
        },
    }
    # switched-off: 503, no retry
    with pytest.raises(anthropic.ServiceUnavailableError) as unavailable:
        await client.messages.create(model="switched-off", max_tokens=5, messages=USER)
    assert unavailable.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert unavailable.value.response.headers["x-should-retry"] == "false"
    async with http.post(
        router.url + "/v1/messages", json={"model": "sim-chat", "messages": USER}
    ) as response:
        assert response.status == 400
        assert await response.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
        }
    # The OpenAI paths keep OpenAI's shape.
    async with http.post(
        router.url + "/v1/chat/completions", json={"model": "nope", "messages": USER}
    ) as response:
        assert (await response.json())["error"]["code"] == "model_not_found"


async def test_a_model_loading_is_a_retryable_503_and_a_stream_ends_with_an_error_event(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    with pytest.raises(anthropic.ServiceUnavailableError) as caught:
        await anthropic_for(router).messages.create(model="sleepy", max_tokens=5, messages=USER)
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "Retry-After" in caught.value.response.headers
    # A stream's head went with the loading comments: the refusal is Anthropic's error event.
    body = {"model": "sleepy", "max_tokens": 5, "messages": USER, "stream": True}
    async with http.post(router.url + "/v1/messages", json=body) as response:
        raw = await response.text()
    assert raw.startswith(": loading model\n\n")
    assert raw.endswith('"}}\n\n') and "event: error\ndata: " in raw
    event = json.loads(raw.split("event: error\ndata: ")[1])
    assert event["type"] == "error" and event["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.APIStatusError):  # what the client raises on it
        async with anthropic_for(router).messages.stream(
            model="sleepy", max_tokens=5, messages=USER
        ) as stream:
            async for _ in stream:
                pass


async def test_an_on_demand_model_is_loaded_for_a_message(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    client = anthropic_for(await start_router(load_wait=5.0, load_wait_streaming=5.0))
    waiting = asyncio.create_task(client.messages.create(model="sleepy", max_tokens=3, messages=USER))
    assert await eventually(lambda: bool(cluster.sink.wakes("sleepy")))  # the wake-up went out
    await cluster.add_sim("sleepy")
    message = await waiting
    assert message.model == "sleepy" and len(message.content[0].text.split()) == 3  # type: ignore[union-attr]


async def test_a_fallback_answers_a_message_and_is_counted(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor, http: aiohttp.ClientSession
) -> None:
    """chat-a (vLLM, translated) has no replica: its fallback sim-chat (native) answers."""
    await cluster.add_sim("sim-chat")
    router = await start_router()
    raw = await anthropic_for(router).messages.with_raw_response.create(
        model="chat-a", max_tokens=3, messages=USER
    )
    assert raw.headers["x-llmgw-model"] == "sim-chat"
    message = await raw.parse()
    assert message.model == "sim-chat" and message.type == "message"
    text = await _metrics(http, router)
    assert metric_value(text, "llmgw_router_fallbacks_total", requested="chat-a", served="sim-chat") == 1
    assert metric_value(text, "llmgw_router_tokens_total", model="sim-chat", kind="completion") == 3


# --- keys -----------------------------------------------------------------------------------------


async def test_x_api_key_and_bearer_both_authenticate_and_a_key_keeps_its_models(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    await cluster.add_sim("sim-chat")
    await cluster.add_sim("chat-b")
    key, _ = cluster.issue_key(models=["chat-b"])
    router = await start_router(with_keys=True)
    by_header = anthropic_for(router, api_key=key)  # x-api-key
    by_bearer = anthropic_for(router, api_key=None, auth_token=key)  # Claude Code's ANTHROPIC_AUTH_TOKEN
    for client in (by_header, by_bearer):
        message = await client.messages.create(model="chat-b", max_tokens=2, messages=USER)
        assert message.model == "chat-b"
        # A model the key was not given looks like one that does not exist.
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="sim-chat", max_tokens=2, messages=USER)
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.count_tokens(model="sim-chat", messages=USER)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await anthropic_for(router, api_key="sk-llmgw-nope.nope").messages.create(
            model="chat-b", max_tokens=2, messages=USER
        )
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_two_different_keys_in_one_request_are_refused(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """A client holding a narrow key and a broad one must not get the broad one's rights
    by sending both: whichever header the router read first."""
    await cluster.add_sim("sim-chat")
    narrow, _ = cluster.issue_key(name="narrow", models=["chat-b"])
    broad, _ = cluster.issue_key(name="broad")
    router = await start_router(with_keys=True)
    body = {"model": "sim-chat", "max_tokens": 2, "messages": USER}
    for headers in (
        {"x-api-key": narrow, "Authorization": f"Bearer {broad}"},
        {"x-api-key": broad, "Authorization": f"Bearer {narrow}"},
        {"x-api-key": broad, "Authorization": f"Basic {broad}"},
        {"x-api-key": broad, "Authorization": ""},
        {"x-api-key": "", "Authorization": f"Bearer {broad}"},
    ):
        for path in ("/v1/messages", "/v1/chat/completions"):
            async with http.post(router.url + path, json=body, headers=headers) as response:
                assert response.status == 401, (headers, path)
                answer = await response.json()
            if path == "/v1/messages":
                assert answer["error"]["type"] == "authentication_error"
            else:
                assert answer["error"]["type"] == "invalid_request_error"
    async with http.post(
        router.url + "/v1/messages",
        json=body,
        headers={"x-api-key": broad, "Authorization": f"Bearer {broad}"},
    ) as response:
        assert response.status == 200  # the same key twice is one key
    async with http.post(router.url + "/v1/messages", json=body) as response:
        assert response.status == 401
        assert "x-api-key" in (await response.json())["error"]["message"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_usage_of_messages_settles_a_token_limited_key(
    streamed: bool, cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    """The answer's usage (a whole message's, a stream's message_start and message_delta)
    is what the key pays, native and translated alike. A prompt of one long word holds
    ~95 tokens (4 bytes a token) and uses 1: only a settled hold leaves room for the
    second request; the third finds the budget spent."""
    await cluster.add_sim("sim-chat")
    await cluster.add_sim("chat-b")
    long_word: Any = [{"role": "user", "content": "x" * 300}]
    for model in ("sim-chat", "chat-b"):
        key, _ = cluster.issue_key(name=model, tokens_per_minute=200)
        client = anthropic_for(await start_router(with_keys=True), api_key=key)
        if streamed:
            async with client.messages.stream(model=model, max_tokens=60, messages=long_word) as stream:
                first = await stream.get_final_message()
        else:
            first = await client.messages.create(model=model, max_tokens=60, messages=long_word)
        assert (first.usage.input_tokens, first.usage.output_tokens) == (1, 60)
        second = await client.messages.create(model=model, max_tokens=100, messages=USER)
        assert second.usage.output_tokens == 100
        with pytest.raises(anthropic.RateLimitError) as caught:
            await client.messages.create(model=model, max_tokens=40, messages=USER)
        assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert "Retry-After" in caught.value.response.headers


# --- the guard ------------------------------------------------------------------------------------


async def test_the_guard_screens_every_field_that_reaches_the_prompt(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    cluster.set_catalog(guard_catalog())
    judge = FakeJudge("unsafe\nS1")
    await cluster.add_app("judge", judge.app())
    await cluster.add_sim("guarded")
    client = anthropic_for(await start_router())
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(
            model="guarded",
            max_tokens=5,
            system=[{"type": "text", "text": "SYSTEM-TEXT"}],
            tools=[
                {"name": "TOOL-NAME", "description": "TOOL-DESCRIPTION", "input_schema": {"type": "object"}}
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "USER-TEXT"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "TOOL-NAME", "input": {"q": "TOOL-INPUT"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "TOOL-RESULT"}],
                        }
                    ],
                },
            ],
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "content policy" in caught.value.message and "S1" in caught.value.message
    screened = json.dumps(judge.seen[0]["messages"])
    for text in ("SYSTEM-TEXT", "TOOL-NAME", "TOOL-DESCRIPTION", "USER-TEXT", "TOOL-INPUT", "TOOL-RESULT"):
        assert text in screened, text
    judge.verdict = "safe"
    message = await client.messages.create(model="guarded", max_tokens=2, messages=USER)
    assert message.model == "guarded"
    # A block the screen cannot read is refused, not passed on unscreened.
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(model="guarded", max_tokens=2, messages=USER_DOCUMENT)
    assert "guard policy" in refused.value.message


async def test_an_engine_breaking_midway_ends_the_stream_with_anthropics_error_event(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor, http: aiohttp.ClientSession
) -> None:
    """A translated stream whose engine resets after two words: the client has them,
    then an ``error`` event in Anthropic's shape (no retry: the engine did the work)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in ("alpha", " beta"):
            chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        assert request.transport is not None
        request.transport.abort()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    await cluster.add_app("chat-a", app)
    router = await start_router()
    texts: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        async with anthropic_for(router).messages.stream(
            model="chat-a", max_tokens=5, messages=USER
        ) as stream:
            async for text in stream.text_stream:
                texts.append(text)
    assert "".join(texts) == "alpha beta"
    assert caught.value.body == {  # type: ignore[comparison-overlap]
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The model `chat-a` stopped answering midway; the output above is incomplete.",
        },
    }
    text = await _metrics(http, router)
    assert metric_value(text, "llmgw_router_stream_errors_total", model="chat-a") == 1


async def test_an_engines_unreadable_answer_is_a_502_in_anthropics_shape_not_a_200(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    """chat-a (vLLM, translated) answers 200 with a body that is no JSON, to a message
    and to its token count (/tokenize): the client gets an error it can act on, with an
    error status, never a 200 whose body is an error."""

    async def broken(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"<html>proxy says hi</html>", content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", broken)
    app.router.add_post("/tokenize", broken)
    await cluster.add_app("chat-a", app)
    client = anthropic_for(await start_router())
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client.messages.create(model="chat-a", max_tokens=2, messages=USER)
    assert caught.value.status_code == 502
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "chat-a" in caught.value.message
    with pytest.raises(anthropic.APIStatusError) as counted:
        await client.messages.count_tokens(model="chat-a", messages=USER)
    assert counted.value.status_code == 502
    assert counted.value.body["error"]["type"] == "api_error"  # type: ignore[index]


async def test_a_native_streams_input_tokens_come_from_its_message_start(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor, http: aiohttp.ClientSession
) -> None:
    """An engine that serves Messages the way llama.cpp does: the input tokens (some of
    them from its cache) only in message_start, the output tokens in message_delta."""

    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    async def messages(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "sim-chat", "content": []}
        usage = {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 0}
        await response.write(event("message_start", {"message": {**start, "usage": usage}}))
        await response.write(
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        )
        await response.write(
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hi"}})
        )
        await response.write(event("content_block_stop", {"index": 0}))
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        await response.write(event("message_delta", {"delta": delta, "usage": {"output_tokens": 7}}))
        await response.write(event("message_stop", {}))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    await cluster.add_app("sim-chat", app)
    router = await start_router()
    async with anthropic_for(router).messages.stream(model="sim-chat", max_tokens=9, messages=USER) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == "hi"  # type: ignore[union-attr]
    text = await _metrics(http, router)
    assert metric_value(text, "llmgw_router_tokens_total", model="sim-chat", kind="prompt") == 10
    assert metric_value(text, "llmgw_router_tokens_total", model="sim-chat", kind="completion") == 7


async def test_a_model_whose_engine_cannot_count_tokens_says_so_and_other_apis_are_refused(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    cluster.set_catalog(
        """
models:
  on-sglang:
    roles: [chat]
    profiles: [{engine: sglang, source: org/m}]
    scaling: {min: 1, max: 1}
  embed:
    roles: [embedding]
    profiles: [{engine: sim}]
    scaling: {min: 1, max: 1}
"""
    )
    await cluster.add_sim("on-sglang")
    client = anthropic_for(await start_router())
    # SGLang 0.5.3 has neither /v1/messages/count_tokens nor /tokenize: a 400, not a guess.
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.count_tokens(model="on-sglang", messages=USER)
    assert "cannot count tokens" in caught.value.message
    # ... while its messages are translated to chat completions.
    message = await client.messages.create(model="on-sglang", max_tokens=2, messages=USER)
    assert len(message.content[0].text.split()) == 2  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError) as wrong:
        await client.messages.create(model="embed", max_tokens=2, messages=USER)
    assert wrong.value.body["error"]["message"] == "The model `embed` does not support the messages API."  # type: ignore[index]


async def test_a_fallback_that_cannot_carry_a_field_is_left_out(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    """``native`` (the sim) takes extended thinking as it is; its fallback ``translated``
    (vLLM) could not carry it, so it never answers such a request in its place."""
    cluster.set_catalog(
        """
models:
  native:
    roles: [chat]
    profiles: [{engine: sim}]
    scaling: {min: 1, max: 1}
  translated:
    roles: [chat]
    profiles: [{engine: vllm, source: org/m}]
    scaling: {min: 1, max: 1}
fallbacks:
  native: [translated]
"""
    )
    await cluster.add_sim("translated")
    client = anthropic_for(await start_router())
    thinking: Any = {"type": "enabled", "budget_tokens": 10}
    with pytest.raises(anthropic.ServiceUnavailableError):  # native has no replica, and no stand-in
        await client.messages.create(model="native", max_tokens=20, messages=USER, thinking=thinking)
    message = await client.messages.create(model="native", max_tokens=2, messages=USER)
    assert message.model == "translated"  # without the field, the fallback answers
    await cluster.add_sim("native")
    message = await client.messages.create(model="native", max_tokens=20, messages=USER, thinking=thinking)
    assert message.model == "native"
    # Its token count too: counted by native, not refused for the fallback's sake.
    counted = await client.messages.count_tokens(model="native", messages=USER, thinking=thinking)
    assert counted.input_tokens == 2


async def test_an_engines_reasoning_is_a_thinking_block_whole_streamed_and_sent_back(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    # A chat engine (vLLM's profile: translated) answering as its reasoning parser does.
    await cluster.add_sim("chat-a", reasoning_tokens=3)
    client = anthropic_for(await start_router())

    message = await client.messages.create(model="chat-a", max_tokens=5, messages=USER)
    assert [block.type for block in message.content] == ["thinking", "text"]
    thinking = message.content[0]
    assert thinking.type == "thinking" and len(thinking.thinking.split()) == 3 and thinking.signature == ""
    assert message.usage.output_tokens == 5

    deltas = []
    async with client.messages.stream(model="chat-a", max_tokens=5, messages=USER) as stream:
        async for item in stream:
            if item.type == "content_block_delta":
                deltas.append((item.index, item.delta.type))
        final = await stream.get_final_message()
    assert deltas == [(0, "thinking_delta")] * 3 + [(0, "signature_delta")] + [(1, "text_delta")] * 2
    assert final.content[0].type == "thinking" and final.content[0].thinking == thinking.thinking
    assert final.content[0].signature == ""

    # The answer sent back as the assistant turn, thinking block and all (as Claude Code does).
    turns: Any = [
        *USER,
        {"role": "assistant", "content": final.to_dict()["content"]},
        {"role": "user", "content": "go on"},
    ]
    again = await client.messages.create(model="chat-a", max_tokens=2, messages=turns)
    assert again.stop_reason == "max_tokens"
    assert again.usage.input_tokens == 2 + 2 + 2  # the sim counts the texts; the thinking went beside them


async def test_adaptive_thinking_shown_omitted_answers_thinking_blocks_without_their_text(
    cluster: Cluster, start_router: StartRouter, anthropic_for: AnthropicFor
) -> None:
    # What Claude Code 2.1.332 asks on every request, to a translated model that reasons.
    await cluster.add_sim("chat-a", reasoning_tokens=3)
    client = anthropic_for(await start_router())
    thinking: Any = {"type": "adaptive", "display": "omitted"}
    asked: Any = {"model": "chat-a", "max_tokens": 5, "messages": USER, "thinking": thinking}

    message = await client.messages.create(**asked, output_config={"effort": "low"})
    assert message.content[0].to_dict() == {
        "type": "thinking", "thinking": "", "signature": ""
    }  # fmt: skip
    assert message.content[1].type == "text" and len(message.content[1].text.split()) == 2

    deltas = []
    async with client.messages.stream(**asked) as stream:
        async for item in stream:
            if item.type == "content_block_delta":
                deltas.append((item.index, item.delta.type))
        final = await stream.get_final_message()
    assert deltas == [(0, "signature_delta")] + [(1, "text_delta")] * 2
    assert final.content[0].type == "thinking" and final.content[0].thinking == ""
