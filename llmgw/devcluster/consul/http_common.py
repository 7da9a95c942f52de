"""What every handler of the Consul stand-in shares: app keys, answers, ACL rules.

Owns the typed ``web.AppKey``s (the store, the agent node an app answers for,
the change feed, the dev control), the answer helpers (JSON with Consul's query
meta headers, plain-text errors), reading blocking parameters, and the ACL
decision for a request.

Must not: hold state of its own (no module singletons) or implement an endpoint.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeVar

from aiohttp import web

from llmgw.devcluster.acl import ConsulAcl, ConsulDenied
from llmgw.devcluster.acl.consul_rules import Access
from llmgw.devcluster.consul.blocking import BlockingParams, ChangeFeed, block_until_changed, parse_blocking
from llmgw.devcluster.consul.devcontrol import DevControl
from llmgw.devcluster.consul.model import CheckRecord, ConsulError
from llmgw.devcluster.consul.state import ConsulState

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATE = web.AppKey("consul_state", ConsulState)
AGENT_NODE = web.AppKey("consul_agent_node", str)
FEED = web.AppKey("consul_change_feed", ChangeFeed)
CONTROL = web.AppKey("consul_dev_control", DevControl)

# The anonymous token's AccessorID in every Consul cluster.
ANONYMOUS_ACCESSOR = "00000000-0000-0000-0000-000000000002"


class Acl(StrEnum):
    """What a route needs before its handler runs, when ACLs are on (settings.acl_token set).

    The handler then checks the named resource itself (``require``) or filters what the
    token may not read (``visible``), as Consul's endpoints do."""

    NONE = "none"  # /v1/status/*: no token needed (Consul checks none there)
    TOKEN = "token"  # noqa: S105 (a rule name, not a secret): a known token or the anonymous one; the handler decides
    MANAGEMENT = "management"  # the dev endpoints: the configured (management) token only


# Set on a read when the token's ACL hid part of the answer (X-Consul-Results-Filtered-By-ACLs).
FILTERED = web.RequestKey("consul_acl_filtered", bool)
TOKEN_ACL = web.RequestKey("consul_token_acl", ConsulAcl)
TOKEN_NAME = web.RequestKey("consul_token_name", str)
_MANAGEMENT = ConsulAcl(accessor="", management=True)


def state_of(request: web.Request) -> ConsulState:
    return request.app[STATE]


def agent_node(request: web.Request) -> str:
    return request.app[AGENT_NODE]


def now(_request: web.Request) -> float:
    """The store's clock: the event loop's, in seconds."""
    return asyncio.get_running_loop().time()


def acl_filtered(request: web.Request) -> bool:
    return bool(request.get(FILTERED, False))


def request_token(request: web.Request) -> str:
    """The token as Consul's ``parseTokenInternal`` finds it: ``?token=``, then
    ``X-Consul-Token``, then ``Authorization: Bearer`` (its first word)."""
    token = request.query.get("token", "") or request.headers.get("X-Consul-Token", "")
    if token:
        return token
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.split()[0]
    return ""


def token_acl(request: web.Request) -> ConsulAcl:
    """The ACL of the request's token (management when ACLs are off)."""
    acl = request.get(TOKEN_ACL)
    return acl if isinstance(acl, ConsulAcl) else _MANAGEMENT


def resolve_token(request: web.Request, rule: Acl) -> None:
    """Find the request's token; 403 ``ACL not found`` for a secret no token has."""
    state = state_of(request)
    if state.settings.acl_token is None or rule is Acl.NONE:
        return
    secret = request_token(request)
    who = "anonymous"
    if secret:
        identity = state.tokens.resolve(secret)
        if identity is None:
            state.tokens.deny("unknown", f"{request.method} {request.path}", "a known token")
            raise web.HTTPForbidden(text="ACL not found", content_type="text/plain")
        acl, who = identity.acl, identity.name
    else:
        acl = ConsulAcl(accessor=ANONYMOUS_ACCESSOR)
    request[TOKEN_NAME] = who
    if rule is Acl.MANAGEMENT and not acl.management:
        raise web.HTTPForbidden(text="Permission denied", content_type="text/plain")
    request[TOKEN_ACL] = acl


