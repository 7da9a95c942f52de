"""The router's aiohttp application: the one wiring point, its lifecycle and its server.

Owns:

- ``create_app(settings, deps)``: builds every part (book, gates, limiter,
  demand tracker, metrics, upstream session, dispatcher, guard) and the routes;
  refuses settings that cannot run (keys missing off loopback).
- the ``cleanup_ctx`` that starts and stops every long-lived thing: the upstream
  session, the watched values (Consul blocking queries), the loops that feed the
  book, the draining set, the unavailable models, the key ring and the catalog
  from them, the demand reporter and the watch monitor that logs when the
  router routes on stale data.
- ``RouterServer``/``run_router``: the aiohttp runner with the options that matter
  for a proxy (listen backlog, handler cancellation on disconnect, keep-alive
  timeout against slowloris, access log off the hot path, malformed requests
  logged without their bytes, graceful shutdown).

Must not: parse the command line or install signal handlers (the CLI does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web

from llmgw.adapters.redis.limits import RedisLimitStore
from llmgw.bundled import read_security_policy
from llmgw.cancellation import cancel_and_wait
from llmgw.core.addresses import url_of
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.conventions import ENGINE_SERVICE
from llmgw.core.records import ApiKeyRecord, CatalogVersion, DrainMark, Endpoint, UnavailableModels
from llmgw.core.routing import NomadView, Vouch
from llmgw.gateway import handlers, messages, middlewares, responses
from llmgw.gateway.book import EndpointBook
from llmgw.gateway.catalogs import CatalogHolder
from llmgw.gateway.context import CONTEXT, RouterContext
from llmgw.gateway.conversations import Conversations
from llmgw.gateway.demand import DemandTracker
from llmgw.gateway.dispatch import Dispatcher
from llmgw.gateway.guard import Guard
from llmgw.gateway.keys import KeyRing, RateLimiter
from llmgw.gateway.limits import ModelGates
from llmgw.gateway.metrics import Gauges, RouterMetrics, WatchHealth
from llmgw.gateway.ports import RouterDeps, Watched
from llmgw.gateway.settings import RouterSettings, RouterSettingsError, validate
from llmgw.gateway.shared_limits import SharedLimits, StoreDown
from llmgw.gateway.upstream import Upstream
from llmgw.http_server import NO_DECOMPRESSION, bound_port, listener_log

log = logging.getLogger("llmgw.gateway")

T = TypeVar("T")

# How often the watch monitor looks at the Consul watches' health (it logs changes only).
WATCH_MONITOR_INTERVAL = 5.0


def create_app(
    settings: RouterSettings, deps: RouterDeps, *, policy: SecurityPolicy | None = None
) -> web.Application:
    """The router app. ``policy`` is the engine security policy the catalog is loaded
    with (the bundled one by default)."""
    problems = validate(settings)
    if deps.api_keys is None and not settings.no_auth:
        problems.append(
            "no API key source: give the router its keys (llmgw/keys/ in Consul), "
            "or pass --no-auth to serve without keys on a loopback address"
        )
    if problems:
        raise RouterSettingsError("; ".join(problems))
    if settings.no_auth:
        log.warning(
            "serving WITHOUT API keys on %s (loopback only): anyone on this host may use every model",
            settings.host,
        )

    metrics = RouterMetrics()

    def unmatched(endpoint: Endpoint) -> None:
        metrics.endpoints_ignored.inc()
        log.warning(
            "ignoring Consul service %r (model %r, %s:%d, allocation %r): Nomad shows no running "
            "allocation of job %r at that address; a forged or stale registration of %s is never "
            "sent a request (see ops/README.md for the Consul ACLs that keep it out)",
            endpoint.service_id,
            endpoint.model,
            endpoint.address,
            endpoint.port,
            endpoint.alloc_id,
            endpoint.replica,
            ENGINE_SERVICE,
        )

    book = EndpointBook(
        deps.clock.wall,
        settings.unavailable_stale_after,
        suspect_for=settings.suspect_for,
        nomad_checked=deps.allocations is not None,
        on_unmatched=unmatched,
    )
    gates = ModelGates(
        settings.max_concurrency_per_model, settings.max_queue_per_model, settings.queue_timeout,
        settings.queue_retry_after,
    )  # fmt: skip
    demand = DemandTracker(
        settings.resolved_router_id(),
        deps.demand,
        deps.clock,
        settings.demand_interval,
        load=lambda model: (gates.running(model), gates.queued(model)),
        on_published=lambda ok: metrics.demand_reports.labels("ok" if ok else "failed").inc(),
    )
    upstream = Upstream(settings, deps.engine_keys)
    dispatcher = Dispatcher(settings, book, upstream, demand, metrics)
    context = RouterContext(
        settings=settings,
        deps=deps,
        book=book,
        catalogs=CatalogHolder(policy or read_security_policy()),
        keys=None if settings.no_auth else KeyRing(),
        limiter=RateLimiter(settings.max_concurrent_per_key),
        gates=gates,
        demand=demand,
        metrics=metrics,
        upstream=upstream,
        dispatcher=dispatcher,
        guard=Guard(settings, dispatcher, metrics),
        conversations=Conversations(settings, deps.responses, deps.response_keys, deps.clock),
        shared_limits=_shared_limits(settings, metrics, deps.clock.wall),
    )
    metrics.add_gauges(_gauges(context))

    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[middlewares.observe],
    )
    app[CONTEXT] = context
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/embeddings", handlers.embeddings)
    app.router.add_post("/v1/responses", responses.create_response)
    app.router.add_post(messages.MESSAGES_PATH, messages.create_message)
    app.router.add_post(messages.COUNT_TOKENS_PATH, messages.count_tokens)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_get("/v1/models/{model:.+}", handlers.get_model)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_get("/", handlers.index)
    app.router.add_get("/favicon.ico", handlers.favicon)
    app.router.add_get("/static/{name}", handlers.static_file)
    app.cleanup_ctx.append(_lifecycle)
    return app


def _shared_limits(
    settings: RouterSettings, metrics: RouterMetrics, wall_clock: Callable[[], float]
) -> SharedLimits | None:
    if not settings.limits_redis_url:
        return None
    return SharedLimits(
        RedisLimitStore(settings.limits_redis_url, timeout=settings.limits_redis_timeout),
        settings.resolved_router_id(),
        store_down=StoreDown(settings.limits_store_down),
        heartbeat_ttl=settings.limits_heartbeat_ttl,
        on_store_error=metrics.limits_store_errors.inc,
        wall_clock=wall_clock,
    )


def _gauges(context: RouterContext) -> Gauges:
    def watches() -> tuple[WatchHealth, ...]:
        return tuple(
            WatchHealth(label, w.healthy, w.last_success_at, w.generation) for label, w in context.watches()
        )

    def queued() -> Mapping[str, int]:
        catalog = context.catalogs.catalog
        names = catalog.models if catalog is not None else {}
        return {name: context.gates.queued(name) for name in names if context.gates.queued(name)}

    def held_back(endpoint: Endpoint) -> str | None:
        vouch = context.book.vouch_of(endpoint)
        return None if vouch is None or vouch is Vouch.ROUTE else str(vouch)

    def nomad() -> WatchHealth | None:
        w = context.deps.allocations
        return None if w is None else WatchHealth("nomad", w.healthy, w.last_success_at, w.generation)

    return Gauges(
        endpoints=context.book.endpoints,
        in_flight=context.book.in_flight,
        draining=context.book.is_draining,
        queued=queued,
        watches=watches,
        now=lambda: asyncio.get_running_loop().time(),
        held_back=held_back,
        nomad=nomad,
    )


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    context = app[CONTEXT]
    deps = context.deps
    await context.upstream.start()
    if context.shared_limits is not None:
        await context.shared_limits.start()
    watched: list[Watched[object]] = [w for _, w in context.watches()]
    if deps.allocations is not None:
        watched.append(deps.allocations)
    started: list[Watched[object]] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for watch in watched:
            await watch.start()
            started.append(watch)
        tasks += [
            asyncio.create_task(
                _follow(deps.endpoints, context.book.replace, context.book), name="router:endpoints"
            ),
            asyncio.create_task(
                _follow(deps.draining, lambda marks: _apply_draining(context, marks), context.book),
                name="router:draining",
            ),
            asyncio.create_task(
                _follow(deps.catalog, lambda v: _apply_catalog(context, v), context.book),
                name="router:catalog",
            ),
            asyncio.create_task(
                _follow(deps.unavailable, lambda d: _apply_unavailable(context, d), context.book),
                name="router:unavailable",
            ),
            asyncio.create_task(context.demand.run(), name="router:demand"),
            *(
                [
                    asyncio.create_task(
                        _follow_nomad(deps.allocations, context.book), name="router:nomad-allocations"
                    )
                ]
                if deps.allocations is not None
                else []
            ),
            asyncio.create_task(_monitor_watches(context), name="router:watch-monitor"),
            asyncio.create_task(context.conversations.sweep(), name="router:responses-sweep"),
        ]
        if context.keys is not None and deps.api_keys is not None:
            ring = context.keys
            tasks.append(
                asyncio.create_task(
                    _follow(deps.api_keys, lambda r: _apply_keys(ring, r), context.book), name="router:keys"
                )
            )
        yield
    finally:
        await cancel_and_wait(*tasks)
        if tasks:  # a clean stop: this router's demand ends now, not when the report ages out
            await context.demand.withdraw()
        for watch in reversed(started):
            await watch.stop()
        await context.upstream.close()
        if context.shared_limits is not None:
            await context.shared_limits.close()
        # Flushes the spans not yet exported: it waits on the exporter's thread.
        await asyncio.to_thread(deps.tracing.shutdown)


async def _follow(watched: Watched[T], apply: Callable[[T], None], book: EndpointBook) -> None:
    """Apply every new value of ``watched`` (the current one first), until cancelled;
    tell ``book`` how far it got."""
    generation = 0
    while True:
        value = await watched.wait_changed(generation)
        generation = watched.generation
        try:
            apply(value)
        except Exception:
            log.exception("applying a new %s value failed; keeping the previous one", watched.name)
        book.processed(watched, generation)


async def _follow_nomad(watched: Watched[NomadView], book: EndpointBook) -> None:
    """Apply every new Nomad view with whether it is current (the watch publishes again
    when it loses or regains Nomad, so a change of health is applied too)."""
    generation = 0
    while True:
        view = await watched.wait_changed(generation)
        generation = watched.generation
        try:
            book.set_nomad(view, current=watched.healthy)
        except Exception:
            log.exception("applying a new Nomad view failed; keeping the previous one")
        book.processed(watched, generation)


def _apply_draining(context: RouterContext, marks: Mapping[str, DrainMark]) -> None:
    context.book.set_draining(frozenset(mark.job_id for mark in marks.values()))


def _apply_catalog(context: RouterContext, version: CatalogVersion | None) -> None:
    context.catalogs.update(version, context.deps.clock.wall())
    context.book.set_catalog(context.catalogs.sha256)


def _apply_unavailable(context: RouterContext, document: UnavailableModels | None) -> None:
    context.book.set_unavailable(document)


def _apply_keys(ring: KeyRing, records: Mapping[str, ApiKeyRecord]) -> None:
    ring.replace(records)


async def _monitor_watches(context: RouterContext) -> None:
    """Log when a Consul watch stops answering (the router keeps its last data) and when it is back."""
    loop = asyncio.get_running_loop()
    was_healthy: dict[str, bool] = {}
    while True:
        for label, watched in context.watches():
            healthy = watched.healthy or (watched.last_success_at is None and watched.last_error is None)
            if was_healthy.get(label, True) and not healthy:
                if watched.last_success_at is None:
                    log.warning(
                        "Consul watch %s is failing (%s) and has had no answer yet; "
                        "nothing is routed from it until it answers",
                        label,
                        watched.last_error,
                    )
                else:
                    log.warning(
                        "Consul watch %s is failing (%s); routing on the last data it had (%.0fs old)",
                        label,
                        watched.last_error,
                        loop.time() - watched.last_success_at,
                    )
            elif not was_healthy.get(label, True) and healthy:
                log.info("Consul watch %s answers again", label)
            was_healthy[label] = healthy
        nomad = context.deps.allocations
        if nomad is not None:
            healthy = nomad.healthy or (nomad.last_success_at is None and nomad.last_error is None)
            if was_healthy.get("nomad", True) and not healthy:
                since = nomad.last_success_at
                age = "" if since is None else f" ({loop.time() - since:.0f}s old)"
                log.warning(
                    "Nomad's allocation stream is failing (%s); routing on the last view it gave%s: "
                    "endpoints it vouched for keep serving, new ones wait until Nomad answers",
                    nomad.last_error,
                    age,
                )
            elif not was_healthy.get("nomad", True) and healthy:
                log.info("Nomad's allocation stream answers again")
            was_healthy["nomad"] = healthy
        await asyncio.sleep(WATCH_MONITOR_INTERVAL)


# --- serving ------------------------------------------------------------------------------------------


def runner_options(settings: RouterSettings) -> dict[str, Any]:
    """The aiohttp runner options a proxy needs (each one has a test)."""
    return {
        # A client that leaves cancels its handler at once, which closes the
        # upstream connection, which makes the engine stop generating.
        "handler_cancellation": True,
        # Access logs would format a line per request on the event loop.
        "access_log": logging.getLogger("llmgw.gateway.access") if settings.access_log else None,
        # Closes idle keep-alive connections AND connections that never finish
        # their request head (aiohttp arms this timer at connect): slowloris.
        "keepalive_timeout": settings.keepalive_timeout,
        "shutdown_timeout": settings.shutdown_timeout,
        # A request aiohttp cannot parse is logged without its bytes (they hold its
        # Authorization header and prompt), and at most once per interval.
        "logger": listener_log("llmgw.gateway.http"),
        # Bodies are never inflated: a compressed one is refused (``read_body``).
        **NO_DECOMPRESSION,
    }


class RouterServer:
    """The router listening on ``settings.host:settings.port``; ``port`` is the bound port."""

    def __init__(
        self, settings: RouterSettings, deps: RouterDeps, *, policy: SecurityPolicy | None = None
    ) -> None:
        self.settings = settings
        self.app = create_app(settings, deps, policy=policy)
        self._runner = web.AppRunner(self.app, **runner_options(settings))
        self.port = 0

    @property
    def url(self) -> str:
        return url_of("http", self.settings.host, self.port)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.settings.host,
            self.settings.port,
            backlog=self.settings.backlog,
            reuse_address=True,
        )
        await site.start()
        self.port = bound_port(self._runner, self.settings.port)
        log.info("llmgw router listening on %s (backlog %d)", self.url, self.settings.backlog)

    async def stop(self) -> None:
        """aiohttp's graceful shutdown: stop accepting, let in-flight requests finish
        within ``shutdown_timeout``, cancel the rest, then the cleanup_ctx."""
        await self._runner.cleanup()

    async def __aenter__(self) -> RouterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def run_router(
    settings: RouterSettings,
    deps: RouterDeps,
    *,
    stop: asyncio.Event | None = None,
    policy: SecurityPolicy | None = None,
) -> None:
    """Serve until ``stop`` is set (forever without one), then shut down gracefully."""
    async with RouterServer(settings, deps, policy=policy):
        await (stop or asyncio.Event()).wait()
