"""The control plane's own HTTP listener: ``/metrics`` for Prometheus and ``/health``.

The admin API stays on loopback behind its token; metrics must be reachable by
a scraper, and hold no secret (names of models and counts only), so they have a
listener of their own. It reads the plane's registry and leadership; it changes
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.core.addresses import url_of
from llmgw.http_server import listener_log


@dataclass(frozen=True, slots=True)
class MetricsListenerSettings:
    # Loopback by default; a Prometheus server elsewhere needs 0.0.0.0 (LLMGW_CONTROL_METRICS_HOST).
    host: str = "127.0.0.1"
    port: int = 8082


class MetricsListener:
    def __init__(
        self, settings: MetricsListenerSettings, registry: CollectorRegistry, is_leader: Callable[[], bool]
    ) -> None:
        self.settings = settings
        app = web.Application()
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
