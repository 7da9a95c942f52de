"""Dispatching one request: the loop over the fallback chain, the endpoints, the
retries and the wait for a model to load, and the answer to the client.

Owns the flow; every decision in it is ``llmgw.core.routing``'s:

1. ``fallback_chain`` and ``plan_route`` say which models to try, which to wake
   (``DemandTracker.wake``, coalesced) and which one to wait for.
2. Per model, ``EndpointBook.choose_by_prefix`` picks the endpoint (the owner of the
   conversation's prefix under the load bound, else the least loaded) and the
   in-flight slot is leased in the same step; ``Upstream.send`` tries it.
3. A failure before the first byte reached the client goes to ``after_failure``:
   same endpoint (stale pooled connection), another endpoint, the next model, or
   give up. Once a byte is out nothing is retried: the stream ends with an error
   event, the way OpenAI reports a failure midway.
4. Nothing served: wait (bounded) for the book to change, keeping a stream alive
   with ``: loading model`` comments; then ``unserved_reason``/``refusal_for``.
   A model the control plane says it cannot serve (``llmgw/unavailable``) is not
   waited for: the answer is an immediate 503 ``model_unavailable`` saying why.
5. The answer: for an HTTP/1.1 keep-alive client, ``_DirectAnswer`` writes it
   from the engine connection's callbacks as soon as it is final (a whole
   answer; a stream's head with its first chunk), and the handler returns a
   ``SentDirectly`` (``aiohttp_private``), ended or relaying the rest; otherwise
   the handler answers through aiohttp.

Must not: parse client requests (``calls``), check keys or limits
(middlewares, handlers), or keep state between requests beyond what the book,
the demand tracker and the metrics own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11

from llmgw.core import anthropic, routing
from llmgw.core.catalog import Catalog
from llmgw.core.engine_usage import cached_prompt_tokens
from llmgw.core.records import Endpoint
from llmgw.gateway import errors
from llmgw.gateway.aiohttp_private import HeadWithFirstWrite, SentDirectly, http_date
from llmgw.gateway.book import EndpointBook, Lease
from llmgw.gateway.calls import API_PATHS, ApiCall
from llmgw.gateway.demand import DemandTracker
from llmgw.gateway.errors import ApiError
from llmgw.gateway.metrics import RouterMetrics
from llmgw.gateway.settings import RouterSettings
from llmgw.gateway.transport import FIELD_VALUE_BAD, EngineResponse
from llmgw.gateway.upstream import (
    AttemptFailed,
    ClientStalled,
    PumpEnd,
    StreamRewrite,
    Upstream,
    UpstreamBroken,
    http_chunk,
    pump,
    token_counts,
    usage_of_body,
    write_within,
)

log = logging.getLogger("llmgw.gateway.dispatch")

LOADING_COMMENT = b": loading model\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_REASONS = {status.value: status.phrase for status in HTTPStatus}
# The head of a stream ``_DirectAnswer`` starts (the router's own lines follow).
_SSE_HEAD = "HTTP/1.1 200 OK\r\n" + "".join(f"{name}: {value}\r\n" for name, value in SSE_HEADERS.items())
_SSE_HEAD += "Transfer-Encoding: chunked\r\n"


class _DirectAnswer:
    """Writes an answer to the client from the engine connection's callbacks: a whole
    non-streamed answer the moment it has arrived (``EnginePool.post``'s ``on_head``),
    a stream's head with its first chunk the moment that chunk has
    (``EngineResponse.call_when_ready``). No task wakes between the engine's bytes and
    the client's: on a proxy running on asyncio, that wake-up and the walk back up the
    handler's awaits are most of what it adds. The handler's task resumes afterwards:
    for a whole answer it settles the books (lease, metrics, usage) off the client's
    path; for a stream it relays the rest (``pump``, through ``SentDirectly``).

    It sends only what is final as it arrives: not a retryable status, a whole answer
    there and within the size limit (a stream: a 200 and a first chunk, the point where
    the router commits to an answer anyway), header values that can be sent, the
    client still connected, and the first-byte timeout not fired (it is switched off
    as the answer goes, so it cannot fire after). Anything else it leaves alone, and
    the task answers as it always does."""

    __slots__ = ("_client", "_fields", "_limit", "_stream", "sent", "timeout")

    def __init__(self, client: asyncio.Transport, fields: str, limit: int, *, stream: bool) -> None:
        self._client = client
        self._fields = fields  # the router's own header lines, each ending in CRLF
        self._limit = limit
        self._stream = stream
        self.timeout: asyncio.Timeout | None = None  # the attempt's first-byte timeout
        self.sent = False

    def __call__(self, response: EngineResponse) -> None:
        status = response.status
        if self._stream:
            if status == 200:  # others are answered whole, by the handler
                response.call_when_ready(self._first_chunk)
            return
        if status in routing.RETRYABLE_STATUSES or not self._may_send():
            return
        body = response.peek_whole()
        if body is None or len(body) > self._limit:
            return
        content_type = response.headers.get("content-type", "application/json")
        if FIELD_VALUE_BAD.search(content_type) or not content_type.isascii():
            return
        self._send(
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n",
            body,
        )

    def _first_chunk(self, response: EngineResponse) -> None:
        chunk = response.peek()
        if not chunk or not self._may_send():  # no chunk: the stream ended or broke first
            return
        self._send(_SSE_HEAD, http_chunk(chunk))

    def _may_send(self) -> bool:
        timeout = self.timeout
        return timeout is not None and not timeout.expired() and not self._client.is_closing()

    def _send(self, start: str, payload: bytes) -> None:
        assert self.timeout is not None
        self.timeout.reschedule(None)
        head = f"{start}Date: {http_date()}\r\nServer: {SERVER_SOFTWARE}\r\n{self._fields}\r\n"
        self._client.write(head.encode("latin-1") + payload)
        self.sent = True


def answer_fields(request_id: str, model: str, replica: str) -> str | None:
    """The router's own header lines of an answer, or None when a value cannot go in
    a head as it is (a replica name comes from a service registration)."""
    values = (request_id, model, replica)
    if any(FIELD_VALUE_BAD.search(value) or not value.isascii() for value in values):
        return None
    return f"x-request-id: {request_id}\r\nx-llmgw-model: {model}\r\nx-llmgw-replica: {replica}\r\n"


class Translation(Protocol):
    """How one model's engine is asked a request of an API it does not serve (the
    Messages API as a chat completion, ``llmgw.gateway.messages``): where to send it,
    what to send, and the client's answer made of the engine's."""

    @property
    def path(self) -> str: ...

    def body(self, model: str) -> bytes: ...

    def whole(self, status: int, body: bytes) -> bytes:
        """The client's body for the engine's whole answer (an error too); raises
        ``ApiError`` for a 200 it cannot read (the client gets that error's status)."""
        ...

    def stream(self) -> StreamRewrite:
        """A rewrite of the engine's stream, fed its bytes as they come."""
        ...


@dataclass(frozen=True, slots=True)
class EngineAnswer:
    """An engine's whole answer to an internal call: its status and body."""

    status: int
    body: bytes


@dataclass
class Served:
    """What a request came to, for the metrics middleware (which labels with these
    catalog names, never with the client's string)."""

    resolved: str = ""  # the catalog model the request named (itself or by alias), once resolved
    model: str = ""  # the model that answered (the resolved one or a fallback)
    engine_status: int = 0  # the status its engine answered with (0: no engine answered)
    usage: dict[str, object] | None = None
    refusal: routing.Refusal | None = None  # the router's refusal that ended a stream already started
    # The answer (a stream: its head) went from the engine's callback (``_DirectAnswer``):
    # nothing else may be sent as this request's answer.
    sent: bool = False
    # The trace context the engine requests carry (``gateway/tracing.py``), set on arrival.
    trace_headers: tuple[tuple[str, str], ...] = ()
    stream: bool = False
    time_to_first_token: float | None = None  # seconds, a stream's


@dataclass(frozen=True, slots=True)
class Exchange:
    """An engine's answer that the caller translates (``Dispatcher.exchange``)."""

    model: str  # the model that answers (the requested one or a fallback)
    replica: str
    response: EngineResponse
    head: bytes  # a stream's first chunk, or the whole body of any other answer
    loading: web.StreamResponse | None  # a stream already begun with loading comments


class RefusedMidStream(Exception):
    """A refusal for a stream whose head already went out with loading comments."""

    def __init__(self, response: web.StreamResponse, refusal: routing.Refusal) -> None:
        super().__init__(refusal.message)
        self.response = response
        self.refusal = refusal


@dataclass
class _Opened:
    model: str
    endpoint: Endpoint
    response: EngineResponse
    head: bytes  # a stream's first chunk, or a whole non-streamed body
    lease: Lease
    # The client has the whole answer, or a stream's head, already (``_DirectAnswer``).
    sent_directly: bool = False
    translation: Translation | None = None  # the engine was asked another API's request


@dataclass
class _LoadingComments:
    """The ``: loading model`` comments of a streamed request waiting for a model, and
    the stream they opened (None until the first: its head goes in the same send)."""

    request: web.Request
    headers: dict[str, str]
    stream: web.StreamResponse | None = None

    async def comment(self) -> None:
        if self.stream is None:
            self.stream = HeadWithFirstWrite(status=200, headers={**SSE_HEADERS, **self.headers})
            await self.stream.prepare(self.request)
        await self.stream.write(LOADING_COMMENT)


@dataclass
class _Route:
    """One request's walk along its chain."""

    requested: str  # the name the client used
    chain: tuple[str, ...]
    catalog: Catalog
    stream: bool
    make_body: Callable[[str], bytes]
    path: str
    request_id: str
    trace_headers: tuple[tuple[str, str], ...] = ()
    loading: _LoadingComments | None = None  # a stream's, while it waits for a model
    api: routing.Api = routing.Api.CHAT  # the client's API (the shape of an error event)
    # Per model: how to ask an engine that does not serve ``api``, or None (it does).
    translate: Callable[[str], Translation | None] | None = None
    # The client's connection, when the answer may be written to it from the engine
    # connection's callbacks (``_DirectAnswer``); None: the handler answers.
    direct_to: asyncio.Transport | None = None
    # The conversation's key (``routing.affinity_key``): its turns go to one replica.
    affinity: str | None = None
    # It carries an earlier answer (``routing.has_history``): a first turn has none.
    history: bool = False
    attempts_total: int = 0
    failures: int = 0
    waited_for: str | None = None
    tried: dict[str, set[str]] = field(default_factory=dict)


class Dispatcher:
    def __init__(
        self,
        settings: RouterSettings,
        book: EndpointBook,
        upstream: Upstream,
        demand: DemandTracker,
        metrics: RouterMetrics,
    ) -> None:
        self._settings = settings
        self._book = book
        self._upstream = upstream
        self._demand = demand
        self._metrics = metrics
        self._policy = routing.RetryPolicy(settings.attempts_per_model, settings.attempts_total)

    # --- client requests -------------------------------------------------------------------------

    async def serve(
        self,
        request: web.Request,
        call: ApiCall,
        chain: tuple[str, ...],
        catalog: Catalog,
        served: Served,
        request_id: str,
        *,
        started: float,
        on_usage: Callable[[int], None] | None,
        translate: Callable[[str], Translation | None] | None = None,
    ) -> web.StreamResponse:
        """Answer ``call`` with the first model of ``chain`` that can (the model it
        resolved to, already allowed, then its ``routing.fallback_chain``).
        ``on_usage`` (a token-limited key's) gets the tokens the answer used, before
        this returns; the router then asks a stream for its usage on the key's behalf.
        ``translate`` says, per model, how to ask an engine that does not serve the
        call's API (None: every engine serves it)."""
        force_usage = on_usage is not None
        served.stream = call.stream
        loop = asyncio.get_running_loop()
        model = chain[0]
        common = {"x-request-id": request_id}
        route = _route_for_call(
            request,
            call,
            chain,
            catalog,
            request_id,
            force_usage=force_usage,
            trace_headers=served.trace_headers,
            translate=translate,
            # HTTP/1.1 keep-alive only: the head it writes is for that case (aiohttp's
            # path handles HTTP/1.0 and Connection: close). Not for a stream whose usage
            # event the router takes out: the first chunk may be it.
            direct_to=request.transport
            if request.version == HttpVersion11
            and request.keep_alive
            and not (call.stream and force_usage and not call.include_usage)
            else None,
        )
        try:
            opened = await self._open(route)
        except ApiError as exc:
            if route.loading is not None and route.loading.stream is not None:
                # The stream's head went out with the loading comments: report in the stream.
                served.refusal = exc.refusal
                return await _end_stream_with(route.loading.stream, exc.refusal, call.api, self._settings)
            raise
        with opened.lease:
            self._note_answerer(opened, model, served)
            headers = {**common, "x-llmgw-model": opened.model, "x-llmgw-replica": opened.endpoint.replica}
            upstream = opened.response
            try:
                if not call.stream or upstream.status != 200:
                    return await self._answer_whole(route, opened, headers, served, on_usage)
                response: web.StreamResponse
                if opened.sent_directly and route.direct_to is not None:
                    response = SentDirectly(200, route.direct_to)
                elif route.loading is not None and route.loading.stream is not None:
                    response = route.loading.stream
                    # Headers are gone: say who answers in a comment the chat page reads.
                    await response.write(
                        f": llmgw model={opened.model} replica={opened.endpoint.replica}\n\n".encode()
                    )
                else:
                    response = HeadWithFirstWrite(status=200, headers={**SSE_HEADERS, **headers})
                    await response.prepare(request)
                # Observed in the next loop step: the first chunk goes out first.
                served.time_to_first_token = loop.time() - started
                loop.call_soon(
                    self._metrics.histogram(self._metrics.ttft, opened.model).observe,
                    served.time_to_first_token,
                )
                result = await pump(
                    upstream,
                    response,
                    request.transport,
                    opened.head,
                    self._settings,
                    strip_usage=force_usage and not call.include_usage,
                    first_sent=opened.sent_directly,
                    rewrite=None if opened.translation is None else opened.translation.stream(),
                )
                if result.end is PumpEnd.COMPLETE:
                    usage = result.usage
                    if call.api is routing.Api.MESSAGES and opened.translation is None:
                        # The input tokens are in message_start, at the stream's start.
                        usage = anthropic.stream_usage(anthropic.message_start_usage(opened.head), usage)
                    self._count_usage(opened.model, usage, served, on_usage)
                    upstream.release()
                    return response
                upstream.close()
                return await self._stream_failed(
                    request, response, opened.model, result.end, result.detail, call.api
                )
            finally:
                upstream.close()

    async def _answer_whole(
        self,
        route: _Route,
        opened: _Opened,
        headers: dict[str, str],
        served: Served,
        on_usage: Callable[[int], None] | None,
    ) -> web.StreamResponse:
        upstream = opened.response
        if upstream.status == 200 and on_usage is not None:
            # A token-limited key's hold is settled before the request ends.
            self._count_body_usage(opened.model, opened.head, served, on_usage)
        elif upstream.status == 200:
            # After the answer went out (the next loop step): finding the usage in a body
            # and counting it is not the client's wait.
            asyncio.get_running_loop().call_soon(
                self._count_body_usage, opened.model, opened.head, served, on_usage
            )
        if opened.sent_directly:
            return SentDirectly(upstream.status).ended(len(opened.head))
        loading = route.loading
        if loading is not None and loading.stream is not None:
            # A stream that waited for a load and then got a refusal from the engine.
            return await _end_stream_with(
                loading.stream,
                _refusal_of_engine_error(upstream.status, opened.head, opened.model),
                route.api,
                self._settings,
            )
        if opened.translation is not None:
            body = opened.translation.whole(upstream.status, opened.head)
            return web.Response(
                status=upstream.status, body=body, headers={**headers, "Content-Type": "application/json"}
            )
        content_type = upstream.headers.get("content-type", "application/json")
        return web.Response(
            status=upstream.status, body=opened.head, headers={**headers, "Content-Type": content_type}
        )

    def _count_body_usage(
        self,
        model: str,
        body: bytes,
        served: Served,
        on_usage: Callable[[int], None] | None,
    ) -> None:
        self._count_usage(model, usage_of_body(body), served, on_usage)

    def _count_usage(
        self,
        model: str,
        usage: dict[str, object] | None,
        served: Served,
        on_usage: Callable[[int], None] | None,
    ) -> None:
        served.usage = usage
        prompt, completion = token_counts(usage)
        if prompt:
            self._metrics.counter(self._metrics.tokens, model, "prompt").inc(prompt)
        if completion:
            self._metrics.counter(self._metrics.tokens, model, "completion").inc(completion)
        cached = cached_prompt_tokens(usage)
        if cached:
            self._metrics.counter(self._metrics.tokens, model, "cached").inc(cached)
        if on_usage is not None and prompt + completion > 0:  # a usage without counts settles nothing
            on_usage(prompt + completion)

    async def _stream_failed(
        self,
        request: web.Request,
        response: web.StreamResponse,
        model: str,
        end: PumpEnd,
        detail: str,
        api: routing.Api,
    ) -> web.StreamResponse:
        self._metrics.stream_errors.labels(model, str(end)).inc()
        if end in (PumpEnd.CLIENT_GONE, PumpEnd.CLIENT_STALLED):
            self._metrics.client_disconnects.labels(model).inc()
            log.info("client left or stalled mid-stream model=%s end=%s", model, end)
            if request.transport is not None:
                request.transport.abort()
            return response
        log.warning("engine stream failed model=%s end=%s detail=%s", model, end, detail)
        refusal = (
            errors.stream_timeout(model) if end is PumpEnd.UPSTREAM_IDLE else errors.stream_broken(model)
        )
        return await _end_stream_with(response, refusal, api, self._settings)

    # --- answers the caller translates (the Responses API) ------------------------------------------

    @contextlib.asynccontextmanager
    async def exchange(
        self,
        request: web.Request,
        call: ApiCall,
        chain: tuple[str, ...],
        catalog: Catalog,
        served: Served,
        request_id: str,
        affinity: str | None = None,
    ) -> AsyncIterator[Exchange]:
        """``call`` answered by the first model of ``chain`` that can, with ``serve``'s walk
        (fallbacks, retries, load on demand, a stream's ``: loading model`` comments) and
        books (lease, demand, fallback metric, ``served``), but the answer is the caller's
        to translate and write: it is never sent from the engine connection's callbacks.
        A refusal after a stream's loading comments went out raises ``RefusedMidStream``.
        ``affinity`` is the client's own conversation key, where the call lost it in translation."""
        served.stream = call.stream
        route = _route_for_call(
            request,
            call,
            chain,
            catalog,
            request_id,
            force_usage=False,
            trace_headers=served.trace_headers,
            affinity=affinity,
        )
        try:
            opened = await self._open(route)
        except ApiError as exc:
            if route.loading is not None and route.loading.stream is not None:
                served.refusal = exc.refusal
                raise RefusedMidStream(route.loading.stream, exc.refusal) from None
            raise
        with opened.lease:
            self._note_answerer(opened, chain[0], served)
            try:
                yield Exchange(
                    opened.model,
                    opened.endpoint.replica,
                    opened.response,
                    opened.head,
                    route.loading.stream if route.loading is not None else None,
                )
            finally:
                opened.response.close()

    def _note_answerer(self, opened: _Opened, requested: str, served: Served) -> None:
        """Who answers, in ``served``, the demand report and the fallback metric."""
        served.model = opened.model
        served.engine_status = opened.response.status
        served.sent = opened.sent_directly
        self._demand.record_use(opened.model)
        if opened.model != requested:
            self._metrics.fallbacks.labels(requested, opened.model).inc()

    def count_usage(
        self,
        model: str,
        usage: dict[str, object] | None,
        served: Served,
        on_usage: Callable[[int], None] | None,
    ) -> None:
        """The tokens of a translated answer, into the metrics and the key's hold, as ``serve`` counts."""
        self._count_usage(model, usage, served, on_usage)

    # --- internal calls (the guard's judge) --------------------------------------------------------

    async def complete(
        self, model: str, catalog: Catalog, body: dict[str, object], request_id: str
    ) -> EngineAnswer:
        """A non-streamed chat completion from ``model`` (and its fallbacks): the
        engine's status and body, whatever the status (the caller decides what an
        engine's refusal means). Raises ``ApiError`` when no engine answers."""
        route = _Route(
            requested=model,
            chain=routing.fallback_chain(catalog, model, routing.Api.CHAT),
            catalog=catalog,
            stream=False,
            make_body=lambda m: json.dumps({**body, "model": m}).encode(),
            path=API_PATHS[routing.Api.CHAT],
            request_id=request_id,
            affinity=routing.affinity_key(routing.Api.CHAT, body),
            history=routing.has_history(routing.Api.CHAT, body),
        )
        opened = await self._open(route)
        with opened.lease:
            opened.response.close()
            if opened.response.status == HTTPStatus.OK:
                self._demand.record_use(opened.model)
            return EngineAnswer(opened.response.status, opened.head)

    # --- the walk ---------------------------------------------------------------------------------

    async def _open(self, route: _Route) -> _Opened:
        """The first attempt that got an answer head (and a first chunk, for a stream)."""
        loop = asyncio.get_running_loop()
        budget = self._settings.load_wait_streaming if route.stream else self._settings.load_wait
        deadline: float | None = None
        wait_started = 0.0
        still_waiting: str | None = None  # what the last plan said to wait for
        try:
            while True:
                unavailable = self._book.unavailable()
                states = {m: self._book.state(m, route.catalog.models[m], unavailable) for m in route.chain}
                plan = routing.plan_route(route.chain, states)
                still_waiting = plan.wait_for
                for name in plan.wake:
                    if self._demand.wake(name):
                        self._metrics.wakeups.labels(name).inc()
                for name in plan.order:
                    opened = await self._try_model(route, name)
                    if opened is not None:
                        if route.waited_for is not None:
                            self._metrics.load_wait.labels(route.waited_for, "served").observe(
                                loop.time() - wait_started
                            )
                        return opened
                if plan.wait_for is None:
                    if route.waited_for in unavailable:  # the wait ended: the control plane gave up
                        self._metrics.load_wait.labels(route.waited_for, "unavailable").observe(
                            loop.time() - wait_started
                        )
                    break
                now = loop.time()
                if deadline is None:
                    deadline, wait_started = now + budget, now
                    route.waited_for = plan.wait_for
                    self._demand.waiting(plan.wait_for, +1)
                if now >= deadline:
                    self._metrics.load_wait.labels(route.waited_for or "", "timeout").observe(
                        now - wait_started
                    )
                    break
                await self._wait_for_change(route, deadline)
        finally:
            if route.waited_for is not None:
                self._demand.waiting(route.waited_for, -1)
        requested_model = route.chain[0]
        unavailable = self._book.unavailable()
        reason = routing.unserved_reason(
            self._book.state(requested_model, route.catalog.models[requested_model], unavailable),
            # A wait that ended because nothing could load any more is not a load in progress.
            waited_for=route.waited_for if still_waiting is not None else None,
            failures=route.failures,
        )
        if reason is routing.Unserved.LOADING:
            retry_after = self._settings.loading_retry_after
        elif reason is routing.Unserved.UNAVAILABLE:
            until = self._book.seconds_until_retry(requested_model)
            retry_after = (
                self._settings.unplaceable_retry_after if until is None else max(1, math.ceil(until))
            )
        else:
            retry_after = self._settings.unavailable_retry_after
        raise ApiError(
            routing.refusal_for(
                reason,
                route.requested,
                retry_after=retry_after,
                waited_for=route.waited_for,
                unavailable=unavailable.get(requested_model),
            )
        )

    async def _try_model(self, route: _Route, model: str) -> _Opened | None:
        """Tries on one model's endpoints until one answers or the policy moves on.
        Returns None to go to the next model; raises the ``ApiError`` that ends the walk
        when the policy gives up (a first-byte timeout, or the request's tries used up)."""
        attempts_on_model = 0
        avoid = route.tried.setdefault(model, set())
        same: Endpoint | None = None
        key = route.affinity if route.catalog.models[model].prefix_affinity else None
        while True:
            if same is None:
                endpoint, outcome = self._book.choose_by_prefix(model, avoid, key, route.history)
                if endpoint is None:
                    return None
                self._metrics.counter(self._metrics.routing_decisions, model, outcome).inc()
            else:
                endpoint, same = same, None
            lease = self._book.lease(endpoint, key)  # in the same step as the choice
            route.attempts_total += 1
            attempts_on_model += 1
            try:
                return await self._attempt(route, model, endpoint, lease)
            except AttemptFailed as failed:
                lease.close()
                self._book.report_failure(endpoint, failed.failure)
                route.failures += 1
                step = routing.after_failure(
                    failed.failure,
                    client_has_bytes=False,
                    attempts_on_model=attempts_on_model,
                    attempts_total=route.attempts_total,
                    policy=self._policy,
                )
                log.info(
                    "attempt failed model=%s replica=%s failure=%s next=%s detail=%s",
                    model, endpoint.replica, failed.failure, step, failed.detail,
                )  # fmt: skip
                if step is routing.NextStep.GIVE_UP:
                    reason = (
                        routing.Unserved.TIMEOUT
                        if failed.failure is routing.Failure.FIRST_BYTE_TIMEOUT
                        else routing.Unserved.UPSTREAM_FAILED
                    )
                    raise ApiError(
                        routing.refusal_for(
                            reason, route.requested, retry_after=self._settings.unavailable_retry_after
                        )
                    ) from None
                self._metrics.retries.labels(model, str(failed.failure)).inc()
                if step is routing.NextStep.NEXT_MODEL:
                    return None
                if step is routing.NextStep.SAME_ENDPOINT:
                    same = endpoint
                else:
                    avoid.add(endpoint.service_id)
            except BaseException:
                lease.close()
                raise

    async def _attempt(self, route: _Route, model: str, endpoint: Endpoint, lease: Lease) -> _Opened:
        direct = None
        translation = route.translate(model) if route.translate is not None else None
        # Not once a load wait's comments sent a stream's head, nor for an answer to rewrite.
        if (
            route.direct_to is not None
            and translation is None
            and (route.loading is None or route.loading.stream is None)
        ):
            fields = answer_fields(route.request_id, model, endpoint.replica)
            if fields is not None:
                direct = _DirectAnswer(
                    route.direct_to, fields, self._settings.max_response_bytes, stream=route.stream
                )
        try:
            async with asyncio.timeout(self._settings.upstream_first_byte_timeout) as timeout:
                if direct is not None:
                    direct.timeout = timeout
                path, body = (
                    (route.path, route.make_body(model))
                    if translation is None
                    else (translation.path, translation.body(model))
                )
                response = await self._upstream.send(
                    endpoint, path, body, route.request_id, on_head=direct, trace=route.trace_headers
                )
                try:
                    if response.status in routing.RETRYABLE_STATUSES:
                        raise AttemptFailed(routing.Failure.UNAVAILABLE, f"engine answered {response.status}")
                    if route.stream and response.status == 200:
                        head = await self._upstream.first_chunk(response)
                    else:
                        head = await self._upstream.read_body(response)
                except BaseException:
                    response.close()
                    raise
        except TimeoutError:
            raise AttemptFailed(
                routing.Failure.FIRST_BYTE_TIMEOUT, "no answer within the first-byte timeout"
            ) from None
        except UpstreamBroken as exc:
            # The engine answered and then broke: it did the work, so no retry.
            log.warning("engine answer broke model=%s replica=%s: %s", model, endpoint.replica, exc)
            raise ApiError(errors.stream_broken(model)) from None
        return _Opened(
            model=model,
            endpoint=endpoint,
            response=response,
            head=head,
            lease=lease,
            sent_directly=direct is not None and direct.sent,
            translation=translation,
        )

    async def _wait_for_change(self, route: _Route, deadline: float) -> None:
        """Until a model of the chain can serve, or the deadline; streams get comments."""
        loop = asyncio.get_running_loop()
        interval = self._settings.loading_comment_interval
        while True:
            now = loop.time()
            if now >= deadline:
                return
            if route.loading is not None:
                await route.loading.comment()
            timeout = min(deadline - now, interval) if route.loading is not None else deadline - now
            try:
                async with asyncio.timeout(timeout):
                    await self._book.wait_changed()
            except TimeoutError:
                continue
            if any(self._book.usable_count(m) for m in route.chain):
                return
            unavailable = self._book.unavailable()
            if any(m in unavailable for m in route.chain):
                return  # the control plane's word came: plan again (it may say stop waiting)


def _route_for_call(
    request: web.Request,
    call: ApiCall,
    chain: tuple[str, ...],
    catalog: Catalog,
    request_id: str,
    *,
    force_usage: bool,
    trace_headers: tuple[tuple[str, str], ...] = (),
    translate: Callable[[str], Translation | None] | None = None,
    direct_to: asyncio.Transport | None = None,
    affinity: str | None = None,
) -> _Route:
    """The walk for a client's ``call`` along ``chain``: its body per model (with the
    usage asked for when ``force_usage``), its path, and a stream's loading comments."""
    return _Route(
        requested=call.model,
        chain=chain,
        catalog=catalog,
        stream=call.stream,
        make_body=lambda m: call.upstream_body(m, force_usage=force_usage),
        path=call.path,
        request_id=request_id,
        trace_headers=trace_headers,
        loading=_LoadingComments(request, {"x-request-id": request_id}) if call.stream else None,
        api=call.api,
        translate=translate,
        direct_to=direct_to,
        affinity=routing.affinity_key(call.api, call.body, affinity),
        history=routing.has_history(call.api, call.body),
    )


async def _end_stream_with(
    response: web.StreamResponse,
    refusal: routing.Refusal,
    api: routing.Api,
    settings: RouterSettings,
) -> web.StreamResponse:
    """The stream's error event, then its end; a client that takes neither within
    the write rule (``write_within``) or has gone is left to aiohttp, which closes it."""
    try:
        await write_within(response, errors.sse_error_event(refusal, api), settings)
        await response.write_eof()
    except (ConnectionError, RuntimeError, ClientStalled):
        pass
    return response


def _refusal_of_engine_error(status: int, body: bytes, model: str) -> routing.Refusal:
    """An engine's own error answer, as a refusal (for a stream already under way)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = error.get("code")
        return routing.Refusal(
            status,
            error["message"],
            str(error.get("type") or "server_error"),
            code if isinstance(code, str) else None,
            param=error.get("param") if isinstance(error.get("param"), str) else None,
        )
    return routing.Refusal(status, f"The model `{model}` answered with HTTP {status}.", "server_error", None)
