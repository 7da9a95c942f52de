"""Each engine release's error shapes and overflow words, read (``llmgw.core.engine_errors``),
and what Claude Code 2.1.332 and Codex CLI make of them once translated.

The bodies are the engines' own, built as their source builds them (file and release
beside each); the regular expressions are Claude Code's, copied from its cli.js."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from llmgw.core import anthropic, engine_errors, responses
from llmgw.core.engine_errors import Overflow

# Claude Code 2.1.332: the overflow it shrinks max_tokens on, and the known "prompt too long".
CLAUDE_CODE_OVERFLOW = re.compile(
    r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)"
)
CLAUDE_CODE_TOO_LONG = re.compile(r"^prompt is too long: \d+ tokens > \d+ maximum$")
CLAUDE_CODE_TOO_LONG_NUMBERS = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)


def _vllm(message: str) -> dict[str, Any]:
    # vLLM's ErrorResponse (0.11.0 and 0.34.0): {"error": {message, type, param, code}}.
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


def _sglang(message: str) -> dict[str, Any]:
    # SGLang's create_error_response (serving_base.py, 0.5.3 and 0.5.23): at the top.
    return {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": 400}


def _sglang_stream(message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    # SGLang's create_streaming_error_response: the same fields under "error", in a data: event.
    return {"error": {"object": "error", "message": message, "type": kind, "param": None, "code": 400}}


def _llama(prompt: int, context: int) -> dict[str, Any]:
    # llama-server build 11434 (server_task_result_error::to_json, server-context.cpp).
    return {
        "error": {
            "code": 400,
            "message": f"request ({prompt} tokens) exceeds the available context size ({context} tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": context,
        }
    }


OVERFLOWS = [
    pytest.param(
        _vllm(
            "This model's maximum context length is 16384 tokens. However, you requested 42000 tokens "
            "(10000 in the messages, 32000 in the completion). Please reduce the length of the messages or "
            "completion."
        ),
        Overflow(10000, 32000, 16384),
        id="vllm-0.11.0-input-and-max-tokens",
    ),
    pytest.param(
        _vllm(
            "This model's maximum context length is 16384 tokens. However, your request has 17000 input "
            "tokens. Please reduce the length of the input messages."
        ),
        Overflow(17000, None, 16384),
        id="vllm-0.11.0-input",
    ),
    pytest.param(
        _vllm(
            "This model's maximum context length is 16384 tokens. However, your prompt contains at least "
            "16385 input tokens, which exceeds this limit even without any output tokens. Please reduce the "
            "length of the input prompt."
        ),
        Overflow(16385, None, 16384),
        id="vllm-0.34.0-input",
    ),
    pytest.param(
        _vllm(
            "This model's maximum context length is 16384 tokens. However, your prompt contains 900000 "
            "characters (more than 819200 characters, which is the upper bound for 16384 input tokens). "
            "Please reduce the length of the input prompt."
        ),
        Overflow(16385, None, 16384),  # over the context: the characters prove it
        id="vllm-0.34.0-characters",
    ),
    pytest.param(
        _vllm(
            "The decoder prompt (length 20000) is longer than the maximum model length of 16384. Make sure "
            "that `max_model_len` is no smaller than the number of text tokens."
        ),
        Overflow(20000, None, 16384),
        id="vllm-input-processor",
    ),
    pytest.param(
        _sglang("The input (17000 tokens) is longer than the model's context length (16384 tokens)."),
        Overflow(17000, None, 16384),
        id="sglang-input",
    ),
    pytest.param(
        _sglang(
            "Requested token count exceeds the model's maximum context length of 16384 tokens. You requested "
            "a total of 42000 tokens: 10000 tokens from the input messages and 32000 tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion to fit "
            "within the limit."
        ),
        Overflow(10000, 32000, 16384),
        id="sglang-input-and-max-tokens",
    ),
    pytest.param(
        _sglang(
            "max_completion_tokens is too large: 32000.This model supports at most 16384 completion tokens."
        ),
        Overflow(0, 32000, 16384),  # SGLang did not count the input: 0 is its lower bound
        id="sglang-max-tokens",
    ),
    pytest.param(
        _sglang_stream(
            "Input length (16380 tokens) exceeds the maximum allowed length (16378 tokens). Use a shorter "
            "input or enable --allow-auto-truncate.",
            "BAD_REQUEST",
        ),
        Overflow(16380, None, 16378),
        id="sglang-0.5.23-scheduler-in-stream",
    ),
    pytest.param(_llama(17000, 16384), Overflow(17000, None, 16384), id="llama-server-11434"),
]


@pytest.mark.parametrize(("body", "overflow"), OVERFLOWS)
def test_each_engine_s_overflow_is_read_with_its_numbers(body: dict[str, Any], overflow: Overflow) -> None:
    for given in (body, json.dumps(body).encode()):  # a stream event's JSON, or a whole answer's bytes
        error = engine_errors.read(400, given)
        assert error.overflow == overflow
        assert error.too_long


@pytest.mark.parametrize(("body", "overflow"), OVERFLOWS)
def test_messages_says_an_overflow_as_anthropic_does_so_claude_code_recovers(
    body: dict[str, Any], overflow: Overflow
) -> None:
    answer = anthropic.engine_error_body(400, json.dumps(body).encode(), "m")
    assert answer["type"] == "error"
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    message = error["message"]
    if overflow.max_tokens is not None and overflow.input_tokens < overflow.context:
        # Claude Code retries with max_tokens = context - input - 1000.
        found = CLAUDE_CODE_OVERFLOW.search(message)
        assert found is not None, message
        assert tuple(int(n) for n in found.groups()) == (
            overflow.input_tokens,
            overflow.max_tokens,
            overflow.context,
        )
    else:
        # Claude Code compacts the conversation, knowing by how much it is over.
        assert CLAUDE_CODE_TOO_LONG.match(message), message
        numbers = CLAUDE_CODE_TOO_LONG_NUMBERS.search(message)
        assert numbers is not None
        assert (int(numbers[1]), int(numbers[2])) == (overflow.input_tokens, overflow.context)


@pytest.mark.parametrize(("body", "overflow"), OVERFLOWS)
def test_responses_gives_every_engine_s_overflow_openai_s_code(
    body: dict[str, Any], overflow: Overflow
) -> None:
    refusal = responses.engine_refusal(400, json.dumps(body).encode(), "m", too_long=False)
    assert (refusal.status, refusal.code, refusal.param, refusal.type) == (
        400,
        "context_length_exceeded",
        "input",
        "invalid_request_error",
    )
    inner = body.get("error", body)
    assert refusal.message == inner["message"]  # the engine's own words, with its numbers


@pytest.mark.parametrize(
    "body",
    [
        _vllm("[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]"),
        _sglang("Tool 0 function has invalid 'parameters' schema: bad"),
        {
            "error": {
                "code": 400,
                "message": "tools param requires --jinja flag",
                "type": "invalid_request_error",
            }
        },
        {"detail": "Not Found"},
        {"error": "a string"},
        [1, 2],
    ],
)
def test_other_errors_are_not_overflows(body: object) -> None:
    error = engine_errors.read(400, json.dumps(body).encode())
    assert (error.too_long, error.overflow) == (False, None)


def test_an_error_s_fields_whatever_the_shape() -> None:
    sglang = engine_errors.read(400, json.dumps(_sglang("bad tool")).encode())
    assert (sglang.message, sglang.code, sglang.param) == ("bad tool", None, None)  # its code is the status
    openai_like = engine_errors.read(
        400, b'{"error": {"message": "no", "type": "invalid_request_error", "param": "tools", "code": "bad"}}'
    )
    assert (openai_like.message, openai_like.code, openai_like.param) == ("no", "bad", "tools")
    assert engine_errors.read(502, b"<html>bad gateway</html>").message is None


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"code": 400}, 400),
        ({"type": "BAD_REQUEST"}, 400),  # SGLang's abort, when the code is not there
        ({"code": 503, "type": "SERVICE_UNAVAILABLE"}, 503),
        ({"code": "400"}, 500),
        ({"code": True}, 500),
        ({}, 500),
    ],
)
def test_an_in_stream_error_s_status(error: dict[str, object], status: int) -> None:
    assert engine_errors.stream_status(error) == status
