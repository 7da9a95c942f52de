"""``POST /v1/responses``: OpenAI's Responses API, translated to chat completions.

Owns the Responses request's way through the router: read and check it
(``llmgw.core.responses``), expand a ``previous_response_id`` from the shared store
(the key that stored it only), and then the chat path's own steps on the chat
request it stands for: model resolution under the key's models (``Api.RESPONSES``:
chat models), the key's limits (holding ``max_output_tokens``), the model gate,
the guard (it screens the chat messages, so the instructions, every input item,
tool outputs and tool definitions), and the dispatcher's walk (fallbacks, load on
demand, retries). The chat answer comes back as a Response or as Responses stream
events; its usage goes to the same metrics and key accounting as chat's; with
``store`` the conversation is kept for follow-ups under a random ``resp_`` id.

Must not: choose endpoints or retry (the dispatcher does), screen (the guard does),
or know where the store keeps its values (``ports.ResponseStore``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from aiohttp import web

from llmgw.core import responses
from llmgw.core.responses import ResponsesInvalid, StoredConversation
from llmgw.core.routing import Api, Refusal
from llmgw.gateway import errors, handlers
from llmgw.gateway.calls import ApiCall, json_object, parse_call
from llmgw.gateway.context import API_KEY, CONTEXT, REQUEST_ID, SERVED, STARTED, RouterContext
from llmgw.gateway.dispatch import SSE_HEADERS, Exchange, RefusedMidStream, Served
from llmgw.gateway.errors import ApiError
from llmgw.gateway.guard import says_too_long
from llmgw.gateway.transport import BodyBroken
from llmgw.gateway.upstream import ClientStalled, PumpEnd, write_within

log = logging.getLogger("llmgw.gateway.responses")

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def previous_not_found(response_id: str) -> Refusal:
    # OpenAI's answer (HTTP 400, code previous_response_not_found), the same for an id
    # never stored, expired, or stored by another key: a key cannot tell them apart.
    return Refusal(
        400,
        f"Previous response with id '{response_id[:100]}' not found.",
        "invalid_request_error",
        "previous_response_not_found",
        param="previous_response_id",
        retryable=False,
    )


def _too_large(size: int, limit: int, param: str) -> Refusal:
    return Refusal(
        400,
        f"The conversation is {size} bytes, over the {limit} bytes this gateway stores for "
        "previous_response_id: send it with store set to false, and the whole conversation in input.",
        "invalid_request_error",
        "conversation_too_large",
        param=param,
        retryable=False,
    )


def _store_unavailable() -> Refusal:
    return Refusal(
        503,
        "The stored responses cannot be read now; retry shortly.",
        "server_error",
        "response_store_unavailable",
        retry_after=5,
    )


# A body larger than this is read and translated in a worker thread: every input item
# costs Python work (980,000 one-letter items held the loop seconds); under it the work
# costs less than the hand-off to the thread.
_TRANSLATE_ON_LOOP_BYTES = 64 * 1024


async def _off_the_loop_if(size: int, work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``work`` run here when the body is small, else in a worker thread, where the
    interpreter hands the loop back every few milliseconds (``sys.getswitchinterval``):
    the body is this request's alone, and nothing else touches it meanwhile."""
    if size <= _TRANSLATE_ON_LOOP_BYTES:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


def _parsed(raw: bytes) -> responses.ResponsesRequest:
    try:
        return responses.parse_request(json_object(raw))
    except ResponsesInvalid as exc:
        raise errors.bad_request(exc.message, param=exc.param, code=exc.code) from None


def _chat_call(
    parsed: responses.ResponsesRequest, history: tuple[dict[str, object], ...], max_stored: int
) -> ApiCall:
    """The chat request ``parsed`` stands for after ``history``; the 400 for a
    conversation to store that is over ``max_stored`` bytes."""
    if parsed.store:
        size = len(json.dumps(responses.conversation_after(history, parsed.body, [])).encode())
        if size > max_stored:
            raise ApiError(_too_large(size, max_stored, "store"))
    chat = responses.chat_after(parsed, history)
    return parse_call(Api.CHAT, json.dumps(chat, ensure_ascii=False).encode())


