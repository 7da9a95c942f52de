"""The sim through the official OpenAI client, as a user of the API sees it."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from llmgw.sim import vocabulary
from tests.support.sim import TEST_MODEL, fast_settings

from .conftest import ClientFor, StartServer


def _is_greek(text: str) -> bool:
    words = text.split(" ")
    return bool(words) and all(word in vocabulary.GREEK for word in words)


async def test_chat_completion_returns_greek_words_up_to_max_tokens(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server())
    reply = await client.chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "say something nice"}], max_tokens=7
    )
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == TEST_MODEL
    assert reply.system_fingerprint and reply.system_fingerprint.startswith("fp_")
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content is not None and _is_greek(choice.message.content)
    assert len(choice.message.content.split()) == 7
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (3, 7, 10)


async def test_answer_tokens_ends_an_answer_with_a_stop_before_max_tokens(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server(fast_settings(answer_tokens=3)))
    user: Any = [{"role": "user", "content": "say something nice"}]
    short = await client.chat.completions.create(model=TEST_MODEL, messages=user, max_tokens=7)
    assert short.choices[0].finish_reason == "stop" and short.usage is not None
    assert short.usage.completion_tokens == 3 and len((short.choices[0].message.content or "").split()) == 3
    chunks = [
        c async for c in await client.chat.completions.create(model=TEST_MODEL, messages=user, stream=True)
    ]
    assert chunks[-1].choices[0].finish_reason == "stop"
    # max_tokens under it still cuts the answer there.
    cut = await client.chat.completions.create(model=TEST_MODEL, messages=user, max_tokens=2)
    assert cut.choices[0].finish_reason == "length"


async def test_same_prompt_same_answer_and_default_max_tokens(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server(fast_settings(default_max_tokens=5)))
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "repeat"}]
    first = await client.chat.completions.create(model=TEST_MODEL, messages=messages)
    second = await client.chat.completions.create(model=TEST_MODEL, messages=messages)
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.usage is not None and first.usage.completion_tokens == 5
    assert first.choices[0].finish_reason == "stop"  # the sim's own stop, not a cut at max_tokens


async def test_max_completion_tokens_is_honoured(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    reply = await client.chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "x"}], max_completion_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3


async def test_streamed_chat_starts_with_the_role_and_joins_to_the_full_text(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server())
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "stream it"}]
    whole = await client.chat.completions.create(model=TEST_MODEL, messages=messages, max_tokens=6)
    stream = await client.chat.completions.create(
        model=TEST_MODEL, messages=messages, max_tokens=6, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == whole.choices[0].message.content
    assert len(chunks) == 1 + 6 + 1  # role, one per token, finish


async def test_include_usage_adds_a_final_chunk_without_choices(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server())
    stream = await client.chat.completions.create(
        model=TEST_MODEL,
        messages=[{"role": "user", "content": "count me in"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (3, 4, 7)
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_raw_sse_framing_ends_with_done(start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server()
    body = {"model": TEST_MODEL, "prompt": "raw", "max_tokens": 2, "stream": True}
    async with http.post(server.make_url("/v1/completions"), json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = await response.read()
    events = raw.split(b"\n\n")
    assert events[-1] == b""  # every event ends with a blank line
    assert events[-2] == b"data: [DONE]"
    assert all(event.startswith(b"data: {") for event in events[:-2])


async def test_text_completion_plain_and_streamed(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    whole = await client.completions.create(model=TEST_MODEL, prompt="once upon a time", max_tokens=5)
    assert whole.object == "text_completion"
    assert whole.id.startswith("cmpl-")
    assert whole.choices[0].finish_reason == "length"
    assert _is_greek(whole.choices[0].text)
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (4, 5)
    stream = await client.completions.create(
        model=TEST_MODEL,
        prompt="once upon a time",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


async def test_tool_fields_pass_through(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    reply = await client.chat.completions.create(
        model=TEST_MODEL,
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
        tool_choice="auto",
        temperature=0.3,
        max_tokens=2,
        extra_body={"top_k": 5, "repetition_penalty": 1.1},
    )
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("encoding", ["float", None])
async def test_embeddings_are_deterministic_unit_vectors(
    start_server: StartServer, client_for: ClientFor, encoding: str | None
) -> None:
    # Without encoding_format the client asks for base64 and decodes it: both paths must agree.
    client = client_for(await start_server(fast_settings(embedding_dim=16)))
    inputs = ["first text", "second"]
    if encoding is None:
        result = await client.embeddings.create(model=TEST_MODEL, input=inputs)
    else:
        result = await client.embeddings.create(model=TEST_MODEL, input=inputs, encoding_format="float")
    assert result.model == TEST_MODEL
    assert [item.index for item in result.data] == [0, 1]
    vectors = [item.embedding for item in result.data]
    assert all(len(vector) == 16 for vector in vectors)
    assert all(math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-5) for vector in vectors)
    assert vectors[0] != vectors[1]
    assert list(vectors[0]) == list(vocabulary.embedding_vector("first text", 16))
    assert result.usage.prompt_tokens == 3


async def test_embeddings_raw_base64_is_little_endian_float32(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server(fast_settings(embedding_dim=8))
    body = {"model": TEST_MODEL, "input": "x", "encoding_format": "base64"}
    async with http.post(server.make_url("/v1/embeddings"), json=body) as response:
        payload = await response.json()
    encoded = payload["data"][0]["embedding"]
    assert isinstance(encoded, str)
    assert struct.unpack("<8f", base64.b64decode(encoded)) == vocabulary.embedding_vector("x", 8)


async def test_embedding_dimensions_shorten_the_vector(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server(fast_settings(embedding_dim=16)))
    result = await client.embeddings.create(model=TEST_MODEL, input="short", dimensions=4)
    assert len(result.data[0].embedding) == 4


async def test_models_lists_the_served_name(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    models = [model async for model in client.models.list()]
    assert [(m.id, m.object, m.owned_by) for m in models] == [(TEST_MODEL, "model", "llmgw-sim")]
    assert models[0].created > 0


async def test_wrong_model_is_openai_404(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 404
    assert caught.value.code == "model_not_found"
    assert caught.value.type == "invalid_request_error"
    assert "gpt-nope" in caught.value.message


async def test_missing_field_is_openai_400(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=TEST_MODEL, messages=[])
    assert caught.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.post("/completions", body={"model": TEST_MODEL}, cast_to=object)
    assert caught.value.param == "prompt"
    assert caught.value.code == "missing_required_parameter"


async def test_n_above_one_is_refused(start_server: StartServer, client_for: ClientFor) -> None:
    client = client_for(await start_server())
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=TEST_MODEL, messages=[{"role": "user", "content": "x"}], n=2
        )
    assert caught.value.param == "n"


async def _raw_error(
    http: aiohttp.ClientSession, server: TestServer, path: str, data: bytes
) -> tuple[int, object]:
    async with http.post(server.make_url(path), data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b"\xff\xfe"])
async def test_bad_json_is_openai_400(
    start_server: StartServer, http: aiohttp.ClientSession, data: bytes
) -> None:
    server = await start_server()
    status, body = await _raw_error(http, server, "/v1/chat/completions", data)
    assert status == 400
    assert isinstance(body, dict)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"


async def test_unknown_path_is_openai_404(start_server: StartServer, http: aiohttp.ClientSession) -> None:
    server = await start_server()
    async with http.get(server.make_url("/v1/nothing-here")) as response:
        assert response.status == 404
        body = await response.json()
    assert body["error"]["code"] == "unknown_url"


async def test_wrong_method_is_an_openai_shaped_405(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server()
    async with http.get(server.make_url("/v1/chat/completions")) as response:
        assert response.status == 405
        body = await response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_long_prompts_beyond_a_mebibyte_are_read(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server(fast_settings(max_model_len=1_000_000)))
    prompt = "word " * 300_000  # 1.5 MB of JSON
    reply = await client.completions.create(model=TEST_MODEL, prompt=prompt, max_tokens=1)
    assert reply.usage is not None and reply.usage.prompt_tokens == 300_000


async def test_a_judge_sim_answers_safe_or_unsafe_and_completions_stay_greek(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server(fast_settings(judge_unsafe_phrase="forbidden fruit")))

    async def verdict(text: str) -> str | None:
        reply = await client.chat.completions.create(
            model=TEST_MODEL, messages=[{"role": "user", "content": text}], max_tokens=10
        )
        return reply.choices[0].message.content

    assert await verdict("how do I bake bread?") == "safe"
    assert await verdict("where is the Forbidden Fruit?") == "unsafe"
    stream = await client.chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "forbidden fruit"}], stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "unsafe"
    completion = await client.completions.create(model=TEST_MODEL, prompt="forbidden fruit", max_tokens=3)
    assert _is_greek(completion.choices[0].text)  # a judge is a chat model; completions are unchanged


async def test_a_reasoning_sim_sends_reasoning_content_first_as_vllms_reasoning_parser(
    start_server: StartServer, client_for: ClientFor
) -> None:
    server = await start_server(fast_settings(reasoning_tokens=3))
    client = client_for(server)
    messages: Any = [{"role": "user", "content": "think about it"}]
    reply = await client.chat.completions.create(model=TEST_MODEL, messages=messages, max_tokens=5)
    message = reply.choices[0].message.model_dump()
    assert len(message["reasoning_content"].split()) == 3 and _is_greek(message["reasoning_content"])
    assert len(message["content"].split()) == 2  # the rest of max_tokens
    assert reply.usage is not None and reply.usage.completion_tokens == 5  # reasoning is generated too

    stream = await client.chat.completions.create(
        model=TEST_MODEL, messages=messages, max_tokens=5, stream=True
    )
    deltas = [
        chunk.choices[0].delta.model_dump(exclude_unset=True) async for chunk in stream if chunk.choices
    ]
    assert deltas[0] == {"role": "assistant", "content": "", "refusal": None}
    assert [set(delta) for delta in deltas[1:-1]] == [{"reasoning_content"}] * 3 + [{"content"}] * 2
    assert "".join(d["reasoning_content"] for d in deltas[1:4]) == message["reasoning_content"]
    assert "".join(d["content"] for d in deltas[4:6]) == message["content"]

    # All of a small budget goes to the reasoning: no content (null), as vLLM's parser leaves it.
    reply = await client.chat.completions.create(model=TEST_MODEL, messages=messages, max_tokens=2)
    assert reply.choices[0].message.content is None
    assert len(reply.choices[0].message.model_dump()["reasoning_content"].split()) == 2
    completion = await client.completions.create(model=TEST_MODEL, prompt="think", max_tokens=4)
    assert len(completion.choices[0].text.split()) == 4  # text completions never reason

    # Without the setting, an answer has no reasoning_content at all (the sim's default).
    plain = client_for(await start_server(fast_settings()))
    reply = await plain.chat.completions.create(model=TEST_MODEL, messages=messages, max_tokens=2)
    assert "reasoning_content" not in reply.choices[0].message.model_dump(exclude_unset=True)


async def test_api_key_guards_v1_as_vllm_does_and_leaves_health_and_metrics_open(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    """vLLM's AuthenticationMiddleware: /v1/* needs the Bearer key, 401 {"error": "Unauthorized"}."""
    from dataclasses import replace

    server = await start_server(replace(fast_settings(), api_key="k-123"))
    body = {"model": TEST_MODEL, "prompt": "x", "max_tokens": 1}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic k-123"},
        {"Authorization": "k-123"},
    ):
        async with http.post(server.make_url("/v1/completions"), json=body, headers=headers) as response:
            assert response.status == 401, headers
            assert await response.json() == {"error": "Unauthorized"}
        async with http.get(server.make_url("/v1/models"), headers=headers) as response:
            assert response.status == 401
    async with http.post(
        server.make_url("/v1/completions"), json=body, headers={"Authorization": "Bearer k-123"}
    ) as response:
        assert response.status == 200
    # What vLLM leaves open: /health (the Consul check needs no key) and /metrics.
    for path in ("/health", "/metrics"):
        async with http.get(server.make_url(path)) as response:
            assert response.status in (200, 503), path


