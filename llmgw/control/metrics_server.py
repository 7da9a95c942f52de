"""The control plane's own HTTP listener: ``/metrics`` for Prometheus and ``/health``.

The admin API stays on loopback behind its token; metrics must be reachable by
a scraper, and hold no secret (names of models and counts only), so they have a
listener of their own. It reads the plane's registry and leadership; it changes
nothing.

Bound to loopback (the default, and ``llmgw dev``), it answers only a ``Host`` that is an
IP address or ``localhost``: a page an operator's browser opens can rebind its own name
to 127.0.0.1 and would otherwise read every model's name and count. Whatever scrapes a
loopback listener runs on this machine and names it by address; a listener bound
elsewhere is scraped by the names Prometheus is given, so it checks no ``Host``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.core.addresses import host_of_header, is_ip_or_localhost, is_loopback, url_of
from llmgw.http_server import listener_log


@dataclass(frozen=True, slots=True)
class MetricsListenerSettings:
    # Loopback by default; a Prometheus server elsewhere needs 0.0.0.0 (LLMGW_CONTROL_METRICS_HOST).
    host: str = "127.0.0.1"
    port: int = 8082


@web.middleware
async def _loopback_host_check(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    host = host_of_header(request.headers.get("Host", "127.0.0.1"))
    if host is None or not is_ip_or_localhost(host):
        return web.Response(
            status=403,
            text="this listener is bound to loopback and answers only http://127.0.0.1 or http://localhost\n",
        )
    return await handler(request)


class MetricsListener:
    def __init__(
        self, settings: MetricsListenerSettings, registry: CollectorRegistry, is_leader: Callable[[], bool]
    ) -> None:
        self.settings = settings
        app = web.Application(middlewares=[_loopback_host_check] if is_loopback(settings.host) else [])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self._registry = registry
        self._is_leader = is_leader
        self._runner = web.AppRunner(app, access_log=None, logger=listener_log("llmgw.control.http"))
        self.port = 0

    @property
    def url(self) -> str:
        return url_of("http", self.settings.host, self.port)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        # 200 for a standby too: it is healthy; whether it leads is in the body.
        return web.Response(
            text=json.dumps({"status": "ok", "leader": self._is_leader()}), content_type="application/json"
        )
