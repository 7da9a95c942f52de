"""OpenAI's Responses API as llmgw carries it: a request read and checked, turned into a
chat completions request, and the chat answer (whole or streamed) turned back into a
Response object and Responses stream events.

Owns: the subset of the Responses API llmgw carries (``CARRIED`` and the input item
and tool types below), the 400 naming every field it cannot carry (never a silent
drop), the chat body an engine receives, the conversation a stored response leaves
for the next turn (``turns``), and the translation of answers and stream events.

The router keeps Responses state itself (see ``llmgw/gateway/DESIGN.md``): a
follow-up's ``previous_response_id`` is expanded here into the earlier turns
(``to_chat_body``'s ``history``) and the engine is asked a plain chat completion.

Must not: do I/O, read a clock or draw random ids (``created_at`` and ``new_id``
are parameters), or know where stored responses are kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core import engine_errors
from llmgw.core.engine_usage import cached_tokens
from llmgw.core.json_values import one_of
from llmgw.core.routing import Refusal

# Fields llmgw carries to the engine (translated) or keeps itself (store,
# previous_response_id, metadata), and Codex CLI's ``client_metadata`` (its session's
# ids, a map of strings like ``metadata``: it asks nothing of the model, see
# llmgw/gateway/DESIGN.md), accepted and not passed on. Anything else is refused by name.
CARRIED = frozenset(
    {
        "model", "input", "instructions", "stream", "store", "previous_response_id", "metadata",
        "max_output_tokens", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls",
        "text", "user", "reasoning", "include", "truncation", "service_tier", "prompt_cache_key",
        "safety_identifier", "stream_options", "client_metadata", "prompt_cache_retention",
        "prompt_cache_options",
    }
)  # fmt: skip
# ``prompt_cache_retention``'s values (openai-python 3.60.0, ``ResponseCreateParams``).
# It and ``prompt_cache_key`` / ``prompt_cache_options`` steer OpenAI's prompt cache;
# the engines cache prefixes by themselves (vLLM's and SGLang's prefix caching,
# llama-server's ``cache_prompt``), so they are checked and not passed on.
_CACHE_RETENTIONS = frozenset({"in_memory", "24h"})
# ``include`` values that ask for nothing the translation leaves out: its reasoning
# items carry the engine's reasoning as plain text (``content``), so there is no
# encrypted reasoning to include (Codex CLI asks for it on every request).
_INCLUDABLE = frozenset({"reasoning.encrypted_content"})
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
# A reasoning item's parts: OpenAI's ``reasoning_text`` (and ``summary_text`` in its
# ``summary``); Codex CLI's ``ReasoningItemContent`` also has ``text``
# (openai/codex, ``codex-rs/protocol/src/models.rs``).
_REASONING_PARTS = frozenset({"reasoning_text", "text"})
# ``reasoning.effort``'s values in OpenAI's API reference (Responses, ``reasoning``), each
# as the chat ``reasoning_effort`` every engine release llmgw deploys accepts: vLLM
# 0.11.0 and SGLang 0.5.3 take only low, medium and high (a 400 for any other); vLLM
# 0.34.0 (``ReasoningEffort``, vllm/renderers/params.py) and SGLang 0.5.23
# (``ReasoningEffortTier``) take all six, and llama-server 11434 reads "none" as
# reasoning off. The chain may hold any of them, so the words outside the three go
# to the nearest inside: none and minimal to low, xhigh to high.
_EFFORTS = {
    "none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high",
}  # fmt: skip

NewId = Callable[[str], str]  # a fresh id with the given prefix ("msg", "fc", "rs")


class ResponsesInvalid(Exception):
    """A request llmgw cannot carry, as OpenAI's 400: what is wrong and the ``param``."""

    def __init__(self, message: str, param: str | None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _unsupported(param: str, what: str) -> ResponsesInvalid:
    return ResponsesInvalid(
        f"{what} is not supported by this gateway's Responses API (it translates to chat "
        f"completions); remove '{param}' or use /v1/chat/completions.",
        param,
        "unsupported_parameter",
    )


def _type_error(value: object, kind: str, param: str) -> ResponsesInvalid:
    shown = json.dumps(value, ensure_ascii=False)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ResponsesInvalid(f"{shown} is not of type '{kind}' - '{param}'", param, "invalid_type")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A checked Responses request: the fields the router acts on, and the client's body."""

    model: str
    stream: bool
    store: bool  # OpenAI's default: true
    previous_response_id: str | None
    body: Mapping[str, object]
    # The chat completions body it comes to without earlier turns (``to_chat_body``):
    # translated once, here, where checking it needs the translation anyway.
    chat: Mapping[str, object]


def parse_request(body: Mapping[str, object]) -> ResponsesRequest:
    """The request, or ``ResponsesInvalid`` for the first field that cannot be carried."""
    for name in body:
        if name not in CARRIED:
            raise _unsupported(name, f"The parameter '{name}'")
    model = body.get("model")
    if model is None:
        raise ResponsesInvalid("you must provide a model parameter", "model", "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise _type_error(model, "string", "model")
    stream = _optional_bool(body, "stream", False)
    store = _optional_bool(body, "store", True)
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise _type_error(previous, "string", "previous_response_id")
    if body.get("input") is None:
        raise ResponsesInvalid("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _type_error(instructions, "string", "instructions")
    for name in ("metadata", "client_metadata"):
        metadata = body.get(name)
        if metadata is not None and not (
            isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
        ):
            raise _type_error(metadata, "map of strings", name)
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _type_error(value, "number", name)
    cap = body.get("max_output_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ResponsesInvalid(
            f"Invalid 'max_output_tokens': {json.dumps(cap)}. Expected an integer of at least 1.",
            "max_output_tokens",
            "invalid_value",
        )
    _optional_bool(body, "parallel_tool_calls", True)
    for name in ("user", "prompt_cache_key", "safety_identifier"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise _type_error(value, "string", name)
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in _CACHE_RETENTIONS:
        raise ResponsesInvalid(
            f"Invalid value for 'prompt_cache_retention': {json.dumps(retention)[:60]}. "
            "Supported values are: 'in_memory', '24h'.",
            "prompt_cache_retention",
            "invalid_value",
        )
    cache_options = body.get("prompt_cache_options")
    if cache_options is not None and not isinstance(cache_options, dict):
        raise _type_error(cache_options, "object", "prompt_cache_options")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise _unsupported("truncation", f"truncation {json.dumps(truncation)}")
    tier = body.get("service_tier")
    if tier not in (None, "auto", "default"):
        raise _unsupported("service_tier", f"service_tier {json.dumps(tier)}")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list):
            raise _type_error(include, "array", "include")
        for index, value in enumerate(include):
            if not one_of(value, _INCLUDABLE):
                raise _unsupported(f"include[{index}]", f"include {json.dumps(value)}")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error(options, "object", "stream_options")
    # The translation itself checks input, tools, tool_choice, text and reasoning.
    chat = to_chat_body(body, (), model)
    return ResponsesRequest(model, stream, store, previous, body, chat)


def chat_after(request: ResponsesRequest, history: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """``to_chat_body(request.body, history, ...)`` from the translation ``parse_request``
    made: ``history`` (the earlier turns of a ``previous_response_id``) after the
    instructions' system message, before the input's turns."""
    messages = request.chat["messages"]
    assert isinstance(messages, list)  # to_chat_body's
    instructions = request.body.get("instructions")
    lead = 1 if isinstance(instructions, str) and instructions else 0
    earlier = [dict(turn) for turn in history]
    return {**request.chat, "messages": [*messages[:lead], *earlier, *messages[lead:]]}


def _optional_bool(body: Mapping[str, object], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(value, "boolean", name)
    return value


# --- the request as a chat completion -----------------------------------------------------------


def turns(body: Mapping[str, object]) -> list[dict[str, object]]:
    """The chat messages a request's ``input`` stands for (its ``instructions`` left out:
    OpenAI does not carry them to a follow-up)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _type_error(value, "string or array", "input")
    messages: list[dict[str, object]] = []
    # Reasoning items not yet given to the assistant turn that follows them.
    reasoning: list[str] = []
    for index, item in enumerate(value):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise _type_error(item, "object", param)
        kind = item.get("type", "message")
        if kind == "reasoning":
            text = _reasoning_text(item, param)
            if text:
                reasoning.append(text)
            continue
        if reasoning and not (
            kind == "function_call" or (kind == "message" and item.get("role") == "assistant")
        ):
            messages.append(_reasoning_turn(reasoning))
            reasoning = []
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            _only_fields(item, param, _FUNCTION_CALL_FIELDS, "function call")
            call = {
                "id": _string(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", param),
                    "arguments": _string(item, "arguments", param),
                },
            }
            last = messages[-1] if messages else None
            if (
                last is not None
                and last.get("role") == "assistant"
                and isinstance(last.get("tool_calls"), list)
            ):
                calls = last["tool_calls"]
                assert isinstance(calls, list)
                calls.append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            _only_fields(item, param, _FUNCTION_CALL_OUTPUT_FIELDS, "function call output")
            output = item.get("output")
            if isinstance(output, list):
                output = _text_of_parts(output, f"{param}.output")
            if not isinstance(output, str):
                raise _type_error(output, "string", f"{param}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": output}
            )
        else:
            raise _unsupported(f"{param}.type", f"The input item type {json.dumps(kind)}")
        if reasoning:  # the assistant turn just appended (or extended) follows it
            _give_reasoning(messages[-1], reasoning)
            reasoning = []
    if reasoning:
        messages.append(_reasoning_turn(reasoning))
    return messages


# The fields of a function call and of its output that the chat turn carries (``call_id``,
# ``name``, ``arguments``; ``call_id``, ``output``), and the two it has no place for and
# needs none: ``id``, the item's own id (Codex CLI 0.171.0 sends back the ``fc_`` id the
# router's stream gave the call, and an ``fco_`` id of its own on the output), and
# ``status``, where the item stood when it was returned (openai-python 3.57.0's
# ``ResponseFunctionToolCallParam`` and ``FunctionCallOutput``: "Populated when items are
# returned via API"). Neither changes what the model is asked. Any other field is refused
# by name (the same types' ``namespace`` and ``caller``, a tool in a namespace, which chat
# tools cannot hold, or run by a program; the output's ``name``): dropped, it would
# change the conversation without the client knowing.
_FUNCTION_CALL_FIELDS = frozenset({"type", "id", "status", "call_id", "name", "arguments"})
_FUNCTION_CALL_OUTPUT_FIELDS = frozenset({"type", "id", "status", "call_id", "output"})


def _only_fields(item: Mapping[str, object], param: str, carried: frozenset[str], noun: str) -> None:
    for name in item:
        if name not in carried:
            raise _unsupported(f"{param}.{name}", f"The {noun} field '{name}'")


def _reasoning_text(item: Mapping[str, object], param: str) -> str:
    """A reasoning item's text: its ``content`` (the reasoning itself), else its
    ``summary`` (OpenAI's summary of it); "" for an item that carries neither (Codex
    CLI sends its reasoning items back without their ``reasoning_text``)."""
    for name in item:
        if name not in ("type", "id", "summary", "content", "encrypted_content", "status"):
            raise _unsupported(f"{param}.{name}", f"The reasoning item field '{name}'")
    if item.get("encrypted_content") is not None:
        # Only OpenAI can read its own encrypted reasoning; this gateway produces none.
        raise _unsupported(f"{param}.encrypted_content", "Encrypted reasoning from another provider")
    texts: dict[str, list[str]] = {}
    for name, kinds in (("content", _REASONING_PARTS), ("summary", frozenset({"summary_text"}))):
        parts = item.get(name)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise _type_error(parts, "array", f"{param}.{name}")
        for index, part in enumerate(parts):
            where = f"{param}.{name}[{index}]"
            if not isinstance(part, dict):
                raise _type_error(part, "object", where)
            if not one_of(part.get("type"), kinds):
                raise _unsupported(f"{where}.type", f"The reasoning part type {json.dumps(part.get('type'))}")
            texts.setdefault(name, []).append(_string(part, "text", where))
    return "".join(texts.get("content") or texts.get("summary") or [])


def _reasoning_turn(reasoning: list[str]) -> dict[str, object]:
    """The assistant turn of reasoning that no message or call follows (an answer cut
    while it reasoned)."""
    turn: dict[str, object] = {"role": "assistant", "content": ""}
    _give_reasoning(turn, reasoning)
    return turn


def _give_reasoning(turn: dict[str, object], reasoning: list[str]) -> None:
    # ``reasoning_content``: the field the engines' chat answers carry it in, which
    # chat templates read back (see llmgw/gateway/DESIGN.md) and the guard screens.
    before = turn.get("reasoning_content")
    turn["reasoning_content"] = "\n\n".join([*([before] if isinstance(before, str) else []), *reasoning])


def _message(item: Mapping[str, object], param: str) -> dict[str, object]:
    for name in item:
        if name not in ("type", "role", "content", "id", "status"):
            raise _unsupported(f"{param}.{name}", f"The message field '{name}'")
    role = item.get("role")
    if not one_of(role, _ROLES):
        raise ResponsesInvalid(
            f"Invalid value for '{param}.role': expected one of user, assistant, system, developer.",
            f"{param}.role",
            "invalid_value",
        )
    assert isinstance(role, str)
    # The developer role as system: SGLang 0.5.3's ``ChatCompletionMessageGenericParam``
    # refuses it (400; 0.5.23 takes it), Qwen2.5's and Qwen3's templates skip messages of
    # a role they do not know, and Llama 3.1's writes it under a header it never saw
    # in training. Every engine and template takes system (``_merge_leading_system``).
    role = "system" if role == "developer" else role
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise _type_error(content, "string or array", f"{param}.content")
    parts: list[dict[str, object]] = []
    for index, part in enumerate(content):
        where = f"{param}.content[{index}]"
        if not isinstance(part, dict):
            raise _type_error(part, "object", where)
        kind = part.get("type")
        if one_of(kind, _TEXT_PARTS):
            text = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text, str):
                raise _type_error(text, "string", f"{where}.text")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _unsupported(f"{where}.image_url", "An input image without an image_url (file_id)")
            image: dict[str, object] = {"url": url}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise _unsupported(f"{where}.type", f"The content part type {json.dumps(kind)}")
    if all(part["type"] == "text" for part in parts):
        # Plain text: what every chat template renders (some take no part lists).
        return {"role": role, "content": "".join(str(part["text"]) for part in parts)}
    return {"role": role, "content": parts}


def _text_of_parts(parts: list[object], param: str) -> str:
    texts: list[str] = []
    for index, part in enumerate(parts):
        if (
            not isinstance(part, dict)
            or part.get("type") != "input_text"
            or not isinstance(part.get("text"), str)
        ):
            raise _unsupported(f"{param}[{index}]", "A tool output part other than input_text")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, object], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _type_error(value, "string", f"{param}.{name}")
    return value


def _tools(value: object) -> list[dict[str, object]]:
    if not isinstance(value, list):
        raise _type_error(value, "array", "tools")
    tools: list[dict[str, object]] = []
    for index, tool in enumerate(value):
        param = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise _type_error(tool, "object", param)
        if tool.get("type") != "function":
            raise _unsupported(f"{param}.type", f"The tool type {json.dumps(tool.get('type'))}")
        for name in tool:
            if name not in ("type", "name", "description", "parameters", "strict"):
                raise _unsupported(f"{param}.{name}", f"The tool field '{name}'")
        function: dict[str, object] = {"name": _string(tool, "name", param)}
        for name in ("description", "parameters", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: object) -> object:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise _unsupported("tool_choice", f"tool_choice {json.dumps(value)}")


def _response_format(text: object) -> dict[str, object] | None:
    if not isinstance(text, dict):
        raise _type_error(text, "object", "text")
    for name in text:
        if name != "format" and not (name == "verbosity" and text[name] is None):
            raise _unsupported(f"text.{name}", f"The text option '{name}'")
    form = text.get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise _type_error(form, "object", "text.format")
    kind = form.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema: dict[str, object] = {
            "name": _string(form, "name", "text.format"),
            "schema": form.get("schema"),
        }
        if form.get("strict") is not None:
            schema["strict"] = form["strict"]
        if form.get("description") is not None:
            schema["description"] = form["description"]
        return {"type": "json_schema", "json_schema": schema}
    raise _unsupported("text.format.type", f"The text format {json.dumps(kind)}")


def _reasoning_effort(value: object) -> str | None:
    if not isinstance(value, dict):
        raise _type_error(value, "object", "reasoning")
    for name in value:
        if name not in ("effort", "summary"):
            raise _unsupported(f"reasoning.{name}", f"The reasoning option '{name}'")
    # No reasoning summaries are produced; "auto" lets the model decide, and it decides none.
    if value.get("summary") not in (None, "auto", "none"):
        raise _unsupported("reasoning.summary", f"reasoning.summary {json.dumps(value.get('summary'))}")
    effort = value.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise _type_error(effort, "string", "reasoning.effort")
    if effort is not None and effort not in _EFFORTS:
        # Chat templates write it into the prompt (gpt-oss's "Reasoning: {effort}"),
        # where no guard reads it: only OpenAI's words pass.
        raise ResponsesInvalid(
            f"Invalid value for 'reasoning.effort': {json.dumps(effort[:40])}. Supported values are: "
            + ", ".join(f"'{word}'" for word in _EFFORTS)
            + ".",
            "reasoning.effort",
            "invalid_value",
        )
    return None if effort is None else _EFFORTS[effort]


def to_chat_body(
    body: Mapping[str, object], history: Sequence[Mapping[str, object]], model: str
) -> dict[str, object]:
    """The chat completions body for ``body``: its instructions as the system message,
    then ``history`` (the earlier turns of a ``previous_response_id``), then its input.
    A stream always asks for its usage: the last event (``response.completed``) carries it."""
    messages: list[dict[str, object]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(dict(turn) for turn in history)
    messages.extend(turns(body))
    messages = _merge_leading_system(messages)
    if not messages and body.get("input"):
        raise ResponsesInvalid(
            "Invalid 'input': it holds only reasoning items without text, which give the model "
            "nothing to answer; send a message too.",
            "input",
            "invalid_value",
        )
    if not messages:
        raise ResponsesInvalid(
            "Invalid 'input': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "input",
            "empty_array",
        )
    chat: dict[str, object] = {"model": model, "messages": messages}
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        response_format = _response_format(body["text"])
        if response_format is not None:
            chat["response_format"] = response_format
    if body.get("reasoning") is not None:
        effort = _reasoning_effort(body["reasoning"])
        if effort is not None:
            chat["reasoning_effort"] = effort
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _merge_leading_system(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    """The system messages a conversation opens with (the instructions, then Codex CLI's
    developer message) as one: Llama 3.1's template takes only ``messages[0]`` as the
    system prompt (beside its tool list and dates), so a second leading one would
    render under a system header of its own after it. Text only; a system message
    later in the conversation stays where it is."""
    lead = 0
    while (
        lead < len(messages)
        and messages[lead].get("role") == "system"
        and isinstance(messages[lead].get("content"), str)
    ):
        lead += 1
    if lead < 2:
        return messages
    merged = "\n\n".join(str(message["content"]) for message in messages[:lead] if message["content"])
    return [{"role": "system", "content": merged}, *messages[lead:]]


# --- the answer as a Response ------------------------------------------------------------------


def usage_of_chat(usage: object, timings: object = None) -> dict[str, object]:
    """A chat ``usage`` as the Responses API's (input/output/total and their details):
    ``cached_tokens`` as the engine reports them (``engine_usage``; llama-server's
    ``timings``), ``cache_write_tokens`` 0 (no cache the client addresses is written;
    openai-python 3.60.0's ``InputTokensDetails`` requires the field)."""
    given = usage if isinstance(usage, dict) else {}
    prompt = _count(given.get("prompt_tokens"))
    completion = _count(given.get("completion_tokens"))
    cached = min(cached_tokens(given, timings), prompt)
    out_details = given.get("completion_tokens_details")
    reasoning = _count(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def chat_usage(usage: Mapping[str, object]) -> dict[str, object]:
    """A Responses ``usage`` as the chat shape the router's accounting reads."""
    return {
        "prompt_tokens": _count(usage.get("input_tokens")),
        "completion_tokens": _count(usage.get("output_tokens")),
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def response_object(
    body: Mapping[str, object],
    response_id: str,
    model: str,
    created_at: int,
    *,
    status: str,
    output: list[dict[str, object]],
    usage: dict[str, object] | None,
    incomplete_reason: str | None = None,
) -> dict[str, object]:
    """A Response object (OpenAI's fields; ``model`` is the name the client used)."""
    text = body.get("text")
    reasoning = body.get("reasoning")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None if incomplete_reason is None else {"reason": incomplete_reason},
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": reasoning if isinstance(reasoning, dict) else {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature", 1.0),
        "text": text if isinstance(text, dict) and "format" in text else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": body.get("user"),
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    """OpenAI's reasoning item (``ResponseReasoningItem``) with the engine's reasoning as
    its ``reasoning_text``: no summary (none is produced), nothing encrypted."""
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def reasoning_of(message: Mapping[str, object]) -> str | None:
    """The reasoning an engine's reasoning parser split from a chat message or delta:
    ``reasoning_content`` in the pinned engines (vLLM 0.11.0's ``ChatMessage`` and
    ``DeltaMessage``, llama-server's ``--reasoning-format``), ``reasoning`` in later
    vLLM releases."""
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, object]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _incomplete_reason(finish_reason: object) -> str | None:
    return "max_output_tokens" if finish_reason == "length" else None


def from_chat_answer(
    body: Mapping[str, object],
    answer: Mapping[str, object],
    response_id: str,
    model: str,
    created_at: int,
    new_id: NewId,
) -> dict[str, object]:
    """The Response for a whole chat completion (its first choice): its reasoning (a
    ``reasoning`` item), its text (a ``message``) and its tool calls, in that order."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    output: list[dict[str, object]] = []
    reasoning = reasoning_of(message)
    if reasoning is not None:
        output.append(_reasoning_item(new_id("rs"), reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(_message_item(new_id("msg"), content))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            output.append(
                _call_item(
                    new_id("fc"),
                    str(call.get("id") or new_id("call")),
                    str(function.get("name") or ""),
                    str(function.get("arguments") or ""),
                )
            )
    reason = _incomplete_reason(choice.get("finish_reason"))
    return response_object(
        body,
        response_id,
        model,
        created_at,
        status="completed" if reason is None else "incomplete",
        output=output,
        usage=usage_of_chat(answer.get("usage"), answer.get("timings")),
        incomplete_reason=reason,
    )


def engine_refusal(status: int, body: bytes | Mapping[str, object], model: str, *, too_long: bool) -> Refusal:
    """An engine's error answer (not 200, or an error event in its stream) as OpenAI's
    error, its message kept.

    Engines answer in shapes of their own (``engine_errors``: vLLM's ``ErrorResponse``,
    SGLang's at the top or in an event, llama-server's with ``n_prompt_tokens`` and
    ``n_ctx``), each with an integer ``code`` (the status) where OpenAI has a string
    or null, and types of their own (``BadRequestError``, ``BAD_REQUEST``,
    ``exceed_context_size_error``...). A Responses client gets OpenAI's fields instead:
    ``type`` ``invalid_request_error`` (a 4xx) or ``server_error``, the engine's
    ``param`` and ``code`` only where they are strings, and for a prompt longer than
    the context (``too_long``, the caller's reading, or each engine's words as
    ``engine_errors`` reads them) OpenAI's own ``code`` ``context_length_exceeded``
    and ``param`` ``input``, which clients test for (Codex CLI ends the turn on it
    instead of retrying; OpenAI's answer to a too-long input, as its clients report it:
    ``{"type": "invalid_request_error", "code": "context_length_exceeded", "param":
    "input"}``, e.g. anomalyco/opencode issue 6071)."""
    error = engine_errors.read(status, body)
    message = error.message or f"The model `{model}` answered with HTTP {status}."
    kind = "invalid_request_error" if status < 500 else "server_error"
    if too_long or (error.too_long and status < 500):
        return Refusal(status, message, "invalid_request_error", "context_length_exceeded", param="input")
    return Refusal(status, message, kind, error.code, param=error.param)


def output_turns(output: object) -> list[dict[str, object]]:
    """A Response's output as the chat messages of the next turn's history (its
    reasoning as the assistant turn's ``reasoning_content``, as ``turns`` carries a
    reasoning item a client sends back)."""
    turns_out: list[dict[str, object]] = []
    calls: list[dict[str, object]] = []
    text: list[str] = []
    reasoning: list[str] = []
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "reasoning":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]:
                    reasoning.append(part["text"])
        elif item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    text.append(part["text"])
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
    if text or calls or reasoning:
        turn: dict[str, object] = {
            "role": "assistant",
            "content": "".join(text) if text or not calls else None,
        }
        if calls:
            turn["tool_calls"] = calls
        if reasoning:
            _give_reasoning(turn, reasoning)
        turns_out.append(turn)
    return turns_out


# --- the stream -------------------------------------------------------------------------------


def sse_event(event: Mapping[str, object]) -> bytes:
    """One Responses stream event as SSE (its ``type`` also as the ``event:`` line)."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


@dataclass
class _Call:
    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamTranslation:
    """A chat completions stream in, Responses events out, in the order vLLM's
    ``serving_responses.py`` sends them: ``response.created``, ``response.in_progress``,
    per item ``response.output_item.added`` (a message: ``response.content_part.added``,
    ``response.output_text.delta``..., ``response.output_text.done``,
    ``response.content_part.done``; a function call: ``response.function_call_arguments.delta``...,
    ``response.function_call_arguments.done``), ``response.output_item.done``, and
    ``response.completed`` (``response.incomplete`` when cut by ``max_output_tokens``) with the usage.
    The engine's reasoning (``reasoning_content`` deltas) is a reasoning item in the same
    shape as a message, with ``response.reasoning_text.delta``/``.done`` (OpenAI's events,
    the ``openai`` SDK's ``ResponseReasoningText*Event``) and a ``reasoning_text`` part; it
    is closed as soon as the answer's text or a tool call starts, before that item's
    ``response.output_item.added``. An error event of the chat stream becomes an ``error``
    event and ``response.failed``."""

    body: Mapping[str, object]
    response_id: str
    model: str
    created_at: int
    new_id: NewId
    final: dict[str, object] | None = None  # the Response of ``response.completed`` (or incomplete/failed)
    _buffer: bytes = b""
    _sequence: int = 0
    _started: bool = False
    _text_item: str | None = None
    _text_index: int = 0
    _text: list[str] = field(default_factory=list)
    _calls: dict[int, _Call] = field(default_factory=dict)
    _reasoning_item: str | None = None  # the reasoning item still open
    _reasoning_index: int = 0
    _reasoning: list[str] = field(default_factory=list)
    _done: dict[int, dict[str, object]] = field(default_factory=dict)  # closed items by output index
    _next_index: int = 0
    _finish_reason: object = None
    _usage: object = None
    _timings: object = None  # llama-server's (``cache_n``)

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress`` (sent before the engine answers)."""
        if self._started:
            return b""
        self._started = True
        shell = self._response("in_progress", [], None)
        return self._emit({"type": "response.created", "response": shell}) + self._emit(
            {"type": "response.in_progress", "response": shell}
        )

    def feed(self, chunk: bytes) -> bytes:
        """The events for the chat stream's bytes so far (partial lines wait for the rest)."""
        out = [self.start()]
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:") or self.final is not None:
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out.append(self.finish())
                continue
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(self._chunk(event))
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events (at ``[DONE]``, or when the chat stream ends without it)."""
        if self.final is not None:
            return b""
        out = [self.start(), self._close_items()]
        reason = _incomplete_reason(self._finish_reason)
        status = "completed" if reason is None else "incomplete"
        self.final = self._response(status, self._output(), usage_of_chat(self._usage, self._timings), reason)
        out.append(self._emit({"type": f"response.{status}", "response": self.final}))
        return b"".join(out)

    def fail(self, code: str | None, message: str) -> bytes:
        """An ``error`` event and ``response.failed``: the stream broke off."""
        if self.final is not None:
            return b""
        out = [self.start(), self._emit({"type": "error", "code": code, "message": message, "param": None})]
        self.final = self._response("failed", self._output(), usage_of_chat(self._usage, self._timings), None)
        self.final["error"] = {"code": code or "server_error", "message": message}
        out.append(self._emit({"type": "response.failed", "response": self.final}))
        return b"".join(out)

    # the chat chunks

    def _chunk(self, event: Mapping[str, object]) -> bytes:
        error = event.get("error")
        if isinstance(error, dict):
            # An engine's error after its 200 (SGLang's validation at 0.5.3, its
            # scheduler's aborts at 0.5.23, llama-server's): OpenAI's code for it.
            refusal = engine_refusal(engine_errors.stream_status(error), event, self.model, too_long=False)
            return self.fail(refusal.code, refusal.message)
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            self._timings = event["timings"]
        out: list[bytes] = []
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                reasoning = reasoning_of(delta)
                if reasoning is not None:
                    out.append(self._reasoning_delta(reasoning))
                content = delta.get("content")
                if isinstance(content, str) and content:
                    out.append(self._close_reasoning() + self._text_delta(content))
                calls = delta.get("tool_calls")
                for call in calls if isinstance(calls, list) else []:
                    if isinstance(call, dict):
                        out.append(self._close_reasoning() + self._call_delta(call))
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        if self._reasoning_item is None:
            self._reasoning_item = self.new_id("rs")
            self._reasoning_index = self._take_index()
            self._reasoning = []
            item = {**_reasoning_item(self._reasoning_item, "", "in_progress"), "content": []}
            out += self._emit(
                {"type": "response.output_item.added", "output_index": self._reasoning_index, "item": item}
            )
            out += self._emit(
                {
                    "type": "response.content_part.added",
                    **self._reasoning_where(),
                    "part": {"type": "reasoning_text", "text": ""},
                }
            )
        self._reasoning.append(text)
        return out + self._emit(
            {"type": "response.reasoning_text.delta", **self._reasoning_where(), "delta": text}
        )

    def _reasoning_where(self) -> dict[str, object]:
        assert self._reasoning_item is not None
        return {"item_id": self._reasoning_item, "output_index": self._reasoning_index, "content_index": 0}

    def _close_reasoning(self) -> bytes:
        """The open reasoning item's closing events and ``response.output_item.done`` (none open: b"")."""
        if self._reasoning_item is None:
            return b""
        text = "".join(self._reasoning)
        where = self._reasoning_where()
        out = self._emit({"type": "response.reasoning_text.done", **where, "text": text})
        out += self._emit(
            {"type": "response.content_part.done", **where, "part": {"type": "reasoning_text", "text": text}}
        )
        item = _reasoning_item(self._reasoning_item, text)
        out += self._emit(
            {"type": "response.output_item.done", "output_index": self._reasoning_index, "item": item}
        )
        self._done[self._reasoning_index] = item
        self._reasoning_item = None
        return out

    def _text_delta(self, content: str) -> bytes:
        out = b""
        if self._text_item is None:
            self._text_item = self.new_id("msg")
            self._text_index = self._take_index()
            out += self._emit(
                {
                    "type": "response.output_item.added",
                    "output_index": self._text_index,
                    "item": {**_message_item(self._text_item, "", "in_progress"), "content": []},
                }
            )
            out += self._emit(
                {
                    "type": "response.content_part.added",
                    "item_id": self._text_item,
                    "output_index": self._text_index,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                }
            )
        self._text.append(content)
        return out + self._emit(
            {
                "type": "response.output_text.delta",
                "item_id": self._text_item,
                "output_index": self._text_index,
                "content_index": 0,
                "delta": content,
                "logprobs": [],
            }
        )

    def _call_delta(self, call: Mapping[str, object]) -> bytes:
        index = call.get("index", 0)
        position = index if isinstance(index, int) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        out = b""
        known = self._calls.get(position)
        if known is None:
            known = _Call(
                self.new_id("fc"),
                str(call.get("id") or self.new_id("call")),
                str(function.get("name") or ""),
                self._take_index(),
            )
            self._calls[position] = known
            out += self._emit(
                {
                    "type": "response.output_item.added",
                    "output_index": known.output_index,
                    "item": _call_item(known.item_id, known.call_id, known.name, "", "in_progress"),
                }
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            known.arguments.append(arguments)
            out += self._emit(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": known.item_id,
                    "output_index": known.output_index,
                    "delta": arguments,
                }
            )
        return out

    def _close_items(self) -> bytes:
        """Each open item's closing events, then its ``response.output_item.done``, in output order."""
        items: list[tuple[int, Callable[[], tuple[bytes, dict[str, object]]]]] = []
        if self._text_item is not None:
            items.append((self._text_index, self._close_text))
        for known in self._calls.values():
            items.append((known.output_index, lambda known=known: self._close_call(known)))  # type: ignore[misc]
        out = b""
        for index, close in sorted(items, key=lambda entry: entry[0]):
            if self._reasoning_item is not None and self._reasoning_index < index:
                out += self._close_reasoning()
            events, item = close()
            out += events + self._emit(
                {"type": "response.output_item.done", "output_index": index, "item": item}
            )
            self._done[index] = item
        # An answer cut while it reasoned, or one that only reasoned.
        return out + self._close_reasoning()

    def _output(self) -> list[dict[str, object]]:
        """The closed items, in output order."""
        return [self._done[index] for index in sorted(self._done)]

    def _close_text(self) -> tuple[bytes, dict[str, object]]:
        assert self._text_item is not None
        text = "".join(self._text)
        item = _message_item(self._text_item, text)
        where = {"item_id": self._text_item, "output_index": self._text_index, "content_index": 0}
        events = self._emit({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return events + self._emit({"type": "response.content_part.done", **where, "part": part}), item

    def _close_call(self, known: _Call) -> tuple[bytes, dict[str, object]]:
        arguments = "".join(known.arguments)
        event = {
            "type": "response.function_call_arguments.done",
            "item_id": known.item_id,
            "output_index": known.output_index,
            "name": known.name,
            "arguments": arguments,
        }
        return self._emit(event), _call_item(known.item_id, known.call_id, known.name, arguments)

    def _take_index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def _response(
        self,
        status: str,
        output: list[dict[str, object]],
        usage: dict[str, object] | None,
        reason: str | None = None,
    ) -> dict[str, object]:
        return response_object(
            self.body,
            self.response_id,
            self.model,
            self.created_at,
            status=status,
            output=list(output),
            usage=usage,
            incomplete_reason=reason,
        )

    def _emit(self, event: dict[str, object]) -> bytes:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        return sse_event(event)


# --- stored conversations ---------------------------------------------------------------------

_ID_PREFIX = "resp_"
# 8 hex digits of the creation time (the Response's own created_at: what lets every
# router sweep expired ids from their key names alone), then 40 random ones (20
# bytes). Nothing in it names the replica, the node or the router.
_ID_TIME_HEX = 8
_ID_HEX = 48


def is_response_id(value: str) -> bool:
    """Whether ``value`` has the shape of an id a router draws (``resp_`` and 48 hex
    digits); anything else is unknown without asking the store (and cannot name a key
    outside its prefix)."""
    rest = value[len(_ID_PREFIX) :]
    return (
        value.startswith(_ID_PREFIX) and len(rest) == _ID_HEX and all(c in "0123456789abcdef" for c in rest)
    )


def response_id_of(created_at: int, random_hex: str) -> str:
    """The id of a response created at ``created_at`` (wall-clock seconds), with 40 random hex digits."""
    if len(random_hex) != _ID_HEX - _ID_TIME_HEX:
        raise ValueError(f"a response id takes {_ID_HEX - _ID_TIME_HEX} random hex digits")
    return f"{_ID_PREFIX}{created_at & 0xFFFFFFFF:08x}{random_hex}"


def expired_ids(ids: Iterable[str], now: float, retention: float) -> list[str]:
    """The ids, among those a store lists, whose retention has passed: ids of another
    shape are not a router's and are left alone."""
    return [
        value
        for value in ids
        if is_response_id(value)
        and int(value[len(_ID_PREFIX) : len(_ID_PREFIX) + _ID_TIME_HEX], 16) + retention < now
    ]


@dataclass(frozen=True, slots=True)
class StoredConversation:
    """What a stored response leaves for its follow-ups: who owns it, until when, and
    every chat turn up to and with its answer (instructions aside). ``too_large`` is
    a response whose conversation was over the size cap: kept only to say so."""

    owner: str  # the API key id that created it ("" without keys)
    expires_at: float  # wall-clock seconds
    messages: tuple[Mapping[str, object], ...]
    too_large: int = 0  # the conversation's size in bytes when it was not kept

    def encode(self) -> bytes:
        return json.dumps(
            {
                "owner": self.owner,
                "expires_at": self.expires_at,
                "messages": list(self.messages),
                "too_large": self.too_large,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()


def decode_conversation(raw: bytes) -> StoredConversation | None:
    """A stored value, or None when it is not one (KV content is untrusted)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    owner, expires, messages, too_large = (
        value.get("owner"),
        value.get("expires_at"),
        value.get("messages"),
        value.get("too_large", 0),
    )
    if (
        not isinstance(owner, str)
        or isinstance(expires, bool)
        or not isinstance(expires, int | float)
        or not isinstance(messages, list)
        or not all(isinstance(m, dict) for m in messages)
        or not isinstance(too_large, int)
    ):
        return None
    return StoredConversation(owner, float(expires), tuple(messages), too_large)


def conversation_after(
    history: Sequence[Mapping[str, object]], body: Mapping[str, object], output: object
) -> list[dict[str, object]]:
    """The turns a follow-up of this response continues: the earlier ones, this
    request's input and the answer's output."""
    return [*(dict(turn) for turn in history), *turns(body), *output_turns(output)]
