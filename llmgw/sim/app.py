"""The simulated engine's aiohttp application: routes, handlers, middlewares, background tasks.

Owns: `create_app(settings, deps)`, the only wiring point. Rank 0 (the head)
serves the OpenAI API, /health, /metrics, /sim/*; a worker (rank >= 1)
serves /health and /sim/* on its own port. Every long-lived task (weight
loading, the head's join deadline, a worker's link to its head) is started and
stopped by `cleanup_ctx`; on shutdown, in-flight requests are drained.

Must not: exit the process or install signal handlers (that is `server.py`),
or keep state outside the `SimState` it stores under `STATE`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw.cancellation import cancel_and_wait
from llmgw.sim import messages_api, metrics, openai_api, rendezvous, responses_api, streaming, vocabulary
from llmgw.sim.engine import Engine
from llmgw.sim.faults import ExitProcess, FaultState, FaultUpdate
from llmgw.sim.lifecycle import Lifecycle
from llmgw.sim.openai_api import ApiError, Endpoint, GenerationRequest, Limits, ResponseIdentity
from llmgw.sim.settings import ExitCode, SimSettings

log = logging.getLogger("llmgw.sim")

_API_PREFIX = "/v1/"
# Request bodies up to this size are read (aiohttp's 1 MiB default is too small for long prompts).
MAX_BODY_BYTES = 64 * 1024 * 1024


def exit_now(code: int, reason: str) -> None:
    """Die like a crashed engine: no cleanup, no graceful close of connections."""
    log.critical("exiting now exit_code=%d reason=%r", code, reason)
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(code)


_TRACES_KEPT = 64  # the trace contexts /sim/stats shows, newest last


@dataclass(frozen=True)
class SimDeps:
    """The effects the app performs on the world, replaceable in tests."""

    exit_process: ExitProcess = exit_now


class InFlight:
    """The requests being answered now, so shutdown can wait for them and then cancel the rest."""

    def __init__(self) -> None:
        self._tasks: dict[object, asyncio.Task[Any]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._tasks)

    @contextmanager
    def track(self) -> Iterator[None]:
        token = object()
        task = asyncio.current_task()
        if task is not None:
            self._tasks[token] = task
            self._idle.clear()
        try:
            yield
        finally:
            self._tasks.pop(token, None)
            if not self._tasks:
                self._idle.set()

    async def drain(self, grace: float) -> int:
        """Wait up to `grace` seconds for in-flight requests, then cancel the rest; returns how many."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
            return 0
        except TimeoutError:
            pending = list(self._tasks.values())
            for task in pending:
                task.cancel()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), _CANCEL_GRACE)
            return len(pending)


# How long cancelled handlers get to unwind after a drain timed out.
_CANCEL_GRACE = 1.0


@dataclass
class SimState:
    """Everything one app owns; the references are fixed, the owners inside hold the mutable state."""

    settings: SimSettings
    deps: SimDeps
    engine: Engine
    faults: FaultState
    lifecycle: Lifecycle
    book: rendezvous.WorkerBook
    link: rendezvous.WorkerLink
    registry: CollectorRegistry
    created: int  # wall-clock seconds, the `created` of /v1/models
    fingerprint: str
    in_flight: InFlight = field(default_factory=InFlight)
    # The W3C trace context of the last API requests (vLLM reads the same two headers,
    # vllm/tracing/utils.py TRACE_HEADERS, 0.34.0), for tests to see what reached the engine.
    trace_contexts: deque[dict[str, str]] = field(default_factory=lambda: deque(maxlen=_TRACES_KEPT))

    @property
    def limits(self) -> Limits:
        s = self.settings
        return Limits(s.default_max_tokens, s.max_model_len, s.embedding_dim)

    @property
    def answer_lengths(self) -> tuple[int, int]:
        """What ``GenerationRequest.answered`` ends a chat answer by: --answer-tokens, and
        for a request without max_tokens and no --answer-tokens, --default-max-tokens."""
        return self.settings.answer_tokens, self.settings.default_max_tokens

    def not_ready_reason(self) -> str | None:
        """Why /health is not 200 yet (or no longer), or None when it is healthy."""
        if self.lifecycle.stopping:
            return "shutting down"
        if not self.lifecycle.loaded:
            return "loading weights"
        if self.settings.is_head and not self.book.complete:
            return f"waiting for workers: {self.book.joined}/{self.settings.world_size - 1} joined"
        if not self.settings.is_head and not self.link.joined:
            return "not joined to the head"
        return None

    async def generate(self, prompt_tokens: int, pieces: Iterable[str]) -> list[str]:
        """A whole answer of ``pieces``, under the faults in force (a first-token delay, a hang)."""
        return await self.engine.generate(
            prompt_tokens, pieces, self.faults.first_token_delay, self.faults.wait_while_hung
        )