async def create_response(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT]
    raw = await handlers.read_request_body(request, context.settings)
    parsed = await _off_the_loop_if(len(raw), _parsed, raw)
    catalog = handlers.catalog_of(context)
    route = handlers.resolved_route(request, parsed.model, Api.RESPONSES)
    chain = handlers.tool_calling_chain(catalog, parsed.model, route, parsed.body)
    served = request[SERVED]
    key = request.get(API_KEY)
    owner = key.key_id if key is not None else ""
    history: tuple[dict[str, object], ...] = ()
    if parsed.previous_response_id is not None:
        history = await _history(context, parsed.previous_response_id, owner)
    call = await _off_the_loop_if(len(raw), _chat_call, parsed, history, context.settings.responses_max_bytes)

    if key is not None:
        context.limiter.enter(key)  # the key's requests in progress: 429 past its limit
    try:
        hold = handlers.hold_for(
            request, call.tokens_to_hold(context.settings.hold_for_unbounded_answer), unbounded=call.unbounded
        )
        request_id = request[REQUEST_ID]
        gates = context.gates
        try:
            if not gates.enter_now(route.model):
                await gates.enter(route.model)
            try:
                if route.guarded:
                    call = await context.guard.screen(call, chain, catalog, request_id)
                turn = _Turn(
                    context,
                    parsed,
                    history,
                    owner,
                    served,
                    request_id,
                    hold.settle if hold is not None else None,
                )
                try:
                    async with context.dispatcher.exchange(
                        request, call, chain, catalog, served, request_id
                    ) as exchange:
                        if parsed.stream and exchange.response.status == 200:
                            return await turn.stream(request, exchange)
                        return await turn.whole(exchange)
                except RefusedMidStream as exc:
                    return await _end_with_error(exc.response, exc.refusal)
            finally:
                gates.release(route.model)
        finally:
            handlers.close_hold(hold, served)  # as chat's
    finally:
        if key is not None:
            context.limiter.leave(key)


class _Turn:
    """One request's answer: translated, counted, and stored."""

    def __init__(
        self,
        context: RouterContext,
        parsed: responses.ResponsesRequest,
        history: tuple[dict[str, object], ...],
        owner: str,
        served: Served,
        request_id: str,
        on_usage: Callable[[int], None] | None,
    ) -> None:
        self._context = context
        self._parsed = parsed
        self._history = history
        self._owner = owner
        self._served = served
        self._request_id = request_id
        self._on_usage = on_usage
        self.created_at = int(context.deps.clock.wall())
        self.response_id = responses.response_id_of(self.created_at, secrets.token_hex(20))

    def _headers(self, exchange: Exchange) -> dict[str, str]:
        return {
            "x-request-id": self._request_id,
            "x-llmgw-model": exchange.model,
            "x-llmgw-replica": exchange.replica,
        }

    async def whole(self, exchange: Exchange) -> web.StreamResponse:
        """A whole answer, or an engine's refusal (of a stream too: ``create_response``
        sends only a stream's 200 to ``stream``)."""
        if exchange.response.status != 200:
            refusal = _engine_refusal(exchange)
            if exchange.loading is not None:
                return await _end_with_error(exchange.loading, refusal)
            return web.json_response(refusal.body(), status=refusal.status, headers=self._headers(exchange))
        try:
            answer = json.loads(exchange.head)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ApiError(errors.stream_broken(exchange.model))
        result = responses.from_chat_answer(
            self._parsed.body, answer, self.response_id, exchange.model, self.created_at, _new_id
        )
        self._count(exchange.model, result)
        await self._store(result)
        return web.json_response(result, headers=self._headers(exchange))

    async def stream(self, request: web.Request, exchange: Exchange) -> web.StreamResponse:
        context = self._context
        response = exchange.loading
        if response is None:
            response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **self._headers(exchange)})
            await response.prepare(request)
        try:
            await self._relay(request, exchange, response)
        except ClientStalled:
            # The client's own stream rule, as chat's and Messages' (``pump``): dropped,
            # and the engine's stream closed with the exchange.
            context.metrics.stream_errors.labels(exchange.model, str(PumpEnd.CLIENT_STALLED)).inc()
            context.metrics.client_disconnects.labels(exchange.model).inc()
            log.info("client stalled mid-stream model=%s (Responses)", exchange.model)
            if request.transport is not None:
                request.transport.abort()
        return response

    async def _relay(self, request: web.Request, exchange: Exchange, response: web.StreamResponse) -> None:
        """The engine's chat stream as Responses events, each write under the client
        write rule (``write_within``); the conversation counted and stored at its end."""
        context = self._context
        settings = context.settings
        loop = asyncio.get_running_loop()
        translation = responses.StreamTranslation(
            self._parsed.body, self.response_id, exchange.model, self.created_at, _new_id
        )
        await write_within(response, translation.feed(exchange.head), settings)
        context.metrics.histogram(context.metrics.ttft, exchange.model).observe(
            loop.time() - request[STARTED]
        )
        upstream = exchange.response
        while translation.final is None:
            try:
                async with asyncio.timeout(settings.upstream_idle_timeout):
                    chunk = await upstream.read()
            except TimeoutError:
                context.metrics.stream_errors.labels(exchange.model, "upstream-idle").inc()
                failed = translation.fail("upstream_timeout", errors.stream_timeout(exchange.model).message)
                await write_within(response, failed, settings)
                break
            except BodyBroken:
                context.metrics.stream_errors.labels(exchange.model, "upstream-broken").inc()
                failed = translation.fail("upstream_error", errors.stream_broken(exchange.model).message)
                await write_within(response, failed, settings)
                break
            if not chunk:
                await write_within(response, translation.finish(), settings)  # ended without [DONE]
                break
            out = translation.feed(chunk)
            if out:
                await write_within(response, out, settings)
        final = translation.final
        assert final is not None
        self._count(exchange.model, final)
        if final["status"] in ("completed", "incomplete"):
            await self._store(final)
        await response.write_eof()

    def _count(self, model: str, result: dict[str, object]) -> None:
        usage = result.get("usage")
        chat_usage = responses.chat_usage(usage) if isinstance(usage, dict) else None
        self._context.dispatcher.count_usage(model, chat_usage, self._served, self._on_usage)

    async def _store(self, result: dict[str, object]) -> None:
        if not self._parsed.store:
            return
        context = self._context
        expires_at = context.deps.clock.wall() + context.settings.responses_retention
        messages = responses.conversation_after(self._history, self._parsed.body, result.get("output"))
        record = StoredConversation(self._owner, expires_at, tuple(messages))
        value = record.encode()
        if len(value) > context.settings.responses_max_bytes:
            # The answer went to the client already: a follow-up is told why it cannot continue.
            value = StoredConversation(self._owner, expires_at, (), too_large=len(value)).encode()
        try:
            await context.deps.responses.put(self.response_id, value)
        except Exception:
            log.exception(
                "storing response %s failed: a follow-up by its id will not find it", self.response_id
            )


