"""Every engine's error shapes through the router, as Claude Code and Codex CLI would
read them: a fake engine answers each shape as its release does (the bodies are the
ones the engines' source builds, see ``tests/unit/test_engine_errors.py``), whole
(HTTP 400 before any byte) or after its 200 (SGLang's ``data: {"error": ...}`` event),
and the official ``anthropic`` and ``openai`` clients see Anthropic's and OpenAI's
errors: a context overflow in Anthropic's words and numbers on ``/v1/messages``,
``context_length_exceeded`` on ``/v1/responses``."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web

from .conftest import Cluster, OpenAIFor, StartRouter
from .test_messages import USER, AnthropicFor
from .test_messages import anthropic_for as anthropic_for  # the fixture, used here too

# Claude Code 2.1.332's own expressions (cli.js).
CLAUDE_CODE_OVERFLOW = re.compile(
    r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)"
)
CLAUDE_CODE_TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum$")

VLLM_0_11_INPUT_AND_MAX = {
    "error": {
        "message": "This model's maximum context length is 16384 tokens. However, you requested 42000 tokens "
        "(10000 in the messages, 32000 in the completion). Please reduce the length of the messages or "
        "completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
VLLM_0_34_INPUT = {
    "error": {
        "message": "This model's maximum context length is 16384 tokens. However, your prompt contains 17000 "
        "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
        "the input prompt.",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
}
SGLANG_INPUT_AND_MAX = {  # create_error_response: at the top
    "object": "error",
    "message": "Requested token count exceeds the model's maximum context length of 16384 tokens. You "
    "requested a total of 42000 tokens: 10000 tokens from the input messages and 32000 tokens for the "
    "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
    "the limit.",
    "type": "BadRequest",
    "param": None,
    "code": 400,
}
SGLANG_SCHEDULER_ABORT = {  # 0.5.23's scheduler, after the 200 (type: the status's name)
    "object": "error",
    "message": "Input length (16380 tokens) exceeds the maximum allowed length (16378 tokens). Use a shorter "
    "input or enable --allow-auto-truncate.",
    "type": "BAD_REQUEST",
    "param": None,
    "code": 400,
}
LLAMA_SERVER = {
    "error": {
        "code": 400,
        "message": "request (17000 tokens) exceeds the available context size (16384 tokens), try "
        "increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 17000,
        "n_ctx": 16384,
    }
}

# (the engine's error, whether it comes after a 200 in a stream, Anthropic's numbers)
CASES = [
    pytest.param(VLLM_0_11_INPUT_AND_MAX, False, ("max", 10000, 32000, 16384), id="vllm-0.11.0"),
    pytest.param(VLLM_0_34_INPUT, False, ("input", 17000, 16384), id="vllm-0.34.0"),
    pytest.param(SGLANG_INPUT_AND_MAX, False, ("max", 10000, 32000, 16384), id="sglang-whole"),
    pytest.param(SGLANG_INPUT_AND_MAX, True, ("max", 10000, 32000, 16384), id="sglang-0.5.3-after-200"),
    pytest.param(SGLANG_SCHEDULER_ABORT, True, ("input", 16380, 16378), id="sglang-0.5.23-scheduler"),
    pytest.param(LLAMA_SERVER, False, ("input", 17000, 16384), id="llama-server-11434"),
]


def _engine(error: dict[str, Any], after_200: bool) -> web.Application:
    """A chat engine refusing every request in ``error``'s shape: a 400 before any byte,
    or, for a stream with ``after_200``, a 200 whose only event is the error (SGLang)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not (after_200 and body.get("stream")):
            return web.json_response(error, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        inner = error if "error" in error else {"error": error}
        await response.write(b"data: " + json.dumps(inner).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _says(message: str, numbers: tuple[object, ...]) -> None:
    """``message`` is Anthropic's, with ``numbers``, as Claude Code matches it."""
    if numbers[0] == "max":
        found = CLAUDE_CODE_OVERFLOW.search(message)
    else:
        found = CLAUDE_CODE_TOO_LONG.match(message)
    assert found is not None, message
    assert tuple(int(n) for n in found.groups()) == numbers[1:]


@pytest.mark.parametrize(("error", "after_200", "numbers"), CASES)
async def test_an_overflow_on_messages_is_anthropic_s_with_the_engine_s_numbers(
    cluster: Cluster,
    start_router: StartRouter,
    anthropic_for: AnthropicFor,
    error: dict[str, Any],
    after_200: bool,
    numbers: tuple[object, ...],
) -> None:
    await cluster.add_app("chat-a", _engine(error, after_200))
    client = anthropic_for(await start_router())
    with pytest.raises(anthropic.BadRequestError) as whole:
        await client.messages.create(model="chat-a", max_tokens=32000, messages=USER)
    assert whole.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    _says(whole.value.body["error"]["message"], numbers)  # type: ignore[index]
    with pytest.raises(anthropic.APIStatusError) as streamed:
        async with client.messages.stream(model="chat-a", max_tokens=32000, messages=USER) as stream:
            async for _ in stream:
                pass
    body: Any = streamed.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    _says(body["error"]["message"], numbers)


@pytest.mark.parametrize(("error", "after_200", "numbers"), CASES)
async def test_an_overflow_on_responses_is_context_length_exceeded(
    cluster: Cluster,
    start_router: StartRouter,
    openai_for: OpenAIFor,
    error: dict[str, Any],
    after_200: bool,
    numbers: tuple[object, ...],
) -> None:
    await cluster.add_app("chat-a", _engine(error, after_200))
    client = openai_for(await start_router())
    message = error.get("error", error)["message"]
    with pytest.raises(openai.BadRequestError) as whole:
        await client.responses.create(model="chat-a", input="a long prompt")
    assert whole.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
    if not after_200:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="chat-a", input="a long prompt", stream=True)
        assert refused.value.code == "context_length_exceeded"
        return
    stream = await client.responses.create(model="chat-a", input="a long prompt", stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    failed: Any = events[-1]
    # Codex CLI 0.171.0 ends the turn on this code instead of retrying (codex-api/src/sse/responses.rs).
    assert failed.response.error.code == "context_length_exceeded"
    assert failed.response.error.message == message
