"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Owns: the Messages checks beyond ``calls.parse_call``'s (``max_tokens``), and, per
model of a request's chain, how its engine is asked: as it is, on ``/v1/messages``,
when every profile of the model runs an engine that serves it (``NATIVE_ENGINES``),
else translated to a chat completion (``llmgw.core.anthropic``: the documented subset,
a 400 naming any field it cannot carry) and the answer translated back. Token counts
go to the engine's ``/v1/messages/count_tokens`` (the sim's, llama-server's:
``COUNT_TOKENS_ENGINES``), or vLLM's ``/tokenize`` (``TOKENIZE_ENGINES``); a model
whose engine has neither is answered 400.

Everything else is chat completions' (``handlers.serve_call``): model resolution,
aliases, the key's model list, limits, the guard, fallbacks, loading on demand,
metrics and usage. Errors on these paths are rendered in Anthropic's shape by the
middleware (``middlewares.observe``) and, mid-stream, by the dispatcher.

Must not: choose endpoints or build error bodies by hand beyond the 400s here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from llmgw.core import anthropic
from llmgw.core.catalog import Catalog, Engine
from llmgw.core.routing import Api
from llmgw.gateway import errors, handlers
from llmgw.gateway.calls import ApiCall, parse_call
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.dispatch import Translation
from llmgw.gateway.errors import ApiError
from llmgw.gateway.handlers import Translate
from llmgw.gateway.upstream import StreamRewrite

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
CHAT_PATH = "/v1/chat/completions"
TOKENIZE_PATH = "/tokenize"

# Engines whose pinned release serves /v1/messages and /v1/messages/count_tokens
# itself. Only the sim: vLLM 0.11.0 and 0.10.2, SGLang 0.5.3 and llama.cpp b6795 (the
# releases llmgw's images pin) have no Messages endpoint (see DESIGN.md).
NATIVE_ENGINES = frozenset({Engine.SIM})
# Engines whose pinned release counts a chat's tokens on /tokenize ({"messages"} in,
# {"count"} out): vLLM's TokenizeChatRequest (vllm/entrypoints/openai/protocol.py).
TOKENIZE_ENGINES = frozenset({Engine.VLLM})
# Engines that answer /v1/messages/count_tokens themselves though their Messages are
# translated: llama.cpp's llama-server (b11434, tools/server/server.cpp's route, and
# server-context.cpp's handle_count_tokens: the Anthropic body converted to a chat, its
# template applied and tokenized, as /apply-template then /tokenize would, in one call).
COUNT_TOKENS_ENGINES = frozenset({Engine.LLAMACPP})


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def native(catalog: Catalog, model: str) -> bool:
    """Whether every profile of ``model`` runs an engine that serves Messages itself."""
    return all(profile.engine in NATIVE_ENGINES for profile in catalog.models[model].profiles)


def counts_tokens(catalog: Catalog, model: str) -> bool:
    return (
        native(catalog, model)
        or all(profile.engine in TOKENIZE_ENGINES for profile in catalog.models[model].profiles)
        or _counts_natively(catalog, model)
    )


def _counts_natively(catalog: Catalog, model: str) -> bool:
    """Whether every profile's engine answers /v1/messages/count_tokens itself."""
    return all(
        profile.engine in NATIVE_ENGINES | COUNT_TOKENS_ENGINES for profile in catalog.models[model].profiles
    )


# --- the handlers --------------------------------------------------------------------------------


async def create_message(request: web.Request) -> web.StreamResponse:
    call = await _parse(request, count=False)
    return await handlers.serve_call(request, call, translate=lambda c, chain: _for_messages(call, c, chain))


async def count_tokens(request: web.Request) -> web.StreamResponse:
    call = await _parse(request, count=True)
    # A count is the engine's work (it tokenizes the whole prompt): a token-limited key
    # holds the prompt's estimate and, its answer carrying no usage, pays it.
    return await handlers.serve_call(
        request,
        call,
        translate=lambda c, chain: _for_count(call, c, chain),
        hold_tokens=call.tokens_to_hold(0),
        screen=False,
    )


async def _parse(request: web.Request, *, count: bool) -> ApiCall:
    context = request.app[CONTEXT]
    call = parse_call(Api.MESSAGES, await handlers.read_request_body(request, context.settings))
    max_tokens = call.body.get("max_tokens")
    if count:
        if call.stream:
            raise errors.bad_request("stream: Extra inputs are not permitted", param="stream")
    elif max_tokens is None:
        raise errors.bad_request("max_tokens: Field required", param="max_tokens")
    elif isinstance(max_tokens, int) and max_tokens < 1:  # parse_call checked it is an integer
        raise errors.bad_request("max_tokens: Input should be greater than or equal to 1", param="max_tokens")
    return call


