"""In-process harness for end-to-end tests of the control plane on the dev stand-ins.

Everything a test needs runs in the test's event loop, as ``llmgw dev`` wires it: the
Nomad and Consul stand-ins (``DevCluster``, whose allocations are REAL sim processes),
the router (``Services(role=router)``), one or more control planes, and a load of
requests through the router. Timings come from ``llmgw dev``'s settings, shortened
only where a test would otherwise wait for nothing (drains, the leader lock).

- ``Stack``: the cluster, the router and a client of each stand-in for the test's own
  reads; ``await stack.services("cp-1")`` starts a ``Services(role=control-plane)``;
  ``await stack.instance("cp-1")`` starts a bare ``ControlPlane`` whose Nomad writes and
  drain marks are recorded in ``stack.acts`` (who acted, when, and whether anyone else
  believed it led at that instant), optionally behind a ``TcpProxy`` to Consul that
  the test can freeze (a partition: for Consul, the instance is dead).
- ``Load``: concurrent chat completions through the router, every failure kept.
- ``replicas``, ``endpoints``, ``draining``: what Nomad and Consul show now.
- ``eventually``: wait for a condition with a generous deadline (never sleep-and-assert).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from llmgw.adapters.consul import (
    CatalogStore,
    ClientSettings,
    ConsulClient,
    DrainingMarks,
    ElectionSettings,
    StatusPublisher,
    parse_endpoint,
)
from llmgw.adapters.nomad import NomadClient, Registered
from llmgw.admin import AdminSettings
from llmgw.cli.dev_run import dev_control_settings, dev_render_settings
from llmgw.cli.serving import Role, Services, ServiceSettings, publish_catalog
from llmgw.control import ControlPlane, ControlSettings, control_deps
from llmgw.control.metrics_server import MetricsListenerSettings
from llmgw.core import conventions as c
from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.core.engine_keys import EngineKeys
from llmgw.core.records import DrainMark, Endpoint
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import NodeSpec, StandInConfig
from llmgw.devcluster.partition import TcpProxy
from llmgw.devcluster.timing import real_defaults
from llmgw.gateway.app import RouterServer
from llmgw.gateway.settings import RouterSettings
from llmgw.render import Renderer
from llmgw.settings import ConsulConnection, NomadConnection
from tests.support.waiting import eventually as eventually  # the one wait-until helper, for the tests here

log = logging.getLogger("tests.e2e")
T = TypeVar("T")

# The leader lock on short clocks, so a failover takes a few seconds, not the default ~14 s
# (the dead leader's 3 s process check goes critical, then 10 s lock-delay; see
# test_after_a_leader_crash_another_leads_within_20_s_at_consuls_real_timing). Renewals every
# 0.5 s, not ttl / 2: a leader steps down unless a renewal sent within ttl - safety_margin
# (1.5 s) came back, and at 1 s apart that left 0.5 s for two round trips through a loop
# that lags more than that on a loaded machine (the term ended and began again, and a test
# that looked then saw no leader). At 0.5 s the loop may lag 1 s; failovers take no longer.
FAST_ELECTION = ElectionSettings(
    ttl=2.0,
    renew_interval=0.5,
    lock_delay=2.0,
    safety_margin=0.5,
    acquire_retry_interval=0.5,
    key_wait=2.0,
    release_timeout=2.0,
    backoff_initial=0.2,
    backoff_max=1.0,
)
# Real Consul's clocks, except that a session TTL may be as short as FAST_ELECTION's.
CONSUL = ConsulSettings(session_ttl_min=1.0)
# The connect timeout stays ClientSettings' 5 s: aiohttp times a connect on the event loop, and
# this loop runs the whole stack (stand-ins, routers, control planes, the load), which lags a
# second and more on a loaded 2-core machine. At 1 s, such a lag while a new instance (or the
# test's own client) opened its first connections failed those requests although Consul had
# accepted them. A short one detects nothing here: a frozen TcpProxy still accepts connections.
FAST_CLIENT = ClientSettings(request_timeout=5.0, blocking_slack=1.0)


def e2e_control_settings() -> ControlSettings:
    """``llmgw dev``'s control settings with short drains: without an engine in-flight probe,
    a replica of a model under load drains until ``drain_timeout`` (routers always report
    the model in flight), and a test would wait that out once per replica."""
    base = dev_control_settings()
    return replace(base, planning=replace(base.planning, drain_min=1.0, drain_timeout=4.0))


def nodes(count: int, *, gpus: int = 1) -> tuple[NodeSpec, ...]:
    return tuple(
        NodeSpec(name=f"gpu-{i}", gpus=gpus, gpu_model="H100", fabric="fabric-a") for i in range(1, count + 1)
    )


# --- what the cluster shows -------------------------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    job_id: str
    modify_index: int  # JobModifyIndex: changes when the job is registered again
    allocs: frozenset[str]  # running allocation ids
    nodes: frozenset[str]
    meta: dict[str, str]


async def replicas(nomad: NomadClient, model: str | None = None) -> dict[str, Replica]:
    """Every llmgw job (of ``model``) that Nomad runs, with its running allocations."""
    out: dict[str, Replica] = {}
    for stub in (await nomad.jobs(prefix="llmgw-")).items:
        job = await nomad.job(str(stub["ID"]))
        if job is None or job.get("Stop") or job.get("Status") == "dead":
            continue
        meta = {str(k): str(v) for k, v in (job.get("Meta") or {}).items()}
        if model is not None and meta.get(c.JOB_META_MODEL) != model:
            continue
        allocs = (await nomad.job_allocations(str(job["ID"]))).items
        running = [
            a for a in allocs if a.get("ClientStatus") == "running" and a.get("DesiredStatus") == "run"
        ]
        out[str(job["ID"])] = Replica(
            job_id=str(job["ID"]),
            modify_index=int(job["JobModifyIndex"]),
            allocs=frozenset(str(a["ID"]) for a in running),
            nodes=frozenset(str(a["NodeID"]) for a in running),
            meta=meta,
        )
    return out


async def endpoints(consul: ConsulClient) -> list[Endpoint]:
    entries, _ = await consul.health_service(c.ENGINE_SERVICE)
    return [parse_endpoint(e) for e in entries]


async def healthy_jobs(consul: ConsulClient, model: str) -> set[str]:
    """Job ids whose rank-0 engine passes."""
    return {e.replica for e in await endpoints(consul) if e.model == model and e.passing}


async def draining(consul: ConsulClient) -> dict[str, DrainMark]:
    return dict(await DrainingMarks(consul).list())


@dataclass(frozen=True)
class Sample:
    at: float  # loop time
    running: frozenset[str]  # job ids of the model with a running allocation
    healthy: frozenset[str]  # job ids whose engine passes its Consul check
    marked: frozenset[str]  # job ids with a drain mark


@dataclass
class Timeline:
    """What Nomad and Consul show of one model, sampled every ``every`` seconds: the record a
    test reads the order of a roll from (first seen healthy, first seen marked...)."""

    nomad: NomadClient
    consul: ConsulClient
    model: str
    every: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                # Consul first: a replica seen marked here was marked before Nomad was read.
                healthy = await healthy_jobs(self.consul, self.model)
                marked = set(await draining(self.consul))
                running = {j for j, r in (await replicas(self.nomad, self.model)).items() if r.allocs}
                self.samples.append(
                    Sample(loop.time(), frozenset(running), frozenset(healthy), frozenset(marked & running))
                )
            await asyncio.sleep(self.every)  # a sampler: what the cluster shows, every ``every`` s

    def first(self, job_id: str, where: str) -> float | None:
        """When ``job_id`` was first seen in ``where`` (running, healthy or marked)."""
        return next((s.at for s in self.samples if job_id in getattr(s, where)), None)


# --- the load ------------------------------------------------------------------------------------------


class ClientPool:
    """``concurrency`` client tasks over one session, started and stopped together; a
    load names what each client does in ``_client``."""

    concurrency: int
    _tasks: list[asyncio.Task[None]]
    _session: aiohttp.ClientSession | None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.concurrency)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    async def _client(self, n: int) -> None:
        raise NotImplementedError


@dataclass
class Load(ClientPool):
    """``concurrency`` clients sending chat completions to ``model`` back to back."""

    router_url: str
    model: str
    concurrency: int = 2
    max_tokens: int = 4
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    async def _client(self, n: int) -> None:
        assert self._session is not None
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"client {n}"}],
            "max_tokens": self.max_tokens,
        }
        while True:
            try:
                async with self._session.post(f"{self.router_url}/v1/chat/completions", json=body) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        self.failures.append(f"{resp.status}: {text[:300]}")
                    elif not json.loads(text).get("choices"):
                        self.failures.append(f"no choices: {text[:300]}")
                    else:
                        self.answered += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)  # a user's client pauses before it tries again

    async def wait_answers(self, more: int, within: float = 30.0) -> None:
        """Until ``more`` further requests were answered (the load really runs)."""
        target = self.answered + more
        await eventually(lambda: self.answered >= target, within, f"{more} more answers from {self.model}")


# --- who acted, and when ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Act:
    instance: str
    at: float  # loop time
    what: str  # register, deregister, mark, clear
    subject: str
    others_leading: tuple[str, ...]  # other instances that believed they led at that instant


@dataclass
class ActLog:
    planes: dict[str, ControlPlane] = field(default_factory=dict)
    acts: list[Act] = field(default_factory=list)

    def record(self, instance: str, what: str, subject: str) -> None:
        others = tuple(
            sorted(name for name, p in self.planes.items() if name != instance and p.deps.leader.is_leader)
        )
        act = Act(instance, asyncio.get_running_loop().time(), what, subject, others)
        log.info("act %s", act)
        self.acts.append(act)

    def by(self, instance: str) -> list[Act]:
        return [a for a in self.acts if a.instance == instance]

    def actors(self) -> list[str]:
        """The instances that acted, in order, each run of acts by one instance collapsed."""
        out: list[str] = []
        for act in self.acts:
            if not out or out[-1] != act.instance:
                out.append(act.instance)
        return out


class RecordingNomad:
    """The Nomad client with its writes recorded in an ``ActLog`` (reads pass through)."""

    def __init__(self, inner: NomadClient, instance: str, acts: ActLog) -> None:
        self._inner = inner
        self._instance = instance
        self._acts = acts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def register(self, job: dict[str, Any]) -> Registered:
        self._acts.record(self._instance, "register", str(job.get("ID")))
        return await self._inner.register(job)

    async def deregister(self, job_id: str, *, purge: bool = True) -> None:
        self._acts.record(self._instance, "deregister", job_id)
        await self._inner.deregister(job_id, purge=purge)


class RecordingMarks:
    def __init__(self, inner: DrainingMarks, instance: str, acts: ActLog) -> None:
        self._inner = inner
        self._instance = instance
        self._acts = acts

    async def set(self, mark: DrainMark) -> None:
        self._acts.record(self._instance, "mark", mark.job_id)
        await self._inner.set(mark)

    async def clear(self, job_id: str) -> None:
        self._acts.record(self._instance, "clear", job_id)
        await self._inner.clear(job_id)


@dataclass
class LeadershipWatch:
    """Samples every instance's own belief that it leads, every ``every`` seconds: ``overlaps``
    lists the moments two or more believed it at once (``ActLog`` checks each act exactly;
    this catches an overlap with no act in it)."""

    acts: ActLog
    every: float = 0.05
    overlaps: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    changes: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def leaders(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, p in self.acts.planes.items() if p.deps.leader.is_leader))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now, leaders = loop.time(), self.leaders()
            if len(leaders) > 1:
                self.overlaps.append((now, leaders))
            if not self.changes or self.changes[-1][1] != leaders:
                self.changes.append((now, leaders))
            await asyncio.sleep(self.every)  # a sampler: who leads, every ``every`` s


# --- the stack -------------------------------------------------------------------------------------------


@dataclass
class Instance:
    """A bare control plane (no admin API) with its own Nomad and Consul clients."""

    name: str
    plane: ControlPlane
    consul: ConsulClient
    nomad: NomadClient
    proxy: TcpProxy | None

    @property
    def leading(self) -> bool:
        return self.plane.deps.leader.is_leader

    async def stop(self) -> None:
        """Stop acting, then resign (a frozen proxy makes the release fail: Consul then frees
        the lock only when the session times out, as after a crash)."""
        await self.plane.stop()
        await self.nomad.close()
        await self.consul.close()
        if self.proxy is not None:
            await self.proxy.stop()


class Stack:
    """``async with Stack(tmp_path, policy, nodes(3)) as stack:`` cluster, router, clients."""

    def __init__(
        self,
        tmp_path: Path,
        policy: SecurityPolicy,
        node_specs: tuple[NodeSpec, ...],
        *,
        election: ElectionSettings = FAST_ELECTION,
        real_timing: bool = False,
        acl_policies: dict[str, str] | None = None,
        nomad: dict[str, Any] | None = None,
    ) -> None:
        """``real_timing``: the stand-ins on Nomad's and Consul's real default clocks
        (``llmgw.devcluster.timing.real_defaults``) instead of the short ones.
        ``acl_policies``: the components' policies instead of ops/acl's (by file name);
        ``nomad``: more of the Nomad stand-in's settings (``StandInConfig`` fields)."""
        self.tmp_path = tmp_path
        self.policy = policy
        self.election = election
        self.control_settings = e2e_control_settings()
        # Engines require their replica's key, as under llmgw dev: every e2e request exercises it.
        self.render_settings = replace(dev_render_settings(), engine_api_keys=True)
        self.engine_keys = EngineKeys(secrets.token_hex(32))
        config = DevClusterConfig(
            nomad=StandInConfig(nodes=node_specs, heartbeat_grace_s=1.0, **(nomad or {})),
            consul=CONSUL,
            state_dir=tmp_path / "nomad",
            acl_policies=acl_policies,
        )
        self.cluster = DevCluster(real_defaults(config) if real_timing else config)
        self.acts = ActLog()
        self._stack = contextlib.AsyncExitStack()
        self._instances: list[Instance] = []
        self.consul: ConsulClient
        self.nomad: NomadClient
        self.router_url = ""
        self.router: RouterServer | None = None  # the router Services started (its book, metrics)

    async def __aenter__(self) -> Stack:
        try:
            await self._stack.enter_async_context(self.cluster)
            self.consul = await self._stack.enter_async_context(self._consul_client(self.cluster.consul_addr))
            self.nomad = await self._stack.enter_async_context(NomadClient(self._nomad_connection()))
            router = await self._stack.enter_async_context(
                Services(
                    self.service_settings(
                        "router",
                        Role.ROUTER,
                        router=RouterSettings(host="127.0.0.1", port=0, no_auth=True, router_id="router-1"),
                    )
                )
            )
            assert router.router is not None
            self.router = router.router
            self.router_url = router.router.url
            self._stack.push_async_callback(self._stop_instances)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def _consul_client(self, url: str) -> ConsulClient:
        return ConsulClient(self._consul_connection(url), FAST_CLIENT)

    # The stand-ins run with ACLs on: every client sends the cluster's tokens, as llmgw dev's do.
    def _nomad_connection(self) -> NomadConnection:
        return NomadConnection(address=self.cluster.nomad_addr, token=self.cluster.nomad_token)

    def _consul_connection(self, url: str) -> ConsulConnection:
        return ConsulConnection.from_env(
            {"CONSUL_HTTP_ADDR": url, "CONSUL_HTTP_TOKEN": self.cluster.consul_token}
        )

    # Each component runs with a token of exactly its ops/acl policy, never the management
    # token (the test's own clients above keep that: they observe, they are no component).
    def component_nomad(self, who: str) -> NomadConnection:
        return NomadConnection(address=self.cluster.nomad_addr, token=self.cluster.nomad_tokens[who])

    def component_consul(self, who: str, url: str | None = None) -> ConsulConnection:
        return ConsulConnection.from_env(
            {
                "CONSUL_HTTP_ADDR": url or self.cluster.consul_addr,
                "CONSUL_HTTP_TOKEN": self.cluster.consul_tokens[who],
            }
        )

    def service_settings(self, instance_id: str, role: Role, **overrides: Any) -> ServiceSettings:
        who = "router" if role is Role.ROUTER else "control-plane"
        settings = ServiceSettings(
            role=role,
            nomad=self.component_nomad(who),
            consul=self.component_consul(who),
            policy=self.policy,
            render=self.render_settings,
            control=self.control_settings,
            admin=None,
            control_metrics=MetricsListenerSettings("127.0.0.1", 0),
            instance_id=instance_id,
            election=self.election,
            engine_keys=self.engine_keys,
        )
        return replace(settings, **overrides)

    @contextlib.asynccontextmanager
    async def services(self, instance_id: str, *, admin: bool = False) -> AsyncIterator[Services]:
        """A ``Services(role=control-plane)`` as ``llmgw serve`` runs it (with the admin API on
        a free loopback port when ``admin``)."""
        settings = self.service_settings(
            instance_id,
            Role.CONTROL_PLANE,
            admin=AdminSettings(host="127.0.0.1", port=0) if admin else None,
        )
        async with Services(settings) as running:
            yield running

    async def instance(self, name: str, *, partitionable: bool = False) -> Instance:
        """A started ``ControlPlane`` whose writes go to ``self.acts``."""
        proxy = None
        consul_url = self.cluster.consul_addr
        if partitionable:
            host, _, port = consul_url.split("://", 1)[-1].partition(":")
            proxy = TcpProxy(host, int(port))
            await proxy.start()
            consul_url = proxy.url
        consul = ConsulClient(self.component_consul("control-plane", consul_url), FAST_CLIENT)
        await consul.start()
        nomad = NomadClient(self.component_nomad("control-plane"))
        deps = control_deps(
            nomad=nomad,
            renderer=Renderer(self.render_settings, self.policy),
            consul=consul,
            instance_id=name,
            policy=self.policy,
            election=self.election,
            engine_keys=self.engine_keys,
        )
        deps = replace(
            deps,
            nomad=RecordingNomad(nomad, name, self.acts),
            drain_writer=RecordingMarks(DrainingMarks(consul), name, self.acts),
        )
        plane = ControlPlane(self.control_settings, deps)
        self.acts.planes[name] = plane
        await plane.start()
        instance = Instance(name, plane, consul, nomad, proxy)
        self._instances.append(instance)
        return instance

    async def stop_instance(self, instance: Instance) -> None:
        if instance in self._instances:
            self._instances.remove(instance)
            await instance.stop()

    async def _stop_instances(self) -> None:
        for instance in list(self._instances):
            await self.stop_instance(instance)

    async def apply(self, text: str, applied_by: str = "e2e test") -> None:
        """Apply ``text`` as the next catalog version (it must load: a test's typo fails here)."""
        loaded = load_catalog(text, filename="e2e catalog", policy=self.policy)
        assert loaded.catalog is not None, [str(d) for d in loaded.errors]
        await publish_catalog(self.consul, text, applied_by=applied_by)

    async def catalog_version(self) -> int:
        current = await CatalogStore(self.consul).current()
        return current.version if current else 0

    async def leader(self) -> str | None:
        entry, _ = await self.consul.kv_get(c.KV_LEADER)
        return entry.value.decode() if entry is not None and entry.session else None

    async def status(self) -> dict[str, Any] | None:
        document = await StatusPublisher(self.consul).read()  # stored in pieces: read it whole
        return None if document is None else dict(json.loads(document.text))


