"""The health and catalog reads (``/v1/health/...``, ``/v1/catalog/...``), all blocking.

Owns, per endpoint: reading the view from the store as a blocking query,
rendering it, applying ``?node-meta=`` on the rendered documents (as Consul
filters its structs), refusing ``?filter=`` (see ``refuse_filter``), emptying it
for an anonymous reader when ACLs are on, and answering with the view's index. ``?near=``, ``?stale``,
``?consistent`` and ``?cached`` are accepted and ignored (one server, no cache).

Must not: hold rules (the store) or shapes (rendering).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from llmgw.devcluster.acl.consul_rules import Access
from llmgw.devcluster.consul import rendering
from llmgw.devcluster.consul.decoding import parse_bool
from llmgw.devcluster.consul.http_common import (
    blocking_read,
    check_readable,
    json_answer,
    meta_headers,
    node_meta_filter,
    refuse_filter,
    state_of,
    visible,
)
from llmgw.devcluster.consul.model import CheckRecord
from llmgw.devcluster.consul.rendering import Json
from llmgw.devcluster.consul.state import ConsulState


def _passing(request: web.Request) -> bool:
    # Consul: a bare ?passing is on; a value must be a Go bool ("1", "true", "0", ...).
    raw = request.query.get("passing")
    if raw is None:
        return False
    return raw == "" or parse_bool(raw, "passing")


def _select(
    request: web.Request, docs: list[Json], node_meta_at: Callable[[Json], object] | None = None
) -> list[Json]:
    meta = node_meta_filter(request)
    if not meta or node_meta_at is None:
        return docs
    out = []
    for d in docs:
        have = node_meta_at(d)
        if isinstance(have, dict) and all(have.get(k) == v for k, v in meta.items()):
            out.append(d)
    return out


async def health_service(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    name = request.match_info["service"]
    refuse_filter(request)  # before any waiting, as Consul compiles it first
    tags = request.query.getall("tag", [])
    passing = _passing(request)
    index, rows = await blocking_read(
        request, lambda: state.health_service(name, passing_only=passing, tags=tags)
    )
    dc = state.settings.datacenter
    # filterCheckServiceNodes (agent/consul/acl.go): an entry needs node read and service read.
    rows = visible(
        request,
        rows,
        lambda acl, r: (
            acl.allows("node", r.node.name, Access.READ)
            and acl.allows("service", r.service.name, Access.READ)
        ),
    )
    docs = [rendering.service_entry(r.node, r.service, list(r.checks), dc) for r in rows]
    docs = _select(request, docs, lambda d: d["Node"]["Meta"])  # type: ignore[index]
    return json_answer(docs, headers=meta_headers(request, index))


async def _health_checks_answer(
    request: web.Request, view: Callable[[ConsulState], tuple[int, list[CheckRecord]]]
) -> web.StreamResponse:
    refuse_filter(request)
    state = state_of(request)
    view(state)  # a bad argument (an unknown state) is a 400 before any waiting
    index, checks = await blocking_read(request, lambda: view(state))
    checks = visible(request, checks, check_readable)
    docs = _select(request, [rendering.health_check(c) for c in checks])
    return json_answer(docs, headers=meta_headers(request, index))


async def health_checks(request: web.Request) -> web.StreamResponse:
    name = request.match_info["service"]
    return await _health_checks_answer(request, lambda state: state.health_checks_of_service(name))


async def health_state(request: web.Request) -> web.StreamResponse:
    which = request.match_info["state"]
    return await _health_checks_answer(request, lambda state: state.health_state(which))


async def health_node(request: web.Request) -> web.StreamResponse:
    node = request.match_info["node"]
    return await _health_checks_answer(request, lambda state: state.health_node(node))


async def catalog_services(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    index, services = await blocking_read(request, state.catalog_services)
    names = visible(request, sorted(services), lambda acl, name: acl.allows("service", name, Access.READ))
    body = {name: services[name] for name in names}
    return json_answer(body, headers=meta_headers(request, index))


async def catalog_service(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    name = request.match_info["service"]
    refuse_filter(request)
    tags = request.query.getall("tag", [])
    index, rows = await blocking_read(request, lambda: state.catalog_service(name, tags))
    # filterServiceNodes: node read and service read.
    rows = visible(
        request,
        rows,
        lambda acl, row: (
            acl.allows("node", row[0].name, Access.READ) and acl.allows("service", row[1].name, Access.READ)
        ),
    )
    dc = state.settings.datacenter
    docs = [rendering.catalog_service(n, s, dc) for n, s in rows]
    docs = _select(request, docs, lambda d: d["NodeMeta"])
    return json_answer(docs, headers=meta_headers(request, index))


async def catalog_nodes(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    refuse_filter(request)
    index, nodes = await blocking_read(request, state.catalog_nodes)
    nodes = visible(request, nodes, lambda acl, n: acl.allows("node", n.name, Access.READ))
    dc = state.settings.datacenter
    docs = _select(request, [rendering.node(n, dc) for n in nodes], lambda d: d["Meta"])
    return json_answer(docs, headers=meta_headers(request, index))
