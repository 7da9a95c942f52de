"""Services registered on a node's agent, with checks that really run, read back
through the health and catalog endpoints as llmgw's router reads a real Consul."""

from __future__ import annotations

from typing import TYPE_CHECKING

import consul
import consul.aio
import consul.exceptions
import pytest
from aiohttp import ClientSession

from llmgw.devcluster.consul import ConsulStandIn

if TYPE_CHECKING:
    from conftest import Eventually, HealthEndpoint, KeyExact


async def register_vllm(
    agent: consul.aio.Consul, endpoint: HealthEndpoint, *, sid: str = "vllm-1", **check: object
) -> None:
    http_check = consul.Check.http(endpoint.url, "50ms", timeout=str(check.pop("timeout", "1s")))
    http_check.update(check)
    ok = await agent.agent.service.register(
        "vllm",
        service_id=sid,
        address="127.0.0.1",
        port=endpoint.port,
        tags=["llama-8b", "primary"],
        meta={"model": "llama-8b", "engine": "vllm"},
        check=http_check,
    )
    assert ok is True


async def passing_ids(client: consul.aio.Consul, name: str = "vllm") -> list[str]:
    _, entries = await client.health.service(name, passing=True)
    return [e["Service"]["ID"] for e in entries]


async def check_of(client: consul.aio.Consul, check_id: str, name: str = "vllm") -> dict[str, object]:
    _, entries = await client.health.service(name)
    for entry in entries:
        for chk in entry["Checks"]:
            if chk["CheckID"] == check_id:
                return dict(chk)
    raise AssertionError(f"no check {check_id}")


async def test_http_check_follows_a_real_endpoint(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
    key_exact: KeyExact,
) -> None:
    await register_vllm(node1_client, health_endpoint)

    # Consul starts a check critical until its first run says otherwise.
    _, entries = await server_client.health.service("vllm")
    key_exact(entries, "[]*ServiceEntry")
    assert [c["Status"] for c in entries[0]["Checks"] if c["CheckID"] == "service:vllm-1"] in (
        ["critical"],
        ["passing"],
    )

    async def passing() -> bool:
        return await passing_ids(server_client) == ["vllm-1"]

    await eventually(passing)
    _, entries = await server_client.health.service("vllm", passing=True)
    key_exact(entries, "[]*ServiceEntry")
    entry = entries[0]
    assert entry["Node"]["Node"] == "node-1"
    assert entry["Node"]["Address"] == "127.0.0.1"
    assert entry["Service"]["Port"] == health_endpoint.port
    assert entry["Service"]["Meta"] == {"model": "llama-8b", "engine": "vllm"}
    assert {c["CheckID"] for c in entry["Checks"]} == {"serfHealth", "service:vllm-1"}
    check = next(c for c in entry["Checks"] if c["CheckID"] == "service:vllm-1")
    assert check["Name"] == "Service 'vllm' check"
    assert check["Type"] == "http"
    assert check["ServiceTags"] == ["llama-8b", "primary"]
    assert check["Output"] == f"HTTP GET {health_endpoint.url}: 200 OK Output: status 200"
    assert check["Definition"] == {"HTTP": health_endpoint.url, "Interval": "50ms", "Timeout": "1s"}
    assert health_endpoint.seen_headers[-1]["User-Agent"] == "Consul Health Check"

    health_endpoint.status = 500

    async def gone() -> bool:
        return await passing_ids(server_client) == []

    await eventually(gone)
    check = await check_of(server_client, "service:vllm-1")
    assert check["Status"] == "critical"
    assert check["Output"] == f"HTTP GET {health_endpoint.url}: 500 Internal Server Error Output: status 500"

    health_endpoint.status = 200
    await eventually(passing)


