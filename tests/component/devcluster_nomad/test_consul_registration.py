"""What the Nomad stand-in's client sends a Consul agent for one service block, as
Nomad 2.0.5's ``command/agent/consul/service_client.go`` sends it: one
``PUT /v1/agent/service/register`` with the checks inline, check ids ``MakeCheckID``'s
SHA-256 of the fields ``ServiceCheck.Hash`` reads (``nomad/structs/services.go``)."""

from __future__ import annotations

import hashlib

import aiohttp
from aiohttp import web

from llmgw.devcluster.nomad.consul_http import ConsulAgent, registration
from tests.support.http_app import serving

S = 1_000_000_000
SID = "_nomad-task-0b6c-group-web-web-http"


def web_service() -> dict[str, object]:
    return {
        "Name": "web",
        "PortLabel": "http",
        "Checks": [
            {
                "Type": "http",
                "Path": "/health",
                "Interval": 10 * S,
                "Timeout": 2 * S,
                "OnUpdate": "require_healthy",
            },
            {
                "Name": "ready",
                "Type": "tcp",
                "Interval": S // 2,
                "Timeout": S,
                "OnUpdate": "require_healthy",
                "SuccessBeforePassing": 2,
            },
        ],
    }


def test_the_checks_go_inline_with_ids_hashed_as_nomad_2_0_5_hashes_them() -> None:
    reg = registration(
        alloc_id="0b6c",
        workload="group-web",
        service=web_service(),
        address="10.0.0.5",
        port=8080,
        check_ports={},
    )
    # ServiceCheck.Hash writes, in order: service id, Name, Type, Command, Args, Path,
    # Protocol, PortLabel, Interval, Timeout, Method, Body, OnUpdate, Notes, then the
    # optional fields only when set ("success:2").
    first = hashlib.sha256(
        (SID + 'service: "web" check' + "http" + "/health" + "10s" + "2s" + "require_healthy").encode()
    ).hexdigest()
    second = hashlib.sha256(
        (SID + "ready" + "tcp" + "500ms" + "1s" + "require_healthy" + "success:2").encode()
    ).hexdigest()
    assert reg.service["ID"] == SID
    assert reg.service["Checks"] == [
        {
            "CheckID": f"_nomad-check-{first}",
            "Name": 'service: "web" check',
            "Status": "",
            "Interval": "10s",
            "Timeout": "2s",
            "HTTP": "http://10.0.0.5:8080/health",
        },
        {
            "CheckID": f"_nomad-check-{second}",
            "Name": "ready",
            "Status": "",
            "Interval": "500ms",
            "Timeout": "1s",
            "SuccessBeforePassing": 2,
            "TCP": "10.0.0.5:8080",
        },
    ]


async def test_a_service_and_its_checks_are_one_agent_call() -> None:
    calls: list[tuple[str, dict[str, object]]] = []

    async def record(request: web.Request) -> web.Response:
        calls.append((request.path, await request.json()))
        return web.Response()

    app = web.Application()
    app.router.add_put("/{tail:.*}", record)
    async with serving(app) as url:
        reg = registration(
            alloc_id="0b6c",
            workload="group-web",
            service=web_service(),
            address="10.0.0.5",
            port=8080,
            check_ports={},
        )
        async with aiohttp.ClientSession() as http:
            await ConsulAgent(http, url).register(reg)
    assert [path for path, _ in calls] == ["/v1/agent/service/register"]
    assert len(calls[0][1]["Checks"]) == 2  # type: ignore[arg-type]
