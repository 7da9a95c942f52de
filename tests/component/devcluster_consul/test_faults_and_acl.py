"""Outage faults (hang, refuse, no-leader), the /_dev control endpoints, and ACL tokens."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
import consul.aio
import consul.exceptions
import pytest
from aiohttp import ClientSession

from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn, OutageMode
from tests.support import waiting

if TYPE_CHECKING:
    from conftest import Eventually


async def test_hang_outage_holds_requests_and_long_polls_until_it_ends(
    standin: ConsulStandIn, node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    assert await node1_client.agent.service.register("vllm", service_id="v1", port=1)
    index, _ = await server_client.health.service("vllm")
    long_poll = asyncio.create_task(server_client.health.service("vllm", index=index, wait="10s"))
    await waiting.eventually(lambda: standin.blocked_queries == 1, what="the long poll parked")

    await standin.start_outage(OutageMode.HANG)
    plain_read = asyncio.create_task(server_client.health.service("vllm"))
    # A change during the outage must not be delivered through it.
    standin.fail_node("node-1")
    done, _ = await asyncio.wait({long_poll, plain_read}, timeout=0.3)  # a check that nothing comes
    assert done == set()

    await standin.end_outage()
    new_index, entries = await asyncio.wait_for(long_poll, 5)
    assert int(new_index) > int(index)
    assert {c["CheckID"]: c["Status"] for c in entries[0]["Checks"]}["serfHealth"] == "critical"
    _, entries = await asyncio.wait_for(plain_read, 5)
    assert len(entries) == 1


async def test_refuse_outage_closes_the_ports_and_reopens_them(
    standin: ConsulStandIn, http: ClientSession, eventually: Eventually
) -> None:
    await standin.start_outage(OutageMode.REFUSE)
    for url in (standin.url, standin.agent_url("node-1")):
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as fresh, fresh.get(url + "/v1/status/leader") as resp:
                await resp.read()
    await standin.end_outage()
    async with http.get(standin.url + "/v1/status/leader") as resp:
        assert resp.status == 200


async def test_timed_outage_through_the_dev_endpoint_ends_by_itself(
    standin: ConsulStandIn, http: ClientSession, eventually: Eventually
) -> None:
    async with http.put(standin.url + "/_dev/outage?mode=refuse&duration=300ms") as resp:
        assert await resp.json() is True

    async def refused() -> bool:
        try:
            async with aiohttp.ClientSession() as fresh, fresh.get(standin.url + "/v1/status/leader") as resp:
                await resp.read()
        except aiohttp.ClientConnectionError:
            return True
        return False

    async def answering() -> bool:
        return not await refused()

    await eventually(refused)
    await eventually(answering)
    async with http.get(standin.url + "/_dev/cluster") as resp:
        assert (await resp.json())["Outage"] is None


async def test_no_leader_outage_keeps_the_agent_answering(
    standin: ConsulStandIn, node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    await standin.start_outage(OutageMode.NO_LEADER)
    with pytest.raises(consul.exceptions.ConsulException, match="No cluster leader"):
        await server_client.health.service("vllm")
    with pytest.raises(consul.exceptions.ConsulException, match="No cluster leader"):
        await server_client.kv.get("x")
    assert await server_client.status.leader() == ""
    assert await node1_client.agent.services() == {}
    await standin.end_outage()
    assert (await server_client.health.service("vllm"))[1] == []


async def test_dev_endpoints_shape_the_cluster(standin: ConsulStandIn, http: ClientSession) -> None:
    async with http.put(standin.url + "/_dev/nodes/gpu-7?address=127.0.0.7") as resp:
        added = await resp.json()
    assert (added["Node"], added["Address"]) == ("gpu-7", "127.0.0.7")
    assert added["AgentURL"] == standin.agent_url("gpu-7")
    async with http.get(added["AgentURL"] + "/v1/agent/self") as resp:
        assert (await resp.json())["Config"]["NodeName"] == "gpu-7"

    async with http.put(standin.url + "/_dev/nodes/gpu-7/fail") as resp:
        assert resp.status == 200
    async with http.get(standin.url + "/v1/health/node/gpu-7") as resp:
        assert [(c["CheckID"], c["Status"]) for c in await resp.json()] == [("serfHealth", "critical")]
    async with http.put(standin.url + "/_dev/nodes/gpu-7/recover") as resp:
        assert resp.status == 200
    async with http.put(standin.url + "/_dev/nodes/gpu-7/check-latency?delay=2s") as resp:
        assert resp.status == 200
    async with http.get(standin.url + "/_dev/cluster") as resp:
        nodes = {n["Node"]: n for n in (await resp.json())["Nodes"]}
    assert (nodes["gpu-7"]["Failed"], nodes["gpu-7"]["CheckLatency"]) == (False, 2.0)

    async with http.delete(standin.url + "/_dev/nodes/gpu-7") as resp:
        assert resp.status == 200
    async with http.get(standin.url + "/v1/catalog/nodes") as resp:
        assert "gpu-7" not in [n["Node"] for n in await resp.json()]
    async with http.put(standin.url + "/_dev/outage?mode=sideways") as resp:
        assert resp.status == 400


async def test_unknown_paths_and_methods_read_like_consul(
    standin: ConsulStandIn, http: ClientSession
) -> None:
    async with http.get(standin.url + "/v1/nothing/here") as resp:
        assert (resp.status, await resp.text()) == (404, "404 page not found")
    # Endpoints real Consul has and nothing in llmgw calls are absent, answered alike
    # (and, like any unknown path, before any ACL rule).
    for method, path in (
        ("GET", "/v1/catalog/node/node-1"),
        ("PUT", "/v1/agent/maintenance?enable=true"),
        ("PUT", "/v1/agent/check/update/serfHealth"),
        ("GET", "/v1/status/peers"),
    ):
        async with http.request(method, standin.agent_url("node-1") + path) as resp:
            assert (resp.status, await resp.text()) == (404, "404 page not found"), path
    async with http.delete(standin.url + "/v1/agent/services") as resp:
        assert (resp.status, await resp.text()) == (405, "method DELETE not allowed")


@pytest.mark.parametrize("settings", [ConsulSettings.for_tests(acl_token="s3cret")])
async def test_acl_token_is_required_when_configured(
    standin: ConsulStandIn, http: ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    anonymous = consul.aio.Consul(host=standin.host, port=standin.port)
    wrong = consul.aio.Consul(host=standin.host, port=standin.port, token="guess")
    # py-consul reads CONSUL_HTTP_TOKEN, as llmgw's processes are given it.
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "s3cret")
    right = consul.aio.Consul(host=standin.host, port=standin.port)
    try:
        assert await right.kv.put("k", "v") is True
        assert await right.agent.service.register("vllm", service_id="v1", port=1) is True
        assert len((await right.health.service("vllm"))[1]) == 1

        # Anonymous reads of lists come back empty and marked filtered, as with a
        # default-deny policy; anything else is refused.
        async with http.get(standin.url + "/v1/health/service/vllm") as resp:
            assert await resp.json() == []
            assert resp.headers["X-Consul-Results-Filtered-By-ACLs"] == "true"
        assert await anonymous.agent.services() == {}
        assert list(await right.agent.services()) == ["v1"]
        with pytest.raises(consul.exceptions.ACLPermissionDenied, match="Permission denied"):
            await anonymous.kv.put("k", "x")
        with pytest.raises(consul.exceptions.ACLPermissionDenied, match="Permission denied"):
            await anonymous.kv.get("k")
        with pytest.raises(consul.exceptions.ACLPermissionDenied, match="ACL not found"):
            await wrong.health.service("vllm")
        # The token may also come as ?token= or a Bearer header.
        async with http.get(standin.url + "/v1/kv/k?token=s3cret") as resp:
            assert resp.status == 200
        async with http.get(standin.url + "/v1/kv/k", headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200
        # Status needs no token.
        assert await anonymous.status.leader() != ""
    finally:
        for client in (anonymous, wrong, right):
            await client.close()


async def test_tokens_are_ignored_without_acls(standin: ConsulStandIn) -> None:
    client = consul.aio.Consul(host=standin.host, port=standin.port, token="anything")
    try:
        assert await client.kv.put("k", "v") is True
    finally:
        await client.close()


async def test_bare_app_is_a_working_single_agent(http: ClientSession, eventually: Eventually) -> None:
    """create_consul_app(state) alone runs its own checks and timers."""
    from aiohttp import web

    from llmgw.devcluster.consul import ConsulState, create_consul_app

    state = ConsulState(ConsulSettings.for_tests())
    runner = web.AppRunner(create_consul_app(state), shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        body = {"Name": "api", "Check": {"TTL": "100ms", "Status": "passing"}}
        async with http.put(base + "/v1/agent/service/register", json=body) as resp:
            assert resp.status == 200

        async def expired() -> bool:
            async with http.get(base + "/v1/health/service/api?passing") as resp:
                return await resp.json() == []

        await eventually(expired)
    finally:
        await runner.cleanup()


async def test_a_namespace_is_refused_as_consul_ce_refuses_it(
    standin: ConsulStandIn, http: aiohttp.ClientSession
) -> None:
    """Consul CE answers a request naming a namespace with 400 and parseEntMeta's text
    (agent/http_ce.go); an empty ``ns`` is no namespace. Status endpoints take none."""
    async with http.get(standin.url + "/v1/kv/llmgw/status?ns=team-a") as resp:
        assert resp.status == 400
        assert (
            await resp.text() == 'Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature'
        )
    async with http.put(
        standin.url + "/v1/session/create", json={}, headers={"X-Consul-Namespace": "team-a"}
    ) as resp:
        assert resp.status == 400
        assert await resp.text() == (
            'Invalid header: "X-Consul-Namespace" - Namespaces are a Consul Enterprise feature'
        )
    async with http.get(standin.url + "/v1/kv/llmgw/status?ns=") as resp:
        assert resp.status == 404
    async with http.get(standin.url + "/v1/status/leader?ns=team-a") as resp:
        assert resp.status == 200
