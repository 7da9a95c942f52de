"""Jobs rendered from templates/ for the example catalog, on the Nomad and Consul stand-ins.

Driven only through the clients llmgw uses against real clusters: llmgw's own
Nomad client to submit, python-nomad and py-consul to look.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import consul.aio
import nomad

from llmgw.adapters.nomad import NomadClient
from llmgw.apispec import check_document
from llmgw.core.catalog import Catalog, catalog_digest
from llmgw.core.conventions import ENGINE_SERVICE
from llmgw.devcluster.cluster import DevCluster
from llmgw.render import Renderer, ReplicaRequest
from llmgw.settings import NomadConnection
from tests.support.waiting import eventually

TWO_NODE_SIM = ("llama-3.1-405b", 1)


def _python_nomad(dev: DevCluster) -> nomad.Nomad:
    address = urlsplit(dev.nomad_addr)
    return nomad.Nomad(host=address.hostname, port=address.port, timeout=10, token=dev.nomad_token)


def _py_consul(dev: DevCluster) -> consul.aio.Consul:
    address = urlsplit(dev.consul_addr)
    return consul.aio.Consul(host=address.hostname, port=address.port, token=dev.consul_token)


async def test_every_example_profile_parses_and_registers_and_real_engines_say_why_they_cannot_run(
    dev: DevCluster, example_catalog: Catalog, renderer: Renderer
) -> None:
    digest = catalog_digest(example_catalog)
    async with NomadClient(NomadConnection(address=dev.nomad_addr, token=dev.nomad_token)) as client:
        for name, model in example_catalog.models.items():
            for index, profile in enumerate(model.profiles):
                fabric = "fabric-a" if profile.node_count > 1 else None
                rendered = renderer.render(
                    example_catalog, ReplicaRequest(name, index, "0", fabric), catalog_hash=digest
                )
                job = await client.parse_hcl(rendered.hcl)  # the stand-in's parser, strict as Nomad's
                assert check_document(job, "Job") == [], (name, index)
                plan = await client.plan(job)
                if profile.engine.value == "sim":
                    assert plan.feasible, (name, plan.explanation)
                else:
                    # No docker on the dev cluster: refused with the reason, never a silent hang.
                    assert not plan.feasible
                    assert "missing drivers" in plan.explanation, plan.explanation


async def test_two_node_sim_replica_is_healthy_only_with_both_ranks_and_dies_whole_with_a_node(
    dev: DevCluster, example_catalog: Catalog, renderer: Renderer
) -> None:
    model, profile = TWO_NODE_SIM
    rendered = renderer.render(
        example_catalog,
        ReplicaRequest(model, profile, "0", "fabric-a"),
        catalog_hash=catalog_digest(example_catalog),
    )
    looker = _python_nomad(dev)
    registry = _py_consul(dev)
    try:
        await _run_two_node_scenario(dev, rendered, looker, registry)
    finally:
        await registry.http.close()


async def _run_two_node_scenario(dev, rendered, looker, registry) -> None:  # type: ignore[no-untyped-def]

    async def allocations() -> list[dict]:  # type: ignore[type-arg]
        return await asyncio.to_thread(looker.job.get_allocations, rendered.job_id)

    async def engine_passing() -> bool:
        # Nomad registers a service before its checks; one without its engine check is not healthy.
        _, entries = await registry.health.service(ENGINE_SERVICE, passing=True)
        return any(
            e["Service"]["Meta"].get("llmgw_job") == rendered.job_id
            and any(check["ServiceID"] and check["Status"] == "passing" for check in e["Checks"])
            for e in entries
        )

    async def healthy_with_both_ranks() -> bool:
        if not await engine_passing():
            return False
        running = [a for a in await allocations() if a["ClientStatus"] == "running"]
        # Whenever Consul says the replica is healthy, both ranks must be running.
        assert len(running) == 2, running
        return True

    async with NomadClient(NomadConnection(address=dev.nomad_addr, token=dev.nomad_token)) as client:
        await client.register(await client.parse_hcl(rendered.hcl))
    await eventually(healthy_with_both_ranks, 60, "the two-rank replica passing its check")
    placed = {a["TaskGroup"]: a["NodeID"] for a in await allocations()}
    assert len(set(placed.values())) == 2, "ranks on distinct nodes"
    # update { max_parallel = 0 }: no Nomad deployment to fail while a model loads.
    assert await asyncio.to_thread(looker.job.get_deployments, rendered.job_id) == []

    # Fail the worker's node: the whole replica goes down, not only that shard.
    worker_node = placed["rank-1"]
    assert dev.nomad is not None
    await dev.nomad.fail_node(worker_node)

    async def replica_down() -> bool:
        statuses = {a["TaskGroup"]: a["ClientStatus"] for a in await allocations()}
        return not await engine_passing() and statuses.get("rank-0") in ("failed", "complete")

    await eventually(replica_down, 30, "rank 0 failing after its worker's node died")