def require(request: web.Request, resource: str, name: str, access: Access) -> None:
    """Consul's 403 ``Permission denied: token ... lacks permission 'R:A' on "name"``."""
    try:
        token_acl(request).require(resource, name, access)
    except ConsulDenied as exc:
        who = request.get(TOKEN_NAME, "anonymous")
        state_of(request).tokens.deny(
            who, f"{request.method} {request.path}", f"{resource}:{access.value} on {name!r}"
        )
        raise web.HTTPForbidden(text=str(exc), content_type="text/plain") from exc


def visible(request: web.Request, items: list[T], allowed: Callable[[ConsulAcl, T], bool]) -> list[T]:
    """The items the token may read; marks the answer filtered when any is left out."""
    acl = token_acl(request)
    kept = [item for item in items if allowed(acl, item)]
    if len(kept) != len(items):
        request[FILTERED] = True
        who = request.get(TOKEN_NAME, "anonymous")
        state_of(request).tokens.deny(who, f"{request.method} {request.path}", "read of what was filtered")
    return kept


def check_readable(acl: ConsulAcl, check: CheckRecord) -> bool:
    """filterHealthChecks (agent/consul/acl.go): node read, and service read for a service's check."""
    if not acl.allows("node", check.node, Access.READ):
        return False
    return not check.service_name or acl.allows("service", check.service_name, Access.READ)


def guarded(rule: Acl, handler: Handler) -> Handler:
    async def run(request: web.Request) -> web.StreamResponse:
        resolve_token(request, rule)
        return await handler(request)

    run.__name__ = handler.__name__
    return run


def meta_headers(request: web.Request, index: int) -> dict[str, str]:
    """Consul's QueryMeta headers for a read that reports an index."""
    headers = {
        "X-Consul-Index": str(max(1, index)),
        "X-Consul-KnownLeader": "true",
        "X-Consul-LastContact": "0",
        "X-Consul-Effective-Consistency": "leader",
    }
    if acl_filtered(request):
        headers["X-Consul-Results-Filtered-By-ACLs"] = "true"
    return headers


def json_answer(data: object, headers: dict[str, str] | None = None, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, content_type="application/json", headers=headers
    )


def text_answer(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain", headers=headers)


def blocking_params(request: web.Request) -> BlockingParams:
    return parse_blocking(request.query.get("index"), request.query.get("wait"), state_of(request).settings)


async def blocking_read(request: web.Request, view: Callable[[], tuple[int, T]]) -> tuple[int, T]:
    """Run ``view`` as a blocking query for this request's ``?index=`` and ``?wait=``."""
    params = blocking_params(request)
    return await block_until_changed(request.app[FEED], params, state_of(request).settings, view)


def refuse_filter(request: web.Request) -> None:
    """Refuse a ``?filter=`` expression as Consul refuses one it cannot parse.

    The stand-in evaluates no go-bexpr expressions: nothing in llmgw sends one.
    Consul answers a filter it cannot compile with 500 and bexpr's
    ``Failed to create boolean expression evaluator: ...`` (see DESIGN.md), so a
    client that sends one fails here as it would on a filter real Consul rejects,
    instead of silently getting the unfiltered list.
    """
    if request.query.get("filter", ""):
        raise ConsulError(
            500,
            "Failed to create boolean expression evaluator: the llmgw dev stand-in does not evaluate "
            "?filter= expressions (real Consul does); leave out ?filter= and select from the answer "
            "in the client",
        )


def node_meta_filter(request: web.Request) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in request.query.getall("node-meta", []):
        key, _, value = item.partition(":")
        out[key] = value
    return out