async def test_status_429_is_warning_and_not_passing(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    health_endpoint.status = 429
    await register_vllm(node1_client, health_endpoint)

    async def warning() -> bool:
        return (await check_of(server_client, "service:vllm-1"))["Status"] == "warning"

    await eventually(warning)
    assert await passing_ids(server_client) == []


async def test_failures_before_critical_counts_consecutive_failures(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    await register_vllm(node1_client, health_endpoint, FailuresBeforeCritical=3, FailuresBeforeWarning=1)

    async def status_is(wanted: str) -> bool:
        return (await check_of(server_client, "service:vllm-1"))["Status"] == wanted

    await eventually(lambda: status_is("passing"))
    health_endpoint.status = 503
    probes_at_flip = health_endpoint.probes
    seen: list[str] = []

    async def critical() -> bool:
        status = str((await check_of(server_client, "service:vllm-1"))["Status"])
        if not seen or seen[-1] != status:
            seen.append(status)
        return status == "critical"

    await eventually(critical)
    # One failure is a warning; only the third in a row is critical.
    assert seen[0] in ("passing", "warning")
    assert "warning" in seen
    assert health_endpoint.probes - probes_at_flip >= 3


async def test_check_timeout_and_slow_node_fault(
    standin: ConsulStandIn,
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    await register_vllm(node1_client, health_endpoint, timeout="200ms")

    async def passing() -> bool:
        return await passing_ids(server_client) == ["vllm-1"]

    await eventually(passing)
    standin.slow_node_checks("node-1", 0.5)

    async def timed_out() -> bool:
        check = await check_of(server_client, "service:vllm-1")
        return check["Status"] == "critical" and "Client.Timeout exceeded" in str(check["Output"])

    await eventually(timed_out)
    standin.slow_node_checks("node-1", 0)
    await eventually(passing)


async def test_endpoint_that_answers_too_slowly_is_critical(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    health_endpoint.delay = 0.3
    await register_vllm(node1_client, health_endpoint, timeout="100ms")

    async def timed_out() -> bool:
        check = await check_of(server_client, "service:vllm-1")
        return check["Status"] == "critical" and "context deadline exceeded" in str(check["Output"])

    await eventually(timed_out)


async def test_failed_node_drops_its_services_and_recovers(
    standin: ConsulStandIn,
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
    key_exact: KeyExact,
) -> None:
    await register_vllm(node1_client, health_endpoint)

    async def passing() -> bool:
        return await passing_ids(server_client) == ["vllm-1"]

    await eventually(passing)
    standin.fail_node("node-1")

    assert await passing_ids(server_client) == []
    serf = await check_of(server_client, "serfHealth")
    assert serf["Status"] == "critical"
    assert serf["Output"] == "Agent not live or unreachable"
    # As in Consul, the servers keep the service check's last known status.
    assert (await check_of(server_client, "service:vllm-1"))["Status"] == "passing"
    _, critical = await server_client.health.state("critical")
    key_exact(critical, "HealthChecks")
    assert {(c["Node"], c["CheckID"]) for c in critical} == {("node-1", "serfHealth")}

    standin.recover_node("node-1")
    await eventually(passing)


async def test_ttl_check(
    node1_client: consul.aio.Consul, server_client: consul.aio.Consul, eventually: Eventually
) -> None:
    ok = await node1_client.agent.service.register(
        "router", service_id="router-1", port=8080, check=consul.Check.ttl("300ms")
    )
    assert ok is True
    assert (await check_of(server_client, "service:router-1", "router"))["Status"] == "critical"

    assert await node1_client.agent.check.ttl_pass("service:router-1", notes="all good") is True
    check = await check_of(server_client, "service:router-1", "router")
    assert (check["Status"], check["Output"], check["Type"]) == ("passing", "all good", "ttl")

    async def expired() -> bool:
        check = await check_of(server_client, "service:router-1", "router")
        return check["Status"] == "critical" and str(check["Output"]).startswith("TTL expired")

    await eventually(expired)
    assert await node1_client.agent.check.ttl_warn("service:router-1") is True
    assert (await check_of(server_client, "service:router-1", "router"))["Status"] == "warning"
    # Unknown check: Consul answers 404, which py-consul reads as False.
    assert await node1_client.agent.check.ttl_fail("service:nope") is False


async def test_maintenance_makes_a_service_critical(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    await register_vllm(node1_client, health_endpoint)

    async def passing() -> bool:
        return await passing_ids(server_client) == ["vllm-1"]

    await eventually(passing)
    assert await node1_client.agent.service.maintenance("vllm-1", True, reason="draining") is True
    assert await passing_ids(server_client) == []
    maint = await check_of(server_client, "_service_maintenance:vllm-1")
    assert (maint["Status"], maint["Notes"]) == ("critical", "draining")
    assert maint["Name"] == "Service Maintenance Mode"

    assert await node1_client.agent.service.maintenance("vllm-1", False) is True
    await eventually(passing)
    assert await node1_client.agent.service.maintenance("nope", True) is False  # 404


async def test_agent_views_and_catalog_are_key_exact(
    standin: ConsulStandIn,
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    key_exact: KeyExact,
) -> None:
    await register_vllm(node1_client, health_endpoint)

    services = await node1_client.agent.services()
    key_exact(services, "map[string]*AgentService")
    assert list(services) == ["vllm-1"]
    assert services["vllm-1"]["Service"] == "vllm"
    checks = await node1_client.agent.checks()
    key_exact(checks, "map[string]*AgentCheck")
    assert list(checks) == ["service:vllm-1"]  # serfHealth is the servers', not the agent's
    # Each agent knows only its own node's services.
    assert await server_client.agent.services() == {}

    _, names = await server_client.catalog.services()
    assert names == {"vllm": ["llama-8b", "primary"]}
    _, instances = await server_client.catalog.service("vllm")
    key_exact(instances, "[]*CatalogService")
    assert (instances[0]["Node"], instances[0]["ServiceID"], instances[0]["ServiceMeta"]["model"]) == (
        "node-1",
        "vllm-1",
        "llama-8b",
    )
    _, nodes = await server_client.catalog.nodes()
    key_exact(nodes, "[]*Node")
    assert [n["Node"] for n in nodes] == sorted(["consul-server-1", "node-1", "node-2"])
    _, checks_of_service = await server_client.health.checks("vllm")
    key_exact(checks_of_service, "HealthChecks")
    assert [c["CheckID"] for c in checks_of_service] == ["service:vllm-1"]
    me = await node1_client.agent.self()
    assert (me["Config"]["NodeName"], me["Config"]["Datacenter"], me["Member"]["Addr"]) == (
        "node-1",
        "dc1",
        "127.0.0.1",
    )
    assert await server_client.status.leader() == f"{standin.settings.server_address}:8300"


async def test_nomad_style_registration_service_then_check(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    """Nomad registers the service bare, then each check with its ServiceID."""
    assert await node1_client.agent.service.register(
        "vllm", service_id="_nomad-task-a1-vllm-vllm-http", address="127.0.0.1", port=health_endpoint.port
    )
    assert await node1_client.agent.check.register(
        "vllm ready",
        check=consul.Check.http(health_endpoint.url, "50ms", timeout="1s"),
        check_id="_nomad-check-abc",
        service_id="_nomad-task-a1-vllm-vllm-http",
    )

    async def passing() -> bool:
        return await passing_ids(server_client) == ["_nomad-task-a1-vllm-vllm-http"]

    await eventually(passing)
    check = await check_of(server_client, "_nomad-check-abc")
    assert (check["Name"], check["ServiceID"], check["ServiceName"]) == (
        "vllm ready",
        "_nomad-task-a1-vllm-vllm-http",
        "vllm",
    )
    assert await node1_client.agent.check.deregister("_nomad-check-abc") is True
    assert await node1_client.agent.service.deregister("_nomad-task-a1-vllm-vllm-http") is True
    _, entries = await server_client.health.service("vllm")
    assert entries == []
    assert await node1_client.agent.service.deregister("_nomad-task-a1-vllm-vllm-http") is False  # 404


async def test_reregistering_the_same_service_writes_nothing(
    standin: ConsulStandIn, node1_client: consul.aio.Consul, server_client: consul.aio.Consul
) -> None:
    async def register() -> None:
        assert await node1_client.agent.service.register(
            "api", service_id="api-1", port=80, tags=["a"], check=consul.Check.ttl("1h")
        )

    await register()
    first, _ = await server_client.health.service("api")
    await register()
    again, _ = await server_client.health.service("api")
    assert again == first
    assert await node1_client.agent.service.register("api", service_id="api-1", port=81, tags=["a"])
    changed, entries = await server_client.health.service("api")
    assert int(changed) > int(first)
    assert entries[0]["Service"]["Port"] == 81
    # Without replace-existing-checks the TTL check registered earlier stays.
    assert [c["CheckID"] for c in entries[0]["Checks"]] == ["serfHealth", "service:api-1"]
    assert await node1_client.agent.service.register(
        "api", service_id="api-1", port=81, tags=["a"], replace_existing_checks=True
    )
    _, entries = await server_client.health.service("api")
    assert [c["CheckID"] for c in entries[0]["Checks"]] == ["serfHealth"]


async def test_tag_and_filter_selection(
    node1_client: consul.aio.Consul, server_client: consul.aio.Consul, key_exact: KeyExact
) -> None:
    for sid, tags, model in (("a", ["x", "y"], "m1"), ("b", ["x"], "m2")):
        assert await node1_client.agent.service.register(
            "engine", service_id=sid, port=1, tags=tags, meta={"model": model}
        )

    async def ids(**kw: object) -> list[str]:
        _, entries = await server_client.health.service("engine", **kw)
        key_exact(entries, "[]*ServiceEntry")
        return [e["Service"]["ID"] for e in entries]

    assert await ids() == ["a", "b"]
    assert await ids(tag="x") == ["a", "b"]
    assert await ids(tag=["x", "y"]) == ["a"]
    assert await ids(near="_agent") == ["a", "b"]
    _, catalog = await server_client.catalog.service("engine", tag="y")
    assert [c["ServiceID"] for c in catalog] == ["a"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/health/service/engine",
        "/v1/health/checks/engine",
        "/v1/health/state/any",
        "/v1/health/node/node-1",
        "/v1/catalog/service/engine",
        "/v1/catalog/nodes",
        "/v1/agent/services",
        "/v1/agent/checks",
    ],
)
async def test_a_filter_expression_is_refused_as_consul_refuses_one_it_cannot_compile(
    standin: ConsulStandIn, server_client: consul.aio.Consul, http: ClientSession, path: str
) -> None:
    # The stand-in evaluates no ?filter=: it answers as Consul answers a filter its
    # go-bexpr cannot compile (500, plain text, bexpr's prefix), at once even on a
    # blocking read, instead of returning the unfiltered list.
    url = standin.agent_url("node-1") + path
    params = {"filter": 'Service.Meta.model == "m1"', "index": "999999", "wait": "30s"}
    async with http.get(url, params=params) as resp:
        body = await resp.text()
        assert resp.status == 500, body
        assert resp.content_type == "text/plain"
    assert body.startswith("Failed to create boolean expression evaluator: ")
    assert "leave out ?filter=" in body
    # py-consul surfaces it as the ConsulException it raises for a 500.
    with pytest.raises(consul.ConsulException, match="Failed to create boolean expression evaluator"):
        await server_client.health.service("engine", filter_expr='Service.Meta.model == "m1"')


async def test_critical_service_is_deregistered_after_its_timeout(
    node1_client: consul.aio.Consul,
    server_client: consul.aio.Consul,
    health_endpoint: HealthEndpoint,
    eventually: Eventually,
) -> None:
    health_endpoint.status = 500
    await register_vllm(node1_client, health_endpoint, DeregisterCriticalServiceAfter="150ms")

    async def reaped() -> bool:
        _, entries = await server_client.health.service("vllm")
        return entries == [] and await node1_client.agent.services() == {}

    await eventually(reaped)


async def test_registration_errors_read_like_consul(standin: ConsulStandIn, http: ClientSession) -> None:
    url = standin.agent_url("node-1") + "/v1/agent/service/register"
    async with http.put(url, json={"ID": "x"}) as resp:
        assert (resp.status, await resp.text()) == (400, "Missing service name")
    async with http.put(url, json={"Name": "x", "Check": {"HTTP": "http://127.0.0.1:1/"}}) as resp:
        assert resp.status == 400
        assert "Interval must be > 0" in await resp.text()
    async with http.put(url, json={"Name": "x", "Port": "80"}) as resp:
        assert resp.status == 400
        assert (await resp.text()).startswith("Request decode failed")
    # Snake-case keys and any letter case are read as Consul reads them; unknown keys are dropped.
    tagged = {"lan": {"address": "10.0.0.1", "port": 80}}
    body = {"name": "x", "port": 80, "tagged_addresses": tagged, "Bogus": 1}
    async with http.put(url, json=body) as resp:
        assert resp.status == 200
    async with http.get(standin.agent_url("node-1") + "/v1/agent/services") as resp:
        assert (await resp.json())["x"]["TaggedAddresses"] == {"lan": {"Address": "10.0.0.1", "Port": 80}}
