"""Blocking queries with Consul's index rules, through py-consul and plain HTTP."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import consul
import consul.aio
from aiohttp import ClientSession

from llmgw.devcluster.consul import ConsulStandIn
from tests.support.waiting import eventually

if TYPE_CHECKING:
    from conftest import KeyExact


async def parked(standin: ConsulStandIn, queries: int = 1) -> None:
    """Returns once ``queries`` blocking queries wait at the stand-in for a change."""
    await eventually(lambda: standin.blocked_queries >= queries, what=f"{queries} blocking queries parked")


async def test_long_poll_wakes_on_a_change_of_its_view(
    standin: ConsulStandIn,
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    key_exact: KeyExact,
) -> None:
    index, entries = await server_client.health.service("vllm")
    assert entries == []
    assert int(index) >= 1

    poll = asyncio.create_task(server_client.health.service("vllm", index=index, wait="10s"))
    await parked(standin)
    assert not poll.done()
    assert await node1_client.agent.service.register("vllm", service_id="vllm-1", port=8000)

    new_index, entries = await asyncio.wait_for(poll, 5)
    key_exact(entries, "[]*ServiceEntry")
    assert int(new_index) > int(index)
    assert [e["Service"]["ID"] for e in entries] == ["vllm-1"]


async def test_long_poll_ends_at_wait_with_the_same_index(
    standin: ConsulStandIn, node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    assert await node1_client.agent.service.register("vllm", service_id="vllm-1", port=8000)
    index, _ = await server_client.health.service("vllm")
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Writes to other views (KV, another service) do not wake it.
    poll = asyncio.create_task(server_client.health.service("vllm", index=index, wait="300ms"))
    await parked(standin)
    assert await server_client.kv.put("unrelated", "x")
    assert await node1_client.agent.service.register("other", service_id="other-1", port=1)
    same, entries = await poll
    assert same == index
    assert len(entries) == 1
    assert loop.time() - started >= 0.3


async def test_index_from_the_future_waits_then_answers_the_current_lower_index(
    node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    assert await node1_client.agent.service.register("vllm", service_id="vllm-1", port=8000)
    index, _ = await server_client.health.service("vllm")
    future = str(int(index) + 1000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    answered, _ = await server_client.health.service("vllm", index=future, wait="200ms")
    # The client sees the index go backwards and must reset to 0, as Consul's docs say.
    assert int(answered) < int(future)
    assert answered == index
    assert loop.time() - started >= 0.2
    # An index older than the view's answers at once with the current one.
    again, _ = await asyncio.wait_for(server_client.health.service("vllm", index="1", wait="10s"), 5)
    assert again == index


async def test_index_is_never_zero(standin: ConsulStandIn, http: ClientSession) -> None:
    # A fresh store with no KV data, no such service, no sessions: still at least 1.
    for path in (
        "/v1/kv/missing",
        "/v1/kv/?recurse",
        "/v1/health/service/none",
        "/v1/catalog/service/none",
        "/v1/session/list",
        "/v1/health/state/critical",
    ):
        async with http.get(standin.url + path) as resp:
            assert resp.status in (200, 404), path
            assert int(resp.headers["X-Consul-Index"]) >= 1, path
            assert resp.headers["X-Consul-KnownLeader"] == "true"
            assert resp.headers["X-Consul-LastContact"] == "0"


async def test_bad_blocking_parameters_are_400(standin: ConsulStandIn, http: ClientSession) -> None:
    async with http.get(standin.url + "/v1/health/service/x?index=abc") as resp:
        assert (resp.status, await resp.text()) == (400, "Invalid index")
    async with http.get(standin.url + "/v1/health/service/x?index=1&wait=soon") as resp:
        assert (resp.status, await resp.text()) == (400, "Invalid wait time")


async def test_blocking_on_a_kv_key_wakes_when_it_appears(
    standin: ConsulStandIn, server_client: consul.aio.Consul
) -> None:
    index, value = await server_client.kv.get("config/router")
    assert value is None
    poll = asyncio.create_task(server_client.kv.get("config/router", index=index, wait="5s"))
    await parked(standin)
    assert await server_client.kv.put("config/router", b"v1")
    new_index, value = await asyncio.wait_for(poll, 5)
    assert int(new_index) > int(index)
    assert value is not None and value["Value"] == b"v1"


async def test_catalog_services_blocks_and_wakes(
    standin: ConsulStandIn, node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    index, services = await server_client.catalog.services()
    assert services == {}
    poll = asyncio.create_task(server_client.catalog.services(index=index, wait="5s"))
    await parked(standin)
    assert await node1_client.agent.service.register("vllm", service_id="v", port=1, tags=["t"])
    new_index, services = await asyncio.wait_for(poll, 5)
    assert int(new_index) > int(index)
    assert services == {"vllm": ["t"]}


async def test_sync_client_blocking_query(
    standin: ConsulStandIn, sync_client: consul.Consul, node1_client: consul.aio.Consul
) -> None:
    """py-consul's blocking (requests) client, as a thread in a sync program would use it."""
    index, _ = await asyncio.to_thread(sync_client.health.service, "vllm")
    poll = asyncio.create_task(asyncio.to_thread(sync_client.health.service, "vllm", index=index, wait="5s"))
    await parked(standin)
    assert await node1_client.agent.service.register("vllm", service_id="v", port=1)
    new_index, entries = await asyncio.wait_for(poll, 5)
    assert int(new_index) > int(index)
    assert len(entries) == 1


async def test_output_only_changes_do_not_wake_pollers_at_once(
    node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    """A check whose status stays the same but whose output changes reaches the
    catalog only every check_update_interval, so pollers are not woken each run."""
    assert await node1_client.agent.service.register(
        "api", service_id="api-1", port=1, check=consul.Check.ttl("1h")
    )
    assert await node1_client.agent.check.ttl_pass("service:api-1", notes="first")
    index, _ = await server_client.health.service("api")
    assert await node1_client.agent.check.ttl_pass("service:api-1", notes="second")
    same, entries = await server_client.health.service("api", index=index, wait="100ms")
    assert same == index
    assert entries[0]["Checks"][1]["Output"] == "first"
    # The agent's own view has it at once.
    assert (await node1_client.agent.checks())["service:api-1"]["Output"] == "second"
    # After check_update_interval (0.5 s in test settings) the catalog catches up.
    later, entries = await server_client.health.service("api", index=index, wait="3s")
    assert int(later) > int(index)
    assert entries[0]["Checks"][1]["Output"] == "second"
