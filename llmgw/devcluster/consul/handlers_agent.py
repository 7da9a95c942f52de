"""The agent endpoints (``/v1/agent/...``) and ``/v1/status/...`` of one node's agent.

Owns translating each agent request into one store call on the app's agent node:
service and check registration, TTL updates, maintenance, and the agent's own
views (services, checks, self). Each handler parses, calls, renders; nothing more.

Must not: hold rules (the store) or shapes (rendering).
"""

from __future__ import annotations

from aiohttp import web

from llmgw.devcluster.acl.consul_rules import Access
from llmgw.devcluster.consul import rendering
from llmgw.devcluster.consul.decoding import (
    decode_check_registration,
    decode_service_registration,
    parse_bool,
)
from llmgw.devcluster.consul.http_common import (
    Handler,
    acl_filtered,
    agent_node,
    check_readable,
    json_answer,
    now,
    refuse_filter,
    require,
    state_of,
    text_answer,
    visible,
)
from llmgw.devcluster.consul.model import ConsulError, HealthStatus


def _filtered(request: web.Request) -> dict[str, str] | None:
    return {"X-Consul-Results-Filtered-By-ACLs": "true"} if acl_filtered(request) else None


async def register_service(request: web.Request) -> web.StreamResponse:
    spec = decode_service_registration(await request.read())
    # agent/agent_endpoint.go vetServiceRegister: service:write on the service's name.
    require(request, "service", spec.name, Access.WRITE)
    replace_checks = request.query.get("replace-existing-checks", "")
    state_of(request).register_service(
        agent_node(request),
        spec,
        now(request),
        replace_existing_checks=parse_bool(replace_checks, "replace-existing-checks")
        if replace_checks
        else False,
    )
    return web.Response()


def _require_service_write(request: web.Request, service_id: str) -> None:
    found = state_of(request).agent_service(agent_node(request), service_id)
    if found is not None:
        require(request, "service", found.name, Access.WRITE)


def _require_check_write(request: web.Request, check_id: str) -> None:
    """vetCheckUpdate: service:write on a service's check, node:write on a node's."""
    check = next(
        (c for c in state_of(request).agent_checks(agent_node(request)) if c.check_id == check_id), None
    )
    if check is None:
        return
    if check.service_id:
        require(request, "service", check.service_name, Access.WRITE)
    else:
        require(request, "node", check.node, Access.WRITE)


async def deregister_service(request: web.Request) -> web.StreamResponse:
    _require_service_write(request, request.match_info["service_id"])
    state_of(request).deregister_service(agent_node(request), request.match_info["service_id"], now(request))
    return web.Response()


async def services(request: web.Request) -> web.StreamResponse:
    refuse_filter(request)
    state = state_of(request)
    dc = state.settings.datacenter
    shown = visible(
        request,
        state.agent_services(agent_node(request)),
        lambda acl, s: acl.allows("service", s.name, Access.READ),
    )
    return json_answer(
        {s.service_id: rendering.agent_service(s, dc) for s in shown}, headers=_filtered(request)
    )


async def service(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    sid = request.match_info["service_id"]
    svc = state.agent_service(agent_node(request), sid)
    if svc is None:
        return text_answer(404, f'unknown service ID: "{sid}"')
    require(request, "service", svc.name, Access.READ)
    doc = rendering.agent_service(svc, state.settings.datacenter, with_hash=True)
    return json_answer(doc, headers={"X-Consul-ContentHash": str(doc["ContentHash"])})


async def checks(request: web.Request) -> web.StreamResponse:
    refuse_filter(request)
    shown = visible(request, state_of(request).agent_checks(agent_node(request)), check_readable)
    return json_answer({c.check_id: rendering.agent_check(c) for c in shown}, headers=_filtered(request))


async def register_check(request: web.Request) -> web.StreamResponse:
    spec = decode_check_registration(await request.read())
    if spec.service_id:
        _require_service_write(request, spec.service_id)
    else:
        require(request, "node", agent_node(request), Access.WRITE)
    state_of(request).register_check(agent_node(request), spec, now(request))
    return web.Response()


async def deregister_check(request: web.Request) -> web.StreamResponse:
    _require_check_write(request, request.match_info["check_id"])
    state_of(request).deregister_check(agent_node(request), request.match_info["check_id"], now(request))
    return web.Response()


def _ttl(status: HealthStatus) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        _require_check_write(request, request.match_info["check_id"])
        state_of(request).update_ttl(
            agent_node(request),
            request.match_info["check_id"],
            status,
            request.query.get("note", ""),
            now(request),
        )
        return web.Response()

    handler.__name__ = f"check_{status.value}"
    return handler


check_pass = _ttl(HealthStatus.PASSING)
check_warn = _ttl(HealthStatus.WARNING)
check_fail = _ttl(HealthStatus.CRITICAL)


def _enable(request: web.Request) -> bool:
    raw = request.query.get("enable")
    if raw is None:
        raise ConsulError(400, "Missing value for enable")
    return parse_bool(raw, "enable")


async def service_maintenance(request: web.Request) -> web.StreamResponse:
    _require_service_write(request, request.match_info["service_id"])
    state_of(request).set_service_maintenance(
        agent_node(request),
        request.match_info["service_id"],
        _enable(request),
        request.query.get("reason", ""),
        now(request),
    )
    return web.Response()


async def agent_self(request: web.Request) -> web.StreamResponse:
    require(request, "agent", agent_node(request), Access.READ)
    state = state_of(request)
    return json_answer(rendering.agent_self(state.require_node(agent_node(request)), state.settings))


async def status_leader(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    return json_answer(f"{state.settings.server_address}:8300")
