"""``NomadStandIn``: one object that owns the dev Nomad's state, loops, nodes and processes.

Owns: the store, event broker, scheduler and its evaluation queue (one worker, like a
single scheduler worker), the simulated client nodes (heartbeats, failure and restore; no drain or
eligibility API: see DESIGN.md), the alloc runners and every child process, and the write
operations the HTTP API calls (register, deregister, stop alloc...). ``stop()`` kills
every process it started and cancels every task it created.

Must not: parse HTTP (``http_api`` does) or import other llmgw programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import platform
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from llmgw.devcluster.acl import NomadAcl, TokenBook
from llmgw.devcluster.nomad import docker
from llmgw.devcluster.nomad.acl_api import TokenPolicies
from llmgw.devcluster.nomad.client import AllocRunner
from llmgw.devcluster.nomad.config import NodeSpec, StandInConfig
from llmgw.devcluster.nomad.consul_http import ConsulAgent, service_id
from llmgw.devcluster.nomad.deployments import DeploymentWatcher
from llmgw.devcluster.nomad.events import EventBroker
from llmgw.devcluster.nomad.jobcanon import as_registered, canonicalize, job_warnings, validate
from llmgw.devcluster.nomad.processes import ProcessTable
from llmgw.devcluster.nomad.scheduler import PlanOutcome, Scheduler, lost_after_ns, spec_key
from llmgw.devcluster.nomad.state import (
    EV_ALLOC_DESIRED,
    EV_ALLOC_UPDATED,
    EV_JOB_DEREGISTERED,
    EV_JOB_REGISTERED,
    EV_NODE_EVENT,
    EV_NODE_REGISTRATION,
    AllocRecord,
    EvalRecord,
    JobRecord,
    NodeRecord,
    Store,
    go_time,
    now_ns,
)
from llmgw.devcluster.nomad.taskenv import node_values
from llmgw.devcluster.nomad.variables import Variables

JSON = dict[str, Any]
NS = 1_000_000_000
NOMAD_VERSION = "1.10.5"  # what the stand-in reports; it mirrors the 1.x HTTP API
log = logging.getLogger(__name__)


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


def free_port(exclude: set[int]) -> int:
    """A port nothing listens on right now (the OS picks it), not already handed out."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in exclude:
            return port
    raise RuntimeError("no free port found on 127.0.0.1")


def _gpu_devices(spec: NodeSpec, node_index: int) -> list[JSON]:
    if spec.gpus <= 0:
        return []
    instances = [
        {
            "ID": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'llmgw-dev/{spec.name}/{i}')}",
            "Healthy": True,
            "HealthDescription": "",
            "Locality": {"PciBusID": f"00000000:{0x10 + i:02X}:00.0"},
        }
        for i in range(spec.gpus)
    ]
    return [
        {
            "Vendor": spec.gpu_vendor,
            "Type": "gpu",
            "Name": spec.gpu_model,
            "Instances": instances,
            "Attributes": {
                "memory": {"Int": spec.gpu_memory_mib, "Unit": "MiB"},
                "bar1": {"Int": spec.gpu_memory_mib, "Unit": "MiB"},
                "power": {"Int": 700, "Unit": "W"},
                "cores_clock": {"Int": 1980, "Unit": "MHz"},
                "memory_clock": {"Int": 2619, "Unit": "MHz"},
                "pci_bandwidth": {"Int": 32768, "Unit": "MB/s"},
                "driver_version": {"String": "550.54.15"},
                "display_state": {"String": "Disabled"},
                "persistence_mode": {"String": "Enabled"},
            },
        }
    ]


async def _call_hooks(hooks: list[Callable[[str], Awaitable[None] | None]], name: str) -> None:
    for hook in hooks:
        result = hook(name)
        if inspect.isawaitable(result):
            await result


