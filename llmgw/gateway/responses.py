"""``POST /v1/responses``: OpenAI's Responses API, translated to chat completions.

Owns the Responses request's way through the router: read and check it
(``llmgw.core.responses``), expand a ``previous_response_id`` from the shared store
(the key that stored it only: ``conversations``), and then the chat path's own steps on the chat
request it stands for: model resolution under the key's models (``Api.RESPONSES``:
chat models), the key's limits (holding ``max_output_tokens``), the model gate,
the guard (it screens the chat messages, so the instructions, every input item,
tool outputs and tool definitions), and the dispatcher's walk (fallbacks, load on
demand, retries). The chat answer comes back as a Response or as Responses stream
events; its usage goes to the same metrics and key accounting as chat's; with
``store`` the conversation is kept for follow-ups under a random ``resp_`` id,
sealed and within the key's quota (``conversations``).

Must not: choose endpoints or retry (the dispatcher does), screen (the guard does),
or know where the store keeps its values (``ports.ResponseStore``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import ParamSpec, TypeVar

from aiohttp import web

from llmgw.core import responses
from llmgw.core.responses import ResponsesInvalid
from llmgw.core.routing import Api, Refusal
from llmgw.gateway import conversations, errors, handlers
from llmgw.gateway.calls import ApiCall, json_object, parse_call, release_shaper
from llmgw.gateway.context import API_KEY, CONTEXT, REQUEST_ID, SERVED, STARTED, RouterContext
from llmgw.gateway.conversations import Reservation
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
) -> tuple[ApiCall, int]:
    """The chat request ``parsed`` stands for after ``history``, and the size of the
    conversation it stores so far (0 without ``store``); the 400 for a conversation to
    store that is over ``max_stored`` bytes."""
    size = 0
    if parsed.store:
        size = len(json.dumps(responses.conversation_after(history, parsed.body, [])).encode())
        if size > max_stored:
            raise ApiError(conversations.too_large(size, max_stored, "store"))
    chat = responses.chat_after(parsed, history)
    return parse_call(Api.CHAT, json.dumps(chat, ensure_ascii=False).encode()), size


def _unless_kept(parsed: responses.ResponsesRequest, keeping: bool) -> responses.ResponsesRequest:
    """``parsed`` as this gateway serves it: with no key to seal stored responses, a
    ``store`` left at OpenAI's default (true) stores nothing and the Response says
    ``store: false``; one the client set to true is refused, as it asked for what
    cannot be done."""
    if keeping or not parsed.store:
        return parsed
    if parsed.body.get("store") is True:
        raise ApiError(conversations.store_off("store"))
    return replace(parsed, store=False, body={**parsed.body, "store": False})


async def create_response(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT]
    raw = await handlers.read_request_body(request, context.settings)
    kept = context.conversations
    parsed = _unless_kept(await _off_the_loop_if(len(raw), _parsed, raw), kept.keeping)
    catalog = handlers.catalog_of(context)
    route = handlers.resolved_route(request, parsed.model, Api.RESPONSES)
    chain = handlers.tool_calling_chain(catalog, parsed.model, route, parsed.body)
    served = request[SERVED]
    key = request.get(API_KEY)
    owner = key.key_id if key is not None else ""
    history: tuple[dict[str, object], ...] = ()
    if parsed.previous_response_id is not None:
        history = await kept.load(owner, parsed.previous_response_id)
    call, stored_size = await _off_the_loop_if(
        len(raw), _chat_call, parsed, history, context.settings.responses_max_bytes
    )
    # Each model of the chain is asked in the words its engine releases take.
    call = replace(
        call, shape=release_shaper(catalog, context.deps.engine_images, responses.asked_effort(parsed.body))
    )

    if key is not None:
        context.limiter.enter(key)  # the key's requests in progress: 429 past its limit
    reservation = None
    try:
        if parsed.store:
            reservation = await kept.reserve(owner, stored_size)  # 429 at the key's quota
        hold = await handlers.hold_for(
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
                    reservation,
                    served,
                    request_id,
                    hold.settle if hold is not None else None,
                )
                try:
                    # Its translation to chat leaves prompt_cache_key out (engines cache by themselves).
                    cache_key = parsed.body.get("prompt_cache_key")
                    async with context.dispatcher.exchange(
                        request,
                        call,
                        chain,
                        catalog,
                        served,
                        request_id,
                        affinity=cache_key if isinstance(cache_key, str) else None,
                    ) as exchange:
                        if parsed.stream and exchange.response.status == 200:
                            return await turn.stream(request, exchange)
                        return await turn.whole(exchange)
                except RefusedMidStream as exc:
                    return await _end_with_error(exc.response, exc.refusal)
            finally:
                gates.release(route.model)
        finally:
            handlers.close_hold(request, hold, served)  # as chat's
    finally:
        if reservation is not None:
            kept.release(reservation)
        if key is not None:
            context.limiter.leave(key)


class _Turn:
    """One request's answer: translated, counted, and stored."""

    def __init__(
        self,
        context: RouterContext,
        parsed: responses.ResponsesRequest,
        history: tuple[dict[str, object], ...],
        reservation: Reservation | None,
        served: Served,
        request_id: str,
        on_usage: Callable[[int], None] | None,
    ) -> None:
        self._context = context
        self._parsed = parsed
        self._history = history
        self._reservation = reservation
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
        if self._reservation is None:
            return
        messages = responses.conversation_after(self._history, self._parsed.body, result.get("output"))
        await self._context.conversations.keep(self._reservation, self.response_id, tuple(messages))


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