STATE = web.AppKey("llmgw_sim_state", SimState)


def create_app(settings: SimSettings, deps: SimDeps | None = None) -> web.Application:
    """The head's API app for rank 0, a worker's health app for ranks >= 1.

    Run it with ``handler_cancellation=True`` (as `server.serve` and aiohttp's
    `TestServer` do) so a client that leaves cancels its generation at once;
    without it a stream notices at its next write and a non-streamed request
    only at its end. The default `SimDeps` really ends the process on a crash
    fault: in-process tests that crash pass their own `exit_process`.
    """
    deps = deps or SimDeps()
    engine = Engine(settings.max_num_seqs, settings.token_rate)
    state = SimState(
        settings=settings,
        deps=deps,
        engine=engine,
        faults=FaultState(settings.faults, deps.exit_process),
        lifecycle=Lifecycle(),
        book=rendezvous.WorkerBook(settings.world_size),
        link=rendezvous.WorkerLink(),
        registry=metrics.build_registry(engine.snapshot, settings.served_name, settings.max_num_seqs),
        created=int(time.time()),
        fingerprint=openai_api.system_fingerprint(settings.served_name),
    )
    app = web.Application(
        middlewares=[_require_api_key, _error_envelope, _track_in_flight], client_max_size=MAX_BODY_BYTES
    )
    app[STATE] = state
    app.router.add_get("/health", _health)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_post("/sim/fault", _fault)
    if settings.is_head:
        app.router.add_post("/v1/chat/completions", _chat)
        app.router.add_post("/v1/completions", _completions)
        app.router.add_post("/v1/embeddings", _embeddings)
        app.router.add_post("/v1/responses", responses_api.handler(_admit, _pieces))
        app.router.add_get("/v1/models", _models)
        app.router.add_get("/metrics", _metrics)
        app.router.add_get(rendezvous.RENDEZVOUS_PATH, _rendezvous)
        messages_api.add_routes(app, _admit, _answer, lambda r: r.app[STATE].engine.count_failure())
    app.cleanup_ctx.append(_background_tasks)
    app.on_shutdown.append(_drain)
    return app


# ---------------------------------------------------------------- middlewares

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    """vLLM's ``AuthenticationMiddleware`` (vllm/entrypoints/openai/api_server.py, 0.10.2 and
    0.11.0): with a key, a path under /v1 needs ``Authorization: Bearer <key>`` (OPTIONS
    excepted) or is answered 401 ``{"error": "Unauthorized"}``; other paths stay open."""
    key = request.app[STATE].settings.api_key
    if key is None or request.method == "OPTIONS" or not request.path.startswith("/v1"):
        return await handler(request)
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    expected = hashlib.sha256(key.encode()).digest()
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        hashlib.sha256(sent.encode()).digest(), expected
    ):
        return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


