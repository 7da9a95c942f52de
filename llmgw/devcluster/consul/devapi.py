"""``/_dev/...``: the stand-in's own control endpoints, for ``llmgw dev`` and tests.

Real Consul has no ``/_dev`` path, so nothing written for Consul can reach these
by accident; with ACLs on they need the token as the API does (they fail nodes
and stop Consul), and they keep answering through any outage except
REFUSE (whose listeners are closed: give it a duration, or end it from Python).

    GET    /_dev/cluster                          nodes, agent URLs, faults, index
    PUT    /_dev/nodes/{node}?address=A           join a node (its agent URL back)
    DELETE /_dev/nodes/{node}                     the node leaves
    PUT    /_dev/nodes/{node}/fail                serfHealth critical
    PUT    /_dev/nodes/{node}/recover             serfHealth passing, checks synced
    PUT    /_dev/nodes/{node}/check-latency?delay=2s   0s clears it
    PUT    /_dev/outage?mode=hang|refuse|no-leader[&duration=10s]
    DELETE /_dev/outage

Owns translating these into :class:`DevControl` calls.

Must not: change state except through :class:`DevControl`.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmgw.devcluster.consul.durations import DurationError, parse_go_duration
from llmgw.devcluster.consul.http_common import CONTROL, json_answer, state_of
from llmgw.devcluster.consul.model import ConsulError, OutageMode


def _duration(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return parse_go_duration(raw)
    except DurationError as exc:
        raise ConsulError(400, f"{name}: {exc}") from None


async def cluster(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    urls = request.app[CONTROL].agent_urls()
    faults = state.faults
    loop_now = asyncio.get_running_loop().time()
    outage = None
    if faults.outage is not None:
        left = None if faults.outage.until is None else max(0.0, faults.outage.until - loop_now)
        outage = {"Mode": faults.outage.mode.value, "SecondsLeft": left}
    return json_answer(
        {
            "Datacenter": state.settings.datacenter,
            "Index": state.index,
            "Nodes": [
                {
                    "Node": n.name,
                    "Address": n.address,
                    "AgentURL": urls.get(n.name),
                    "Failed": n.name in faults.failed_nodes,
                    "CheckLatency": faults.check_latency.get(n.name, 0.0),
                }
                for n in state.nodes()
            ],
            "Outage": outage,
        }
    )


async def add_node(request: web.Request) -> web.StreamResponse:
    name = request.match_info["node"]
    address = request.query.get("address", "127.0.0.1")
    url = await request.app[CONTROL].add_node(name, address)
    return json_answer({"Node": name, "Address": address, "AgentURL": url})


async def remove_node(request: web.Request) -> web.StreamResponse:
    await request.app[CONTROL].remove_node(request.match_info["node"])
    return json_answer(True)


async def fail_node(request: web.Request) -> web.StreamResponse:
    request.app[CONTROL].fail_node(request.match_info["node"])
    return json_answer(True)


async def recover_node(request: web.Request) -> web.StreamResponse:
    request.app[CONTROL].recover_node(request.match_info["node"])
    return json_answer(True)


async def check_latency(request: web.Request) -> web.StreamResponse:
    delay = _duration(request, "delay")
    if delay is None:
        raise ConsulError(400, "delay is required (a duration such as 2s; 0s clears it)")
    request.app[CONTROL].slow_node_checks(request.match_info["node"], delay)
    return json_answer(True)


async def start_outage(request: web.Request) -> web.StreamResponse:
    raw = request.query.get("mode", OutageMode.HANG.value)
    try:
        mode = OutageMode(raw)
    except ValueError:
        raise ConsulError(400, f"mode must be one of {', '.join(m.value for m in OutageMode)}") from None
    duration = _duration(request, "duration")
    if mode is OutageMode.REFUSE and duration is None:
        raise ConsulError(400, "a refuse outage closes this port too: give it a duration")
    answer = json_answer(True)
    # Answer before the outage starts: a REFUSE outage drops this very connection.
    await answer.prepare(request)
    await answer.write_eof()
    await request.app[CONTROL].start_outage(mode, duration)
    return answer


async def end_outage(request: web.Request) -> web.StreamResponse:
    await request.app[CONTROL].end_outage()
    return json_answer(True)