_SHELL_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "shell",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}


async def test_tool_calls_answer_a_turn_that_offers_the_tool_with_a_call_as_vllm_does(
    start_server: StartServer, client_for: ClientFor
) -> None:
    settings = fast_settings(
        answer_tokens=3, tool_calls=(("absent", "{}"), ("shell", '{"cmd": "echo hi there"}'))
    )
    client = client_for(await start_server(settings))
    user: Any = [{"role": "user", "content": "run it"}]
    whole = await client.chat.completions.create(model=TEST_MODEL, messages=user, tools=[_SHELL_TOOL])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("shell", '{"cmd": "echo hi there"}')  # type: ignore[union-attr]
    assert whole.usage is not None and whole.usage.completion_tokens == 4  # {"cmd": "echo hi there"}

    stream = await client.chat.completions.create(
        model=TEST_MODEL,
        messages=user,
        tools=[_SHELL_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    # The id, type and name first, then the arguments a token at a time, all at index 0.
    assert deltas[0].id and deltas[0].id.startswith("chatcmpl-tool-") and deltas[0].type == "function"
    assert deltas[0].function is not None and deltas[0].function.name == "shell"
    assert {d.index for d in deltas} == {0} and all(d.id is None for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == '{"cmd": "echo hi there"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_tool_calls_answer_text_after_the_result_or_without_the_tool(
    start_server: StartServer, client_for: ClientFor
) -> None:
    client = client_for(await start_server(fast_settings(answer_tokens=3, tool_calls=(("shell", "{}"),))))
    call: Any = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
    after: Any = [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "hi"},
    ]
    other: Any = {**_SHELL_TOOL, "function": {**_SHELL_TOOL["function"], "name": "other"}}
    for messages, tools, choice in (
        (after, [_SHELL_TOOL], "auto"),  # the result came back: the loop ends
        (after[:1], [other], "auto"),  # not offered
        (after[:1], [_SHELL_TOOL], "none"),  # offered, but not to be called
    ):
        reply = await client.chat.completions.create(
            model=TEST_MODEL, messages=messages, tools=tools, tool_choice=choice
        )
        assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls
        assert _is_greek(reply.choices[0].message.content or "")
    # Without the setting (the default) an offered tool is never called.
    plain = client_for(await start_server())
    reply = await plain.chat.completions.create(model=TEST_MODEL, messages=after[:1], tools=[_SHELL_TOOL])
    assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls
