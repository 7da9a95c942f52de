"""Every rule of every ``ops/acl`` policy file is needed: without it, what its component does fails.

Each component of llmgw runs with a token of exactly its policy file (``DevCluster``
issues them; ``llmgw dev`` and the e2e harness use them). Here each component does what
it does on a cluster, through llmgw's own clients and stores, against stand-ins
enforcing the file: once with the files as they are (nothing is refused), and once per
rule with that one rule taken out of its file (the rules are read from the files:
``tests/support/acl_rules.py``). Without the rule the work fails as it would against
real Nomad and Consul: a 403 from the server, or a read Consul answered without what was
written (its silent ACL filter); and the stand-in recorded the refusal of that component.

The components, by the files they read: the control plane (``nomad-control-plane``,
``consul-control-plane``), a router (``nomad-router``, ``consul-router``), the CI
pipeline's ``llmgw render --plan`` (``nomad-ci``), ``llmgw status``
(``consul-status``), the Nomad agents registering the services of llmgw's jobs
(``consul-nomad-agent``, which also reads the ranks for a client that sets ``template {
use_client_consul_token = true }``), and an engine task's rendezvous template reading the ranks of
its replica with the token its workload identity logs in to (``consul-engine-tasks``).
A cluster starts in milliseconds, so each case has its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.adapters.consul import ConsulClient
from llmgw.adapters.consul.api_keys import ApiKeyStore
from llmgw.adapters.consul.catalog import CatalogStore
from llmgw.adapters.consul.demand import DemandPublisher
from llmgw.adapters.consul.draining import DrainingMarks
from llmgw.adapters.consul.election import LeaderElection
from llmgw.adapters.consul.responses import ResponseKV
from llmgw.adapters.consul.status import StatusPublisher
from llmgw.adapters.consul.unavailable import UnavailableStore
from llmgw.adapters.nomad import NomadClient
from llmgw.bundled import read_security_policy
from llmgw.cli.serving import publish_catalog
from llmgw.core import conventions as c
from llmgw.core.catalog import catalog_digest, load_catalog
from llmgw.core.records import DemandReport, DrainMark, ModelUse, UnavailableModels
from llmgw.devcluster.acl import ops_policies
from llmgw.devcluster.acl.identity import sign_identity
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import StandInConfig
from llmgw.devcluster.nomad.config import GPU_NODE_DOCKER, real_gpu_nodes
from llmgw.render import Renderer, RenderSettings, ReplicaRequest
from llmgw.settings import ConsulConnection, NomadConnection
from tests.support.acl_rules import Rule, rules_of, without
from tests.support.waiting import eventually

CATALOG = """
models:
  vllm-cached:
    roles: [chat]
    profiles:
      - engine: vllm
        source: meta-llama/Llama-3.1-8B-Instruct
        gpu: {model: H100, memory_gb: 80}
"""

Work = Callable[[DevCluster], Awaitable[None]]


def _consul(dev: DevCluster, who: str) -> ConsulClient:
    return ConsulClient(
        ConsulConnection.from_env(
            {"CONSUL_HTTP_ADDR": dev.consul_addr, "CONSUL_HTTP_TOKEN": dev.consul_tokens[who]}
        )
    )


def _operator_consul(dev: DevCluster) -> ConsulClient:
    return ConsulClient(
        ConsulConnection.from_env(
            {"CONSUL_HTTP_ADDR": dev.consul_addr, "CONSUL_HTTP_TOKEN": dev.consul_token}
        )
    )


def _nomad(dev: DevCluster, who: str) -> NomadClient:
    return NomadClient(NomadConnection(address=dev.nomad_addr, token=dev.nomad_tokens[who]))


def _cached_vllm_job() -> tuple[str, str]:
    """The job id and HCL llmgw renders for a vLLM replica with the model cache (a
    read-write host volume, ``llmgw-models``)."""
    catalog = load_catalog(CATALOG, filename="acl.yaml", policy=read_security_policy()).catalog
    assert catalog is not None
    renderer = Renderer(RenderSettings(mirror_url="http://127.0.0.1:9"), read_security_policy())
    rendered = renderer.render(
        catalog, ReplicaRequest("vllm-cached", 0, "0", None), catalog_hash=catalog_digest(catalog)
    )
    assert 'source    = "llmgw-models"' in rendered.hcl or '"llmgw-models"' in rendered.hcl, rendered.hcl
    return rendered.job_id, rendered.hcl


async def _register_instance(dev: DevCluster, service: str, service_id: str) -> None:
    """An instance of ``service`` on the node's agent, as a Nomad client registers an
    allocation's service block (with the agents' token)."""
    async with _consul(dev, "nomad-agent") as agent:
        await agent.agent_service_register({"ID": service_id, "Name": service, "Port": 9, "Tags": ["t"]})


async def _ids(client: ConsulClient, service: str) -> set[str]:
    entries, _ = await client.health_service(service)
    return {str(e["Service"]["ID"]) for e in entries if isinstance(e, dict)}


# --- the components' work ----------------------------------------------------------------


async def control_plane(dev: DevCluster) -> None:
    """A placement and a stop as ``control/executing.py`` makes them, what observing reads,
    the catalog and status it writes, the engines' health and the leader lock."""
    job_id, hcl = _cached_vllm_job()
    async with _nomad(dev, "control-plane") as nomad:
        nodes = await nomad.nodes()
        assert nodes.items and await nomad.node(str(nodes.items[0]["ID"])) is not None
        await nomad.jobs()
        job = await nomad.parse_hcl(hcl)
        assert (await nomad.plan(job)).feasible
        await nomad.put_variable(f"nomad/jobs/{job_id}", {"engine_key": "k"})
        await nomad.register(job)
        assert await nomad.job(job_id) is not None
        await nomad.job_allocations(job_id)
        await nomad.deregister(job_id, purge=True)
        await nomad.delete_variable(f"nomad/jobs/{job_id}")
    await _register_instance(dev, c.ENGINE_SERVICE, "engine-1")
    async with _consul(dev, "control-plane") as consul:
        assert await publish_catalog(consul, CATALOG, applied_by="test") is not None
        await StatusPublisher(consul).publish('{"models": []}')
        assert "engine-1" in await _ids(consul, c.ENGINE_SERVICE), (
            "the engine's health read came back without it"
        )
        await _lead(dev, consul)


async def _lead(dev: DevCluster, consul: ConsulClient) -> None:
    """Take the leader lock (its session, its TTL check on the agent), or fail once the
    stand-in refused the control plane something on the way."""
    election = LeaderElection(consul, "cp-1")
    await election.start()
    try:
        await eventually(lambda: election.term is not None or _denials_of(dev, "control-plane"), within=30)
        assert election.term is not None, f"never led: {_denials_of(dev, 'control-plane')}"
    finally:
        await election.stop()


async def router(dev: DevCluster) -> None:
    """What a router reads and writes (``cli/serving.py`` RouterDeps): allocations and
    nodes from Nomad; endpoints, catalog, drain marks, unavailable models, API keys from
    Consul; its demand report and stored responses written."""
    await _register_instance(dev, c.ENGINE_SERVICE, "engine-1")
    async with _operator_consul(dev) as operator:  # what the control plane wrote before
        await publish_catalog(operator, CATALOG, applied_by="test")
        await DrainingMarks(operator).set(DrainMark(job_id="llmgw-x-0", model="x", since=1.0, reason="r"))
        await UnavailableStore(operator).publish(
            UnavailableModels(catalog_sha256="", published_at=1.0, models=())
        )
        issued = await ApiKeyStore(operator).create(name="k")
    async with _nomad(dev, "router") as nomad:
        await nomad.allocations()
        await nomad.nodes()
    async with _consul(dev, "router") as consul:
        assert "engine-1" in await _ids(consul, c.ENGINE_SERVICE), "the endpoints read came back without it"
        assert await CatalogStore(consul).current() is not None, "no catalog"
        assert "llmgw-x-0" in await DrainingMarks(consul).list(), "no drain mark"
        assert await UnavailableStore(consul).read() is not None, "no unavailable document"
        assert issued.record.key_id in await ApiKeyStore(consul).list(), "no API key"
        model = ModelUse(model="x", last_used=1.0, in_flight=0, queued=0, wake=False)
        await DemandPublisher(consul, "r1").publish(
            DemandReport(router_id="r1", sent_at=1.0, models=(model,))
        )
        await ResponseKV(consul).put("resp_1", b"{}")
        assert await ResponseKV(consul).get("resp_1") == b"{}"


async def ci(dev: DevCluster) -> None:
    """``llmgw render --plan``: Nomad parses and plans every rendered job."""
    _, hcl = _cached_vllm_job()
    async with _nomad(dev, "ci") as nomad:
        assert (await nomad.plan(await nomad.parse_hcl(hcl))).feasible


async def status(dev: DevCluster) -> None:
    """``llmgw status`` reads what the leader published."""
    async with _operator_consul(dev) as operator:
        await StatusPublisher(operator).publish('{"models": []}')
    async with _consul(dev, "status") as consul:
        assert await StatusPublisher(consul).read() is not None, "no status"