def _translated(
    call: ApiCall, catalog: Catalog, chain: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, object] | None]:
    """The chain that can answer ``call`` and the chat completion its translated models
    are asked (None: every model of that chain serves Messages itself). Decided before
    any engine is asked: a field the translation cannot carry is a 400 when the first
    model needs it, and leaves out the fallbacks that would (they cannot answer this
    request as it was asked)."""
    if all(native(catalog, model) for model in chain):
        return chain, None
    try:
        return chain, anthropic.to_chat(call.body)
    except anthropic.Untranslatable as exc:
        if not native(catalog, chain[0]):
            raise errors.bad_request(f"{exc.param}: {exc}", param=exc.param) from None
        return tuple(model for model in chain if native(catalog, model)), None


def _for_messages(call: ApiCall, catalog: Catalog, chain: tuple[str, ...]) -> Translate:
    chain, chat = _translated(call, catalog, chain)
    if chat is None:
        return chain, None
    stops = chat.get("stop")
    stops = tuple(stops) if isinstance(stops, list) else ()
    omit_thinking = anthropic.thinking_omitted(call.body)

    def per_model(model: str) -> Translation | None:
        return None if native(catalog, model) else _ChatTranslation(chat, model, stops, omit_thinking)

    return chain, per_model


def _for_count(call: ApiCall, catalog: Catalog, chain: tuple[str, ...]) -> Translate:
    if not counts_tokens(catalog, chain[0]):
        raise errors.bad_request(
            f"The model `{call.model}` runs on an engine that cannot count tokens "
            "(no /v1/messages/count_tokens, no /tokenize); count them with messages.create's usage.",
            param="model",
        )
    able, chat = _translated(call, catalog, tuple(model for model in chain if counts_tokens(catalog, model)))

    def per_model(model: str) -> Translation | None:
        if _counts_natively(catalog, model) or chat is None:
            return _NativeCount(call.body)
        return _TokenizeTranslation(chat, model)

    return able, per_model


# --- the translations ----------------------------------------------------------------------------


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _engine_error(status: int, body: bytes, model: str) -> bytes:
    """An engine's error answer, any engine's shape, in Anthropic's (a context overflow
    in Anthropic's words: ``anthropic.engine_error_body``)."""
    return _json(anthropic.engine_error_body(status, body, model))


@dataclass(frozen=True, slots=True)
class _ChatTranslation:
    """A Messages request asked as a chat completion, and its answer translated back."""

    chat: dict[str, object]
    model: str
    stops: tuple[str, ...]
    omit_thinking: bool = False
    path: str = CHAT_PATH

    def body(self, model: str) -> bytes:
        return _json({**self.chat, "model": model})

    def whole(self, status: int, body: bytes) -> bytes:
        if status != 200:
            return _engine_error(status, body, self.model)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ApiError(errors.upstream_unreadable(self.model))
        return _json(anthropic.from_chat(answer, self.model, self.stops, omit_thinking=self.omit_thinking))

    def stream(self) -> StreamRewrite:
        return anthropic.StreamTranslation(self.model, self.stops, self.omit_thinking)


@dataclass(frozen=True, slots=True)
class _NativeCount:
    """A token count the engine answers itself, on /v1/messages/count_tokens."""

    request: dict[str, object]
    path: str = COUNT_TOKENS_PATH

    def body(self, model: str) -> bytes:
        return _json({**self.request, "model": model})

    def whole(self, status: int, body: bytes) -> bytes:
        return body

    def stream(self) -> StreamRewrite:  # a count is never streamed (``_parse``)
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _TokenizeTranslation:
    """A token count asked as vLLM's /tokenize of the chat the request translates to."""

    chat: dict[str, object]
    model: str
    path: str = TOKENIZE_PATH

    def body(self, model: str) -> bytes:
        request: dict[str, object] = {
            "model": model,
            "messages": self.chat["messages"],
            "add_generation_prompt": True,
        }
        if "tools" in self.chat:
            request["tools"] = self.chat["tools"]
        return _json(request)

    def whole(self, status: int, body: bytes) -> bytes:
        if status != 200:
            return _engine_error(status, body, self.model)
        try:
            count = json.loads(body).get("count")
        except (ValueError, AttributeError):
            count = None
        if not isinstance(count, int):
            raise ApiError(errors.upstream_unreadable(self.model))
        return _json({"input_tokens": count})

    def stream(self) -> StreamRewrite:
        raise NotImplementedError
