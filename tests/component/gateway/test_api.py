"""The OpenAI API through the router, as the official client sees it: answers, streams,
usage, the model list, passthrough of fields the router does not know, and error shapes."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from .conftest import Cluster, OpenAIFor, StartRouter, metric_value

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


async def test_chat_completion_names_the_model_and_replica(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    raw = await client.chat.completions.with_raw_response.create(
        model="sim-chat", messages=MESSAGES, max_tokens=5
    )
    completion = raw.parse()
    assert completion.model == "sim-chat"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert raw.headers["x-llmgw-model"] == "sim-chat"
    assert raw.headers["x-llmgw-replica"] == engine.endpoint.replica
    assert raw.headers["x-request-id"]


async def test_an_alias_answers_as_its_model(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    client = openai_for(await start_router())
    completion = await client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=3)
    assert completion.model == "sim-chat"


async def test_streaming_passes_chunks_and_usage_only_when_asked(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    client = openai_for(await start_router())
    whole = await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=8)

    stream = await client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=8, stream=True
    )
    pieces = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == whole.choices[0].message.content
    assert all(c.usage is None for c in pieces)
    assert pieces[-1].choices[0].finish_reason == "length"

    stream = await client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    pieces = [chunk async for chunk in stream]
    assert pieces[-1].choices == []
    assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 8


async def test_completions_and_embeddings(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    await cluster.add_sim("embed")
    client = openai_for(await start_router())
    completion = await client.completions.create(model="sim-chat", prompt="once upon", max_tokens=4)
    assert completion.model == "sim-chat" and completion.choices[0].text
    stream = await client.completions.create(model="sim-chat", prompt="once upon", max_tokens=4, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == completion.choices[0].text
    embedding = await client.embeddings.create(model="embed", input=["a", "b"])
    assert len(embedding.data) == 2 and len(embedding.data[0].embedding) > 0
    assert embedding.usage.prompt_tokens == 2


async def test_a_model_without_the_role_is_refused(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("embed")
    client = openai_for(await start_router())
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="embed", messages=MESSAGES)
    assert caught.value.code == "model_not_supported"


def _recording_engine(seen: list[dict[str, Any]]) -> web.Application:
    """An engine that records what reached it and answers with a tool call."""

    async def chat(request: web.Request) -> web.Response:
        seen.append({"body": await request.json(), "headers": dict(request.headers)})
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "chat-a",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                                }
                            ],
                        },
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_unknown_fields_pass_through_and_credentials_do_not(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    seen: list[dict[str, Any]] = []
    await cluster.add_app("chat-a", _recording_engine(seen))
    client = openai_for(await start_router(), api_key="sk-client-secret")
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    completion = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        tools=tools,
        tool_choice="auto",
        extra_body={
            "some_future_field": {"x": 1},
            "api_base": "http://169.254.169.254/",
            "base_url": "http://evil.example/",
            "api_key": "sk-smuggled",
        },
    )
    call = completion.choices[0].message.tool_calls
    assert call is not None and call[0].function.name == "get_weather"  # type: ignore[union-attr]
    body = seen[0]["body"]
    assert body["model"] == "chat-a"  # the alias resolved
    assert body["tools"] == tools and body["tool_choice"] == "auto"
    assert body["some_future_field"] == {"x": 1}
    assert not {"api_base", "base_url", "api_key"} & set(body)
    headers = {k.lower(): v for k, v in seen[0]["headers"].items()}
    assert "authorization" not in headers
    assert "sk-client-secret" not in json.dumps(seen)


async def test_model_list_has_aliases_and_marks_simulated_models(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router())
    models = {m.id: m for m in (await client.models.list()).data}
    assert {"chat-a", "sim-chat", "gpt-4o-mini", "fast", "sleepy"} <= set(models)
    assert models["chat-a"].owned_by == "llmgw"
    assert models["sim-chat"].owned_by == "llmgw-sim"
    assert models["fast"].owned_by == "llmgw-sim"  # an alias of a simulated model
    ids = list(models)
    assert ids.index("chat-a") < ids.index("sim-chat")  # real models first
    one = await client.models.retrieve("gpt-4o-mini")
    assert one.id == "gpt-4o-mini" and one.owned_by == "llmgw"
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("gpt-5")
    assert caught.value.code == "model_not_found"


async def test_unknown_model_gets_openais_exact_404(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    async with http.post(
        router.url + "/v1/chat/completions", json={"model": "gpt-5", "messages": MESSAGES}
    ) as response:
        assert response.status == 404
        assert await response.json() == {
            "error": {
                "message": "The model `gpt-5` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        }
    assert cluster.sink.reports == [] or not cluster.sink.wakes("gpt-5")


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b"[1, 2]", None, "JSON object"),
        (b'{"messages": []}', "model", "provide a model"),
        (b'{"model": 5, "messages": []}', "model", "not of type 'string'"),
        (b'{"model": "sim-chat"}', "messages", "Missing required parameter"),
        (b'{"model": "sim-chat", "messages": "hi"}', "messages", "not of type 'array'"),
        (b'{"model": "sim-chat", "messages": []}', "messages", "empty array"),
        (b'{"model": "sim-chat", "messages": [{"content": "x"}]}', "messages.[0].role", "role"),
        (b'{"model": "sim-chat", "messages": [{"role": "user"}], "stream": "yes"}', "stream", "boolean"),
        (
            b'{"model": "sim-chat", "messages": [{"role": "user"}], "max_tokens": "9"}',
            "max_tokens",
            "integer",
        ),
    ],
)
async def test_malformed_requests_get_openais_400(
    cluster: Cluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
    body: bytes,
    param: str | None,
    fragment: str,
) -> None:
    router = await start_router()
    async with http.post(
        router.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert fragment in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "body",
    [
        # Each a body the router writes again before the engine gets it: an alias (the
        # model is renamed), a stripped credential field, and a guarded model (below).
        b'{"model": "fast", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "sim-chat", "api_key": "x", "messages": [{"role": "user", "content": "\\udfff"}]}',
        b'{"model": "fast", "messages": [{"role": "user", "content": "ok", "\\ud800": 1}]}',
        # The bytes of a surrogate, which json.loads reads as one too.
        b'{"model": "fast", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        # A body that is sent on as it came gets the same answer.
        b'{"model": "sim-chat", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    ],
)
async def test_a_lone_surrogate_gets_openais_400_without_a_traceback(
    cluster: Cluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await start_router()
    with caplog.at_level(logging.INFO, logger="llmgw"):
        async with http.post(
            router.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] is None
    assert "could not parse the JSON body" in error["message"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert (await engine.stats(http))["requests_total"] == 0
    # A surrogate pair (an emoji, as Python's json.dumps escapes it) is text: it goes on.
    pair = b'{"model": "fast", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 1}'
    async with http.post(
        router.url + "/v1/chat/completions", data=pair, headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 200


async def test_unknown_urls_and_methods_are_openai_shaped(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    async with http.get(router.url + "/v1/nothing-here") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "unknown_url"
    async with http.get(router.url + "/v1/chat/completions") as response:
        assert response.status == 405
        assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_health_and_metrics_answer(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router()
    async with http.get(router.url + "/health") as response:
        health = await response.json()
    assert response.status == 200 and health["status"] == "ok"
    assert health["endpoints"] == 1 and health["usable_endpoints"] == 1
    assert health["consul"]["endpoints"]["healthy"] is True
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert "llmgw_router_consul_watch_up" in text


async def test_metrics_count_requests_latency_first_tokens_and_usage(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await start_router()
    client = openai_for(router)
    stream = await client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    [chunk async for chunk in stream]
    await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    replica = engine.endpoint.replica
    assert metric_value(text, "llmgw_router_requests_total", model="sim-chat", status="200") == 2
    assert metric_value(text, "llmgw_router_requests_total", model="", status="404") == 1
    assert metric_value(text, "llmgw_router_request_seconds_count", model="sim-chat") == 2
    assert metric_value(text, "llmgw_router_time_to_first_token_seconds_count", model="sim-chat") == 1
    assert metric_value(text, "llmgw_router_tokens_total", model="sim-chat", kind="completion") == 10
    assert metric_value(text, "llmgw_router_in_flight", model="sim-chat", replica=replica) == 0
