"""Anthropic's Messages API, as pure data: the request checks, its translation to a chat
completion for engines that do not serve ``/v1/messages``, and the way back (a whole
answer, a stream's events, an error).

Owns: which request fields the translation carries (``TRANSLATED_FIELDS`` and the
content block types below), the 400 naming any other (never a silent drop) in the words
Claude Code recovers from, the error type Anthropic gives each HTTP status, an engine's
error in Anthropic's shape (a context overflow in Anthropic's words and the engine's
numbers, ``overflow_message``), and the token counts of a Messages ``usage``.

Must not: do I/O or read a clock (ids come from the engine's answer).

The subset follows vLLM's own converter (``vllm/entrypoints/anthropic/serving_messages.py``
on vLLM's main branch; no release llmgw pins has it), with what that converter drops
silently refused here instead: image URLs, thinking enabled, documents, server tools.
An engine's reasoning (``reasoning_content``) is a ``thinking`` block, and a thinking
block sent back in an assistant turn is that turn's ``reasoning_content`` again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.core import engine_errors
from llmgw.core.engine_errors import Overflow
from llmgw.core.engine_usage import cached_tokens

# Top-level fields the translation carries to a chat completion.
TRANSLATED_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "top_k",
        "stop_sequences", "tools", "tool_choice", "metadata", "output_config",
    }
)  # fmt: skip
# Fields that change nothing an engine generates, accepted and not passed on: a
# service tier is Anthropic's capacity choice; ``thinking`` only when disabled or
# adaptive, and ``context_management`` only when it keeps every thinking block
# (``_check_thinking``, ``_check_context_management``).
IGNORED_FIELDS = frozenset({"service_tier", "thinking", "context_management"})
# ``output_config.effort`` as a chat completion's ``reasoning_effort``: the values both
# APIs share, and Anthropic's "max" (the most the model can) as "high", the most every
# engine release llmgw deploys accepts (vLLM 0.11.0 and SGLang 0.5.3 take only low,
# medium and high; see llmgw/gateway/DESIGN.md).
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
# ``context_management`` edits that leave the conversation as it was sent.
_KEEP_ALL_EDITS = {"type": "clear_thinking_20251015", "keep": "all"}
# ``cache_control`` marks a prompt cache breakpoint: engines cache prefixes by
# themselves (vLLM's and SGLang's prefix caching, llama.cpp's cache_prompt), so it is
# accepted on every block and tool and not passed on.
_IGNORED_BLOCK_FIELDS = frozenset({"type", "cache_control", "citations"})

# Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# The finish reasons of a chat completion, as Messages stop reasons.
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status: 503 (a model loading, no replica,
    the screen down) is ``overloaded_error``, which the SDKs retry as they do 529."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    if status == 503:
        return "overloaded_error"
    return "invalid_request_error" if status < 500 else "api_error"


def error_body(status: int, message: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def overflow_message(overflow: Overflow) -> str:
    """Anthropic's words for a request over the context, with the engine's numbers:
    the ones Claude Code acts on. The input and ``max_tokens`` together: "input length
    and `max_tokens` exceed context limit: I + M > C", which Claude Code 2.1.332 parses
    (``/input length and `max_tokens` exceed context limit: (\\d+) \\+ (\\d+) > (\\d+)/``)
    to retry with ``max_tokens`` C - I - 1000; the input alone: "prompt is too long:
    I tokens > C maximum", on which it compacts the conversation."""
    if overflow.max_tokens is not None and overflow.input_tokens < overflow.context:
        return (
            "input length and `max_tokens` exceed context limit: "
            f"{overflow.input_tokens} + {overflow.max_tokens} > {overflow.context}, "
            "decrease input length or `max_tokens` and try again"
        )
    return f"prompt is too long: {overflow.input_tokens} tokens > {overflow.context} maximum"


def engine_error_body(
    status: int, body: bytes | Mapping[str, object], model: str, unworded: str | None = None
) -> dict[str, object]:
    """An engine's error answer (any engine's shape, ``engine_errors``) as Anthropic's
    error: a context overflow in Anthropic's words and numbers, else the engine's
    message (``unworded`` when it has none)."""
    error = engine_errors.read(status, body)
    if error.overflow is not None:
        message = overflow_message(error.overflow)
    else:
        message = error.message or unworded or f"The model `{model}` answered with HTTP {status}."
    return error_body(status, message)