def model_status(status: dict[str, Any] | None, model: str) -> dict[str, Any] | None:
    if status is None:
        return None
    return next((m for m in status.get("models", ()) if m.get("model") == model), None)


class NotYet(str):
    """A falsy reason: what ``eventually`` shows as the last result when it gives up."""

    def __bool__(self) -> bool:
        return False


def unsettled(status: dict[str, Any] | None, *models: str) -> str:
    """Why the leader's status does not show each model with every wanted replica healthy
    and nothing else going on ("" when it does)."""
    if status is None:
        return "no status published"
    for model in models:
        st = model_status(status, model)
        if st is None:
            return f"{model}: not in the status ({status.get('note')})"
        busy = [
            f"{r['job_id']}: {r['phase']}{' draining' if r['draining'] else ''}"
            f"{' stopping' if r['stopping'] else ''}{' outdated' if r['outdated'] else ''} ({r['reason']})"
            for r in st["replicas"]
            if r["draining"] or r["stopping"] or r["outdated"] or r["phase"] != "healthy"
        ]
        if (
            st["healthy"] != st["desired"]
            or st["desired"] != len(st["replicas"])
            or st.get("waiting")
            or busy
        ):
            return f"{model}: {st['healthy']}/{st['desired']} healthy, waiting={st.get('waiting')!r}, {busy}"
    return ""


def settled(status: dict[str, Any] | None, *models: str) -> bool:
    return not unsettled(status, *models)


def wall() -> float:
    return time.monotonic()