@web.middleware
async def _error_envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as OpenAI's envelope; API errors are counted as failed requests."""
    state = request.app[STATE]
    try:
        return await handler(request)
    except ApiError as exc:
        if request.path.startswith(_API_PREFIX):
            state.engine.count_failure()
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            error = ApiError(
                404, f"Unknown request URL: {request.method} {request.path}.", code="unknown_url"
            )
        elif exc.status == 405:
            error = ApiError(405, f"Method {request.method} is not allowed on {request.path}.")
        else:
            error = ApiError(exc.status, exc.reason)
        return web.json_response(error.body(), status=error.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error path=%s", request.path)
        error = ApiError(500, "The simulated engine failed unexpectedly.", openai_api.ErrorType.SERVER)
        return web.json_response(error.body(), status=500)


@web.middleware
async def _track_in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path == rendezvous.RENDEZVOUS_PATH:
        return await handler(request)  # ends by itself when the lifecycle stops
    with request.app[STATE].in_flight.track():
        return await handler(request)


# ---------------------------------------------------------------- lifecycle


async def _background_tasks(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    tasks = [asyncio.create_task(_load_weights(state), name="sim-load")]
    if state.settings.is_head and state.settings.world_size > 1:
        tasks.append(asyncio.create_task(_await_workers(state), name="sim-join-deadline"))
    if not state.settings.is_head:
        tasks.append(
            asyncio.create_task(
                rendezvous.join_head(state.settings, state.link, state.lifecycle), name="sim-worker-link"
            )
        )
    yield
    await cancel_and_wait(*tasks)


async def _load_weights(state: SimState) -> None:
    s = state.settings
    log.info(
        "loading model=%s served_model_name=%s rank=%d world_size=%d load_time=%s",
        s.model,
        s.served_name,
        s.rank,
        s.world_size,
        s.load_time,
    )
    await asyncio.sleep(s.load_time)
    state.lifecycle.loaded = True
    log.info("loaded model=%s", s.model)


async def _await_workers(state: SimState) -> None:
    """The head gives its workers --join-timeout to arrive, as torch.distributed's init would."""
    s = state.settings
    loop = asyncio.get_running_loop()
    deadline = loop.time() + s.join_timeout
    while not state.book.complete:
        remaining = deadline - loop.time()
        if remaining <= 0:
            state.lifecycle.stop(
                ExitCode.JOIN_TIMEOUT,
                f"only {state.book.joined}/{s.world_size - 1} workers joined "
                f"within --join-timeout {s.join_timeout}s",
            )
            return
        await asyncio.sleep(min(s.head_file_poll_interval, remaining))
    log.info("replica assembled world_size=%d", s.world_size)


async def _drain(app: web.Application) -> None:
    state = app[STATE]
    state.lifecycle.stop(ExitCode.OK, "server shutting down")  # no-op when a stop came first
    # A lost peer or a crash leaves nothing worth finishing; a clean stop lets requests finish.
    grace = state.settings.shutdown_timeout if state.lifecycle.exit_code is ExitCode.OK else 0.0
    in_flight = len(state.in_flight)
    cancelled = await state.in_flight.drain(grace)
    if in_flight:
        log.info("drained in_flight=%d cancelled=%d", in_flight, cancelled)


# ---------------------------------------------------------------- API handlers


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise openai_api.bad_json() from None
    return dict(openai_api.require_object(body))


async def _admit(request: web.Request) -> tuple[SimState, dict[str, Any]]:
    """What every API request goes through before its own parsing: faults, body, model, readiness."""
    state = request.app[STATE]
    state.faults.on_arrival(state.engine.count_arrival())
    trace = {name: request.headers[name] for name in ("traceparent", "tracestate") if name in request.headers}
    if trace:
        state.trace_contexts.append(trace)
    await state.faults.wait_while_hung()
    body = await _json_body(request)
    model = openai_api.requested_model(body)
    if model != state.settings.served_name:
        raise openai_api.model_not_found(model)
    reason = state.not_ready_reason()
    if reason is not None:
        raise openai_api.not_ready(reason)
    return state, body


async def _chat(request: web.Request) -> web.StreamResponse:
    state, body = await _admit(request)
    generation = openai_api.parse_chat(body, state.limits).answered(*state.answer_lengths)
    return await _generate(request, state, generation, "chatcmpl-")


async def _completions(request: web.Request) -> web.StreamResponse:
    state, body = await _admit(request)
    return await _generate(request, state, openai_api.parse_completion(body, state.limits), "cmpl-")


async def _generate(
    request: web.Request, state: SimState, generation: GenerationRequest, id_prefix: str
) -> web.StreamResponse:
    failure = state.faults.draw_failure()
    if failure is not None:
        raise failure
    identity = ResponseIdentity(
        id=id_prefix + uuid.uuid4().hex,
        created=int(time.time()),
        model=state.settings.served_name,
        system_fingerprint=state.fingerprint,
    )
    call = openai_api.tool_call_for(
        state.settings.tool_calls, generation, "chatcmpl-tool-" + uuid.uuid4().hex
    )
    if call is not None:
        return await _call_tool(request, state, generation, identity, call)
    if generation.stream:
        return await _stream(request, state, generation, identity)
    reasoning, answer = _answer(state.settings, generation)
    pieces = await state.generate(generation.prompt_tokens, answer)
    body = openai_api.completion_body(
        generation,
        identity,
        "".join(pieces[reasoning:]),
        len(pieces),
        generation.finish_reason,
        "".join(pieces[:reasoning]) if reasoning else None,
    )
    return web.json_response(body)


def _answer(settings: SimSettings, generation: GenerationRequest) -> tuple[int, Iterator[str]]:
    """A chat or text completion's pieces, and how many of the first are reasoning
    (``--reasoning-tokens``, chat only): the reasoning reads as the Greek answer of that
    many tokens, and the content as the answer of the tokens left."""
    reasoning = min(settings.reasoning_tokens, generation.max_tokens)
    if not reasoning or generation.endpoint is not Endpoint.CHAT or settings.judge_unsafe_phrase is not None:
        return 0, _pieces(settings, generation)
    prompt = generation.prompt
    pieces = itertools.chain(
        vocabulary.greek_pieces(prompt, reasoning),
        vocabulary.greek_pieces(prompt, generation.max_tokens - reasoning),
    )
    return reasoning, pieces


def _pieces(settings: SimSettings, generation: GenerationRequest) -> Iterator[str]:
    """What the model says: a judge's verdict (``--judge-unsafe-phrase``, chat only), else Greek."""
    phrase = settings.judge_unsafe_phrase
    if phrase is not None and generation.endpoint is Endpoint.CHAT:
        return vocabulary.judge_pieces(generation.prompt, phrase, generation.max_tokens)
    return vocabulary.greek_pieces(generation.prompt, generation.max_tokens)


async def _stream(
    request: web.Request, state: SimState, generation: GenerationRequest, identity: ResponseIdentity
) -> web.StreamResponse:
    """Server-sent events, one chunk per token, as OpenAI streams them."""

    reasoning, answer = _answer(state.settings, generation)

    def piece(text: str, index: int) -> list[bytes]:
        data = [
            openai_api.sse_event(openai_api.chunk(generation, identity, text, reasoning=index < reasoning))
        ]
        if index == 0 and generation.endpoint is Endpoint.CHAT:
            data.insert(0, openai_api.sse_event(openai_api.chunk(generation, identity, None, role=True)))
        return data

    def end(sent: int) -> list[bytes]:
        data = [openai_api.sse_event(openai_api.chunk(generation, identity, None, generation.finish_reason))]
        if generation.include_usage:
            data.append(openai_api.sse_event(openai_api.usage_chunk(generation, identity, sent)))
        return [*data, openai_api.SSE_DONE]

    return await streaming.stream_pieces(
        request, state, generation.prompt_tokens, answer, piece=piece, end=end
    )


async def _call_tool(
    request: web.Request,
    state: SimState,
    generation: GenerationRequest,
    identity: ResponseIdentity,
    call: openai_api.ToolCall,
) -> web.StreamResponse:
    """A chat answer that is one tool call (``--tool-calls``), whole or streamed; its
    arguments are its tokens, paced as any answer's (all of them, whatever max_tokens: a
    call cut short would not parse)."""
    if not generation.stream:
        pieces = await state.generate(generation.prompt_tokens, iter(call.pieces()))
        return web.json_response(openai_api.tool_call_body(generation, identity, call, len(pieces)))

    def piece(text: str, index: int) -> list[bytes]:
        data = [openai_api.sse_event(openai_api.tool_call_chunk(generation, identity, call, text))]
        if index == 0:
            data[:0] = [
                openai_api.sse_event(openai_api.chunk(generation, identity, None, role=True)),
                openai_api.sse_event(openai_api.tool_call_chunk(generation, identity, call, None)),
            ]
        return data

    def end(sent: int) -> list[bytes]:
        data = [openai_api.sse_event(openai_api.chunk(generation, identity, None, "tool_calls"))]
        if generation.include_usage:
            data.append(openai_api.sse_event(openai_api.usage_chunk(generation, identity, sent)))
        return [*data, openai_api.SSE_DONE]

    return await streaming.stream_pieces(
        request, state, generation.prompt_tokens, iter(call.pieces()), piece=piece, end=end
    )


async def _embeddings(request: web.Request) -> web.StreamResponse:
    state, body = await _admit(request)
    embedding = openai_api.parse_embeddings(body, state.limits)
    failure = state.faults.draw_failure()
    if failure is not None:
        raise failure
    dimension = embedding.dimensions or state.settings.embedding_dim
    engine = state.engine
    async with engine.sequence():
        engine.count_tokens(prompt=sum(embedding.input_tokens))
        if state.faults.first_token_delay:
            await asyncio.sleep(state.faults.first_token_delay)
        vectors = [vocabulary.embedding_vector(text, dimension) for text in embedding.inputs]
    engine.count_completion()
    return web.json_response(openai_api.embeddings_body(embedding, state.settings.served_name, vectors))


async def _models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    await state.faults.wait_while_hung()
    return web.json_response(openai_api.models_body(state.settings.served_name, state.created))


# ---------------------------------------------------------------- operations


async def _health(request: web.Request) -> web.StreamResponse:
    """200 with an empty body when serving (as vLLM); 503 with the reason otherwise."""
    state = request.app[STATE]
    await state.faults.wait_while_hung()
    reason = state.not_ready_reason()
    if reason is None:
        return web.Response(status=200)
    return web.json_response(openai_api.not_ready(reason).body(), status=503)


async def _metrics(request: web.Request) -> web.StreamResponse:
    body = metrics.render(request.app[STATE].registry)
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})