class Untranslatable(ValueError):
    """A field the translation cannot carry; ``param`` names it (``messages.0.content.1.type``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def token_counts(usage: Mapping[str, object] | None) -> tuple[int, int]:
    """(input, output) tokens of a Messages ``usage``: cached input counts as input."""
    if usage is None:
        return 0, 0

    def count(name: str) -> int:
        value = usage.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    prompt = count("input_tokens") + count("cache_read_input_tokens") + count("cache_creation_input_tokens")
    return prompt, count("output_tokens")


def message_start_usage(head: bytes) -> dict[str, object] | None:
    """The usage in a stream's ``message_start`` event (its first), found in the
    stream's first bytes: the input tokens, which a ``message_delta`` need not repeat
    (llama.cpp's carries ``output_tokens`` only, ``tools/server/server-task.cpp`` of
    build 11434; Anthropic's own API likewise)."""
    for line in head.split(b"\n"):
        if not line.startswith(b"data:") or b'"message_start"' not in line:
            continue
        try:
            data = json.loads(line[5:])
        except ValueError:
            return None
        message = data.get("message") if isinstance(data, dict) else None
        usage = message.get("usage") if isinstance(message, dict) else None
        return usage if isinstance(usage, dict) else None
    return None


def stream_usage(
    start: Mapping[str, object] | None, delta: Mapping[str, object] | None
) -> dict[str, object] | None:
    """A stream's usage from its ``message_start`` and its last ``message_delta``: each
    count the larger of the two (a delta's counts are cumulative; vLLM's repeats the
    input, llama.cpp's does not)."""
    if start is None and delta is None:
        return None
    merged: dict[str, object] = {}
    for usage in (start or {}, delta or {}):
        for name, value in usage.items():
            if isinstance(value, int) and not isinstance(value, bool):
                before = merged.get(name)
                merged[name] = max(value, before) if isinstance(before, int) else value
    return merged


# --- the request, to a chat completion ------------------------------------------------------------


def to_chat(body: Mapping[str, object]) -> dict[str, object]:
    """The chat completion body that asks what ``body`` (a checked Messages request)
    asks, or ``Untranslatable`` naming the first field it cannot carry."""
    for name in body:
        if name not in TRANSLATED_FIELDS and name not in IGNORED_FIELDS:
            raise Untranslatable(name, f"`{name}` is not supported by this model's engine; leave it out.")
    _check_thinking(body.get("thinking"))
    _check_context_management(body.get("context_management"))
    messages: list[dict[str, object]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _system_text(system)})
    raw_messages = body.get("messages")
    for index, message in enumerate(raw_messages if isinstance(raw_messages, list) else []):
        messages.extend(_chat_messages(message, f"messages.{index}"))
    chat: dict[str, object] = {"model": body.get("model"), "messages": messages}
    for name in ("max_tokens", "temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise Untranslatable("stop_sequences", "`stop_sequences` must be a list of strings.")
        chat["stop"] = stops
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    effort = _effort(body.get("output_config"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = _chat_tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_chat_tool_choice(choice))
    if body.get("stream") is True:
        chat["stream"] = True
        # The usage chunk is read by the translation (message_delta's usage), never forwarded.
        chat["stream_options"] = {"include_usage": True}
    return chat


def _check_thinking(thinking: object) -> None:
    """``thinking`` disabled, or adaptive (the model decides whether to think, as an
    engine's chat template does): nothing to pass on. Its ``display`` is carried on the
    way back (``thinking_omitted``)."""
    if thinking is None:
        return
    if not isinstance(thinking, Mapping):
        raise Untranslatable("thinking", "`thinking` must be an object.")
    kind = thinking.get("type")
    if kind not in ("disabled", "adaptive"):
        # Claude Code 2.1.332 reads "thinking.type: `enabled` ... not supported"
        # (``/thinking\\.type[^a-z]{1,8}(enabled|adaptive)[^]*?not supported/i``) and retries
        # with adaptive thinking.
        shown = kind if isinstance(kind, str) else json.dumps(kind)
        raise Untranslatable(
            "thinking.type",
            f"`{shown[:40]}` is not supported by this model's engine; send `adaptive` or `disabled`.",
        )
    for name in thinking:
        if name not in ("type", "display"):
            raise Untranslatable(
                f"thinking.{name}", f"`thinking.{name}` is not supported by this model's engine."
            )
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise Untranslatable("thinking.display", "`thinking.display` must be summarized or omitted.")


def thinking_omitted(body: Mapping[str, object]) -> bool:
    """Whether the answer's thinking blocks come without their text (``thinking.display``
    ``omitted``: Anthropic then sends each block with an empty ``thinking`` and its
    signature, and no ``thinking_delta``)."""
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("display") == "omitted"


def _check_context_management(value: object) -> None:
    """Only edits that keep every thinking block pass: the engine sees the conversation
    as sent, so any edit that would clear part of it cannot be carried."""
    if value is None:
        return
    if not isinstance(value, Mapping) or not isinstance(value.get("edits"), list):
        raise Untranslatable("context_management", "`context_management` must be an object with `edits`.")
    for name in value:
        if name != "edits":
            raise Untranslatable(
                f"context_management.{name}",
                f"`context_management.{name}` is not supported by this model's engine.",
            )
    edits = value["edits"]
    assert isinstance(edits, list)
    for index, edit in enumerate(edits):
        if edit != _KEEP_ALL_EDITS:
            raise Untranslatable(
                f"context_management.edits.{index}",
                "Context editing is not supported by this model's engine (only "
                '`{"type": "clear_thinking_20251015", "keep": "all"}`, which clears nothing).',
            )


def _effort(output_config: object) -> str | None:
    if output_config is None:
        return None
    if not isinstance(output_config, Mapping):
        raise Untranslatable("output_config", "`output_config` must be an object.")
    for name in output_config:
        if name != "effort":
            # Anthropic's words for a field a model does not take, which Claude Code
            # 2.1.332 reads ("output_config.format: Extra inputs are not permitted": it
            # retries without structured output).
            raise Untranslatable(f"output_config.{name}", "Extra inputs are not permitted")
    effort = output_config.get("effort")
    if effort is None:
        return None
    if not isinstance(effort, str) or effort not in _EFFORTS:
        # "effort parameter" and "not support": what Claude Code 2.1.332 reads to
        # resend without effort.
        shown = effort if isinstance(effort, str) else json.dumps(effort)
        raise Untranslatable(
            "output_config.effort",
            f"The effort parameter value `{shown[:40]}` is not supported by this model's engine "
            "(low, medium, high or max).",
        )
    return _EFFORTS[effort]


def _system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise Untranslatable("system", "`system` must be a string or a list of text blocks.")
    return _text_of_blocks(system, "system", "`system` blocks must be text blocks.")


def _text_of_blocks(blocks: list[object], where: str, refusal: str) -> str:
    """The texts of a list of text blocks, a line each; ``refusal`` for any other block."""
    texts = []
    for index, block in enumerate(blocks):
        if (
            not isinstance(block, Mapping)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise Untranslatable(f"{where}.{index}", refusal)
        texts.append(block["text"])
    return "\n".join(texts)


def _chat_messages(message: object, at: str) -> list[dict[str, object]]:
    if not isinstance(message, Mapping):
        raise Untranslatable(at, "Each message must be an object with a role and content.")
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise Untranslatable(f"{at}.role", "A message's role must be `user`, `assistant` or `system`.")
    for name in message:
        if name not in ("role", "content"):
            raise Untranslatable(f"{at}.{name}", f"`{name}` on a message is not supported; leave it out.")
    content = message.get("content")
    if role == "system":
        # Claude Code sends its environment as a system message after the first user
        # turn: a chat system message in place, text only, as ``system`` is.
        if isinstance(content, list):
            content = _text_of_blocks(
                content, f"{at}.content", "A system message's blocks must be text blocks."
            )
        if not isinstance(content, str):
            raise Untranslatable(f"{at}.content", "A system message's content must be text.")
        return [{"role": "system", "content": content}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise Untranslatable(f"{at}.content", "A message's content must be a string or a list of blocks.")
    parts: list[dict[str, object]] = []
    calls: list[dict[str, object]] = []
    results: list[dict[str, object]] = []
    thinking: list[str] = []
    for index, block in enumerate(content):
        where = f"{at}.content.{index}"
        if not isinstance(block, Mapping):
            raise Untranslatable(where, "A content block must be an object.")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            _only(block, where, {"text"})
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            _only(block, where, {"source"})
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}})
        elif kind == "thinking" and role == "assistant":
            # An answer's thinking, sent back: the turn's reasoning, where the engine put it.
            # Its signature is the one the translation gave it (empty: nothing is signed).
            _only(block, where, {"thinking", "signature"})
            text = block.get("thinking")
            if not isinstance(text, str):
                raise Untranslatable(f"{where}.thinking", "A thinking block needs a string `thinking`.")
            if text:
                thinking.append(text)
        elif kind == "tool_use" and role == "assistant":
            _only(block, where, {"id", "name", "input"})
            name, tool_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(tool_id, str):
                raise Untranslatable(where, "A tool_use block needs a string `id` and `name`.")
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append(
                {"id": tool_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "tool_result" and role == "user":
            _only(block, where, {"tool_use_id", "content", "is_error"})
            tool_id = block.get("tool_use_id")
            if not isinstance(tool_id, str):
                raise Untranslatable(
                    f"{where}.tool_use_id", "A tool_result block needs a string `tool_use_id`."
                )
            text = _tool_result_text(block.get("content"), f"{where}.content")
            if block.get("is_error") is True:
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": tool_id, "content": text})
        else:
            shown = kind if isinstance(kind, str) else type(kind).__name__
            raise Untranslatable(
                f"{where}.type",
                f"A `{shown[:40]}` content block in a {role} message is not supported "
                "by this model's engine.",
            )
    out: list[dict[str, object]] = list(results)  # tool results answer the turn before: they come first
    if parts or calls or thinking or not results:
        chat: dict[str, object] = {"role": role}
        if len(parts) == 1 and parts[0]["type"] == "text":
            chat["content"] = parts[0]["text"]
        else:
            chat["content"] = parts if parts else ("" if not calls else None)
        if calls:
            chat["tool_calls"] = calls
        if thinking:
            # What the pinned engines' reasoning parsers answer in, and the guard screens.
            chat["reasoning_content"] = "\n\n".join(thinking)
        out.append(chat)
    return out


def _only(block: Mapping[str, object], where: str, carried: set[str]) -> None:
    for name in block:
        if name not in carried and name not in _IGNORED_BLOCK_FIELDS:
            raise Untranslatable(
                f"{where}.{name}", f"`{name}` on a content block is not supported by this model's engine."
            )


def _image_url(source: object, where: str) -> str:
    if isinstance(source, Mapping):
        kind = source.get("type")
        if (
            kind == "base64"
            and isinstance(source.get("media_type"), str)
            and isinstance(source.get("data"), str)
        ):
            return f"data:{source['media_type']};base64,{source['data']}"
        if kind == "url" and isinstance(source.get("url"), str):
            return str(source["url"])
    raise Untranslatable(f"{where}.source", "An image's source must be base64 data or a URL.")


def _tool_result_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Untranslatable(where, "A tool result's content must be a string or a list of text blocks.")
    return _text_of_blocks(content, where, "A tool result's content blocks must be text blocks.")


def _chat_tools(tools: object) -> list[dict[str, object]]:
    if not isinstance(tools, list):
        raise Untranslatable("tools", "`tools` must be a list.")
    out: list[dict[str, object]] = []
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise Untranslatable(where, "A tool needs a string `name`.")
        if tool.get("type") not in (None, "custom"):
            raise Untranslatable(
                f"{where}.type",
                f"The server tool `{tool.get('type')}` is not supported by this model's engine.",
            )
        for name in tool:
            if name not in ("name", "description", "input_schema", "type", "cache_control", "defer_loading"):
                raise Untranslatable(
                    f"{where}.{name}", f"`{name}` on a tool is not supported by this model's engine."
                )
        function: dict[str, object] = {
            "name": tool["name"],
            "parameters": tool.get("input_schema") or {"type": "object"},
        }
        if not isinstance(tool.get("defer_loading", False), bool):
            raise Untranslatable(f"{where}.defer_loading", "A tool's `defer_loading` must be a boolean.")
        description = tool.get("description")
        if isinstance(description, str):
            function["description"] = description
        elif description is not None:  # read by no screen, so never passed on unread
            raise Untranslatable(f"{where}.description", "A tool's `description` must be a string.")
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: object) -> dict[str, object]:
    if not isinstance(choice, Mapping):
        raise Untranslatable("tool_choice", "`tool_choice` must be an object.")
    kind = choice.get("type")
    chat: dict[str, object]
    if kind == "auto":
        chat = {"tool_choice": "auto"}
    elif kind == "any":
        chat = {"tool_choice": "required"}
    elif kind == "none":
        chat = {"tool_choice": "none"}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise Untranslatable("tool_choice.type", "`tool_choice` must be auto, any, none, or a named tool.")
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
    return chat


# --- the answer, back to a message ----------------------------------------------------------------


def message_id(chat_id: object) -> str:
    """A message id from the engine's completion id (no replica in it either way)."""
    text = chat_id if isinstance(chat_id, str) and chat_id else "0"
    return "msg_" + text.removeprefix("chatcmpl-")


def _stop(finish: object, matched: object, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """The stop reason and stop sequence. vLLM's choice names the stop string it
    matched (``stop_reason``); other engines' do not, so theirs reads ``end_turn``."""
    if finish == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish if isinstance(finish, str) else "stop", "end_turn"), None


def from_chat(
    answer: Mapping[str, object], model: str, stops: tuple[str, ...] = (), *, omit_thinking: bool = False
) -> dict[str, object]:
    """A Messages answer from a chat completion's JSON (its thinking without its text
    when ``omit_thinking``)."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}
    content: list[dict[str, object]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": "" if omit_thinking else reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name") or "",
                "input": _arguments(function.get("arguments")),
            }
        )
    if not content:
        content.append({"type": "text", "text": ""})
    usage = answer.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice.get("stop_reason"), stops)
    return {
        "id": message_id(answer.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": messages_usage(usage, answer.get("timings")),
    }


def messages_usage(usage: Mapping[str, object], timings: object = None) -> dict[str, object]:
    """A chat ``usage`` as Messages': ``input_tokens`` are the prompt's tokens not read
    from the cache, ``cache_read_input_tokens`` those that were (vLLM's and SGLang's
    ``prompt_tokens_details.cached_tokens``; llama-server's too at build 11434, and its
    ``timings.cache_n``, the one count older builds give). Nothing is written to a cache
    the client can address, so ``cache_creation_input_tokens`` is 0."""
    prompt = _int(usage.get("prompt_tokens"))
    cached = min(cached_tokens(usage, timings), prompt)
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": _int(usage.get("completion_tokens")),
    }


def _arguments(arguments: object) -> object:
    if isinstance(arguments, Mapping):
        return arguments
    if isinstance(arguments, str) and arguments:
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {"_unparsed_arguments": arguments}  # what the model wrote, kept visible
        return parsed if isinstance(parsed, dict) else {"_arguments": parsed}
    return {}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def event(kind: str, payload: Mapping[str, object]) -> bytes:
    """One server-sent event as Anthropic streams them: its type named twice."""
    return (
        f"event: {kind}\ndata: ".encode()
        + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        + b"\n\n"
    )


def error_event(status: int, message: str) -> bytes:
    return event("error", error_body(status, message))


@dataclass
class StreamTranslation:
    """A chat completion's stream (``data:`` chunks, a usage chunk, ``[DONE]``) as the
    Messages events: ``message_start``, per thinking (the engine's reasoning), text or
    tool call a ``content_block_start``, its deltas (a thinking block's ``thinking_delta``
    and its ``signature_delta``) and its ``content_block_stop``, then ``message_delta`` (stop reason and
    usage) and ``message_stop`` when the engine's ``[DONE]`` comes. Fed the engine's
    bytes as they arrive (an event may be split between chunks); ``usage`` is the
    engine's usage chunk, for the router's accounting."""

    model: str
    stops: tuple[str, ...] = ()
    omit_thinking: bool = False  # thinking blocks without their thinking_deltas
    usage: dict[str, object] | None = None
    timings: object = None  # llama-server's, whose cache_n counts the cached prompt
    _pending: bytes = b""
    _started: bool = False
    _block: int = -1  # the index of the open content block, -1: none open
    _block_kind: str = ""
    _tool_indexes: dict[int, int] = field(default_factory=dict)  # chat tool call index -> block index
    _blocks: int = 0
    _finish: object = None
    _matched: object = None
    _done: bool = False

    def feed(self, data: bytes) -> bytes:
        self._pending += data
        out: list[bytes] = []
        while True:
            end = self._pending.find(b"\n\n")
            if end < 0:
                break
            raw, self._pending = self._pending[:end], self._pending[end + 2 :]
            for line in raw.split(b"\n"):
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    out.append(self._data(line[5:].strip()))
        return b"".join(out)

    def _data(self, data: bytes) -> bytes:
        if self._done:
            return b""
        if data == b"[DONE]":
            self._done = True
            return self._close()
        try:
            chunk = json.loads(data)
        except ValueError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        out: list[bytes] = []
        error = chunk.get("error")
        if isinstance(error, Mapping):
            # An engine's error after its 200 (SGLang's validation at 0.5.3, its
            # scheduler's aborts at 0.5.23, llama-server's): Anthropic's ``error`` event.
            self._done = True
            status = engine_errors.stream_status(error)
            return event("error", engine_error_body(status, chunk, self.model, "The engine failed midway."))
        out.append(self._start(chunk.get("id")))
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if isinstance(chunk.get("timings"), Mapping):
            self.timings = chunk["timings"]
        choices = chunk.get("choices")
        choice = (
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else None
        )
        if choice is None:
            return b"".join(out)
        if choice.get("finish_reason") is not None:
            self._finish, self._matched = choice.get("finish_reason"), choice.get("stop_reason")
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            return b"".join(out)
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out.append(self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
            if not self.omit_thinking:
                out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            out.append(self._open("text", {"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": text}))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, Mapping):
                continue
            index = call.get("index", 0)
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            if index not in self._tool_indexes:
                out.append(
                    self._open(
                        "tool_use",
                        {
                            "type": "tool_use",
                            "id": call.get("id") or "",
                            "name": function.get("name") or "",
                            "input": {},
                        },
                        force=True,
                    )
                )
                self._tool_indexes[index if isinstance(index, int) else 0] = self._block
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments and self._tool_indexes.get(index) == self._block:
                out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return b"".join(out)

    def _open(self, kind: str, block: Mapping[str, object], *, force: bool = False) -> bytes:
        if self._block >= 0 and self._block_kind == kind and not force:
            return b""
        out = self._stop_block()
        self._block, self._block_kind = self._blocks, kind
        self._blocks += 1
        return out + event(
            "content_block_start",
            {"type": "content_block_start", "index": self._block, "content_block": block},
        )

    def _delta(self, delta: Mapping[str, object]) -> bytes:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}
        )

    def _stop_block(self) -> bytes:
        if self._block < 0:
            return b""
        out = b""
        if self._block_kind == "thinking":
            # Anthropic's order: a thinking block's signature_delta just before its stop
            # (the SDK's ``SignatureDelta``); the signature is empty, as in a whole answer.
            out = self._delta({"type": "signature_delta", "signature": ""})
        index, self._block = self._block, -1
        return out + event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _start(self, chat_id: object) -> bytes:
        """``message_start``, once: its usage is zeros (the engine's counts come at the
        end, in ``message_delta``)."""
        if self._started:
            return b""
        self._started = True
        message: dict[str, object] = {
            "id": message_id(chat_id),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return event("message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        out = [self._start(None), self._stop_block()]
        usage = self.usage or {}
        stop_reason, stop_sequence = _stop(self._finish, self._matched, self.stops)
        out.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": messages_usage(usage, self.timings),
                },
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        return b"".join(out)
