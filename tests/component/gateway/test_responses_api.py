"""The Responses API (``/v1/responses``) through the router, as the official client sees it:
real simulated engines behind real routers, the ``openai`` SDK's ``responses.create``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.core.responses import parse_stored_name
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.ports import MemoryResponseStore, process_sealing_keys

from .conftest import Cluster, OpenAIFor, StartRouter, eventually, metric_value, router_settings
from .test_guard import guard_catalog

RESPONSE_ID = re.compile(r"^resp_[0-9a-f]{48}$")


async def test_a_response_whole_and_streamed(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    client = openai_for(await start_router())

    response = await client.responses.create(
        model="sim-chat", instructions="be brief", input="hello there", max_output_tokens=5
    )
    assert RESPONSE_ID.match(response.id)
    assert response.object == "response" and response.model == "sim-chat"
    assert len(response.output_text.split()) == 5
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"  # the sim stops at the cap
    assert response.usage is not None
    assert response.usage.output_tokens == 5
    assert response.usage.total_tokens == response.usage.input_tokens + 5
    assert response.instructions == "be brief" and response.store is True

    stream = await client.responses.create(
        model="sim-chat", input="hello there", max_output_tokens=4, stream=True
    )
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[4:8] == ["response.output_text.delta"] * 4
    assert types[8:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert RESPONSE_ID.match(final.id) and final.id != response.id
    assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.output_tokens == 4


def _stored_ids(store: MemoryResponseStore) -> set[str]:
    return {parsed.response_id for name in store.values if (parsed := parse_stored_name(name)) is not None}


@contextlib.asynccontextmanager
async def _routers_sharing_a_store(cluster: Cluster, count: int) -> AsyncIterator[list[RouterServer]]:
    store = MemoryResponseStore()
    keys = process_sealing_keys()  # the same key on every router, as LLMGW_RESPONSES_KEYS gives
    routers = [
        RouterServer(router_settings(), replace(cluster.deps(), responses=store, response_keys=keys))
        for _ in range(count)
    ]
    for router in routers:
        await router.start()
    try:
        for router in routers:
            context = router.app[CONTEXT]
            assert await eventually(
                lambda c=context: c.catalogs.catalog is not None and c.book.generation > 0
            )  # type: ignore[misc]
        yield routers
    finally:
        for router in routers:
            await router.stop()


async def test_a_follow_up_reaches_another_router_and_another_replica(
    cluster: Cluster, openai_for: OpenAIFor
) -> None:
    first_engine = await cluster.add_sim("sim-chat")
    second_engine = await cluster.add_sim("sim-chat")
    async with _routers_sharing_a_store(cluster, 2) as routers:
        a, b = (openai_for(router) for router in routers)
        raw = await a.responses.with_raw_response.create(
            model="sim-chat", input="hello there", max_output_tokens=5
        )
        first = raw.parse()
        served_by = raw.headers["x-llmgw-replica"]
        # The id says nothing of who answered.
        assert served_by not in first.id and "node" not in first.id and RESPONSE_ID.match(first.id)
        # The replica that answered goes away: the follow-up must be answered by the other one.
        gone = first_engine if first_engine.endpoint.replica == served_by else second_engine
        cluster.remove(gone)
        assert await eventually(lambda: routers[1].app[CONTEXT].book.usable_count("sim-chat") == 1)

        raw = await b.responses.with_raw_response.create(
            model="sim-chat", input="and again", previous_response_id=first.id, max_output_tokens=3
        )
        again = raw.parse()
        assert raw.headers["x-llmgw-replica"] != served_by
        assert again.previous_response_id == first.id and len(again.output_text.split()) == 3
        # The engine read the first turn (its input and its answer) before the new input.
        assert first.usage is not None and again.usage is not None
        assert again.usage.input_tokens == first.usage.input_tokens + first.usage.output_tokens + 2

        # A streamed follow-up of the follow-up, on the first router.
        stream = await a.responses.create(
            model="sim-chat", input="more", previous_response_id=again.id, max_output_tokens=2, stream=True
        )
        events = [event async for event in stream]
        final = events[-1].response  # type: ignore[union-attr]
        assert final.usage is not None
        assert final.usage.input_tokens == again.usage.input_tokens + again.usage.output_tokens + 1


async def test_state_errors_as_openai_answers_them(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    mine, theirs = cluster.issue_key("mine")[0], cluster.issue_key("theirs")[0]
    router = await start_router(with_keys=True)
    client, other = openai_for(router, api_key=mine), openai_for(router, api_key=theirs)
    stored = await client.responses.create(model="sim-chat", input="hello", max_output_tokens=2)
    unstored = await client.responses.create(
        model="sim-chat", input="hello", max_output_tokens=2, store=False
    )
    assert unstored.store is False

    for who, previous in (
        (other, stored.id),  # another key's response: as if it did not exist
        (client, unstored.id),  # store: false
        (client, "resp_" + "0" * 48),  # never drawn
        (client, "../keys/abc"),  # not an id at all
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            await who.responses.create(model="sim-chat", input="again", previous_response_id=previous)
        assert caught.value.code == "previous_response_not_found"
        assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    follow = await client.responses.create(model="sim-chat", input="again", previous_response_id=stored.id)
    assert follow.previous_response_id == stored.id


async def test_a_stored_response_expires_after_its_retention(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    client = openai_for(await start_router(responses_retention=60.0))
    stored = await client.responses.create(model="sim-chat", input="hello", max_output_tokens=2)
    cluster.clock.now += 61
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="sim-chat", input="again", previous_response_id=stored.id)
    assert caught.value.code == "previous_response_not_found"


async def test_every_router_sweeps_expired_responses_from_the_store(
    cluster: Cluster, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    store = MemoryResponseStore()
    router = RouterServer(
        router_settings(responses_retention=60.0, responses_sweep_interval=0.05),
        replace(cluster.deps(), responses=store),
    )
    await router.start()
    try:
        client = openai_for(router)
        assert await eventually(lambda: router.app[CONTEXT].book.generation > 0)
        old = await client.responses.create(model="sim-chat", input="hello", max_output_tokens=1)
        cluster.clock.now += 30
        new = await client.responses.create(model="sim-chat", input="hello", max_output_tokens=1)
        assert _stored_ids(store) == {old.id, new.id}
        cluster.clock.now += 31  # old is past its 60 s, new is not
        assert await eventually(lambda: _stored_ids(store) == {new.id})
    finally:
        await router.stop()


async def test_a_conversation_over_the_size_cap_is_refused_before_the_engine(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat")
    client = openai_for(await start_router(responses_max_bytes=1000))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="sim-chat", input="word " * 300, max_output_tokens=2)
    assert caught.value.code == "conversation_too_large"
    assert "store set to false" in caught.value.message
    assert (await engine.stats(http))["requests_total"] == 0
    unstored = await client.responses.create(
        model="sim-chat", input="word " * 300, max_output_tokens=2, store=False
    )
    assert unstored.status == "incomplete"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        pytest.param({"background": True}, "background", id="background"),
        pytest.param({"tools": [{"type": "web_search"}]}, "tools[0].type", id="a built-in tool"),
        pytest.param({"truncation": "auto"}, "truncation", id="truncation auto"),
        pytest.param({"include": ["file_search_call.results"]}, "include[0]", id="an include it cannot fill"),
        pytest.param(
            {"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", id="an item reference"
        ),
        pytest.param({"text": {"format": {"type": "grammar"}}}, "text.format.type", id="a text format"),
        pytest.param({"reasoning": {"summary": "detailed"}}, "reasoning.summary", id="reasoning summaries"),
    ],
)
async def test_what_the_translation_cannot_carry_is_a_400_naming_it(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, extra: dict[str, Any], param: str
) -> None:
    await cluster.add_sim("sim-chat")
    client = openai_for(await start_router())
    body: dict[str, Any] = {"input": "hello", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="sim-chat", **body)
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert param.split("[")[0].split(".")[0] in caught.value.message


async def test_models_keys_and_apis(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    await cluster.add_sim("embed")
    scoped = cluster.issue_key("scoped", models=["embed"])[0]
    anyone = cluster.issue_key("anyone")[0]
    router = await start_router(with_keys=True)
    with pytest.raises(openai.NotFoundError) as caught:
        await openai_for(router, api_key=scoped).responses.create(model="sim-chat", input="hello")
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        await openai_for(router, api_key=anyone).responses.create(model="embed", input="hello")
    assert refused.value.code == "model_not_supported"
    with pytest.raises(openai.AuthenticationError):
        await openai_for(router, api_key="sk-wrong").responses.create(model="sim-chat", input="hello")
    aliased = await openai_for(router, api_key=anyone).responses.create(
        model="fast", input="hi", max_output_tokens=1
    )
    assert aliased.model == "sim-chat"  # the alias's target, as chat completions name it


async def test_every_field_that_reaches_the_prompt_is_screened(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    cluster.set_catalog(guard_catalog())
    await cluster.add_sim("judge", judge_unsafe_phrase="forbidden fruit")
    model = await cluster.add_sim("guarded")
    client = openai_for(await start_router())
    fine = await client.responses.create(model="guarded", input="how do I bake bread?", max_output_tokens=2)
    assert fine.status == "incomplete"
    call = {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"}
    tool = {"type": "function", "name": "look", "parameters": {"type": "object"}}
    for body in (
        {"input": "where is the Forbidden Fruit?"},
        {"instructions": "talk about the forbidden fruit", "input": "hi"},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "the forbidden fruit"}]}]},
        {"input": [call, {"type": "function_call_output", "call_id": "c1", "output": "forbidden fruit"}]},
        {"input": "hi", "tools": [{**tool, "description": "finds the forbidden fruit"}]},
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="guarded", **body)  # type: ignore[arg-type]
        assert caught.value.code == "content_policy_violation", body
    # A follow-up's stored turns are screened again with the new input.
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="guarded", input="forbidden fruit", previous_response_id=fine.id)
    assert caught.value.code == "content_policy_violation"
    assert (await model.stats(http))["requests_total"] == 1  # only the first reached the model


async def test_a_fallback_answers_and_is_counted(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")  # chat-a and chat-b have no replica: chat-a falls back to sim-chat
    router = await start_router()
    raw = await openai_for(router).responses.with_raw_response.create(
        model="chat-a", input="hi", max_output_tokens=2
    )
    assert raw.headers["x-llmgw-model"] == "sim-chat"
    assert raw.parse().model == "sim-chat"  # the model that answered, as chat completions name it
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "llmgw_router_fallbacks_total", requested="chat-a", served="sim-chat") == 1


async def test_a_stream_for_a_sleeping_model_waits_for_its_load(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router(load_wait_streaming=5.0, loading_comment_interval=0.05))
    waiting = asyncio.create_task(
        client.responses.create(model="sleepy", input="hello", max_output_tokens=3, stream=True)
    )
    assert await eventually(lambda: bool(cluster.sink.wakes("sleepy")))  # the router woke it
    await cluster.add_sim("sleepy")
    stream = await waiting
    events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert len(events[-1].response.output_text.split()) == 3  # type: ignore[union-attr]


async def test_usage_reaches_the_metrics_and_the_keys_budget(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    key = cluster.issue_key(tokens_per_minute=150)[0]
    router = await start_router(with_keys=True)
    client = openai_for(router, api_key=key)
    whole = await client.responses.create(model="sim-chat", input="hello there", max_output_tokens=5)
    stream = await client.responses.create(
        model="sim-chat", input="hello there", max_output_tokens=40, stream=True
    )
    streamed = [event async for event in stream][-1].response  # type: ignore[union-attr]
    assert whole.usage is not None and streamed.usage is not None
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "llmgw_router_tokens_total", model="sim-chat", kind="completion") == 45
    prompt = whole.usage.input_tokens + streamed.usage.input_tokens
    assert metric_value(text, "llmgw_router_tokens_total", model="sim-chat", kind="prompt") == prompt
    # Each request held its prompt's estimate (its chat body's bytes / 4, about 25
    # tokens) and its max_output_tokens, and was then charged its usage: 7 and 42 of
    # 150. Had the stream kept its hold (about 65), this one (about 75) would not fit.
    fits = await client.responses.create(model="sim-chat", input="hi", max_output_tokens=50)
    assert fits.usage is not None and fits.usage.output_tokens == 50
    # Now 150 - 7 - 42 - 51 = 50 are left: a request holding more is refused.
    with pytest.raises(openai.RateLimitError) as caught:
        await client.responses.create(model="sim-chat", input="hi", max_output_tokens=40)
    assert caught.value.body["type"] == "tokens"  # type: ignore[index]


def _engine(stream_then_break: bool) -> web.Application:
    """An engine that refuses every request (400, its own words), or streams a word and breaks."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not stream_then_break:
            error = {"message": "This model's maximum context length is 8 tokens.", "type": "BadRequestError"}
            return web.json_response({"error": {**error, "param": None, "code": 400}}, status=400)
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"alpha"}}]}\n\n')
        assert request.transport is not None
        request.transport.close()  # mid-stream: the chunked body never ends
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_an_engines_refusal_reaches_the_client_in_its_words(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_app("sim-chat", _engine(stream_then_break=False))
    client = openai_for(await start_router())
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="sim-chat", input="a long prompt", stream=stream)
        # OpenAI's shape and code for a prompt past the context, the engine's words.
        assert caught.value.body == {
            "message": "This model's maximum context length is 8 tokens.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }


async def test_a_stream_that_breaks_ends_with_an_error_event_and_response_failed(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    await cluster.add_app("sim-chat", _engine(stream_then_break=True))
    router = await start_router()
    stream = await openai_for(router).responses.create(model="sim-chat", input="hi", stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events][-3:] == ["response.output_text.delta", "error", "response.failed"]
    assert events[-1].response.status == "failed"  # type: ignore[union-attr]
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert (
        metric_value(text, "llmgw_router_stream_errors_total", model="sim-chat", reason="upstream-broken")
        == 1
    )


async def test_a_body_that_is_not_text_is_refused_as_chat_refuses_it(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """A lone surrogate escape is JSON but no text an engine can be sent: OpenAI's 400
    for an unparsable body, on /v1/responses as on /v1/chat/completions (never a 500)."""
    await cluster.add_sim("sim-chat")
    router = await start_router()
    for path, body in (
        ("/v1/responses", b'{"model":"sim-chat","input":"hi \\ud800"}'),
        ("/v1/chat/completions", b'{"model":"sim-chat","messages":[{"role":"user","content":"hi \\ud800"}]}'),
    ):
        async with http.post(
            router.url + path, data=body, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 400, path
            answer = await response.json()
        assert answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["message"].startswith("We could not parse the JSON body of your request.")


async def test_an_engines_reasoning_reaches_the_client_whole_and_streamed(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    # The sim answers as vLLM with --reasoning-parser: 3 tokens of reasoning_content first.
    await cluster.add_sim("sim-chat", reasoning_tokens=3)
    client = openai_for(await start_router())

    response = await client.responses.create(model="sim-chat", input="think first", max_output_tokens=5)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert reasoning.content is not None and reasoning.content[0].type == "reasoning_text"
    thought = reasoning.content[0].text
    assert len(thought.split()) == 3 and len(response.output_text.split()) == 2
    assert response.usage is not None and response.usage.output_tokens == 5
    # vLLM 0.11.0's chat usage has no reasoning count, so neither has the Response.
    assert response.usage.output_tokens_details.reasoning_tokens == 0

    stream = await client.responses.create(
        model="sim-chat", input="think first", max_output_tokens=5, stream=True
    )
    events = [event async for event in stream]
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * 3,
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 2,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(e.delta for e in deltas) == thought  # the same prompt, the same words
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    item_id = events[2].item.id  # type: ignore[union-attr]
    assert done.text == thought and {e.item_id for e in [*deltas, done]} == {item_id}
    assert {(e.output_index, e.content_index) for e in [*deltas, done]} == {(0, 0)}
    text_deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert {e.output_index for e in text_deltas} == {1}
    final = events[-1].response  # type: ignore[union-attr]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].id == item_id and final.output_text == "".join(e.delta for e in text_deltas)


def _reasoning_engine(seen: list[dict[str, Any]]) -> web.Application:
    """An engine that answers as vLLM's reasoning parser does and keeps each request's messages."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        message = {"role": "assistant", "reasoning_content": f"thought {len(seen)}", "content": "answer"}
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for delta, finish in (
                ({"role": "assistant", "content": ""}, None),
                ({"reasoning_content": "thought "}, None),
                ({"reasoning_content": str(len(seen))}, None),
                ({"content": "answer"}, "stop"),
            ):
                chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(
            {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_reasoning_goes_back_to_the_engine_stored_or_sent_back(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    seen: list[dict[str, Any]] = []
    await cluster.add_app("sim-chat", _reasoning_engine(seen))
    client = openai_for(await start_router())
    first = await client.responses.create(model="sim-chat", input="q1")
    assert first.output[0].type == "reasoning"
    turn = {"role": "assistant", "content": "answer", "reasoning_content": "thought 1"}

    # A follow-up of a stored response: the router's stored turns carry the reasoning.
    await client.responses.create(model="sim-chat", input="q2", previous_response_id=first.id)
    assert seen[-1]["messages"] == [
        {"role": "user", "content": "q1"},
        turn,
        {"role": "user", "content": "q2"},
    ]

    # store false, the output sent back as input (as Codex CLI and the Agents SDK do).
    items: Any = [
        {"role": "user", "content": "q1"},
        *(item.model_dump(exclude_none=True) for item in first.output),
    ]
    await client.responses.create(
        model="sim-chat", input=[*items, {"role": "user", "content": "q2"}], store=False
    )
    assert seen[-1]["messages"] == [
        {"role": "user", "content": "q1"},
        turn,
        {"role": "user", "content": "q2"},
    ]

    # Reasoning encrypted by another provider cannot be carried: a 400 naming it, the engine never asked.
    asked = len(seen)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(
            model="sim-chat",
            input=[
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"},
                {"role": "user", "content": "q"},
            ],
            store=False,
        )
    assert caught.value.param == "input[0].encrypted_content" and len(seen) == asked

    # The SDK's stream helper builds the Response from the events as they come.
    async with client.responses.stream(model="sim-chat", input="q3", store=False) as helper:
        async for _ in helper:
            pass
        built = await helper.get_final_response()
    assert [item.type for item in built.output] == ["reasoning", "message"]
    assert built.output[0].content[0].text == f"thought {len(seen)}"  # type: ignore[union-attr,index]
    assert built.output_text == "answer"
