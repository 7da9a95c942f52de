"""The Messages API's pure parts: the translation to a chat completion and back."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from anthropic.types import Message

from llmgw.core import anthropic
from llmgw.core.routing import Api
from llmgw.gateway.calls import parse_call
from llmgw.gateway.guard import judge_messages


def test_a_request_becomes_the_chat_completion_that_asks_the_same() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "temperature": 0.5,
        "top_k": 3,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u1"},
        "stream": True,
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
                    {"type": "text", "text": "and?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
                ],
            },
        ],
    }
    assert anthropic.to_chat(body) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "calling",
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "42"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
                ],
            },
        ],
        "max_tokens": 9,
        "temperature": 0.5,
        "top_k": 3,
        "stop": ["END"],
        "user": "u1",
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object"}, "description": "d"},
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.type"),
        ({"container": "c"}, "container"),
        ({"mcp_servers": []}, "mcp_servers"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
            "messages.0.content.0.extra",
        ),
        # Thinking is the assistant's own: a user turn cannot carry it, nor a redacted block be read.
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}]}
                ]
            },
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": 3, "signature": ""}]}
                ]
            },
            "messages.0.content.0.thinking",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "data": "x"}]}
                ]
            },
            "messages.0.content.0.data",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.type",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0",
        ),
        ({"messages": [{"role": "system", "content": 3}]}, "messages.0.content"),
        # Adaptive thinking passes; a budget, or a display Anthropic does not define, does not.
        ({"thinking": {"type": "adaptive", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
        # Only an edit that clears nothing passes: the engine sees the conversation as sent.
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits.0",
        ),
        (
            {
                "context_management": {
                    "edits": [
                        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
                    ]
                }
            },
            "context_management.edits.0",
        ),
        ({"context_management": {"edits": []}, "x": 1}, "x"),
        ({"context_management": "all"}, "context_management"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
        ({"output_config": "high"}, "output_config"),
        ({"tools": [{"name": "f", "input_schema": {}, "defer_loading": "yes"}]}, "tools.0.defer_loading"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]},
            "messages.0.content.0.source",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"name": "f", "input_schema": {}, "strict": True}]}, "tools.0.strict"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"system": [{"type": "image"}]}, "system.0"),
        # What a guard screens is what the translation reads: nothing is dropped unread.
        ({"tools": [{"name": "f", "description": ["read", "me"]}]}, "tools.0.description"),
        ({"messages": [{"role": "user", "content": "hi", "name": "x"}]}, "messages.0.name"),
    ],
)
def test_a_field_the_translation_cannot_carry_is_named(change: dict[str, Any], param: str) -> None:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(anthropic.Untranslatable) as caught:
        anthropic.to_chat(body)
    assert caught.value.param == param


def test_what_changes_nothing_generated_is_accepted() -> None:
    body = {
        "model": "m",
        "max_tokens": 1,
        "service_tier": "auto",
        "thinking": {"type": "disabled"},
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
    }
    assert anthropic.to_chat(body)["messages"] == [{"role": "user", "content": "hi"}]


def test_a_chat_answer_becomes_a_message() -> None:
    answer = {
        "id": "chatcmpl-abc",
        "choices": [
            {
                "message": {
                    "content": "done",
                    "reasoning_content": "thought",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"x": 2}'}}],
                },
                "finish_reason": "stop",
                "stop_reason": "END",  # vLLM names the stop string it matched
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7},
    }
    assert anthropic.from_chat(answer, "served", ("END",)) == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "served",
        "content": [
            {"type": "thinking", "thinking": "thought", "signature": ""},
            {"type": "text", "text": "done"},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 2}},
        ],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {
            "input_tokens": 5,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 7,
        },
    }
    assert anthropic.from_chat({"choices": [{"finish_reason": "length"}]}, "m")["stop_reason"] == "max_tokens"


def test_thinking_sent_back_is_the_assistant_turns_reasoning_again() -> None:
    # A message's thinking block (from the engine's reasoning_content) in the next request.
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "thought", "signature": ""},
                    {"type": "text", "text": "done"},
                    {"type": "tool_use", "id": "c1", "name": "f", "input": {}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "ok"}]},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "only this", "signature": "s"}],
            },
        ],
    }
    assert anthropic.to_chat(body)["messages"] == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "done",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            "reasoning_content": "thought",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "", "reasoning_content": "only this"},
    ]
    # The guard reads it, as every field that reaches the template.
    call = parse_call(Api.CHAT, json.dumps(anthropic.to_chat(body)).encode())
    seen = json.dumps(judge_messages(call))
    assert "thought" in seen and "only this" in seen


def _events(raw: bytes) -> list[dict[str, Any]]:
    found = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == "event: " + event["type"]
        found.append(event)
    return found


CHAT_STREAM = (
    b"".join(
        b"data: " + json.dumps(chunk).encode() + b"\n\n"
        for chunk in (
            {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
            {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "lo"}}]},
            {
                "id": "chatcmpl-1",
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}
                            ]
                        },
                    }
                ],
            },
            {
                "id": "chatcmpl-1",
                "choices": [
                    {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}
                ],
            },
            {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
        )
    )
    + b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("piece", [1, 7, 64, len(CHAT_STREAM)])
def test_a_chat_stream_becomes_messages_events_however_it_is_cut(piece: int) -> None:
    translation = anthropic.StreamTranslation("served")
    raw = b"".join(translation.feed(CHAT_STREAM[at : at + piece]) for at in range(0, len(CHAT_STREAM), piece))
    events = _events(raw)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["id"] == "msg_1" and events[0]["message"]["model"] == "served"
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    assert "".join(e["delta"]["text"] for e in events[2:4]) == "Hello"
    assert events[5] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "c1", "name": "f", "input": {}},
    }
    assert events[6]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    assert events[8]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[8]["usage"] == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 4,
    }
    assert translation.usage == {"prompt_tokens": 3, "completion_tokens": 4}


def test_a_reasoning_stream_is_a_thinking_block_with_its_signature_before_its_stop() -> None:
    chunks = (
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"reasoning_content": "Think"}}]},
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"reasoning_content": "ing."}}]},
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]},
    )

    def stream(*sent: dict[str, Any]) -> bytes:
        return (
            b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in sent) + b"data: [DONE]\n\n"
        )

    events = _events(anthropic.StreamTranslation("served").feed(stream(*chunks)))
    assert [(e["type"], e.get("index"), e.get("delta", {}).get("type")) for e in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert "".join(e["delta"]["thinking"] for e in events[2:4]) == "Thinking."
    assert events[4]["delta"] == {"type": "signature_delta", "signature": ""}
    # A stream that ends while it thinks still signs and stops its block.
    cut = _events(anthropic.StreamTranslation("served").feed(stream(*chunks[:3])))
    assert [e["delta"]["type"] for e in cut if e["type"] == "content_block_delta"][-1] == "signature_delta"
    assert [e["type"] for e in cut][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    # thinking.display "omitted" (Claude Code's default): the block and its signature,
    # without its text, as Anthropic sends them.
    omitted = _events(anthropic.StreamTranslation("served", omit_thinking=True).feed(stream(*chunks)))
    assert [(e["type"], e.get("delta", {}).get("type")) for e in omitted[1:4]] == [
        ("content_block_start", None),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
    assert "Think" not in json.dumps(omitted) and omitted[5]["delta"] == {"type": "text_delta", "text": "Hi"}


def test_thinking_display_omitted_leaves_the_answer_s_thinking_blocks_without_text() -> None:
    answer = {
        "choices": [{"message": {"content": "Hi", "reasoning_content": "secret"}, "finish_reason": "stop"}]
    }
    assert not anthropic.thinking_omitted({"thinking": {"type": "adaptive"}})
    assert anthropic.thinking_omitted({"thinking": {"type": "adaptive", "display": "omitted"}})
    content = anthropic.from_chat(answer, "m", omit_thinking=True)["content"]
    assert content == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": "Hi"}]
    shown = anthropic.from_chat(answer, "m")["content"]
    assert shown[0] == {"type": "thinking", "thinking": "secret", "signature": ""}  # type: ignore[index]


def test_an_engine_error_in_a_chat_stream_becomes_an_error_event() -> None:
    translation = anthropic.StreamTranslation("served")
    out = translation.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
    assert _events(out) == [{"type": "error", "error": {"type": "api_error", "message": "boom"}}]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_each_status_has_anthropics_error_type(status: int, kind: str) -> None:
    assert anthropic.error_body(status, "m") == {"type": "error", "error": {"type": kind, "message": "m"}}


def test_cached_input_counts_as_input() -> None:
    usage = {
        "input_tokens": 3,
        "cache_read_input_tokens": 10,
        "cache_creation_input_tokens": 2,
        "output_tokens": 5,
    }
    assert anthropic.token_counts(usage) == (15, 5)
    assert anthropic.token_counts({"input_tokens": True, "output_tokens": -1}) == (0, 0)


def test_a_streams_usage_is_its_message_start_and_its_last_message_delta() -> None:
    head = (
        b"event: message_start\ndata: "
        + json.dumps(
            {"type": "message_start", "message": {"usage": {"input_tokens": 9, "cache_read_input_tokens": 3}}}
        ).encode()
        + b"\n\nevent: content_block_start\ndata: {}\n\n"
    )
    start = anthropic.message_start_usage(head)
    assert start == {"input_tokens": 9, "cache_read_input_tokens": 3}
    # llama.cpp's message_delta has the output tokens only; vLLM's repeats the input.
    assert anthropic.stream_usage(start, {"output_tokens": 4}) == {
        "input_tokens": 9,
        "cache_read_input_tokens": 3,
        "output_tokens": 4,
    }
    assert anthropic.stream_usage({"input_tokens": 0}, {"input_tokens": 9, "output_tokens": 4}) == {
        "input_tokens": 9,
        "output_tokens": 4,
    }
    assert anthropic.message_start_usage(b"event: ping\ndata: {}\n\n") is None
    assert anthropic.stream_usage(None, None) is None


def test_a_chat_stream_with_nothing_before_its_end_is_still_a_whole_message() -> None:
    events = _events(anthropic.StreamTranslation("served").feed(b"data: [DONE]\n\n"))
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]


def test_claude_code_s_request_is_carried() -> None:
    # What Claude Code 2.1.332 sends on `claude -p` (recorded): a system prompt as blocks
    # with cache breakpoints, its environment as a system message after the user's,
    # adaptive thinking, an effort, a context edit that clears nothing, a deferred tool.
    body = {
        "model": "m",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "billing header"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "reminder"}, {"type": "text", "text": "say hi"}],
            },
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}
                ],
            },
        ],
        "tools": [
            {"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
            {
                "name": "Placeholder",
                "description": "never call",
                "input_schema": {"type": "object"},
                "defer_loading": True,
            },
        ],
        "metadata": {"user_id": '{"device_id":"d"}'},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }
    assert anthropic.to_chat(body) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "billing header\nYou are an agent."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "reminder"}, {"type": "text", "text": "say hi"}],
            },
            {"role": "system", "content": "# Environment"},
        ],
        "max_tokens": 32000,
        "user": '{"device_id":"d"}',
        "reasoning_effort": "high",
        "tools": [
            {
                "type": "function",
                "function": {"name": "Bash", "parameters": {"type": "object"}, "description": "run"},
            },
            # A deferred tool is offered from the start: the model may call it sooner than
            # Anthropic's tool search would load it, and nothing else changes.
            {
                "type": "function",
                "function": {
                    "name": "Placeholder",
                    "parameters": {"type": "object"},
                    "description": "never call",
                },
            },
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # The guard reads the system message in the middle too.
    assert "# Environment" in json.dumps(judge_messages(parse_call(Api.MESSAGES, json.dumps(body).encode())))


def test_claude_code_s_follow_up_after_a_tool_call_is_carried() -> None:
    # Claude Code 2.1.332's request after it ran a Bash call (recorded by
    # tests/e2e/test_agent_clis.py): its environment message now a plain string, the
    # call as the answer gave it, the result with is_error false and a cache breakpoint.
    body = {
        "model": "m",
        "max_tokens": 32000,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "say hello"}]},
            {"role": "system", "content": "# Environment"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "chatcmpl-tool-5775",
                        "name": "Bash",
                        "input": {"command": "echo llmgw-tool-ok", "description": "Print a marker"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "tool_use_id": "chatcmpl-tool-5775",
                        "type": "tool_result",
                        "content": "llmgw-tool-ok",
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }
    assert anthropic.to_chat(body)["messages"] == [
        {"role": "user", "content": "say hello"},
        {"role": "system", "content": "# Environment"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-5775",
                    "type": "function",
                    "function": {
                        "name": "Bash",
                        "arguments": '{"command": "echo llmgw-tool-ok", "description": "Print a marker"}',
                    },
                }
            ],
        },
        # No "Error: " prefix: is_error false is a result as any other.
        {"role": "tool", "tool_call_id": "chatcmpl-tool-5775", "content": "llmgw-tool-ok"},
    ]


# --- what Claude Code 2.1.332 recovers from (its cli.js's own tests of an API error's message) ---

# ``FLi``: the thinking type a model refused, on which it retries with the other type.
_CLAUDE_CODE_THINKING_TYPE = re.compile(
    r"thinking\.type[^a-z]{1,8}(enabled|adaptive)[\s\S]*?not supported", re.I
)


def _claude_code_drops_effort(message: str) -> bool:
    # ``she``: resend without output_config.effort.
    lowered = message.lower()
    return ("effort parameter" in lowered and "not support" in lowered) or (
        "output_config" in lowered and "effort" in lowered and "extra inputs are not permitted" in lowered
    )


def _refusal(change: dict[str, Any]) -> str:
    """The message the router answers (``messages._translated``: ``param: message``)."""
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(anthropic.Untranslatable) as caught:
        anthropic.to_chat(body)
    return f"{caught.value.param}: {caught.value}"


def test_thinking_enabled_is_refused_in_the_words_claude_code_retries_adaptive_on() -> None:
    message = _refusal({"thinking": {"type": "enabled", "budget_tokens": 1024}})
    found = _CLAUDE_CODE_THINKING_TYPE.search(message)
    assert found is not None and found[1] == "enabled", message


def test_an_effort_the_engines_lack_is_refused_in_the_words_claude_code_drops_it_on() -> None:
    assert _claude_code_drops_effort(_refusal({"output_config": {"effort": "extreme"}}))
    # Structured output: Claude Code's ``$Li`` ("output_config.format: extra inputs are not permitted").
    message = _refusal({"output_config": {"format": {"type": "json_schema"}}})
    assert "output_config.format: extra inputs are not permitted" in message.lower()


@pytest.mark.parametrize(
    ("effort", "sent"), [("low", "low"), ("medium", "medium"), ("high", "high"), ("max", "high")]
)
def test_effort_is_what_every_engine_takes(effort: str, sent: str) -> None:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    assert anthropic.to_chat({**body, "output_config": {"effort": effort}})["reasoning_effort"] == sent


@pytest.mark.parametrize(
    ("answer", "cached"),
    [
        # vLLM and SGLang: prompt_tokens_details.cached_tokens; llama-server 11434 too.
        (
            {
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 8},
                }
            },
            8,
        ),
        # llama-server's timings (its older builds' only count).
        ({"usage": {"prompt_tokens": 10, "completion_tokens": 2}, "timings": {"cache_n": 6}}, 6),
        ({"usage": {"prompt_tokens": 10, "completion_tokens": 2}}, 0),
    ],
)
def test_cached_input_is_cache_read_input_tokens(answer: dict[str, Any], cached: int) -> None:
    message = anthropic.from_chat(
        {"id": "chatcmpl-1", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], **answer},
        "m",
    )
    assert message["usage"] == {
        "input_tokens": 10 - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": 2,
    }
    assert anthropic.token_counts(message["usage"]) == (10, 2)  # the router still counts the whole prompt
    Message.model_validate(message)  # the anthropic SDK's own type


def test_a_stream_s_cached_input_comes_in_its_message_delta() -> None:
    translation = anthropic.StreamTranslation("m")
    raw = translation.feed(
        b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, '
        b'"finish_reason": "stop"}]}\n\n'
        b'data: {"id": "c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}, '
        b'"timings": {"cache_n": 4}}\n\ndata: [DONE]\n\n'
    )
    delta = next(e for e in _events(raw) if e["type"] == "message_delta")
    assert delta["usage"] == {
        "input_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 1,
    }


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        # SGLang 0.5.3: its validation after the 200 (create_streaming_error_response).
        (
            {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
             "message": "The input (9000 tokens) is longer than the model's context length (8192 tokens)."},
            400,
            "prompt is too long: 9000 tokens > 8192 maximum",
        ),
        # SGLang 0.5.23: a scheduler's abort, its type an HTTP status name.
        (
            {"object": "error", "message": "Input length (8190 tokens) exceeds the maximum allowed length "
             "(8186 tokens). Use a shorter input or enable --allow-auto-truncate.", "type": "BAD_REQUEST",
             "param": None, "code": 400},
            400,
            "prompt is too long: 8190 tokens > 8186 maximum",
        ),
        # Any other in-stream error keeps the engine's words.
        (
            {"message": "CUDA out of memory", "type": "INTERNAL_SERVER_ERROR", "code": 500},
            500,
            "CUDA out of memory",
        ),
        ({"type": "BAD_REQUEST"}, 400, "The engine failed midway."),
    ],
)  # fmt: skip
def test_an_engine_s_error_after_its_200_is_anthropic_s_error_event(
    error: dict[str, Any], status: int, message: str
) -> None:
    translation = anthropic.StreamTranslation("m")
    raw = translation.feed(b"data: " + json.dumps({"error": error}).encode() + b"\n\ndata: [DONE]\n\n")
    assert _events(raw) == [
        {"type": "error", "error": {"type": anthropic.error_type(status), "message": message}}
    ]