async def nomad_agent(dev: DevCluster) -> None:
    """A Nomad client registers the service blocks of llmgw's jobs: every replica's
    engine and ranks, and the llmgw job's router and control-plane metrics; on a client
    with ``template { use_client_consul_token = true }``, a worker rank's template reads
    its replica's ranks with the same token."""
    for service in (c.ENGINE_SERVICE, c.RANK_SERVICE, c.ROUTER_SERVICE, c.CONTROL_METRICS_SERVICE):
        await _register_instance(dev, service, f"{service}-1")
    async with _consul(dev, "nomad-agent") as agent:
        assert f"{c.RANK_SERVICE}-1" in await _ids(agent, c.RANK_SERVICE), "the ranks read came back empty"


async def engine_task(dev: DevCluster) -> None:
    """A worker rank's template reads its replica's ranks with the Consul token its
    workload identity logs in to (``nomad-workloads``, the role ``nomad-default-tasks``)."""
    await _register_instance(dev, c.RANK_SERVICE, "rank-0")
    claims = {
        "nomad_namespace": "default",
        "nomad_job_id": "llmgw-x-0",
        "nomad_allocation_id": "a1",
        "nomad_task": "engine",
        "aud": ["consul.io"],
    }
    bearer = sign_identity(claims, dev.identity_signing_key)
    async with aiohttp.ClientSession() as session:
        login = {"AuthMethod": "nomad-workloads", "BearerToken": bearer}
        async with session.put(f"{dev.consul_addr}/v1/acl/login", json=login) as resp:
            assert resp.status == 200, await resp.text()
            secret = str((await resp.json())["SecretID"])
    task = ConsulConnection.from_env({"CONSUL_HTTP_ADDR": dev.consul_addr, "CONSUL_HTTP_TOKEN": secret})
    async with ConsulClient(task) as consul:
        assert "rank-0" in await _ids(consul, c.RANK_SERVICE), "the ranks read came back without rank 0"


# Which component reads which file, under which token name in the stand-ins' records.
WORK: dict[str, tuple[Work, str]] = {
    "nomad-control-plane": (control_plane, "control-plane"),
    "consul-control-plane": (control_plane, "control-plane"),
    "nomad-router": (router, "router"),
    "consul-router": (router, "router"),
    "nomad-ci": (ci, "ci"),
    "consul-status": (status, "status"),
    "consul-nomad-agent": (nomad_agent, "nomad-agent"),
    "consul-engine-tasks": (engine_task, "task llmgw-x-0/engine"),  # a task token: its job and task
}
POLICIES = ops_policies()
RULES = [rule for name, text in POLICIES.items() for rule in rules_of(name, text)]


def test_every_policy_file_belongs_to_a_component_here() -> None:
    assert set(POLICIES) == set(WORK), "a policy file no component here reads (or the reverse)"
    assert len(RULES) > len(POLICIES)


@contextlib.asynccontextmanager
async def _cluster(tmp_path: Path, policies: dict[str, str]) -> Any:
    config = DevClusterConfig(
        nomad=StandInConfig(nodes=real_gpu_nodes(1, docker=GPU_NODE_DOCKER), strict=True),
        consul=ConsulSettings.for_tests(),
        state_dir=tmp_path / "nomad",
        acl_policies=policies,
    )
    async with DevCluster(config) as dev:
        yield dev


def _denials_of(dev: DevCluster, who: str) -> list[str]:
    assert dev.nomad is not None
    records = [*dev.nomad.tokens.denials, *dev.consul.state.tokens.denials]
    return [f"{d.request}: lacked {d.lacked}" for d in records if d.who == who]


@pytest.mark.parametrize("policy", sorted(WORK))
async def test_each_component_does_its_work_with_its_policy_file_as_it_is(
    tmp_path: Path, policy: str
) -> None:
    work, who = WORK[policy]
    async with _cluster(tmp_path, dict(POLICIES)) as dev:
        await work(dev)
        assert _denials_of(dev, who) == []


@pytest.mark.parametrize("rule", RULES, ids=str)
async def test_without_any_one_rule_its_component_fails(tmp_path: Path, rule: Rule) -> None:
    work, who = WORK[rule.policy]
    policies = {**POLICIES, rule.policy: without(POLICIES[rule.policy], rule)}
    async with _cluster(tmp_path, policies) as dev:
        failure: BaseException | None = None
        try:
            await work(dev)
        except Exception as exc:  # a 403 from llmgw's client, or a read without what was written
            failure = exc
        assert failure is not None, f"{rule}: the work succeeded without the rule"
        denials = await eventually(lambda: _denials_of(dev, who), within=5, what=f"a refusal of {who}")
        assert denials, (rule, failure)
