"""Anthropic's Messages API on the simulated engine, as vLLM serves it where it does
(``vllm/entrypoints/anthropic/``, vLLM's main branch; no release llmgw pins has it):
``POST /v1/messages`` (whole, or streamed as ``message_start``, ``content_block_start``,
``content_block_delta``..., ``content_block_stop``, ``message_delta`` with the usage,
``message_stop``) and ``POST /v1/messages/count_tokens`` (``{"input_tokens": N}``).

The prompt is what vLLM's converter puts in the chat it generates from: the system
prompt, every text block, tool results; the answer is the sim's Greek. Errors are in
Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``), including the
``_admit`` refusals (unknown model, not ready, injected failures).

Must not: hold state (the app's ``SimState`` does).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from aiohttp import web

from llmgw.sim import openai_api, streaming, vocabulary
from llmgw.sim.openai_api import ApiError, Endpoint, GenerationRequest

# What the app gives these handlers: its admission (faults, body, model, readiness) and
# the pieces a generation says, with how many of the first are reasoning.
Admit = Callable[[web.Request], Awaitable[tuple[Any, dict[str, Any]]]]
Pieces = Callable[[Any, GenerationRequest], tuple[int, Iterator[str]]]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
TOKENIZE_PATH = "/tokenize"
# The chat finish reasons as Messages stop reasons (vLLM's converter maps them so).
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}


def add_routes(
    app: web.Application, admit: Admit, pieces: Pieces, failed: Callable[[web.Request], None]
) -> None:
    """The two routes on the head's app; ``failed`` counts a refused request as the
    app's error envelope does."""

    def _error(request: web.Request, exc: ApiError) -> web.Response:
        failed(request)
        return error_response(exc)

    async def create(request: web.Request) -> web.StreamResponse:
        try:
            state, body = await admit(request)
            generation = parse_messages(body, state.limits).answered(*state.answer_lengths)
            failure = state.faults.draw_failure()
            if failure is not None:
                raise failure
        except ApiError as exc:
            return _error(request, exc)
        # vLLM's converter gives a tool_use block the id of the chat's tool call.
        call = openai_api.tool_call_for(
            state.settings.tool_calls, generation, "chatcmpl-tool-" + uuid.uuid4().hex
        )
        if call is not None:
            return await _call_tool(request, state, generation, call)
        if generation.stream:
            return await _stream(request, state, generation, pieces)
        reasoning, answer = pieces(state.settings, generation)
        said = await state.generate(generation.prompt_tokens, answer)
        return web.json_response(
            {
                **_message(state.settings.served_name, generation, len(said)),
                "content": _content(said, reasoning),
            }
        )

    async def count(request: web.Request) -> web.StreamResponse:
        try:
            _, body = await admit(request)
            prompt, _ = prompt_of(body)
        except ApiError as exc:
            return _error(request, exc)
        return web.json_response({"input_tokens": vocabulary.count_tokens(prompt)})

    async def tokenize(request: web.Request) -> web.StreamResponse:
        # vLLM's /tokenize (vllm/entrypoints/openai/api_server.py, 0.10.2 and 0.11.0): a
        # chat's ``messages`` or a ``prompt`` in, ``count``, ``max_model_len`` and the ids
        # out (the sim's ids are the tokens' positions). llmgw counts a Messages
        # request's tokens here for engines without /v1/messages/count_tokens.
        state, body = await admit(request)
        messages = body.get("messages")
        if isinstance(messages, list):
            text = "\n".join(openai_api.message_text(message, i) for i, message in enumerate(messages))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise ApiError(400, "Either `messages` or `prompt` is required.", param="messages")
        tokens = vocabulary.count_tokens(text)
        return web.json_response(
            {"count": tokens, "max_model_len": state.limits.max_model_len, "tokens": list(range(tokens))}
        )

    app.router.add_post(MESSAGES_PATH, create)
    app.router.add_post(COUNT_TOKENS_PATH, count)
    app.router.add_post(TOKENIZE_PATH, tokenize)


def error_response(exc: ApiError) -> web.Response:
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    if exc.status in (503, 529):
        kind = "overloaded_error"
    return web.json_response(
        {"type": "error", "error": {"type": kind, "message": exc.message}}, status=exc.status
    )


