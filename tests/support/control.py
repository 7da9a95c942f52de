"""Test doubles for the control plane: an in-memory Nomad + Consul simulator and recorded fakes
of every port, so the reconciler can be driven through many passes on virtual time.

Owns (for llmgw's tests; outside the package, so the wheel never ships it):

- ``FakeCluster``: a tiny simulator of Nomad's behaviour that answers in Nomad's JSON —
  nodes with GPUs and a fabric, jobs placed group by group (first fit, no gang
  scheduling: a group that does not fit waits while the others run), allocations that
  start after ``start_delay``, engines that pass their check ``load_delay`` later,
  node loss (down or disconnected), crashes, and an event log with indexes.
- ``FakeRenderer``: renders a replica as job JSON (no templates), with a spec hash that
  covers the profile and a ``template_version`` (change it to simulate a template change).
- ``Simulation``: drives the pure core (observe -> decide -> apply -> record) synchronously
  on a synthetic clock, applying through the real ``Executor`` over ``FakeNomad``; the
  unit tests' harness.
- Async fakes of the ports for component tests: ``FakeNomad`` (records calls, can fail
  calls, break or gap its event stream), ``FakeWatch``, ``FakeLeader``, ``FakeDrainMarks``,
  ``FakeCommands`` (the operator's drain/restart records), ``FakeStatus``, ``FakeProbe`` and
  ``ManualClock`` (sleeps end when the test advances it).

Must not: be imported by production code (an import-linter contract in pyproject.toml
refuses it), or apply actions any other way than through ``llmgw.control.Executor``.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import json
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from llmgw import __version__
from llmgw.control.executing import Executor
from llmgw.control.metrics import ControlMetrics
from llmgw.control.observing import parse_alloc, parse_job, parse_node
from llmgw.control.plane import ControlDeps, ControlPlane
from llmgw.control.ports import JSON
from llmgw.control.settings import ControlSettings
from llmgw.core import conventions as c
from llmgw.core.catalog import Catalog, SecurityPolicy
from llmgw.core.engine_keys import EngineKeys
from llmgw.core.names import slug
from llmgw.core.planning import (
    EMPTY_STATE,
    Action,
    Decision,
    Desired,
    JobId,
    ModelCommand,
    NodeId,
    Observed,
    ObservedJob,
    ObservedNode,
    Outcome,
    PlannerState,
    PlanningSettings,
    SpecOracle,
    decide,
    desired_from_catalog,
    record_outcomes,
)
from llmgw.core.records import (
    CatalogVersion,
    DemandReport,
    DrainMark,
    Endpoint,
    EndpointSnapshot,
    HealthStatus,
    ModelUse,
)
from llmgw.core.scaling import aggregate_demand
from llmgw.render import RenderedJob, RenderError, ReplicaRequest, job_id_for

T = TypeVar("T")
START = 1_700_000_000.0


# --- the simulated cluster -----------------------------------------------------------------------


@dataclass
class SimNode:
    node_id: str
    name: str
    gpus: list[str]
    gpu_model: str
    fabric: str | None
    status: str = "ready"
    status_updated_at: float = START
    eligible: bool = True
    modify_index: int = 1


@dataclass
class SimAlloc:
    alloc_id: str
    job_id: str
    group: str
    node_id: str
    gpus: list[str]
    created_at: float
    client_status: str = "pending"
    desired_status: str = "run"
    started_at: float | None = None
    restarts: int = 0
    restarted_at: float | None = None
    restart_delay: float = 0.0  # the restart policy's delay: pending until restarted_at + this
    # When it last became unknown (its AllocStates' entry; Nomad's LastUnknown).
    unknown_since: float | None = None


@dataclass
class SimGroup:
    name: str
    gpus: int
    gpu_model: str | None
    fabric: str | None
    # Nodes the job's ``${node.unique.id} != <id>`` constraints keep it off (the spread).
    not_on: frozenset[str] = frozenset()


@dataclass
class SimJob:
    job: JSON
    groups: list[SimGroup]
    submitted_at: float
    stop: bool = False
    queued: list[str] = field(default_factory=list)  # groups Nomad has not placed (blocked)


@dataclass(frozen=True, slots=True)
class FakePlan:
    feasible: bool
    explanation: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FakeRegistered:
    eval_id: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FakePage:
    items: list[JSON]
    index: int


@dataclass(frozen=True, slots=True)
class FakeEventBatch:
    index: int
    events: list[JSON]


def _rfc3339(at: float | None) -> str:
    if at is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


class FakeCluster:
    """A deterministic, synchronous Nomad (and the Consul health of its engines)."""

    def __init__(self, *, start: float = START, start_delay: float = 2.0, load_delay: float = 10.0) -> None:
        self.now = start
        self.start_delay = start_delay
        self.load_delay = load_delay
        # Per model: seconds to become healthy after every group runs; None: never.
        self.model_load_delay: dict[str, float | None] = {}
        self.nodes: dict[str, SimNode] = {}
        self.jobs: dict[str, SimJob] = {}
        self.allocs: dict[str, SimAlloc] = {}
        # Nomad Variables the control plane wrote (a replica's engine key), by path.
        self.variables: dict[str, dict[str, str]] = {}
        self.index = 1
        self.events: list[tuple[int, JSON]] = []
        # Nomad before 1.7.5 (hashicorp/nomad#19903) emits no JobDeregistered event when a
        # job is purged; set False to be that Nomad.
        self.purge_events = True
        # What Nomad warns about in every job planned or registered (its Warnings, split).
        self.warnings: tuple[str, ...] = ()
        # Seconds a stopped allocation's tasks take to exit (shutdown_delay, then the kill):
        # until then it keeps its GPUs, as Nomad's ProposedAllocs counts them, purged or not.
        self.stop_delay = 0.0
        self._stopping: dict[str, float] = {}  # alloc id -> when its tasks have exited
        # Real Nomad's heartbeat timing while a node is disconnected: every heartbeat TTL plus
        # grace (20-30 s by default) the leader files "Node heartbeat missed" again and a new
        # StatusUpdatedAt (nomad/heartbeat.go, invalidateHeartbeat, v2.0.5). None: never.
        self.heartbeat_rewrite: float | None = None
        self._rewrite_at: dict[str, float] = {}  # node id -> its next rewrite
        # The groups' ``disconnect { lost_after }``: an unknown allocation past it is lost and
        # Nomad places a lone replacement whatever ``replace`` says (classifyAllocs' expiring
        # allocations, scheduler/reconciler/filters.go, v2.0.5). None: never.
        self.lost_after: float | None = None
        self.replacements: list[str] = []  # allocations Nomad placed for expired ones
        self._ids = itertools.count(1)
        self.changed = asyncio.Event() if _has_loop() else None

    # -- building ----------------------------------------------------------------------------------

    def add_node(
        self, name: str, *, gpus: int = 8, gpu_model: str = "H100", fabric: str | None = None
    ) -> str:
        node_id = f"{name}-{'0' * 8}-node"
        node = SimNode(node_id, name, [f"{name}-gpu{i}" for i in range(gpus)], gpu_model, fabric)
        node.status_updated_at = self.now
        self.nodes[node_id] = node
        self._event("Node", "NodeRegistration", node_id, {"Node": self.node_json(node_id)})
        return node_id

    def node_named(self, name: str) -> SimNode:
        return next(n for n in self.nodes.values() if n.name == name)

    # -- Nomad's API (sync) -------------------------------------------------------------------------

    def plan(self, job: JSON) -> FakePlan:
        groups = _groups_of(job)
        taken: dict[str, int] = {}
        used: set[str] = set()
        misses: list[str] = []
        for group in groups:
            node = self._fit(group, taken, used)
            if node is None:
                misses.append(f"group {group.name}: {self._why_not(group)}")
            else:
                taken[node.node_id] = taken.get(node.node_id, 0) + group.gpus
                used.add(node.node_id)
        if misses:
            return FakePlan(False, "; ".join(misses), self.warnings)
        return FakePlan(True, "", self.warnings)

    def register(self, job: JSON) -> str:
        job_id = str(job["ID"])
        if job_id in self.jobs:
            self.jobs[job_id].job = job  # an update: Nomad keeps the allocations of an unchanged job
            return f"eval-{next(self._ids)}"
        sim = SimJob(job=job, groups=_groups_of(job), submitted_at=self.now)
        self.jobs[job_id] = sim
        self._event("Job", "JobRegistered", job_id, {"Job": self.job_json(job_id)})
        for group in sim.groups:
            self._place(sim, group)
        return f"eval-{next(self._ids)}"

    def deregister(self, job_id: str, purge: bool = True) -> None:
        sim = self.jobs.get(job_id)
        if sim is None:
            return
        for alloc in self._allocs_of(job_id):
            if alloc.desired_status == "run":
                alloc.desired_status = "stop"
                if self.stop_delay > 0 and alloc.client_status in ("pending", "running"):
                    self._stopping[alloc.alloc_id] = self.now + self.stop_delay
                elif alloc.client_status in ("pending", "running", "unknown"):
                    alloc.client_status = "complete"
                self._alloc_event(alloc)
        payload = self.job_json(job_id)
        if purge:
            del self.jobs[job_id]
            for alloc in self._allocs_of(job_id):
                if alloc.alloc_id not in self._stopping:
                    del self.allocs[alloc.alloc_id]
        else:
            sim.stop = True
        if self.purge_events or not purge:
            self._event("Job", "JobDeregistered", job_id, {"Job": payload})

    def job_json(self, job_id: str, *, stub: bool = False) -> JSON:
        sim = self.jobs[job_id]
        allocs = self._allocs_of(job_id)
        summary = {
            g.name: {
                "Queued": int(g.name in sim.queued),
                "Running": sum(1 for a in allocs if a.group == g.name and a.client_status == "running"),
            }
            for g in sim.groups
        }
        running = any(a.client_status == "running" for a in allocs)
        out: JSON = {
            "ID": job_id,
            "Name": job_id,
            "Type": "service",
            "Stop": sim.stop,
            "Status": "dead" if sim.stop else ("running" if running else "pending"),
            "SubmitTime": int(sim.submitted_at * 1e9),
            "Meta": dict(sim.job.get("Meta") or {}),
            "JobSummary": {"JobID": job_id, "Summary": summary},
        }
        if not stub:
            out["TaskGroups"] = sim.job.get("TaskGroups") or []
        return out

    def jobs_json(self, prefix: str | None = None) -> list[JSON]:
        return [self.job_json(j, stub=True) for j in sorted(self.jobs) if j.startswith(prefix or "")]

    def alloc_json(self, alloc: SimAlloc) -> JSON:
        node = self.nodes.get(alloc.node_id)
        state = {
            "pending": "pending",
            "running": "running",
            "unknown": "running",
        }.get(alloc.client_status, "dead")
        return {
            "ID": alloc.alloc_id,
            "JobID": alloc.job_id,
            "TaskGroup": alloc.group,
            "NodeID": alloc.node_id,
            "NodeName": node.name if node else "",
            "ClientStatus": alloc.client_status,
            "DesiredStatus": alloc.desired_status,
            "CreateTime": int(alloc.created_at * 1e9),
            "ModifyTime": int(self.now * 1e9),
            "TaskStates": {
                "engine": {
                    "State": state,
                    "StartedAt": _rfc3339(alloc.started_at),
                    "Restarts": alloc.restarts,
                    "LastRestart": _rfc3339(alloc.restarted_at),
                    "Failed": alloc.client_status == "failed",
                }
            },
            "AllocatedResources": {"Tasks": {"engine": {"Devices": [{"DeviceIDs": list(alloc.gpus)}]}}},
            # The whole allocation carries them; its list stub does not.
            "AllocStates": None
            if alloc.unknown_since is None
            else [{"Field": 0, "Value": "unknown", "Time": _rfc3339(alloc.unknown_since)}],
        }

    def allocs_json(self, job_id: str | None = None, *, resources: bool = False) -> list[JSON]:
        """List stubs as Nomad gives them: ``AllocatedResources`` only when asked for."""
        allocs = self._allocs_of(job_id) if job_id else list(self.allocs.values())
        out = [self.alloc_json(a) for a in sorted(allocs, key=lambda a: a.alloc_id)]
        for stub in out:
            del stub["AllocStates"]
            if not resources:
                del stub["AllocatedResources"]
        return out

    def node_json(self, node_id: str, *, stub: bool = False) -> JSON:
        node = self.nodes[node_id]
        out: JSON = {
            "ID": node.node_id,
            "Name": node.name,
            "Status": node.status,
            "SchedulingEligibility": "eligible" if node.eligible else "ineligible",
            "ModifyIndex": node.modify_index,
        }
        if not stub:
            out["Meta"] = {c.NODE_META_FABRIC: node.fabric} if node.fabric else {}
            out["StatusUpdatedAt"] = int(node.status_updated_at)
        return out

    def nodes_json(self) -> list[JSON]:
        return [self.node_json(n, stub=True) for n in sorted(self.nodes)]

    # -- time ---------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.tick(self.now + seconds)

    def tick(self, now: float) -> None:
        """Let time pass: stopped allocations finish, pending ones start, blocked groups place
        when room freed."""
        self.now = max(self.now, now)
        for alloc_id, done_at in sorted(self._stopping.items()):
            if self.now >= done_at:
                del self._stopping[alloc_id]
                alloc = self.allocs[alloc_id]
                alloc.client_status = "complete"
                self._alloc_event(alloc)
                if alloc.job_id not in self.jobs:
                    del self.allocs[alloc_id]  # its job was purged: Nomad garbage-collects it
        for alloc in sorted(self.allocs.values(), key=lambda a: a.alloc_id):
            node = self.nodes.get(alloc.node_id)
            if (
                alloc.client_status == "pending"
                and alloc.desired_status == "run"
                and node is not None
                and node.status == "ready"
                and self.now - alloc.created_at >= self.start_delay
                and (alloc.restarted_at is None or self.now >= alloc.restarted_at + alloc.restart_delay)
            ):
                alloc.client_status = "running"
                alloc.started_at = (
                    alloc.created_at + self.start_delay
                    if alloc.restarted_at is None
                    else alloc.restarted_at + alloc.restart_delay
                )
                self._alloc_event(alloc)
        self._heartbeats_missed()
        self._expire_disconnects()
        for job_id in sorted(self.jobs):
            sim = self.jobs[job_id]
            for name in list(sim.queued):
                group = next(g for g in sim.groups if g.name == name)
                sim.queued.remove(name)
                self._place(sim, group)

    def _heartbeats_missed(self) -> None:
        if self.heartbeat_rewrite is None:
            return
        for node in sorted(self.nodes.values(), key=lambda n: n.node_id):
            due = self._rewrite_at.get(node.node_id)
            if node.status != "disconnected" or due is None or self.now < due:
                continue
            node.status_updated_at = self.now
            node.modify_index += 1
            self._rewrite_at[node.node_id] = self.now + self.heartbeat_rewrite
            self._event("Node", "NodeStreamEvent", node.node_id, {"Node": self.node_json(node.node_id)})

    def _expire_disconnects(self) -> None:
        if self.lost_after is None:
            return
        for alloc in sorted(self.allocs.values(), key=lambda a: a.alloc_id):
            if (
                alloc.client_status != "unknown"
                or alloc.unknown_since is None
                or self.now < alloc.unknown_since + self.lost_after
            ):
                continue
            alloc.client_status, alloc.desired_status = "lost", "stop"
            self._alloc_event(alloc)
            sim = self.jobs.get(alloc.job_id)
            if sim is None or sim.stop:
                continue
            before = set(self.allocs)
            self._place(sim, next(g for g in sim.groups if g.name == alloc.group))
            self.replacements += sorted(set(self.allocs) - before)

    # -- faults -------------------------------------------------------------------------------------

    def fail_node(self, name: str, *, disconnect: bool = False) -> None:
        """Missed heartbeats: ``down`` (allocations lost) or ``disconnected`` (allocations unknown)."""
        node = self.node_named(name)
        node.status = "disconnected" if disconnect else "down"
        node.status_updated_at = self.now
        node.modify_index += 1
        if disconnect and self.heartbeat_rewrite is not None:
            self._rewrite_at[node.node_id] = self.now + self.heartbeat_rewrite
        self._event("Node", "NodeStatusUpdate", node.node_id, {"Node": self.node_json(node.node_id)})
        for alloc in self.allocs.values():
            if alloc.node_id == node.node_id and alloc.client_status in ("pending", "running"):
                alloc.client_status = "unknown" if disconnect else "lost"
                if disconnect:
                    alloc.unknown_since = self.now
                self._alloc_event(alloc)

    def restore_node(self, name: str) -> None:
        node = self.node_named(name)
        node.status = "ready"
        node.status_updated_at = self.now
        node.modify_index += 1
        self._event("Node", "NodeStatusUpdate", node.node_id, {"Node": self.node_json(node.node_id)})
        for alloc in self.allocs.values():
            if alloc.node_id == node.node_id and alloc.client_status == "unknown":
                alloc.client_status = "running"
                alloc.unknown_since = None
                self._alloc_event(alloc)

    def crash(self, job_id: str, group: str) -> None:
        for alloc in self._allocs_of(job_id):
            if alloc.group == group and alloc.desired_status == "run" and not _terminal(alloc):
                alloc.client_status = "failed"
                self._alloc_event(alloc)

    def restart_task(self, job_id: str, group: str, *, delay: float = 0.0) -> None:
        """Nomad's restart policy restarted the task in place (same allocation). With a
        ``delay`` (the policy's), the allocation is pending meanwhile, as Nomad's
        getClientStatus makes it when no task runs."""
        for alloc in self._allocs_of(job_id):
            if alloc.group == group and alloc.client_status == "running":
                alloc.restarts += 1
                alloc.restarted_at = self.now
                alloc.restart_delay = delay
                if delay > 0:
                    alloc.client_status, alloc.started_at = "pending", None
                else:
                    alloc.started_at = self.now
                self._alloc_event(alloc)

    def start_foreign_job(self, job_id: str, *, node: str, gpus: int = 0) -> None:
        """A job llmgw did not create (no llmgw meta), holding GPUs on a node."""
        job: JSON = {
            "ID": job_id,
            "Meta": {"owner": "someone else"},
            "TaskGroups": [{"Name": "main", "Count": 1, "Tasks": [_task(gpus, None)]}],
        }
        sim = SimJob(job=job, groups=_groups_of(job), submitted_at=self.now)
        self.jobs[job_id] = sim
        node_rec = self.node_named(node)
        free = self._free(node_rec, {})
        alloc = SimAlloc(
            f"alloc-{next(self._ids):06d}", job_id, "main", node_rec.node_id, free[:gpus], self.now
        )
        alloc.client_status, alloc.started_at = "running", self.now
        self.allocs[alloc.alloc_id] = alloc

    # -- Consul's view of the engines ------------------------------------------------------------------

    def healthy(self, job_id: str) -> bool:
        sim = self.jobs.get(job_id)
        if sim is None or sim.stop:
            return False
        meta = sim.job.get("Meta") or {}
        delay = self.model_load_delay.get(str(meta.get(c.JOB_META_MODEL)), self.load_delay)
        if delay is None:
            return False
        current = self._current(job_id)
        if len(current) != len(sim.groups) or any(a.client_status != "running" for a in current.values()):
            return False
        started = max(a.started_at or self.now for a in current.values())
        return self.now - started >= delay

    def endpoints(self) -> EndpointSnapshot:
        out: list[Endpoint] = []
        for job_id in sorted(self.jobs):
            sim = self.jobs[job_id]
            meta = sim.job.get("Meta") or {}
            if meta.get(c.JOB_META_MANAGED_BY) != c.MANAGED_BY_VALUE or not sim.groups:
                continue
            rank0 = self._current(job_id).get(sim.groups[0].name)
            if rank0 is None or rank0.client_status not in ("running", "unknown"):
                continue
            node = self.nodes[rank0.node_id]
            if node.status != "ready":
                # The agent of a node that is away stops answering; Consul marks its checks critical.
                status = HealthStatus.CRITICAL
            else:
                status = HealthStatus.PASSING if self.healthy(job_id) else HealthStatus.CRITICAL
            model = str(meta.get(c.JOB_META_MODEL))
            out.append(
                Endpoint(
                    service_id=f"_nomad-task-{rank0.alloc_id}-engine",
                    node=node.name,
                    model=model,
                    model_slug=slug(model),
                    replica=job_id,
                    alloc_id=rank0.alloc_id,
                    address="127.0.0.1",
                    port=20000 + int(rank0.alloc_id.rsplit("-", 1)[1]),
                    engine="sim",
                    profile=int(meta.get(c.JOB_META_PROFILE, "0")),
                    simulated=True,
                    status=status,
                )
            )
        return EndpointSnapshot(tuple(out), self.index)

    # -- what tests look at ----------------------------------------------------------------------------

    def running_jobs(self, model: str | None = None) -> list[str]:
        out = []
        for job_id, sim in sorted(self.jobs.items()):
            meta = sim.job.get("Meta") or {}
            if meta.get(c.JOB_META_MANAGED_BY) != c.MANAGED_BY_VALUE or sim.stop:
                continue
            if model is None or meta.get(c.JOB_META_MODEL) == model:
                out.append(job_id)
        return out

    def healthy_jobs(self, model: str | None = None) -> list[str]:
        return [j for j in self.running_jobs(model) if self.healthy(j)]

    def gpus_in_use(self) -> dict[str, list[str]]:
        """GPU id -> the allocations holding it (a correct scheduler never lists two)."""
        out: dict[str, list[str]] = {}
        for alloc in self.allocs.values():
            if alloc.desired_status == "run" and not _terminal(alloc):
                for gpu in alloc.gpus:
                    out.setdefault(gpu, []).append(alloc.alloc_id)
        return out

    # -- internals --------------------------------------------------------------------------------------

    def _allocs_of(self, job_id: str | None) -> list[SimAlloc]:
        return [a for a in self.allocs.values() if a.job_id == job_id]

    def _current(self, job_id: str) -> dict[str, SimAlloc]:
        out: dict[str, SimAlloc] = {}
        for alloc in self._allocs_of(job_id):
            if alloc.desired_status == "run":
                out[alloc.group] = alloc
        return out

    def _free(self, node: SimNode, taken: Mapping[str, int]) -> list[str]:
        used = {
            g for a in self.allocs.values() if a.node_id == node.node_id and not _terminal(a) for g in a.gpus
        }
        free = [g for g in node.gpus if g not in used]
        return free[taken.get(node.node_id, 0) :]

    def _fit(self, group: SimGroup, taken: Mapping[str, int], exclude: set[str]) -> SimNode | None:
        """First fit by node name; the groups of one job on distinct nodes (distinct_hosts)."""
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            if node.status != "ready" or not node.eligible or node.node_id in exclude:
                continue
            if node.node_id in group.not_on:
                continue
            if group.fabric is not None and node.fabric != group.fabric:
                continue
            if group.gpus and group.gpu_model and group.gpu_model.lower() != node.gpu_model.lower():
                continue
            if len(self._free(node, taken)) >= group.gpus:
                return node
        return None

    def _why_not(self, group: SimGroup) -> str:
        where = f" on fabric {group.fabric}" if group.fabric else ""
        kind = f" {group.gpu_model}" if group.gpu_model else ""
        return f"no ready node with {group.gpus} free{kind} GPUs{where}"

    def _place(self, sim: SimJob, group: SimGroup) -> None:
        job_id = str(sim.job["ID"])
        used = {a.node_id for a in self._allocs_of(job_id) if a.desired_status == "run" and not _terminal(a)}
        node = self._fit(group, {}, used)
        if node is None:
            sim.queued.append(group.name)
            return
        alloc = SimAlloc(
            alloc_id=f"alloc-{next(self._ids):06d}",
            job_id=str(sim.job["ID"]),
            group=group.name,
            node_id=node.node_id,
            gpus=self._free(node, {})[: group.gpus],
            created_at=self.now,
        )
        self.allocs[alloc.alloc_id] = alloc
        self._alloc_event(alloc)

    def _alloc_event(self, alloc: SimAlloc) -> None:
        self._event("Allocation", "AllocationUpdated", alloc.alloc_id, {"Allocation": self.alloc_json(alloc)})

    def _event(self, topic: str, kind: str, key: str, payload: JSON) -> None:
        self.index += 1
        self.events.append(
            (self.index, {"Topic": topic, "Type": kind, "Key": key, "Index": self.index, "Payload": payload})
        )
        if self.changed is not None:
            self.changed.set()


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _terminal(alloc: SimAlloc) -> bool:
    return alloc.client_status in ("complete", "failed", "lost")


def _task(gpus: int, gpu_model: str | None) -> JSON:
    device: JSON = {"Name": "nvidia/gpu", "Count": gpus}
    if gpu_model:
        device["Constraints"] = [{"LTarget": "${device.model}", "Operand": "=", "RTarget": gpu_model}]
    return {"Name": "engine", "Driver": "raw_exec", "Resources": {"Devices": [device] if gpus else []}}


def _groups_of(job: JSON) -> list[SimGroup]:
    out: list[SimGroup] = []
    not_on = frozenset(
        str(con.get("RTarget"))
        for con in job.get("Constraints") or []
        if con.get("LTarget") == "${node.unique.id}" and con.get("Operand") == "!="
    )
    for group in job.get("TaskGroups") or []:
        fabric = next(
            (
                con.get("RTarget")
                for con in group.get("Constraints") or []
                if con.get("LTarget") == f"${{meta.{c.NODE_META_FABRIC}}}"
            ),
            None,
        )
        gpus, model = 0, None
        for task in group.get("Tasks") or []:
            for device in (task.get("Resources") or {}).get("Devices") or []:
                gpus += int(device.get("Count") or 0)
                for con in device.get("Constraints") or []:
                    if con.get("LTarget") == "${device.model}":
                        model = con.get("RTarget")
        out.append(SimGroup(str(group["Name"]), gpus, model, fabric, not_on))
    return out


# --- rendering without templates -------------------------------------------------------------------


class FakeRenderer:
    """``JobRenderer`` for tests: job JSON (in ``hcl``) with llmgw's meta, one group per node."""

    def __init__(self, *, version: str = __version__, template_version: str = "1") -> None:
        self.version = version
        self.template_version = template_version
        self.refuse: set[tuple[str, int]] = set()  # (model, profile) that fail to render
        self.renders = 0

    def render(self, catalog: Catalog, request: ReplicaRequest, *, catalog_hash: str) -> RenderedJob:
        self.renders += 1
        model = catalog.models.get(request.model)
        if model is None or not 0 <= request.profile_index < len(model.profiles):
            raise RenderError(f"model {request.model!r} has no profile {request.profile_index}")
        if (request.model, request.profile_index) in self.refuse:
            raise RenderError(f"model {request.model!r} profile {request.profile_index}: refused by policy")
        profile = model.profiles[request.profile_index]
        if profile.node_count > 1 and request.fabric is None:
            raise RenderError(
                f"model {request.model!r}: a replica on {profile.node_count} nodes needs a fabric"
            )
        job_id = job_id_for(request.model, request.replica_id)
        spec_hash = hashlib.sha256(
            (profile.model_dump_json() + "\x00" + self.template_version).encode()
        ).hexdigest()
        gpu_model = profile.gpu.model if profile.gpu and profile.gpu.model else None
        gpus = profile.gpus_per_replica_node if profile.requests_gpus else 0
        groups = []
        for rank in range(profile.node_count):
            group: JSON = {"Name": f"rank{rank}", "Count": 1, "Tasks": [_task(gpus, gpu_model)]}
            if request.fabric is not None:
                group["Constraints"] = [
                    {"LTarget": f"${{meta.{c.NODE_META_FABRIC}}}", "Operand": "=", "RTarget": request.fabric}
                ]
            groups.append(group)
        meta = {
            c.JOB_META_MANAGED_BY: c.MANAGED_BY_VALUE,
            c.JOB_META_MODEL: request.model,
            c.JOB_META_PROFILE: str(request.profile_index),
            c.JOB_META_REPLICA: request.replica_id,
            c.JOB_META_CATALOG_HASH: catalog_hash,
            c.JOB_META_SPEC_HASH: spec_hash,
            c.JOB_META_VERSION: self.version,
        }
        if request.fabric:
            meta[c.JOB_META_FABRIC] = request.fabric
        job = {"ID": job_id, "Name": job_id, "Type": "service", "Meta": meta, "TaskGroups": groups}
        return RenderedJob(
            job_id, json.dumps(job, sort_keys=True), spec_hash, f"{profile.engine}.nomad.hcl.j2"
        )

    def check(self, rendered: RenderedJob, *, model: str) -> JSON:
        job: JSON = json.loads(rendered.hcl)
        return job

    def oracle(self, catalog: Catalog, catalog_hash: str) -> SpecOracle:
        def expected(model: str, profile_index: int, replica_id: str, fabric: str | None) -> str | None:
            try:
                return self.render(
                    catalog,
                    ReplicaRequest(model, profile_index, replica_id, fabric),
                    catalog_hash=catalog_hash,
                ).spec_hash
            except RenderError:
                return None

        return expected


# --- the pure core on a synthetic clock ------------------------------------------------------------


@dataclass
class Applied:
    at: float
    action: Action
    outcome: Outcome


class Simulation:
    """observe -> decide -> apply -> record, synchronously, on ``cluster.now``.

    The applying is the real ``Executor`` over ``FakeNomad`` and the recorded fakes of the
    drain marks and the operator's commands, run on an event loop of the simulation's own:
    the one executor, so the unit tests of the decisions exercise what ``llmgw serve``
    applies, and still run hundreds of passes in milliseconds. Call it from synchronous
    code (an async test runs it in a thread: ``asyncio.to_thread``).
    """

    def __init__(
        self,
        catalog: Catalog,
        cluster: FakeCluster,
        *,
        settings: PlanningSettings | None = None,
        renderer: FakeRenderer | None = None,
        catalog_hash: str = "catalog-1",
    ) -> None:
        self.cluster = cluster
        self.settings = settings or PlanningSettings()
        self.renderer = renderer or FakeRenderer()
        self.nomad = FakeNomad(cluster)
        self.leader = FakeLeader(leader=True)
        self._drain_marks = FakeDrainMarks(FakeWatch({}))
        # The operator's commands by model (what Consul KV llmgw/commands/ would hold).
        self._commands = FakeCommands()
        self.executor = Executor(
            self.nomad,
            self.renderer,
            self._drain_marks,
            self.leader,
            ControlSettings(planning=self.settings),
            _ClusterClock(cluster),
            ControlMetrics(),
            self._commands,
        )
        self._loop = asyncio.new_event_loop()
        weakref.finalize(self, self._loop.close)
        self.state: PlannerState = EMPTY_STATE
        self.reports: dict[str, DemandReport] = {}
        self.in_flight: dict[str, int] = {}
        self.applied: list[Applied] = []
        self.decisions: list[Decision] = []
        self.capacity_version = 0
        self.catalog: Catalog | None = None
        self.desired: Desired | None = None
        self.set_catalog(catalog, catalog_hash)

    @property
    def now(self) -> float:
        return self.cluster.now

    @property
    def marks(self) -> Mapping[str, DrainMark]:
        """The drain marks the executor wrote, by job id (what Consul KV would hold)."""
        return self._drain_marks.marks

    @property
    def commands(self) -> Mapping[str, ModelCommand]:
        return self._commands.watch.latest or {}

    def set_catalog(self, catalog: Catalog | None, catalog_hash: str = "catalog-2") -> None:
        self.catalog = catalog
        self.catalog_hash = catalog_hash
        self.desired = (
            None
            if catalog is None
            else desired_from_catalog(
                catalog, catalog_hash, self.renderer.oracle(catalog, catalog_hash), self.settings
            )
        )

    def restart_leader(self) -> None:
        """A new leader: no memory, only what Nomad and Consul show."""
        self.state = EMPTY_STATE

    def use(
        self, model: str, *, in_flight: int = 0, queued: int = 0, wake: bool = False, router: str = "r1"
    ) -> None:
        """A router reports use of ``model`` now (replacing its earlier report of it)."""
        old = self.reports.get(router)
        others = tuple(m for m in (old.models if old else ()) if m.model != model)
        use = ModelUse(model=model, last_used=self.now, in_flight=in_flight, queued=queued, wake=wake)
        self.reports[router] = DemandReport(router_id=router, sent_at=self.now, models=(*others, use))

    def idle(self, model: str, router: str = "r1") -> None:
        """The router still reports the model, with nothing in flight and its last use kept."""
        old = self.reports.get(router)
        if old is None:
            return
        models = tuple(
            ModelUse(m.model, m.last_used, 0, 0, False) if m.model == model else m for m in old.models
        )
        self.reports[router] = DemandReport(router_id=router, sent_at=self.now, models=models)

    def refresh_reports(self) -> None:
        """Routers re-send their reports (same content, new time), as they do every few seconds."""
        self.reports = {k: DemandReport(r.router_id, self.now, r.models) for k, r in self.reports.items()}

    def observe(self) -> Observed:
        jobs: dict[JobId, ObservedJob] = {}
        for raw in self.cluster.jobs_json():
            full = self.cluster.job_json(str(raw["ID"]))
            job = parse_job(full)
            if job is None:
                continue
            stubs = self.cluster.allocs_json(str(raw["ID"]), resources=True)
            allocs = tuple(parse_alloc(a)[1] for a in stubs)
            jobs[job.job_id] = replace(job, allocs=allocs)
        nodes: dict[NodeId, ObservedNode] = {}
        for node_id in self.cluster.nodes:
            node = parse_node(self.cluster.node_json(node_id))
            nodes[node.node_id] = node
        endpoints = self.cluster.endpoints()
        health: dict[JobId, HealthStatus] = {}
        for e in endpoints.endpoints:
            health[JobId(e.replica)] = e.status
        return Observed(
            jobs=jobs,
            nodes=nodes,
            health=health,
            drain_marks={JobId(k): m.since for k, m in self.marks.items()},
            demand=aggregate_demand(self.reports.values(), self.now, self.settings.demand_stale_after),
            in_flight={JobId(k): v for k, v in self.in_flight.items()},
            capacity_version=self.capacity_version,
            # Every allocation the cluster still has, purged jobs' included, as the view counts them.
            gpus_freeing=sum(
                parse_alloc(a)[1].gpus_giving_back for a in self.cluster.allocs_json(resources=True)
            ),
        )

    def drain(self, model: str, *, by: str = "operator") -> None:
        """The operator drains ``model`` (as the admin API records it)."""
        assert self.desired is not None
        self._commands.drain(model, self.desired.models[model].key, by=by, at=self.now)

    def restart(self, model: str, *, by: str = "operator") -> None:
        self._commands.restart(model, by=by, at=self.now)

    def step(self, observed: Observed | None = None) -> Decision:
        observed = observed or self.observe()
        desired = replace(self.desired, commands=dict(self.commands)) if self.desired else None
        decision = decide(desired, observed, self.state, self.now, self.settings)
        outcomes = self.apply(decision.actions)
        self.state = record_outcomes(
            decision.state,
            outcomes,
            self.now,
            self.settings,
            capacity_version=observed.capacity_version,
            gpus_freeing=observed.gpus_freeing,
        )
        self.decisions.append(decision)
        return decision

    def apply(self, actions: Sequence[Action]) -> list[Outcome]:
        """The executor applies ``actions``; a job it deregisters frees capacity (as the view
        counts an allocation that ended)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "Simulation runs the executor on a loop of its own; "
                "from an async test, call it in a thread (asyncio.to_thread)"
            )
        deregistered = len(self.nomad.called("deregister"))
        outcomes = self._loop.run_until_complete(
            self.executor.apply(actions, self.catalog, self.catalog_hash)
        )
        self.capacity_version += len(self.nomad.called("deregister")) - deregistered
        self.applied.extend(Applied(self.now, a, o) for a, o in zip(actions, outcomes, strict=True))
        return outcomes

    def run(self, seconds: float, *, dt: float = 1.0) -> Decision | None:
        """Passes every ``dt`` seconds of synthetic time for ``seconds``; routers keep reporting."""
        last = None
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.cluster.advance(dt)
            self.refresh_reports()
            last = self.step()
        return last

    def actions(self, kind: type[Any] | None = None, *, model: str | None = None) -> list[Applied]:
        return [
            a
            for a in self.applied
            if (kind is None or isinstance(a.action, kind))
            and (model is None or getattr(a.action, "model", None) == model)
        ]


class _ClusterClock:
    """The executor's ``Clock`` in a ``Simulation``: the cluster's synthetic time. The
    executor only reads it (a drain mark's ``since``); nothing sleeps."""

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster

    def time(self) -> float:
        return self._cluster.now

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("the executor does not sleep in a Simulation")


# --- async fakes of the ports ------------------------------------------------------------------------


class FakeNomad:
    """``NomadPort`` over a ``FakeCluster``; records every call; can fail calls and break its stream."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, Exception] = {}  # method -> raised on its next call (once)
        self.buffer = 1000  # events the stream can replay; older ones are gone (Nomad's buffer)
        self._break = asyncio.Event()
        self.streams = 0

    def _enter(self, method: str, arg: str = "") -> None:
        self.calls.append((method, arg))
        exc = self.fail.pop(method, None)
        if exc is not None:
            raise exc

    def called(self, method: str) -> list[str]:
        return [arg for m, arg in self.calls if m == method]

    async def parse_hcl(self, hcl: str) -> JSON:
        self._enter("parse_hcl")
        job: JSON = json.loads(hcl)
        return job

    async def plan(self, job: JSON) -> FakePlan:
        self._enter("plan", str(job.get("ID")))
        return self.cluster.plan(job)

    async def register(self, job: JSON) -> FakeRegistered:
        self._enter("register", str(job.get("ID")))
        return FakeRegistered(self.cluster.register(job), self.cluster.warnings)

    async def deregister(self, job_id: str, *, purge: bool = True) -> None:
        self._enter("deregister", job_id)
        self.cluster.deregister(job_id, purge)

    async def put_variable(self, path: str, items: Mapping[str, str]) -> None:
        self._enter("put_variable", path)
        self.cluster.variables[path] = dict(items)

    async def delete_variable(self, path: str) -> None:
        self._enter("delete_variable", path)
        self.cluster.variables.pop(path, None)

    async def jobs(self, *, prefix: str | None = None) -> FakePage:
        self._enter("jobs", prefix or "")
        return FakePage(self.cluster.jobs_json(prefix), self.cluster.index)

    async def job(self, job_id: str) -> JSON | None:
        self._enter("job", job_id)
        return self.cluster.job_json(job_id) if job_id in self.cluster.jobs else None

    async def job_allocations(self, job_id: str) -> FakePage:
        self._enter("job_allocations", job_id)
        return FakePage(self.cluster.allocs_json(job_id), self.cluster.index)

    async def allocations(self, *, resources: bool = False) -> FakePage:
        self._enter("allocations", "resources" if resources else "")
        return FakePage(self.cluster.allocs_json(resources=resources), self.cluster.index)

    async def allocation(self, alloc_id: str) -> JSON | None:
        self._enter("allocation", alloc_id)
        alloc = self.cluster.allocs.get(alloc_id)
        return self.cluster.alloc_json(alloc) if alloc is not None else None

    async def nodes(self) -> FakePage:
        self._enter("nodes")
        return FakePage(self.cluster.nodes_json(), self.cluster.index)

    async def node(self, node_id: str) -> JSON | None:
        self._enter("node", node_id)
        return self.cluster.node_json(node_id) if node_id in self.cluster.nodes else None

    def break_stream(self) -> None:
        """The connection drops: the current stream raises."""
        self._break.set()

    async def events(self, topics: Sequence[str], *, index: int = 0) -> AsyncIterator[FakeEventBatch]:
        self._enter("events", str(index))
        self.streams += 1
        self._break = asyncio.Event()
        if self.cluster.changed is None:
            self.cluster.changed = asyncio.Event()
        # Nomad starts at the oldest retained event when ``index`` has left its buffer.
        retained = self.cluster.events[-self.buffer :] if self.buffer else []
        oldest = retained[0][0] if retained else self.cluster.index + 1
        position = max(index, oldest)
        while True:
            if self._break.is_set():
                raise ConnectionResetError("event stream connection reset")
            batch = [e for i, e in self.cluster.events if i >= position and e["Topic"] in topics]
            if batch:
                position = max(i for i, _ in self.cluster.events) + 1
                yield FakeEventBatch(position - 1, batch)
                continue
            position = self.cluster.index + 1
            changed = self.cluster.changed
            changed.clear()
            waiter = asyncio.ensure_future(changed.wait())
            breaker = asyncio.ensure_future(self._break.wait())
            try:
                await asyncio.wait({waiter, breaker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                breaker.cancel()


class FakeWatch(Generic[T]):
    """``Watched[T]``: tests ``set`` values; the loop sees them as a Consul watch would publish."""

    def __init__(self, value: T | None = None, *, ready: bool = True) -> None:
        self._latest = value
        self._generation = 1 if ready else 0
        self._changed = asyncio.Event()
        self.started = False

    @property
    def latest(self) -> T | None:
        return self._latest

    @property
    def generation(self) -> int:
        return self._generation

    def set(self, value: T) -> None:
        self._latest = value
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, generation: int) -> T:
        while self._generation <= generation:
            await self._changed.wait()
        return self._latest  # type: ignore[return-value]

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False


@dataclass
class FakeTerm:
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class FakeLeader:
    """``LeaderPort``: the test grants and revokes leadership."""

    def __init__(self, instance_id: str = "control-1", *, leader: bool = False) -> None:
        self.instance_id = instance_id
        self._term: FakeTerm | None = None
        self._granted = asyncio.Event()
        self.started = False
        if leader:
            self.grant()

    @property
    def is_leader(self) -> bool:
        return self._term is not None and not self._term.lost.is_set()

    def grant(self) -> FakeTerm:
        self._term = FakeTerm()
        self._granted.set()
        return self._term

    def lose_quietly(self) -> None:
        """Leadership is gone but the term has not been told yet (a renewal just failed)."""
        self._term = None

    def revoke(self) -> None:
        if self._term is not None:
            self._term.lost.set()
        self._term = None
        self._granted = asyncio.Event()

    async def wait_for_leadership(self) -> FakeTerm:
        while self._term is None or self._term.lost.is_set():
            await self._granted.wait()
        return self._term

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False
        self.revoke()


class FakeDrainMarks:
    """``DrainMarksPort`` that also publishes to a ``FakeWatch`` of the marks, like Consul would."""

    def __init__(self, watch: FakeWatch[Mapping[str, DrainMark]]) -> None:
        self.watch = watch
        self.marks: dict[str, DrainMark] = dict(watch.latest or {})
        self.calls: list[tuple[str, str]] = []

    async def set(self, mark: DrainMark) -> None:
        self.calls.append(("set", mark.job_id))
        self.marks[mark.job_id] = mark
        self.watch.set(dict(self.marks))

    async def clear(self, job_id: str) -> None:
        self.calls.append(("clear", job_id))
        self.marks.pop(job_id, None)
        self.watch.set(dict(self.marks))


class FakeCommands:
    """``CommandsPort`` over a ``FakeWatch`` of the records; tests ``drain`` and ``restart``."""

    def __init__(self, watch: FakeWatch[Mapping[str, ModelCommand]] | None = None) -> None:
        self.watch: FakeWatch[Mapping[str, ModelCommand]] = watch or FakeWatch({})
        self.ended: list[tuple[str, str]] = []

    def _put(self, command: ModelCommand) -> None:
        self.watch.set({**(self.watch.latest or {}), command.model: command})

    def _get(self, model: str) -> ModelCommand:
        return (self.watch.latest or {}).get(model) or ModelCommand(model)

    def drain(self, model: str, model_key: str, *, by: str, at: float) -> None:
        self._put(self._get(model).drained(model_key=model_key, by=by, at=at))

    def restart(self, model: str, *, by: str, at: float) -> None:
        self._put(self._get(model).restarted(by=by, at=at))

    async def end_drain(self, model: str, drained_key: str) -> None:
        self.ended.append((model, drained_key))
        command = (self.watch.latest or {}).get(model)
        if command is not None and command.drained_key == drained_key:
            self._put(command.drain_ended())


class FakeStatus:
    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, text: str) -> None:
        self.published.append(text)

    def last(self) -> Any:
        return json.loads(self.published[-1]) if self.published else None


class FakeProbe:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # job id -> in flight

    async def in_flight(self, endpoint: Endpoint) -> int | None:
        return self.counts.get(endpoint.replica)


class ManualClock:
    """Virtual wall time: ``sleep`` returns when a test ``advance``s past its deadline.

    ``advance`` lets the woken tasks run until the loop is idle (``_settle``) before it
    wakes the next sleeper or returns, so a test sees everything the time it moved caused."""

    def __init__(self, start: float = START) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._seq), future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward to each due sleeper in turn, letting woken tasks run in between."""
        end = self.now + seconds
        while True:
            await _settle()
            if not self._sleepers or self._sleepers[0][0] > end:
                break
            self.now = max(self.now, self._sleepers[0][0])
            while self._sleepers and self._sleepers[0][0] <= self.now:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
        self.now = end
        await _settle()


# A task that never blocks (awaits ``sleep(0)`` in a loop) would keep the loop busy forever:
# after this many yields ``_settle`` fails the test and says so instead of hanging it.
_SETTLE_LIMIT = 10_000


async def _settle() -> None:
    """Return once every other task waits on something (a future, a sleeper, a socket): the
    loop has nothing ready to run but this task's own wake-up.

    The loop runs, per iteration, the callbacks in its ready queue (CPython's
    ``asyncio/base_events.py``, ``BaseEventLoop._run_once``: I/O events and due timers are
    queued there first); a task woken by a future, an event or a ``sleep(0)`` is one of
    them. When this task resumes and the queue is empty, nothing else can run until a
    sleeper is woken, a socket or a timer fires, or a thread calls back.
    """
    loop = asyncio.get_running_loop()
    ready = loop._ready  # type: ignore[attr-defined]
    for _ in range(_SETTLE_LIMIT):
        await asyncio.sleep(0)
        if not ready:
            return
    raise AssertionError(f"the event loop never went idle in {_SETTLE_LIMIT} rounds: a task spins")


# --- the whole plane on fakes ------------------------------------------------------------------------


class ControlHarness:
    """A ``ControlPlane`` wired to fakes of every port, on virtual time.

    ``await h.advance(seconds)`` moves the clock a second at a time; after each second the
    simulated cluster catches up (allocations start, engines pass their checks) and
    Consul's endpoint watch publishes what changed, as the real watches would.
    """

    def __init__(
        self,
        catalog_text: str | None,
        policy: SecurityPolicy,
        *,
        settings: ControlSettings | None = None,
        cluster: FakeCluster | None = None,
        clock: ManualClock | None = None,
        leader: FakeLeader | None = None,
        marks: FakeDrainMarks | None = None,
        commands: FakeCommands | None = None,
        instance_id: str = "control-1",
        engine_keys: EngineKeys | None = None,
    ) -> None:
        self.clock = clock or ManualClock()
        self.cluster = cluster or FakeCluster(start=self.clock.now)
        self.nomad = FakeNomad(self.cluster)
        self.renderer = FakeRenderer()
        self.leader = leader or FakeLeader(instance_id, leader=True)
        self.catalog: FakeWatch[Any] = FakeWatch(
            None if catalog_text is None else CatalogVersion.of(1, catalog_text, "test", self.clock.now)
        )
        self.endpoints: FakeWatch[EndpointSnapshot] = FakeWatch(self.cluster.endpoints())
        self.marks = marks or FakeDrainMarks(FakeWatch({}))
        self.demand: FakeWatch[Mapping[str, DemandReport]] = FakeWatch({})
        self.status = FakeStatus()
        self.probe = FakeProbe()
        self.commands = commands or FakeCommands()
        self.settings = settings or ControlSettings()
        self.deps = ControlDeps(
            nomad=self.nomad,
            renderer=self.renderer,
            leader=self.leader,
            catalog=self.catalog,
            endpoints=self.endpoints,
            drain_marks=self.marks.watch,
            drain_writer=self.marks,
            demand=self.demand,
            status=self.status,
            policy=policy,
            clock=self.clock,
            probe=self.probe,
            commands=self.commands.watch,
            command_writer=self.commands,
            engine_keys=engine_keys,
        )
        self.plane = ControlPlane(self.settings, self.deps)
        self._versions = 1

    async def __aenter__(self) -> ControlHarness:
        await self.plane.start()
        await _settle()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.plane.stop()

    def apply_catalog(self, text: str) -> None:
        self._versions += 1
        self.catalog.set(CatalogVersion.of(self._versions, text, "test", self.clock.now))

    def use(self, model: str, *, in_flight: int = 0, queued: int = 0, wake: bool = False) -> None:
        report = DemandReport(
            "router-1",
            self.clock.now,
            (ModelUse(model, self.clock.now, in_flight, queued, wake),),
        )
        self.demand.set({"router-1": report})

    def sync_consul(self) -> None:
        snapshot = self.cluster.endpoints()
        latest = self.endpoints.latest
        if latest is None or latest.endpoints != snapshot.endpoints:
            self.endpoints.set(snapshot)

    async def advance(self, seconds: float, *, step: float = 1.0) -> None:
        steps = max(1, round(seconds / step))
        for _ in range(steps):
            await self.clock.advance(step)
            self.cluster.tick(self.clock.now)
            self.sync_consul()
            await _settle()
