"""The session endpoints (``/v1/session/...``): create, destroy, renew, info, list, node.

Owns reading session requests as Consul does (create answers ``{"ID": ...}``;
renew of a gone session is 404; info of an unknown one is ``[]``) and calling
the store. A session is created on the asking agent's node unless the body
names another.

Must not: hold rules (the store) or shapes (rendering).
"""

from __future__ import annotations

from aiohttp import web

from llmgw.devcluster.consul import rendering
from llmgw.devcluster.consul.decoding import decode_session_create
from llmgw.devcluster.consul.http_common import (
    acl_filtered,
    agent_node,
    blocking_read,
    json_answer,
    meta_headers,
    now,
    state_of,
)


async def create(request: web.Request) -> web.StreamResponse:
    spec = decode_session_create(await request.read())
    record = state_of(request).session_create(agent_node(request), spec, now(request))
    return json_answer({"ID": record.session_id})


async def destroy(request: web.Request) -> web.StreamResponse:
    state_of(request).session_destroy(request.match_info["session_id"], now(request))
    return json_answer(True)


async def renew(request: web.Request) -> web.StreamResponse:
    record = state_of(request).session_renew(request.match_info["session_id"], now(request))
    return json_answer([rendering.session(record)])


async def info(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    sid = request.match_info["session_id"]
    index, record = await blocking_read(request, lambda: state.session_info(sid))
    body = [rendering.session(record)] if record is not None and not acl_filtered(request) else []
    return json_answer(body, headers=meta_headers(request, index))


async def listing(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    node = request.match_info.get("node")
    index, records = await blocking_read(request, lambda: state.session_list(node))
    body = [] if acl_filtered(request) else [rendering.session(r) for r in records]
    return json_answer(body, headers=meta_headers(request, index))