def prompt_of(body: Mapping[str, Any]) -> tuple[str, list[object]]:
    """The text vLLM's converter puts in the chat (system, text blocks, tool results), and the messages."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: Field required (a non-empty list of messages)", param="messages")
    texts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        texts.append(system)
    elif isinstance(system, list):
        texts.extend(b["text"] for b in system if isinstance(b, dict) and isinstance(b.get("text"), str))
    for index, message in enumerate(messages):
        # A system message among the others: Claude Code sends its environment as one.
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise ApiError(400, f"messages.{index}.role: Input should be 'user', 'assistant' or 'system'")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list) or not content:
            raise ApiError(400, f"messages.{index}.content: message content must not be empty")
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "tool_result":
                result = block.get("content")
                texts.append(result if isinstance(result, str) else json.dumps(result))
            elif block.get("type") == "tool_use":
                texts.append(json.dumps(block.get("input", {})))
    return "\n".join(texts), messages


def parse_messages(body: Mapping[str, Any], limits: openai_api.Limits) -> GenerationRequest:
    model = openai_api.requested_model(body)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiError(400, "max_tokens: Input should be a valid integer of at least 1", param="max_tokens")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream: Input should be a valid boolean", param="stream")
    prompt, messages = prompt_of(body)
    prompt_tokens = vocabulary.count_tokens(prompt)
    openai_api.check_context(prompt_tokens, max_tokens, limits)
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else None
    after_tool_result = isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )
    return GenerationRequest(
        Endpoint.CHAT, model, prompt, prompt_tokens, max_tokens, stream, True,
        tools=_custom_tools(body), after_tool_result=after_tool_result,
    )  # fmt: skip


def _custom_tools(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the request's own tools (no ``type``, or ``custom``: not Anthropic's
    server tools); none under ``tool_choice: {"type": "none"}``."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or (isinstance(choice, dict) and choice.get("type") == "none"):
        return ()
    return tuple(
        tool["name"]
        for tool in tools
        if isinstance(tool, dict)
        and tool.get("type") in (None, "custom")
        and isinstance(tool.get("name"), str)
    )


def _message(model: str, generation: GenerationRequest, output_tokens: int) -> dict[str, Any]:
    return {
        "id": "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": STOP_REASONS[generation.finish_reason] if output_tokens else None,
        "stop_sequence": None,
        "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": output_tokens},
    }


def _content(said: list[str], reasoning: int) -> list[dict[str, Any]]:
    """A whole message's blocks as vLLM's converter makes them of a chat answer
    (``vllm/entrypoints/anthropic/serving.py``, 0.34.0): the reasoning as a ``thinking``
    block with a signature, then the content as a ``text`` block, each only when not empty."""
    blocks: list[dict[str, Any]] = []
    if reasoning:
        thinking = "".join(said[:reasoning])
        blocks.append({"type": "thinking", "thinking": thinking, "signature": uuid.uuid4().hex})
    text = "".join(said[reasoning:])
    if text or not blocks:
        blocks.append({"type": "text", "text": text})
    return blocks


def event(kind: str, payload: Mapping[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _stream(
    request: web.Request, state: Any, generation: GenerationRequest, pieces: Pieces
) -> web.StreamResponse:
    """Streamed as vLLM's converter streams a chat answer (0.34.0): the reasoning as a
    ``thinking`` block of ``thinking_delta``s closed by a ``signature_delta``, then the
    content as a ``text`` block of ``text_delta``s."""
    start = _message(state.settings.served_name, generation, 0)
    reasoning, answer = pieces(state.settings, generation)
    text_index = 1 if reasoning else 0

    def close_thinking() -> list[bytes]:
        signature = {"type": "signature_delta", "signature": uuid.uuid4().hex}
        return [
            event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": signature}),
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]

    def piece(text: str, index: int) -> list[bytes]:
        if index < reasoning:
            delta = {"type": "thinking_delta", "thinking": text}
            data = [event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})]
            if index == 0:
                block = {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""},
                }
                data.insert(0, event("content_block_start", block))
            return data
        delta = {"type": "text_delta", "text": text}
        data = [
            event("content_block_delta", {"type": "content_block_delta", "index": text_index, "delta": delta})
        ]
        if index == reasoning:
            block = {
                "type": "content_block_start",
                "index": text_index,
                "content_block": {"type": "text", "text": ""},
            }
            data = [*(close_thinking() if reasoning else []), event("content_block_start", block), *data]
        return data

    def end(sent: int) -> list[bytes]:
        data: list[bytes] = []
        if sent and sent <= reasoning:
            data = close_thinking()
        elif sent:
            data = [event("content_block_stop", {"type": "content_block_stop", "index": text_index})]
        # vLLM's message_delta carries the input tokens too (message_stream_converter).
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[generation.finish_reason], "stop_sequence": None},
            "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": sent},
        }
        return [*data, event("message_delta", delta), event("message_stop", {"type": "message_stop"})]

    return await streaming.stream_pieces(
        request,
        state,
        generation.prompt_tokens,
        answer,
        start=[event("message_start", {"type": "message_start", "message": start})],
        piece=piece,
        end=end,
    )


async def _call_tool(
    request: web.Request, state: Any, generation: GenerationRequest, call: openai_api.ToolCall
) -> web.StreamResponse:
    """A message that is one ``tool_use`` block (``--tool-calls``), ``stop_reason``
    ``tool_use``, as vLLM's converter makes one of a chat's tool call: whole, the block
    with its ``input``; streamed, a ``content_block_start`` with an empty ``input`` and
    the arguments in ``input_json_delta``s (Anthropic's streaming shape)."""
    generation = dataclasses.replace(generation, stops=True)
    stop_reason = STOP_REASONS["tool_calls"]
    block = {"type": "tool_use", "id": call.id, "name": call.name}
    if not generation.stream:
        said = await state.generate(generation.prompt_tokens, iter(call.pieces()))
        message = _message(state.settings.served_name, generation, len(said))
        return web.json_response(
            {
                **message,
                "stop_reason": stop_reason,
                "content": [{**block, "input": json.loads(call.arguments)}],
            }
        )

    def piece(text: str, index: int) -> list[bytes]:
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": text},
        }
        data = [event("content_block_delta", delta)]
        if index == 0:
            start = {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}}
            data.insert(0, event("content_block_start", start))
        return data

    def end(sent: int) -> list[bytes]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": sent},
        }
        return [
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            event("message_delta", delta),
            event("message_stop", {"type": "message_stop"}),
        ]

    return await streaming.stream_pieces(
        request,
        state,
        generation.prompt_tokens,
        iter(call.pieces()),
        start=[
            event(
                "message_start",
                {"type": "message_start", "message": _message(state.settings.served_name, generation, 0)},
            )
        ],
        piece=piece,
        end=end,
    )
