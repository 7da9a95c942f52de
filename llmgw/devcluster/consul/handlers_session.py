"""The session endpoints (``/v1/session/...``): create, destroy, renew, info, list, node.

Owns reading session requests as Consul does (create answers ``{"ID": ...}``;
renew of a gone session is 404; info of an unknown one is ``[]``) and calling
the store. A session is created on the asking agent's node unless the body
names another.

Must not: hold rules (the store) or shapes (rendering).
"""

from __future__ import annotations

from aiohttp import web

from llmgw.devcluster.acl.consul_rules import Access
from llmgw.devcluster.consul import rendering
from llmgw.devcluster.consul.decoding import decode_session_create
from llmgw.devcluster.consul.http_common import (
    agent_node,
    blocking_read,
    json_answer,
    meta_headers,
    now,
    require,
    state_of,
    visible,
)


async def create(request: web.Request) -> web.StreamResponse:
    spec = decode_session_create(await request.read())
    require(request, "session", spec.node or agent_node(request), Access.WRITE)
    record = state_of(request).session_create(agent_node(request), spec, now(request))
    return json_answer({"ID": record.session_id})


def _require_session_write(request: web.Request) -> None:
    """Session.Apply and Renew: session:write on the node the session belongs to."""
    _, record = state_of(request).session_info(request.match_info["session_id"])
    if record is not None:
        require(request, "session", record.node, Access.WRITE)


async def destroy(request: web.Request) -> web.StreamResponse:
    _require_session_write(request)
    state_of(request).session_destroy(request.match_info["session_id"], now(request))
    return json_answer(True)


async def renew(request: web.Request) -> web.StreamResponse:
    _require_session_write(request)
    record = state_of(request).session_renew(request.match_info["session_id"], now(request))
    return json_answer([rendering.session(record)])


async def info(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    sid = request.match_info["session_id"]
    index, record = await blocking_read(request, lambda: state.session_info(sid))
    records = visible(
        request,
        [record] if record is not None else [],
        lambda acl, r: acl.allows("session", r.node, Access.READ),
    )
    body = [rendering.session(r) for r in records]
    return json_answer(body, headers=meta_headers(request, index))


async def listing(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    node = request.match_info.get("node")
    index, records = await blocking_read(request, lambda: state.session_list(node))
    records = visible(request, records, lambda acl, r: acl.allows("session", r.node, Access.READ))
    body = [rendering.session(r) for r in records]
    return json_answer(body, headers=meta_headers(request, index))