class NomadStandIn:
    """The dev Nomad: state, scheduler, simulated clients. Start it, then serve ``http_api.create_app``."""

    def __init__(self, config: StandInConfig | None = None) -> None:
        self.config = config or StandInConfig()
        self.broker = EventBroker(self.config.event_buffer_size)
        self.store = Store(self.broker, self.config.region)
        self.procs = ProcessTable()
        # Nomad Variables and the ACL policies attached to workloads (what nomadVar reads).
        self.variables = Variables()
        # The ACL tokens: the configured one is a management token; DevCluster issues the
        # components' own (each with its ops/acl policy) through ``tokens.issue``.
        self.tokens: TokenBook[NomadAcl] = TokenBook()
        if self.config.acl_token is not None:
            self.tokens.add(self.config.acl_token, "management", NomadAcl(management=True))
        # The policies and tokens an operator makes over /v1/acl/policy and /v1/acl/token.
        self.token_policies = TokenPolicies()
        # (node id, image) of the images each node's Docker daemon has pulled (``image_pull_s``).
        self.pulled_images: set[tuple[str, str]] = set()
        self.scheduler = Scheduler(self.store, free_port, now_ns)
        self.runners: dict[str, AllocRunner] = {}
        # Per node, the terminal allocations whose directories are kept, oldest first (client GC).
        self._terminal_dirs: dict[str, dict[str, None]] = {}
        self.http_addr = "127.0.0.1:4646"  # set by the server once bound
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.TimerHandle] = []
        self._session: aiohttp.ClientSession | None = None
        self._agents: dict[str, ConsulAgent] = {}
        self._state_root: Path | None = None
        self._own_state_root = False
        self._seen_status: dict[str, str] = {}
        self._started = False
        self.deployments = DeploymentWatcher(self, self._spawn, self._create_eval)
        # Called with the node's name when a node fails / is restored (``DevCluster``
        # uses them to fail the node's Consul agent too, as a dead machine would).
        self.on_node_failed: list[Callable[[str], Awaitable[None] | None]] = []
        self.on_node_restored: list[Callable[[str], Awaitable[None] | None]] = []

    # -- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.config.state_dir is None:
            self._state_root = Path(tempfile.mkdtemp(prefix="llmgw-dev-nomad-"))
            self._own_state_root = True
        else:
            self._state_root = self.config.state_dir / "nomad"
            self._state_root.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession()
        with self.store.txn(EV_NODE_REGISTRATION):
            for i, spec in enumerate(self.config.nodes):
                self.store.touch_node(self._make_node(spec, i))
        self._spawn(self._eval_worker(), "nomad-eval-worker")

    async def stop(self) -> None:
        """Kill every process and task the stand-in started. Safe to call twice."""
        if not self._started:
            return
        self._started = False
        for timer in self._timers:
            timer.cancel()
        runners = list(self.runners.values())
        self.runners.clear()
        for runner in runners:
            await runner.crash()
        await self.procs.kill_all()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.broker.close()
        if self._session is not None:
            await self._session.close()
        if self._own_state_root and self._state_root is not None:
            shutil.rmtree(self._state_root, ignore_errors=True)

    async def __aenter__(self) -> NomadStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _later(self, delay: float, coro_fn: Any, name: str) -> None:
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(delay, lambda: self._spawn(coro_fn(), name)))

    # -- nodes ------------------------------------------------------------

    def _make_node(self, spec: NodeSpec, index: int) -> NodeRecord:
        attributes = {
            "kernel.name": "linux",
            "kernel.version": platform.release(),
            "os.name": "linux",
            "cpu.arch": "amd64",
            "cpu.numcores": "64",
            "cpu.totalcompute": str(spec.cpu_shares),
            "memory.totalbytes": str(spec.memory_mb * 1024 * 1024),
            "unique.hostname": spec.name,
            "unique.network.ip-address": "127.0.0.1",
            "nomad.version": NOMAD_VERSION,
            "nomad.advertise.address": self.http_addr,
        }
        if spec.raw_exec:
            # The dev stand-in's own addition: the interpreter that runs it, so templates
            # can start Python tasks with ${attr.driver.raw_exec.python}.
            attributes.update({"driver.raw_exec": "1", "driver.raw_exec.python": sys.executable})
        if self.config.consul_addr:
            attributes["consul.version"] = "1.20.0"
            attributes["consul.datacenter"] = spec.datacenter
        stamp = go_time(now_ns())
        drivers: dict[str, JSON] = {}
        if spec.raw_exec:
            drivers["raw_exec"] = {
                "Attributes": {"driver.raw_exec": "true"},
                "Detected": True,
                "Healthy": True,
                "HealthDescription": "Healthy",
                "UpdateTime": stamp,
            }
        if spec.exec:
            attributes["driver.exec"] = "1"
            drivers["exec"] = {
                "Attributes": {"driver.exec": "true"},
                "Detected": True,
                "Healthy": True,
                "HealthDescription": "Healthy",
                "UpdateTime": stamp,
            }
        if spec.docker is not None:
            docker_attributes, node_attributes = docker.fingerprint(spec.docker)
            attributes.update(node_attributes)
            drivers["docker"] = {
                "Attributes": docker_attributes,
                "Detected": True,
                "Healthy": True,
                "HealthDescription": "Healthy",
                "UpdateTime": stamp,
            }
        attributes.update(spec.attributes)
        meta = dict(spec.meta)
        if spec.fabric:
            meta["llmgw_fabric"] = spec.fabric
        return NodeRecord(
            spec=spec,
            id=str(uuid.uuid4()),
            attributes=attributes,
            meta=meta,
            devices=_gpu_devices(spec, index),
            drivers=drivers,
            http_addr=self.http_addr,
            status="ready",
            status_updated_at=now_ns() // NS,
            events=[
                {
                    "Message": "Node registered",
                    "Subsystem": "Cluster",
                    "Details": None,
                    "Timestamp": stamp,
                    "CreateIndex": 0,
                }
            ],
        )

    def node_by_name_or_id(self, ref: str) -> NodeRecord:
        for node in self.store.nodes.values():
            if ref in (node.id, node.spec.name):
                return node
        matches = [n for n in self.store.nodes.values() if n.id.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        raise NotFound(f"node not found: {ref}")

    def node_values(self, node_id: str) -> dict[str, str]:
        node = self.store.nodes[node_id]
        return node_values(
            node.id,
            node.spec.name,
            node.spec.datacenter,
            node.spec.node_class,
            node.spec.node_pool,
            self.store.region,
            node.attributes,
            node.meta,
        )

    def _node_event(self, node: NodeRecord, message: str) -> None:
        node.events.append(
            {
                "Message": message,
                "Subsystem": "Cluster",
                "Details": None,
                "Timestamp": go_time(now_ns()),
                "CreateIndex": self.store.index + 1,
            }
        )
        del node.events[:-10]

    # -- client host protocol ----------------------------------------------

    def configure_consul_token(self, token: str) -> None:
        """The agents' ``consul { token }`` changed: agents made from now on send it."""
        self.config = self.config.with_overrides(consul_token=token)
        self._agents.clear()

    def consul_for(self, node_id: str) -> ConsulAgent | None:
        node = self.store.nodes.get(node_id)
        addr = self.config.consul_addr
        if node is not None:
            addr = self.config.consul_agents.get(node.spec.name, addr)
        if not addr or self._session is None:
            return None
        if addr not in self._agents:
            self._agents[addr] = ConsulAgent(self._session, addr, self.config.consul_token)
        return self._agents[addr]

    def alloc_root(self, alloc_id: str) -> Path:
        assert self._state_root is not None
        return self._state_root / "alloc" / alloc_id

    def report(self, alloc: AllocRecord) -> None:
        """A client-side alloc update (AllocationUpdated)."""
        if alloc.id not in self.store.allocs or not self._started:
            return
        with self.store.txn(EV_ALLOC_UPDATED):
            self.store.touch_alloc(alloc)
        self._after_alloc_change(alloc)

    def _after_alloc_change(self, alloc: AllocRecord) -> None:
        before = self._seen_status.get(alloc.id)
        self._seen_status[alloc.id] = alloc.client_status
        if before == alloc.client_status:
            return
        if alloc.client_status == "failed" and alloc.desired_status == "run":
            self._create_eval(alloc.job_id, "alloc-failure")
        if alloc.client_terminal():
            self._retry_blocked()

    # -- evaluations ----------------------------------------------------------

    def _new_eval(self, job_id: str, triggered_by: str, *, node_id: str = "") -> EvalRecord:
        job = self.store.jobs.get(job_id)
        ev = EvalRecord(
            id=str(uuid.uuid4()),
            job_id=job_id,
            triggered_by=triggered_by,
            priority=int(job.job.get("Priority") or 50) if job else 50,
            type=str(job.job.get("Type") or "service") if job else "service",
            node_id=node_id,
            node_modify_index=self.store.nodes[node_id].modify_index if node_id in self.store.nodes else 0,
            job_modify_index=job.job_modify_index if job else 0,
        )
        self.store.touch_eval(ev)
        return ev

    def _create_eval(self, job_id: str, triggered_by: str, *, node_id: str = "") -> EvalRecord:
        with self.store.txn("EvaluationUpdated"):
            ev = self._new_eval(job_id, triggered_by, node_id=node_id)
        self._enqueue(ev.id)
        return ev

    def _enqueue(self, eval_id: str) -> None:
        if eval_id not in self._queued:
            self._queued.add(eval_id)
            self._queue.put_nowait(eval_id)

    def _retry_blocked(self) -> None:
        for ev in self.store.evals.values():
            if ev.status == "blocked":
                self._enqueue(ev.id)

    async def _eval_worker(self) -> None:
        while True:
            eval_id = await self._queue.get()
            self._queued.discard(eval_id)
            try:
                self._process_eval(eval_id)
            except Exception:
                log.exception("evaluation %s failed", eval_id)
                ev = self.store.evals.get(eval_id)
                if ev is not None:
                    with self.store.txn("EvaluationUpdated"):
                        ev.status = "failed"
                        ev.status_description = "scheduler error (see the stand-in's log)"
                        self.store.touch_eval(ev)

    def _process_eval(self, eval_id: str) -> None:
        ev = self.store.evals.get(eval_id)
        if ev is None or ev.status not in ("pending", "blocked"):
            return
        job = self.store.jobs.get(ev.job_id)
        outcome = self.scheduler.compute(job, ev.job_id)
        if ev.status == "blocked" and not (outcome.places or outcome.stops or outcome.inplace):
            failed = {g: m.as_json() for g, m in outcome.failed.items()} or None
            if failed == ev.failed_tg_allocs and outcome.queued == ev.queued_allocations:
                return  # still blocked for the same reasons: nothing to write
        self.scheduler.apply(ev, outcome)
        self._after_plan(outcome)

    def _after_plan(self, outcome: PlanOutcome) -> None:
        for alloc_id, delay in outcome.reschedule_later.items():
            self._later(delay, lambda a=alloc_id: self._reschedule_now(a), f"reschedule-{alloc_id}")
        self._sync_clients()
        for stop in outcome.stops:
            self._after_alloc_change(stop.alloc)

    async def _reschedule_now(self, alloc_id: str) -> None:
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None or alloc.next_allocation:
            return
        with self.store.txn(EV_ALLOC_DESIRED):
            alloc.desired_transition = {**alloc.desired_transition, "Reschedule": True}
            self.store.touch_alloc(alloc, server=True)
            ev = self._new_eval(alloc.job_id, "alloc-failure")
        self._enqueue(ev.id)

    def _sync_clients(self) -> None:
        """Start runners for new allocs on live nodes; ask runners of stopped allocs to stop."""
        for alloc in list(self.store.allocs.values()):
            node = self.store.nodes.get(alloc.node_id)
            runner = self.runners.get(alloc.id)
            if runner is not None:
                if alloc.server_terminal():
                    runner.stop()
                continue
            if alloc.server_terminal() or alloc.client_terminal():
                continue
            if node is None or node.failed_at is not None:
                continue
            runner = AllocRunner(self, alloc)
            self.runners[alloc.id] = runner
            runner.start()
            self._spawn(self._reap(alloc.id, runner), f"reap-{alloc.id}")
            self.deployments.watch(alloc)

    async def _reap(self, alloc_id: str, runner: AllocRunner) -> None:
        await runner.wait()
        if self.runners.get(alloc_id) is runner:
            del self.runners[alloc_id]
        alloc = self.store.allocs.get(alloc_id)
        if alloc is not None and self._state_root is not None:
            self._terminal_dirs.setdefault(alloc.node_id, {})[alloc_id] = None  # oldest first
            self._collect_garbage(alloc.node_id)

    def _collect_garbage(self, node_id: str) -> None:
        """Nomad's client GC (``client/gc.go``, ``keepUsageBelowThreshold``, v2.0.5): while the
        node holds more than ``gc_max_allocs`` allocations, running and terminal, or its
        alloc dir's disk is fuller than ``gc_disk_usage_threshold`` percent, destroy the
        terminal allocation marked for collection first (its directory goes); none left:
        nothing more is done. Nomad checks at ``gc_interval`` (1 min) and when triggered;
        the stand-in checks each time an allocation turns terminal."""
        terminal = self._terminal_dirs.get(node_id, {})
        assert self._state_root is not None
        while terminal:
            live = sum(1 for r in self.runners.values() if r.alloc.node_id == node_id)
            usage = shutil.disk_usage(self._state_root)
            if (
                live + len(terminal) <= self.config.gc_max_allocs
                and usage.used * 100 / usage.total <= self.config.gc_disk_usage_threshold
            ):
                return
            oldest = next(iter(terminal))
            del terminal[oldest]
            shutil.rmtree(self.alloc_root(oldest), ignore_errors=True)
            log.info("garbage collected allocation %s's directory", oldest)

    # -- jobs -----------------------------------------------------------------

    def register_job(self, job_doc: JSON, *, enforce_index: bool = False, job_modify_index: int = 0) -> JSON:
        job_doc = as_registered(canonicalize(job_doc))
        validate(job_doc)
        job_id = str(job_doc["ID"])
        existing = self.store.jobs.get(job_id)
        if enforce_index:
            current = existing.job_modify_index if existing else 0
            if job_modify_index != current:
                if job_modify_index == 0:
                    raise BadRequest(f"Enforcing job modify index 0: job {job_id} already exists")
                raise BadRequest(
                    f"Enforcing job modify index {job_modify_index}: job exists with conflicting job modify "
                    f"index: {current}"
                )
        changed = existing is None or existing.stop or spec_key(existing.job) != spec_key(job_doc)
        with self.store.txn(EV_JOB_REGISTERED):
            if changed:
                if existing is None:
                    record = JobRecord(job=job_doc, version=0, submit_time=now_ns())
                else:
                    record = existing
                    record.job = job_doc
                    record.version += 1
                    record.stop = False
                    record.submit_time = now_ns()
                record.job_modify_index = self.store.index + 1
                self.store.touch_job(record)
            else:
                assert existing is not None
                record = existing
            ev = self._new_eval(job_id, "job-register")
            ev.job_modify_index = record.job_modify_index
        self._enqueue(ev.id)
        return _job_write_answer(ev, record, Warnings=job_warnings(job_doc))

    def deregister_job(self, job_id: str, *, purge: bool = False) -> JSON:
        record = self.store.jobs.get(job_id)
        if record is None:
            # Job.Deregister returns nil for a job it does not find (nomad/job_endpoint.go,
            # v2.0.5): 200, no evaluation, every index 0, no write.
            return {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": 0, **_WRITE_META}
        with self.store.txn(EV_JOB_DEREGISTERED):
            if purge:
                self.store.delete_job(job_id)
            else:
                if not record.stop:
                    record.stop = True
                    record.version += 1
                    record.job_modify_index = self.store.index + 1
                self.store.touch_job(record)
            ev = self._new_eval(job_id, "job-deregister")
            ev.job_modify_index = record.job_modify_index
        self._enqueue(ev.id)
        return _job_write_answer(ev, record)

    def plan_job(self, job_doc: JSON, *, diff: bool) -> JSON:
        job_doc = as_registered(canonicalize(job_doc))
        validate(job_doc)
        job_id = str(job_doc["ID"])
        existing = self.store.jobs.get(job_id)
        outcome = self.scheduler.compute(existing, job_id, job_doc=job_doc)
        desired = {
            group: {
                **{
                    k: 0
                    for k in (
                        "Ignore",
                        "Place",
                        "Migrate",
                        "Stop",
                        "InPlaceUpdate",
                        "DestructiveUpdate",
                        "Canary",
                        "Preemptions",
                        "RescheduleNow",
                        "RescheduleLater",
                        "Disconnect",
                        "Reconnect",
                    )
                },
                **counts,
            }
            for group, counts in outcome.desired.items()
        }
        response: JSON = {
            "JobModifyIndex": existing.job_modify_index if existing else 0,
            "CreatedEvals": None,
            "Diff": self._diff(existing, job_doc, outcome) if diff else None,
            "Annotations": {"DesiredTGUpdates": desired, "PreemptedAllocs": None},
            "FailedTGAllocs": {g: m.as_json() for g, m in outcome.failed.items()} or None,
            "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
            "Warnings": job_warnings(job_doc),
        }
        return response

    @staticmethod
    def _diff(existing: JobRecord | None, job_doc: JSON, outcome: PlanOutcome) -> JSON:
        """A coarse JobDiff: job and group level Added/Edited/None (no per-field diff)."""
        if existing is None:
            kind = "Added"
        elif existing.stop or spec_key(existing.job) != spec_key(job_doc):
            kind = "Edited"
        else:
            kind = "None"
        old_groups = {g["Name"]: g for g in (existing.job.get("TaskGroups") or [])} if existing else {}
        groups = []
        for group in job_doc.get("TaskGroups") or []:
            old = old_groups.get(group["Name"])
            gkind = "Added" if old is None else ("None" if old == group else "Edited")
            updates = {k.lower(): v for k, v in outcome.desired.get(group["Name"], {}).items() if v}
            groups.append(
                {
                    "Type": gkind,
                    "Name": group["Name"],
                    "Fields": None,
                    "Objects": None,
                    "Tasks": None,
                    "Updates": updates or None,
                }
            )
        return {"Type": kind, "ID": job_doc["ID"], "Fields": None, "Objects": None, "TaskGroups": groups}

    def stop_alloc(self, alloc_id: str) -> JSON:
        alloc = self.find_alloc(alloc_id)
        with self.store.txn(EV_ALLOC_DESIRED):
            alloc.desired_transition = {**alloc.desired_transition, "Migrate": True}
            self.store.touch_alloc(alloc, server=True)
            ev = self._new_eval(alloc.job_id, "alloc-stop")
        self._enqueue(ev.id)
        return {"EvalID": ev.id, "Index": self.store.index}

    def find_alloc(self, ref: str) -> AllocRecord:
        alloc = self.store.allocs.get(ref)
        if alloc is not None:
            return alloc
        matches = [a for a in self.store.allocs.values() if a.id.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        raise NotFound(f"alloc not found: {ref}" if not matches else f"alloc prefix {ref} is ambiguous")

    # -- node operations ------------------------------------------------------------

    def _all_jobs_on_node(self, node_id: str) -> list[str]:
        """Nomad's ``createNodeEvals``: one eval per job with *any* alloc on the node, terminal
        ones included (a stopped job's alloc the dead client never confirmed must end lost)."""
        return sorted({a.job_id for a in self.store.node_allocs(node_id)})

    # -- faults ---------------------------------------------------------------------

    async def fail_node(self, node_ref: str) -> NodeRecord:
        """The node's machine dies: its processes are killed and its heartbeats stop.

        The server notices after ``heartbeat_grace_s``: the node goes ``disconnected``
        (if some alloc on it has ``disconnect { lost_after }``) or ``down``, and its
        allocations become ``unknown`` or ``lost``."""
        node = self.node_by_name_or_id(node_ref)
        if node.failed_at is not None:
            return node
        node.failed_at = asyncio.get_running_loop().time()
        await _call_hooks(self.on_node_failed, node.spec.name)
        for alloc in self.store.node_allocs(node.id):
            runner = self.runners.pop(alloc.id, None)
            if runner is not None:
                await runner.crash()
        self._later(
            self.config.heartbeat_grace_s, lambda: self._missed_heartbeat(node.id), f"heartbeat-{node.id}"
        )
        return node

    async def _missed_heartbeat(self, node_id: str) -> None:
        node = self.store.nodes[node_id]
        if node.failed_at is None or (node.status != "ready" and node.status != "initializing"):
            return
        live = [a for a in self.store.node_allocs(node_id) if not a.terminal()]
        lost_after = [self._lost_after_s(a) for a in live]
        disconnectable = [s for s in lost_after if s > 0]
        with self.store.txn(EV_NODE_EVENT):
            node.status = "disconnected" if disconnectable else "down"
            node.status_updated_at = now_ns() // NS
            self._node_event(node, "Node heartbeat missed")
            self.store.touch_node(node)
            for alloc, after in zip(live, lost_after, strict=True):
                if after > 0:
                    alloc.client_status = "unknown"
                    alloc.client_description = "alloc is unknown since its node is disconnected"
                    alloc.unknown_since = now_ns()
                    alloc.alloc_states.append(
                        {"Field": 0, "Value": "unknown", "Time": go_time(alloc.unknown_since)}
                    )
                    self.store.touch_alloc(alloc)
            evals = [
                self._new_eval(job_id, "node-update", node_id=node_id)
                for job_id in self._all_jobs_on_node(node_id)
            ]
        for ev in evals:
            self._enqueue(ev.id)
        if disconnectable:
            self._later(
                self.config.heartbeat_grace_s,
                lambda: self._heartbeat_missed_again(node_id),
                f"heartbeat-again-{node_id}",
            )
            # A moment after the last lost_after runs out, so the evaluation sees it expired
            # (asyncio may fire a timer up to its clock resolution early).
            self._later(
                max(disconnectable) + 0.01,
                lambda: self._disconnect_expired(node_id),
                f"lost-after-{node_id}",
            )

    async def _heartbeat_missed_again(self, node_id: str) -> None:
        """While a node is disconnected, Nomad's leader resets its heartbeat timer with every
        status update that is not ``down`` and, when it fires, files the node disconnected
        again with a new "Node heartbeat missed" event: a Raft write that rewrites
        ``StatusUpdatedAt`` every heartbeat TTL plus grace (``invalidateHeartbeat``,
        nomad/heartbeat.go; ``UpdateStatus``, nomad/node_endpoint.go; ``updateNodeStatusTxn``,
        nomad/state/state_store.go; v2.0.5). Here every ``heartbeat_grace_s``."""
        node = self.store.nodes[node_id]
        if node.status != "disconnected" or node.failed_at is None:
            return
        with self.store.txn(EV_NODE_EVENT):
            node.status_updated_at = now_ns() // NS
            self._node_event(node, "Node heartbeat missed")
            self.store.touch_node(node)
        self._later(
            self.config.heartbeat_grace_s,
            lambda: self._heartbeat_missed_again(node_id),
            f"heartbeat-again-{node_id}",
        )

    async def _disconnect_expired(self, node_id: str) -> None:
        node = self.store.nodes[node_id]
        if node.status != "disconnected":
            return
        with self.store.txn(EV_NODE_EVENT):
            node.status = "down"
            node.status_updated_at = now_ns() // NS
            self._node_event(node, "Node disconnect timeout expired")
            self.store.touch_node(node)
            evals = [
                self._new_eval(job_id, "max-disconnect-timeout", node_id=node_id)
                for job_id in self._all_jobs_on_node(node_id)
            ]
        for ev in evals:
            self._enqueue(ev.id)

    @staticmethod
    def _lost_after_s(alloc: AllocRecord) -> float:
        return lost_after_ns(alloc) / NS

    async def restore_node(self, node_ref: str) -> NodeRecord:
        """The node comes back empty: ready again, its old allocations lost, stale services removed."""
        node = self.node_by_name_or_id(node_ref)
        node.failed_at = None
        await _call_hooks(self.on_node_restored, node.spec.name)
        # Everything the empty client no longer runs, desired-stop allocs included (a stop sent
        # while the node was dead was never confirmed).
        stale = [a for a in self.store.node_allocs(node.id) if not a.client_terminal()]
        await self._forget_services(stale)
        with self.store.txn(EV_NODE_EVENT):
            node.status = "ready"
            node.status_updated_at = now_ns() // NS
            self._node_event(node, "Node reregistered by heartbeat")
            self.store.touch_node(node)
            for alloc in stale:
                alloc.client_status = "lost"
                alloc.client_description = "alloc is lost since its node is down"
                for ts in alloc.task_states.values():
                    if ts.state != "dead":
                        ts.state = "dead"
                        ts.finished_at = now_ns()
                self.store.touch_alloc(alloc)
            evals = [
                self._new_eval(job_id, "node-update", node_id=node.id) for job_id in {a.job_id for a in stale}
            ]
        for ev in evals:
            self._enqueue(ev.id)
        self._retry_blocked()
        return node

    async def _forget_services(self, allocs: list[AllocRecord]) -> None:
        """What a restarted client's Consul sync does: remove _nomad-task- services it no longer runs."""
        for alloc in allocs:
            agent = self.consul_for(alloc.node_id)
            if agent is None:
                continue
            for group in alloc.job.get("TaskGroups") or []:
                if group.get("Name") != alloc.task_group:
                    continue
                ids = [
                    service_id(alloc.id, f"group-{alloc.task_group}", s) for s in group.get("Services") or []
                ]
                for task in group.get("Tasks") or []:
                    ids += [service_id(alloc.id, str(task["Name"]), s) for s in task.get("Services") or []]
                for sid in ids:
                    with contextlib.suppress(Exception):
                        await agent.deregister(sid)

    async def crash_task(self, alloc_ref: str, task: str = "") -> int:
        """SIGKILL one task's process (as if it crashed); its restart policy decides what follows."""
        alloc = self.find_alloc(alloc_ref)
        runner = self.runners.get(alloc.id)
        if runner is None:
            raise NotFound(f"alloc {alloc.id} is not running on a live node")
        names = [task] if task else list(runner.tasks)
        for name in names:
            task_runner = runner.tasks.get(name)
            if task_runner is None or task_runner.proc is None:
                raise NotFound(f"task {name!r} of alloc {alloc.id} has no running process")
            pid = task_runner.proc.pid
            self.procs.signal_group(task_runner.proc, 9)
            return pid
        raise NotFound(f"alloc {alloc.id} has no tasks")


def _job_write_answer(ev: EvalRecord, record: JobRecord, **extra: object) -> JSON:
    """What a job register or deregister answers (``api.JobRegisterResponse`` /
    ``JobDeregisterResponse``): the evaluation, the job's modify index, the WriteMeta."""
    return {
        "EvalID": ev.id,
        "EvalCreateIndex": ev.create_index,
        "JobModifyIndex": record.job_modify_index,
        **extra,
        **_WRITE_META,
    }


_WRITE_META: JSON = {"KnownLeader": True, "LastContact": 0, "NextToken": ""}