async def _history(context: RouterContext, response_id: str, owner: str) -> tuple[dict[str, object], ...]:
    if not responses.is_response_id(response_id):
        raise ApiError(previous_not_found(response_id))
    try:
        raw = await context.deps.responses.get(response_id)
    except Exception:
        log.exception("reading stored response %s failed", response_id)
        raise ApiError(_store_unavailable()) from None
    stored = None if raw is None else responses.decode_conversation(raw)
    if stored is None or stored.owner != owner:
        raise ApiError(previous_not_found(response_id))
    if stored.expires_at <= context.deps.clock.wall():
        try:
            await context.deps.responses.delete(response_id)
        except Exception:
            log.warning("deleting expired response %s failed", response_id, exc_info=True)
        raise ApiError(previous_not_found(response_id))
    if stored.too_large:
        raise ApiError(
            _too_large(stored.too_large, context.settings.responses_max_bytes, "previous_response_id")
        )
    return tuple(dict(message) for message in stored.messages)


async def sweep(context: RouterContext) -> None:
    """Delete the stored responses whose retention has passed, every
    ``responses_sweep_interval`` (every router does; a delete is idempotent), until cancelled."""
    store = context.deps.responses
    while True:
        await asyncio.sleep(context.settings.responses_sweep_interval)
        try:
            expired = responses.expired_ids(
                await store.ids(), context.deps.clock.wall(), context.settings.responses_retention
            )
            for response_id in expired:
                await store.delete(response_id)
        except Exception:
            log.warning("sweeping expired stored responses failed; the next sweep retries", exc_info=True)
        else:
            if expired:
                log.info("deleted %d expired stored responses", len(expired))


def _engine_refusal(exchange: Exchange) -> Refusal:
    """The engine's error answer in OpenAI's shape (``responses.engine_refusal``)."""
    status, body = exchange.response.status, exchange.head
    return responses.engine_refusal(status, body, exchange.model, too_long=says_too_long(status, body))


async def _end_with_error(response: web.StreamResponse, refusal: Refusal) -> web.StreamResponse:
    """A Responses stream's ``error`` event (OpenAI's shape), then its end."""
    event = {"type": "error", "code": refusal.code, "message": refusal.message, "param": refusal.param,
             "sequence_number": 0}  # fmt: skip
    try:
        await response.write(responses.sse_event(event))
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return response
