"""Every reader of a client's body holds against values of the wrong shape: each value
of a rich request (Codex CLI's and Claude Code's, with every part type the
translations know), replaced in turn by a list, an object, a number or null, is
refused with the reader's own error, never a TypeError or KeyError (which the
router answered with a 500: a list checked against a set of strings is unhashable).
And a body nested deeper than ``MAX_JSON_DEPTH`` is refused at the door."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llmgw.core import anthropic, responses
from llmgw.core.json_values import MAX_JSON_DEPTH
from llmgw.core.routing import Api
from llmgw.gateway.calls import json_object, parse_call
from llmgw.gateway.errors import ApiError
from llmgw.gateway.guard import judge_messages

RESPONSES_BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "instructions": "be brief",
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer",
         "content": [{"type": "input_text", "text": "r"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "hi"},
            {"type": "input_image", "image_url": "data:,", "detail": "low"},
        ]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
         "content": [{"type": "reasoning_text", "text": "t"}]},
        {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "c1", "name": "f",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "o"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"},
                                                            {"type": "refusal", "refusal": "no"}]},
    ],
    "tools": [{"type": "function", "name": "f", "description": "d", "strict": False,
               "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}],
    "tool_choice": {"type": "function", "name": "f"},
    "parallel_tool_calls": True,
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k",
    "client_metadata": {"session_id": "s"},
    "metadata": {"a": "b"},
    "max_output_tokens": 10,
    "temperature": 0.5,
    "service_tier": "auto",
    "truncation": "disabled",
    "user": "u",
}  # fmt: skip

MESSAGES_BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 100,
    "stream": True,
    "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "hi", "citations": []},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.invalid/i.png"}},
        ]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": ""},
            {"type": "text", "text": "calling"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "out"}],
             "is_error": False, "cache_control": {"type": "ephemeral"}},
        ]},
        {"role": "system", "content": "env"},
    ],
    "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"},
               "defer_loading": True, "cache_control": {"type": "ephemeral"}}],
    "tool_choice": {"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
    "stop_sequences": ["x"],
    "temperature": 0.1,
    "top_p": 0.9,
    "top_k": 5,
    "metadata": {"user_id": "u"},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "service_tier": "auto",
}  # fmt: skip

CHAT_BODY: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s", "name": "n"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "reasoning_content": "r",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
         "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "tool", "tool_call_id": "c", "content": "o"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
    "chat_template_kwargs": {"enable_thinking": False},
    "max_tokens": 3,
    "stream": True,
    "stream_options": {"include_usage": True},
}  # fmt: skip

WRONG_SHAPES: list[object] = [[], {}, [[]], {"a": []}, 7, None, True]


def _mutations(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], object]]:
    """(path, replacement) for every value under ``value`` and every wrong shape."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        for shape in WRONG_SHAPES:
            yield (*path, key), shape
        yield from _mutations(item, (*path, key))


def _replaced(body: dict[str, Any], path: tuple[Any, ...], shape: object) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    where: Any = changed
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = copy.deepcopy(shape)
    return changed


def _read_responses(body: dict[str, Any]) -> None:
    try:
        parsed = responses.parse_request(body)
    except responses.ResponsesInvalid:
        return
    chat = responses.chat_after(parsed, ({"role": "user", "content": "earlier"},))
    _read_chat(chat)


def _read_messages(body: dict[str, Any]) -> None:
    try:
        call = parse_call(Api.MESSAGES, json.dumps(body).encode())
        anthropic.to_chat(call.body)
        judge_messages(call, images=True)
    except (ApiError, anthropic.Untranslatable):
        return


def _read_chat(body: dict[str, Any]) -> None:
    try:
        call = parse_call(Api.CHAT, json.dumps(body).encode())
        judge_messages(call, images=True)
        call.tokens_to_hold(1024)
    except ApiError:
        return


READERS: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], None]]] = [
    ("responses", RESPONSES_BODY, _read_responses),
    ("messages", MESSAGES_BODY, _read_messages),
    ("chat", CHAT_BODY, _read_chat),
]


@pytest.mark.parametrize(("name", "body", "read"), READERS, ids=[r[0] for r in READERS])
def test_every_value_of_the_wrong_shape_is_a_clear_refusal(
    name: str, body: dict[str, Any], read: Callable[[dict[str, Any]], None]
) -> None:
    read(copy.deepcopy(body))  # the body itself is read whole
    failures = []
    for path, shape in _mutations(body):
        try:
            read(_replaced(body, path, shape))
        except Exception as exc:  # anything but the reader's own refusal is a 500
            failures.append(f"{'.'.join(map(str, path))} = {json.dumps(shape)}: {type(exc).__name__}: {exc}")
    assert failures == []


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_a_body_nested_past_the_limit_is_refused_at_the_door(opening: bytes) -> None:
    closing = b"]" if opening == b"[" else b"}"

    def nested(depth: int) -> bytes:  # the body object is one level
        inner = opening * (depth - 1) + b"1" + closing * (depth - 1)
        return b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":' + inner + b"}"

    # ``messages`` holds its message at depth 3; ``x`` reaches depth ``depth``.
    assert json_object(nested(MAX_JSON_DEPTH))["model"] == "m"
    for depth in (MAX_JSON_DEPTH + 1, 975, 100_000):
        with pytest.raises(ApiError) as refused:
            json_object(nested(depth))
        assert refused.value.refusal.status == 400
        assert f"nested more than {MAX_JSON_DEPTH} levels" in refused.value.refusal.message
