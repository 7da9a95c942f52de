"""Parsing OpenAI request bodies and building the exact response shapes, as plain tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.sim import openai_api
from llmgw.sim.openai_api import ApiError, EncodingFormat, Endpoint, Limits, ResponseIdentity

LIMITS = Limits(default_max_tokens=16, max_model_len=100, embedding_dim=8)
IDENTITY = ResponseIdentity(id="chatcmpl-1", created=1700000000, model="m", system_fingerprint="fp_x")


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello big world"}], **extra}


def test_chat_defaults_and_prompt_tokens() -> None:
    request = openai_api.parse_chat(_chat(), LIMITS)
    assert request.endpoint is Endpoint.CHAT
    # vLLM's chat default is the rest of the context, not the completions' 16.
    assert request.max_tokens == LIMITS.max_model_len - 3
    assert request.prompt_tokens == 3
    assert request.stream is False and request.include_usage is False


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert openai_api.parse_chat(_chat(max_tokens=5, max_completion_tokens=7), LIMITS).max_tokens == 7
    assert openai_api.parse_chat(_chat(max_tokens=5), LIMITS).max_tokens == 5


def test_unknown_fields_and_tool_messages_are_accepted() -> None:
    body = _chat(
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        tool_choice="auto",
        temperature=0.2,
        some_future_field={"x": 1},
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "two words"}, {"type": "image_url"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "result here"},
        ],
    )
    assert openai_api.parse_chat(body, LIMITS).prompt_tokens == 6


def test_stream_options_include_usage() -> None:
    request = openai_api.parse_chat(_chat(stream=True, stream_options={"include_usage": True}), LIMITS)
    assert request.stream and request.include_usage


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model", "missing_required_parameter"),
        ({"model": "m"}, 400, "messages", "missing_required_parameter"),
        ({"model": "m", "messages": []}, 400, "messages", "empty_array"),
        ({"model": "m", "messages": "hi"}, 400, "messages", "invalid_type"),
        (_chat(max_tokens="5"), 400, "max_tokens", "invalid_type"),
        (_chat(max_tokens=0), 400, "max_tokens", "integer_below_min_value"),
        (_chat(n=2), 400, "n", "unsupported_value"),
        (_chat(stream_options={"include_usage": True}), 400, "stream_options", "invalid_value"),
        (
            {"model": "m", "messages": [{"content": "x"}]},
            400,
            "messages[0].role",
            "missing_required_parameter",
        ),
    ],
)
def test_chat_errors_name_the_parameter(body: dict[str, Any], status: int, param: str, code: str) -> None:
    with pytest.raises(ApiError) as caught:
        openai_api.parse_chat(body, LIMITS)
    error = caught.value.body()["error"]
    assert caught.value.status == status
    assert error == {
        "message": caught.value.message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            _chat(max_tokens=98),
            "This model's maximum context length is 100 tokens. However, you requested 101 tokens "
            "(3 in the messages, 98 in the completion). Please reduce the length of the messages or "
            "completion.",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "word " * 100}]},
            "This model's maximum context length is 100 tokens. However, your request has 100 input "
            "tokens. Please reduce the length of the input messages.",
        ),
    ],
)
def test_a_prompt_over_the_context_gets_vllms_answer(body: dict[str, Any], message: str) -> None:
    # vLLM's envelope, not OpenAI's: type BadRequestError, the HTTP status as code, no param.
    with pytest.raises(ApiError) as caught:
        openai_api.parse_chat(body, LIMITS)
    assert caught.value.status == 400
    assert caught.value.body() == {
        "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    }


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [("one two", 2), (["one two three"], 3), ([1, 2, 3, 4], 4), ([[5, 6]], 2), ("", 0)],
)
def test_completion_prompt_forms(prompt: object, tokens: int) -> None:
    request = openai_api.parse_completion({"model": "m", "prompt": prompt}, LIMITS)
    assert request.endpoint is Endpoint.COMPLETION
    assert request.prompt_tokens == tokens


def test_completion_refuses_batched_prompts() -> None:
    with pytest.raises(ApiError) as caught:
        openai_api.parse_completion({"model": "m", "prompt": ["a", "b"]}, LIMITS)
    assert caught.value.param == "prompt"


@pytest.mark.parametrize(
    ("raw", "count"),
    [("text", 1), (["a", "b c"], 2), ([1, 2, 3], 1), ([[1], [2, 3]], 2)],
)
def test_embedding_inputs(raw: object, count: int) -> None:
    request = openai_api.parse_embeddings({"model": "m", "input": raw}, LIMITS)
    assert len(request.inputs) == count
    assert request.encoding_format is EncodingFormat.FLOAT


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"model": "m", "input": "x", "dimensions": 9}, "dimensions"),
    ],
)
def test_embedding_errors(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        openai_api.parse_embeddings(body, LIMITS)
    assert caught.value.status == 400
    assert caught.value.param == param


def test_chat_chunks_follow_openai_streaming() -> None:
    request = openai_api.parse_chat(_chat(stream=True), LIMITS)
    role = openai_api.chunk(request, IDENTITY, None, role=True)
    content = openai_api.chunk(request, IDENTITY, " beta")
    last = openai_api.chunk(request, IDENTITY, None, "length")
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert content["choices"][0] == {
        "index": 0,
        "delta": {"content": " beta"},
        "logprobs": None,
        "finish_reason": None,
    }
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
    assert "usage" not in content  # only present when include_usage is asked


def test_include_usage_puts_null_usage_on_chunks_and_a_final_usage_chunk() -> None:
    request = openai_api.parse_chat(_chat(stream=True, stream_options={"include_usage": True}), LIMITS)
    assert openai_api.chunk(request, IDENTITY, "alpha")["usage"] is None
    final = openai_api.usage_chunk(request, IDENTITY, 4)
    assert final["choices"] == []
    assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_sse_framing_is_compact_json_and_blank_line() -> None:
    event = openai_api.sse_event({"a": 1, "b": [1, 2]})
    assert event == b'data: {"a":1,"b":[1,2]}\n\n'
    assert openai_api.SSE_DONE == b"data: [DONE]\n\n"


def test_text_completion_body() -> None:
    request = openai_api.parse_completion({"model": "m", "prompt": "a b"}, LIMITS)
    body = openai_api.completion_body(request, IDENTITY, "alpha beta", 2, "length")
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"text": "alpha beta", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    json.dumps(body)  # serialisable as is


def test_error_envelope_shape() -> None:
    assert openai_api.model_not_found("gpt-x").body() == {
        "error": {
            "message": "The model `gpt-x` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert openai_api.model_not_found("gpt-x").status == 404
