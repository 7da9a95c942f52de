"""The aiohttp application of one Consul agent of the stand-in: :func:`create_consul_app`.

Owns the route table (Consul's paths and methods, each with its ACL rule), the
middlewares that act on every request (outage faults, ``?dc=``, turning
:class:`ConsulError` into Consul's plain-text answers, Consul's 404/405 texts),
and wiring: the store, the agent node this app answers for, the change feed and
the dev control go in as typed app keys. With ``supervise=True`` (the default)
the app also runs the stand-in's supervisor (check runners, session and TTL
timers) from ``cleanup_ctx``, so ``create_consul_app(state)`` alone is a whole,
working single-agent Consul; :class:`ConsulStandIn` builds one app per node
with ``supervise=False`` and runs a single supervisor itself.

Must not: hold rules (the store) or render (rendering), or keep module state.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from llmgw.devcluster.browsers import refuse_browsers
from llmgw.devcluster.consul import (
    devapi,
    handlers_acl,
    handlers_acl_admin,
    handlers_agent,
    handlers_catalog,
    handlers_kv,
    handlers_session,
)
from llmgw.devcluster.consul.blocking import ChangeFeed
from llmgw.devcluster.consul.devcontrol import DevControl, StateOnlyControl
from llmgw.devcluster.consul.http_common import (
    AGENT_NODE,
    CONTROL,
    FEED,
    STATE,
    Acl,
    Handler,
    guarded,
    json_answer,
    state_of,
    text_answer,
)
from llmgw.devcluster.consul.model import ConsulError, OutageMode
from llmgw.devcluster.consul.state import ConsulState
from llmgw.devcluster.consul.supervisor import Supervisor

log = logging.getLogger(__name__)

DEV_PREFIX = "/_dev/"
# Paths a client agent answers from its own state while the servers are away.
_AGENT_LOCAL_PREFIXES = ("/v1/agent/",)

_SUPERVISOR = web.AppKey("consul_supervisor", Supervisor)


def _outage(request: web.Request) -> OutageMode | None:
    outage = state_of(request).faults.outage
    return outage.mode if outage is not None else None


async def _through_outage(request: web.Request) -> web.StreamResponse | None:
    """Hold, drop or refuse the request as the current outage says; None lets it pass."""
    mode = _outage(request)
    if mode is None:
        return None
    if mode is OutageMode.HANG:
        feed = request.app[FEED]
        await feed.wait_until(lambda: _outage(request) is not OutageMode.HANG)
        if feed.closed:
            return text_answer(503, "llmgw stand-in: shutting down")
        return await _through_outage(request)
    if mode is OutageMode.REFUSE:
        # The stand-in closes its listeners too; a request that slipped in on a
        # kept-alive connection sees the connection drop, as with a dead server.
        request.protocol.force_close()
        raise web.HTTPServiceUnavailable(text="llmgw stand-in: outage (connection dropped)")
    if request.path.startswith(_AGENT_LOCAL_PREFIXES):
        return None
    if request.path == "/v1/status/leader":
        return json_answer("")
    return text_answer(500, "No cluster leader")


@web.middleware
async def _outage_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith(DEV_PREFIX):
        return await handler(request)
    early = await _through_outage(request)
    if early is not None:
        return early
    response = await handler(request)
    # A long poll that finished while an outage began must not be delivered through it.
    late = await _through_outage(request)
    return late if late is not None else response


# Endpoints whose handlers never read a namespace (agent/http_ce.go's parseEntMeta is
# not called for them), so Consul CE answers them whatever ``?ns=`` says.
_NO_NAMESPACE_PATHS = ("/v1/status/", "/v1/agent/self")


def _refuse_namespace_on_ce(request: web.Request) -> None:
    """Consul CE's answer to a namespace: 400 with parseEntMeta's text (agent/http_ce.go)."""
    if state_of(request).settings.enterprise or not request.path.startswith("/v1/"):
        return
    if request.path.startswith(_NO_NAMESPACE_PATHS):
        return
    if request.headers.get("X-Consul-Namespace"):
        raise ConsulError(
            400, 'Invalid header: "X-Consul-Namespace" - Namespaces are a Consul Enterprise feature'
        )
    if request.query.get("ns"):
        raise ConsulError(400, 'Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature')


@web.middleware
async def _consul_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        dc = request.query.get("dc")
        if dc and request.path.startswith("/v1/") and dc != state_of(request).settings.datacenter:
            raise ConsulError(500, "No path to datacenter")
        _refuse_namespace_on_ce(request)
        return await handler(request)
    except ConsulError as exc:
        return text_answer(exc.status, exc.message)
    except web.HTTPNotFound as exc:
        if exc.text and not exc.text.startswith("404"):
            raise
        return text_answer(404, "404 page not found")
    except web.HTTPMethodNotAllowed:
        return text_answer(405, f"method {request.method} not allowed")


def _routes(app: web.Application) -> None:
    a, c, kv, s, dev = handlers_agent, handlers_catalog, handlers_kv, handlers_session, devapi
    table: list[tuple[str, str, Acl, Handler]] = [
        ("PUT", "/v1/agent/service/register", Acl.TOKEN, a.register_service),
        ("PUT", "/v1/agent/service/deregister/{service_id}", Acl.TOKEN, a.deregister_service),
        ("PUT", "/v1/agent/service/maintenance/{service_id}", Acl.TOKEN, a.service_maintenance),
        ("GET", "/v1/agent/service/{service_id}", Acl.TOKEN, a.service),
        ("GET", "/v1/agent/services", Acl.TOKEN, a.services),
        ("GET", "/v1/agent/checks", Acl.TOKEN, a.checks),
        ("PUT", "/v1/agent/check/register", Acl.TOKEN, a.register_check),
        ("PUT", "/v1/agent/check/deregister/{check_id}", Acl.TOKEN, a.deregister_check),
        ("PUT", "/v1/agent/check/pass/{check_id}", Acl.TOKEN, a.check_pass),
        ("PUT", "/v1/agent/check/warn/{check_id}", Acl.TOKEN, a.check_warn),
        ("PUT", "/v1/agent/check/fail/{check_id}", Acl.TOKEN, a.check_fail),
        ("GET", "/v1/agent/self", Acl.TOKEN, a.agent_self),
        ("GET", "/v1/status/leader", Acl.NONE, a.status_leader),
        ("GET", "/v1/health/service/{service}", Acl.TOKEN, c.health_service),
        ("GET", "/v1/health/checks/{service}", Acl.TOKEN, c.health_checks),
        ("GET", "/v1/health/state/{state}", Acl.TOKEN, c.health_state),
        ("GET", "/v1/health/node/{node}", Acl.TOKEN, c.health_node),
        ("GET", "/v1/catalog/services", Acl.TOKEN, c.catalog_services),
        ("GET", "/v1/catalog/service/{service}", Acl.TOKEN, c.catalog_service),
        ("GET", "/v1/catalog/nodes", Acl.TOKEN, c.catalog_nodes),
        # Each handler checks the named resource (or filters a list) for the token.
        ("GET", "/v1/kv/{key:.*}", Acl.TOKEN, kv.kv_get),
        ("PUT", "/v1/kv/{key:.*}", Acl.TOKEN, kv.kv_put),
        ("DELETE", "/v1/kv/{key:.*}", Acl.TOKEN, kv.kv_delete),
        ("PUT", "/v1/session/create", Acl.TOKEN, s.create),
        # The login needs no token: the identity it carries is the credential.
        ("PUT", "/v1/acl/login", Acl.NONE, handlers_acl.login),
        ("POST", "/v1/acl/login", Acl.NONE, handlers_acl.login),
        ("PUT", "/v1/session/destroy/{session_id}", Acl.TOKEN, s.destroy),
        ("PUT", "/v1/session/renew/{session_id}", Acl.TOKEN, s.renew),
        ("GET", "/v1/session/info/{session_id}", Acl.TOKEN, s.info),
        ("GET", "/v1/session/list", Acl.TOKEN, s.listing),
        ("GET", "/v1/session/node/{node}", Acl.TOKEN, s.listing),
        # The dev endpoints fail nodes and stop Consul: with ACLs on they need the token.
        ("GET", "/_dev/cluster", Acl.MANAGEMENT, dev.cluster),
        ("PUT", "/_dev/nodes/{node}", Acl.MANAGEMENT, dev.add_node),
        ("DELETE", "/_dev/nodes/{node}", Acl.MANAGEMENT, dev.remove_node),
        ("PUT", "/_dev/nodes/{node}/fail", Acl.MANAGEMENT, dev.fail_node),
        ("PUT", "/_dev/nodes/{node}/recover", Acl.MANAGEMENT, dev.recover_node),
        ("PUT", "/_dev/nodes/{node}/check-latency", Acl.MANAGEMENT, dev.check_latency),
        ("PUT", "/_dev/outage", Acl.MANAGEMENT, dev.start_outage),
        ("DELETE", "/_dev/outage", Acl.MANAGEMENT, dev.end_outage),
    ]
    # Policies, roles, tokens, the auth method and binding rules: acl:write, management here.
    table += [(m, p, Acl.MANAGEMENT, h) for m, p, h in handlers_acl_admin.ROUTES]
    for method, path, rule, handler in table:
        app.router.add_route(method, path, guarded(rule, handler))


async def _supervise(app: web.Application) -> AsyncIterator[None]:
    supervisor = Supervisor(app[STATE], app[FEED])
    app[_SUPERVISOR] = supervisor
    supervisor.start()
    yield
    app[FEED].close()
    await supervisor.stop()


def create_consul_app(
    state: ConsulState,
    *,
    agent_node: str | None = None,
    feed: ChangeFeed | None = None,
    control: DevControl | None = None,
    supervise: bool = True,
) -> web.Application:
    """The HTTP API of ``agent_node``'s Consul agent (default: the server node) over ``state``.

    ``feed`` and ``control`` are shared when several agents serve one store (the
    stand-in passes its own); ``supervise`` runs the background work (checks,
    timers) with the app's lifetime and must be on for exactly one app per store.
    """
    node = agent_node or state.settings.server_node
    state.require_node(node)
    app = web.Application(middlewares=[refuse_browsers, _consul_errors, _outage_middleware])
    app[STATE] = state
    app[AGENT_NODE] = node
    app[FEED] = feed if feed is not None else ChangeFeed(state)
    app[CONTROL] = control if control is not None else StateOnlyControl(state)
    _routes(app)
    if supervise:
        app.cleanup_ctx.append(_supervise)
    return app
