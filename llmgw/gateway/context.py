"""The typed keys under which the app and each request keep the router's parts.

Owns: ``RouterContext`` (the parts one app is made of, built by ``create_app``)
and the ``web.AppKey``/``web.RequestKey`` constants. No module globals hold
state: two routers in one process (tests do this) share nothing.

Must not: build anything (``app.create_app`` does) or hold logic.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from llmgw.core.records import ApiKeyRecord
from llmgw.gateway.book import EndpointBook
from llmgw.gateway.catalogs import CatalogHolder
from llmgw.gateway.conversations import Conversations
from llmgw.gateway.demand import DemandTracker
from llmgw.gateway.dispatch import Dispatcher, Served
from llmgw.gateway.guard import Guard
from llmgw.gateway.keys import KeyRing, RateLimiter
from llmgw.gateway.limits import ModelGates
from llmgw.gateway.metrics import RouterMetrics
from llmgw.gateway.ports import RouterDeps, Watched
from llmgw.gateway.settings import RouterSettings
from llmgw.gateway.shared_limits import SharedLimits
from llmgw.gateway.upstream import Upstream


@dataclass
class RouterContext:
    settings: RouterSettings
    deps: RouterDeps
    book: EndpointBook
    catalogs: CatalogHolder
    keys: KeyRing | None  # None: serving without keys (loopback only)
    limiter: RateLimiter
    gates: ModelGates
    demand: DemandTracker
    metrics: RouterMetrics
    upstream: Upstream
    dispatcher: Dispatcher
    guard: Guard
    conversations: Conversations  # the Responses API's stored conversations
    # Limits and usage every router shares (--limits-redis-url); None: this router's own.
    shared_limits: SharedLimits | None = None

    def watches(self) -> list[tuple[str, Watched[object]]]:
        """The watched values this router follows, by a short label."""
        found: list[tuple[str, Watched[object]]] = [
            ("endpoints", self.deps.endpoints),
            ("draining", self.deps.draining),
            ("catalog", self.deps.catalog),
            ("unavailable", self.deps.unavailable),
        ]
        if self.keys is not None and self.deps.api_keys is not None:
            found.append(("api_keys", self.deps.api_keys))
        return found


CONTEXT = web.AppKey("llmgw_router", RouterContext)

REQUEST_ID = web.RequestKey("llmgw_request_id", str)
STARTED = web.RequestKey("llmgw_started", float)  # event-loop clock at arrival
API_KEY = web.RequestKey("llmgw_api_key", ApiKeyRecord)  # absent without keys
SERVED = web.RequestKey("llmgw_served", Served)