async def _stats(request: web.Request) -> web.StreamResponse:
    """What tests assert on: counts, readiness and the current faults, as JSON."""
    state = request.app[STATE]
    snap = state.engine.snapshot()
    return web.json_response(
        {
            "rank": state.settings.rank,
            "world_size": state.settings.world_size,
            "model": state.settings.served_name,
            "loaded": state.lifecycle.loaded,
            "healthy": state.not_ready_reason() is None,
            "workers_joined": state.book.joined,
            "joined_head": state.link.joined,
            "running": snap.running,
            "waiting": snap.waiting,
            "requests_total": snap.requests_total,
            "completed": snap.completed,
            "cancelled": snap.cancelled,
            "failed": snap.failed,
            "prompt_tokens": snap.prompt_tokens,
            "generation_tokens": snap.generation_tokens,
            "faults": state.faults.describe(),
            "trace_contexts": list(state.trace_contexts),
        }
    )


async def _fault(request: web.Request) -> web.StreamResponse:
    """Change faults at runtime; ``{"crash": true}`` answers first, then ends the process."""
    state = request.app[STATE]
    update = FaultUpdate(await _json_body(request))
    state.faults.apply(update)
    log.warning("faults changed update=%s now=%s", sorted(update.fields), state.faults.describe())
    body = json.dumps({"faults": state.faults.describe(), "crashing": update.crash}).encode("utf-8")
    if not update.crash:
        return web.Response(body=body, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(body)
    await response.prepare(request)
    await response.write(body)
    await response.write_eof()
    state.faults.crash(update.exit_code, "crash fault requested through POST /sim/fault")
    return response


async def _rendezvous(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await rendezvous.serve_rendezvous(request, state.settings, state.book, state.lifecycle)
