"""The stand-in's state store: nodes, jobs, evaluations and allocations, with Raft-like indexes.

Owns: the records, the single monotonically increasing index, per-table indexes for
blocking queries, and ``Store.txn(kind)``: every write happens inside a transaction
that bumps the index once, stamps the changed objects' ModifyIndex, publishes one
event batch (typed like Nomad's FSM message types) and wakes blocked readers.

Everything runs on one event loop, so a transaction is just a context manager: no locks.

Must not: schedule, run processes or speak HTTP. Rendering records as API JSON lives
here because it needs only the records (``alloc_json`` etc.).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from llmgw.devcluster.nomad.apishape import GO_ZERO_TIME, fill
from llmgw.devcluster.nomad.config import NodeSpec
from llmgw.devcluster.nomad.events import EventBroker

JSON = dict[str, Any]
_R = TypeVar("_R")
NAMESPACE = "default"

# Event types, keyed by the FSM message that caused them (nomad/state/events.go).
EV_JOB_REGISTERED = "JobRegistered"
EV_JOB_DEREGISTERED = "JobDeregistered"
EV_PLAN_RESULT = "PlanResult"
EV_ALLOC_UPDATED = "AllocationUpdated"
EV_ALLOC_DESIRED = "AllocationUpdateDesiredStatus"
EV_EVAL_UPDATED = "EvaluationUpdated"
EV_NODE_REGISTRATION = "NodeRegistration"
EV_NODE_EVENT = "NodeStreamEvent"


def now_ns() -> int:
    return time.time_ns()


def go_time(ns: int) -> str:
    """A Unix-nanosecond time as Go's encoding/json writes a time.Time (RFC 3339, UTC)."""
    if ns <= 0:
        return GO_ZERO_TIME
    seconds, nanos = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f".{nanos:09d}".rstrip("0") if nanos else ""
    return f"{base}{frac}Z"


# ---------------------------------------------------------------------------
# Records


@dataclass
class NodeRecord:
    spec: NodeSpec
    id: str
    attributes: dict[str, str]
    meta: dict[str, str]
    devices: list[JSON]  # NodeDeviceResource documents
    drivers: dict[str, JSON]
    http_addr: str
    status: str = "ready"
    status_description: str = ""
    events: list[JSON] = field(default_factory=list)
    create_index: int = 0
    modify_index: int = 0
    status_updated_at: int = 0  # unix seconds, like Node.StatusUpdatedAt
    # Simulation: the client agent is dead (no heartbeats) since this loop time.
    failed_at: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class JobRecord:
    job: JSON  # api.Job as submitted and canonicalized (server-managed fields overwritten on output)
    version: int = 0
    status: str = "pending"
    stop: bool = False
    stable: bool = False
    create_index: int = 0
    modify_index: int = 0
    job_modify_index: int = 0
    submit_time: int = 0

    @property
    def id(self) -> str:
        return str(self.job["ID"])


@dataclass
class EvalRecord:
    id: str
    job_id: str
    triggered_by: str
    priority: int = 50
    type: str = "service"
    status: str = "pending"
    status_description: str = ""
    node_id: str = ""
    node_modify_index: int = 0
    job_modify_index: int = 0
    previous_eval: str = ""
    next_eval: str = ""
    blocked_eval: str = ""
    failed_tg_allocs: dict[str, JSON] | None = None
    queued_allocations: dict[str, int] = field(default_factory=dict)
    class_eligibility: dict[str, bool] | None = None
    escaped_computed_class: bool = False
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0


@dataclass
class TaskStateRecord:
    state: str = "pending"
    failed: bool = False
    restarts: int = 0
    last_restart: int = 0
    started_at: int = 0
    finished_at: int = 0
    events: list[JSON] = field(default_factory=list)

    def as_json(self) -> JSON:
        return fill(
            "TaskState",
            {
                "State": self.state,
                "Failed": self.failed,
                "Restarts": self.restarts,
                "LastRestart": go_time(self.last_restart),
                "StartedAt": go_time(self.started_at),
                "FinishedAt": go_time(self.finished_at),
                "Events": [fill("TaskEvent", e) for e in self.events],
            },
        )


@dataclass
class AllocRecord:
    id: str
    eval_id: str
    name: str
    node_id: str
    node_name: str
    job_id: str
    job: JSON  # the job version this alloc runs, as rendered by job_json
    job_version: int
    task_group: str
    allocated: JSON  # AllocatedResources
    metrics: JSON
    desired_status: str = "run"
    desired_description: str = ""
    desired_transition: JSON = field(default_factory=dict)
    client_status: str = "pending"
    client_description: str = ""
    task_states: dict[str, TaskStateRecord] = field(default_factory=dict)
    previous_allocation: str = ""
    next_allocation: str = ""
    followup_eval_id: str = ""
    reschedule_events: list[JSON] = field(default_factory=list)
    # When its client status last became "unknown" (Nomad's LastUnknown, from AllocStates);
    # 0 when it never did. Its disconnect { lost_after } counts from here.
    unknown_since: int = 0
    # Nomad's AllocStates: each ClientStatus change the server made (unknown, lost), with
    # its time ({"Field": 0, "Value", "Time"}; AllocStateFieldClientStatus is 0).
    alloc_states: list[JSON] = field(default_factory=list)
    # Lost because its lost_after ran out: Nomad replaces it whatever the group says.
    expired: bool = False
    # The deployment it was placed under, and its health there (AllocDeploymentStatus):
    # None until the client says, then healthy or not at ``deployment_health_at``.
    deployment_id: str = ""
    deployment_healthy: bool | None = None
    deployment_health_at: int = 0
    create_index: int = 0
    modify_index: int = 0
    alloc_modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    @property
    def index(self) -> int:
        """The N in ``job.group[N]``."""
        return int(self.name.rsplit("[", 1)[1].rstrip("]"))

    def server_terminal(self) -> bool:
        return self.desired_status in ("stop", "evict")

    def client_terminal(self) -> bool:
        return self.client_status in ("complete", "failed", "lost")

    def terminal(self) -> bool:
        """Nomad's Allocation.TerminalStatus."""
        return self.server_terminal() or self.client_terminal()


@dataclass
class DeploymentRecord:
    """One Nomad deployment (nomad/structs/deployment.go): a job version rolled out under its
    groups' update strategies; ``groups`` holds each group's DeploymentState as Nomad's JSON,
    but for ``RequireProgressBy`` in unix nanoseconds (0: not started)."""

    id: str
    job_id: str
    job_version: int
    job_create_index: int
    job_modify_index: int
    groups: dict[str, JSON]
    status: str = "running"
    status_description: str = "Deployment is running"
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    def active(self) -> bool:
        return self.status in ("running", "paused", "pending", "blocked", "unblocking", "initializing")


# ---------------------------------------------------------------------------
# Store


@dataclass
class _Txn:
    kind: str
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    evals: dict[str, EvalRecord] = field(default_factory=dict)
    allocs: dict[str, AllocRecord] = field(default_factory=dict)
    deployments: dict[str, DeploymentRecord] = field(default_factory=dict)
    deleted_jobs: set[str] = field(default_factory=set)
    alloc_server_change: set[str] = field(default_factory=set)


class Store:
    """All records plus the index; only touched from the event loop."""

    def __init__(self, broker: EventBroker, region: str) -> None:
        self.broker = broker
        self.region = region
        self.index = 1
        self.table_index: dict[str, int] = {"nodes": 1, "jobs": 1, "evals": 1, "allocs": 1, "deployment": 1}
        self.nodes: dict[str, NodeRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.evals: dict[str, EvalRecord] = {}
        self.allocs: dict[str, AllocRecord] = {}
        self.deployments: dict[str, DeploymentRecord] = {}
        self._changed = asyncio.Event()
        # Blocking queries parked in ``wait_change`` right now: a test writes once its
        # query is parked instead of sleeping first.
        self.waiting = 0
        self._txn: _Txn | None = None

    # -- writes -----------------------------------------------------------

    @contextmanager
    def txn(self, kind: str) -> Iterator[_Txn]:
        """One write: every touched object gets the same new index, one event batch is published."""
        if self._txn is not None:
            # Nested writes join the outer transaction (same index, same event type).
            yield self._txn
            return
        tx = _Txn(kind)
        self._txn = tx
        try:
            yield tx
        finally:
            self._txn = None
        self._commit(tx)

    def touch_node(self, node: NodeRecord) -> None:
        self._require_txn().nodes[node.id] = node

    def touch_job(self, job: JobRecord) -> None:
        self._require_txn().jobs[job.id] = job

    def touch_eval(self, ev: EvalRecord) -> None:
        self._require_txn().evals[ev.id] = ev

    def touch_alloc(self, alloc: AllocRecord, *, server: bool = False) -> None:
        tx = self._require_txn()
        tx.allocs[alloc.id] = alloc
        if server:
            tx.alloc_server_change.add(alloc.id)

    def touch_deployment(self, deployment: DeploymentRecord) -> None:
        self._require_txn().deployments[deployment.id] = deployment

    def delete_job(self, job_id: str) -> None:
        tx = self._require_txn()
        tx.deleted_jobs.add(job_id)
        tx.jobs.pop(job_id, None)

    def _require_txn(self) -> _Txn:
        if self._txn is None:
            raise RuntimeError("state writes must happen inside Store.txn()")
        return self._txn

    def _commit(self, tx: _Txn) -> None:
        if not (tx.nodes or tx.jobs or tx.evals or tx.allocs or tx.deployments or tx.deleted_jobs):
            return
        self.index += 1
        index = self.index
        stamp = now_ns()
        for node in tx.nodes.values():
            if node.create_index == 0:
                node.create_index = index
            node.modify_index = index
        for ev in tx.evals.values():
            _stamp(ev, index, stamp)
        for alloc in tx.allocs.values():
            # AllocModifyIndex moves on creation and on server-side changes only.
            if _stamp(alloc, index, stamp) or alloc.id in tx.alloc_server_change:
                alloc.alloc_modify_index = index
        for deployment in tx.deployments.values():
            _stamp(deployment, index, stamp)
        self._put("nodes", self.nodes, tx.nodes, index)
        self._put("evals", self.evals, tx.evals, index)
        self._put("allocs", self.allocs, tx.allocs, index)
        self._put("deployment", self.deployments, tx.deployments, index)
        for job in tx.jobs.values():
            self.jobs[job.id] = job
        for job_id in tx.deleted_jobs:
            self.jobs.pop(job_id, None)
            self.table_index["jobs"] = index
        # Job status follows its allocations and evaluations in the same write, as in
        # Nomad's setJobStatus; a status change is itself a job change.
        touched = (
            {a.job_id for a in tx.allocs.values()} | {e.job_id for e in tx.evals.values()} | set(tx.jobs)
        )
        for job_id in touched - tx.deleted_jobs:
            found = self.jobs.get(job_id)
            if found is None:
                continue
            status = self.job_status(found)
            if status != found.status or job_id in tx.jobs:
                found.status = status
                tx.jobs[job_id] = found
        for job in tx.jobs.values():
            if job.create_index == 0:
                job.create_index = index
            job.modify_index = index
            self.table_index["jobs"] = index
        self.broker.publish(index, self._events(tx, index))
        self._changed.set()
        self._changed = asyncio.Event()

    def _put(self, table: str, records: dict[str, _R], written: dict[str, _R], index: int) -> None:
        if written:
            records.update(written)
            self.table_index[table] = index

    def _events(self, tx: _Txn, index: int) -> list[JSON]:
        events: list[JSON] = []

        def add(topic: str, key: str, filter_keys: list[str] | None, payload: JSON, namespace: str) -> None:
            events.append(_event(topic, tx.kind, key, filter_keys, namespace, index, {topic: payload}))

        for ev in tx.evals.values():
            add("Evaluation", ev.id, [ev.job_id, ""], self.eval_json(ev), NAMESPACE)
        for alloc in tx.allocs.values():
            body = self.alloc_json(alloc)
            body["Job"] = None  # Nomad strips the job to keep alloc events small
            add("Allocation", alloc.id, [alloc.job_id, ""], body, NAMESPACE)
        for deployment in tx.deployments.values():
            add("Deployment", deployment.id, [deployment.job_id], self.deployment_json(deployment), NAMESPACE)
        for job in tx.jobs.values():
            add("Job", job.id, None, self.job_json(job), NAMESPACE)
        for node in tx.nodes.values():
            add("Node", node.id, None, self.node_json(node), "")
        return events

    async def wait_change(self, seconds: float) -> None:
        """Sleep until the next commit or ``seconds``, whichever comes first."""
        changed = self._changed
        self.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), seconds)
        finally:
            self.waiting -= 1

    # -- reads ------------------------------------------------------------

    def job_allocs(self, job_id: str) -> list[AllocRecord]:
        return sorted((a for a in self.allocs.values() if a.job_id == job_id), key=lambda a: a.create_index)

    def node_allocs(self, node_id: str) -> list[AllocRecord]:
        return sorted((a for a in self.allocs.values() if a.node_id == node_id), key=lambda a: a.create_index)

    def job_deployments(self, job_id: str) -> list[DeploymentRecord]:
        """Newest first, as ``/v1/job/:id/deployments`` lists them."""
        found = [d for d in self.deployments.values() if d.job_id == job_id]
        return sorted(found, key=lambda d: d.create_index, reverse=True)

    def latest_deployment(self, job: JobRecord) -> DeploymentRecord | None:
        """Nomad's LatestDeploymentByJobID, for the job as it is now (same create index)."""
        for deployment in self.job_deployments(job.id):
            if deployment.job_create_index == job.create_index:
                return deployment
        return None

    def deployment_json(self, deployment: DeploymentRecord) -> JSON:
        return fill(
            "Deployment",
            {
                "ID": deployment.id,
                "Namespace": NAMESPACE,
                "JobID": deployment.job_id,
                "JobVersion": deployment.job_version,
                "JobModifyIndex": deployment.job_modify_index,
                "JobSpecModifyIndex": deployment.job_modify_index,
                "JobCreateIndex": deployment.job_create_index,
                "TaskGroups": {
                    name: {**state, "RequireProgressBy": go_time(int(state["RequireProgressBy"]))}
                    for name, state in deployment.groups.items()
                },
                "Status": deployment.status,
                "StatusDescription": deployment.status_description,
                "CreateIndex": deployment.create_index,
                "ModifyIndex": deployment.modify_index,
                "CreateTime": deployment.create_time,
                "ModifyTime": deployment.modify_time,
            },
        )

    def job_evals(self, job_id: str) -> list[EvalRecord]:
        return sorted((e for e in self.evals.values() if e.job_id == job_id), key=lambda e: e.create_index)

    def job_status(self, job: JobRecord) -> str:
        """Nomad's getJobStatus for service and batch jobs."""
        has_alloc = False
        for alloc in self.allocs.values():
            if alloc.job_id != job.id:
                continue
            has_alloc = True
            if not alloc.terminal():
                return "running"
        has_eval = False
        for ev in self.evals.values():
            if ev.job_id != job.id:
                continue
            has_eval = True
            if ev.status not in ("complete", "failed", "canceled"):
                return "pending"
        if has_eval or has_alloc:
            return "dead"
        return "pending"

    # -- JSON -------------------------------------------------------------

    def job_json(self, job: JobRecord) -> JSON:
        doc = copy.deepcopy(job.job)
        doc.update(
            {
                "Status": job.status,
                "StatusDescription": "",
                "Stop": job.stop,
                "Stable": job.stable,
                "Version": job.version,
                "SubmitTime": job.submit_time,
                "CreateIndex": job.create_index,
                "ModifyIndex": job.modify_index,
                "JobModifyIndex": job.job_modify_index,
            }
        )
        return fill("Job", doc)

    def job_summary(self, job: JobRecord) -> JSON:
        summary: dict[str, JSON] = {}
        for group in job.job.get("TaskGroups") or []:
            summary[group["Name"]] = {
                "Queued": 0,
                "Complete": 0,
                "Failed": 0,
                "Running": 0,
                "Starting": 0,
                "Lost": 0,
                "Unknown": 0,
            }
        for ev in self.evals.values():
            if ev.job_id == job.id and ev.status == "blocked":
                for group, n in ev.queued_allocations.items():
                    if group in summary:
                        summary[group]["Queued"] += n
        for alloc in self.allocs.values():
            if alloc.job_id != job.id or alloc.task_group not in summary:
                continue
            row = summary[alloc.task_group]
            key = {
                "pending": "Starting",
                "running": "Running",
                "complete": "Complete",
                "failed": "Failed",
                "lost": "Lost",
                "unknown": "Unknown",
            }.get(alloc.client_status)
            if key:
                row[key] += 1
        return fill(
            "JobSummary",
            {
                "JobID": job.id,
                "Namespace": NAMESPACE,
                "Summary": summary,
                "Children": {"Pending": 0, "Running": 0, "Dead": 0},
                "CreateIndex": job.create_index,
                "ModifyIndex": job.modify_index,
            },
        )

    def job_stub(self, job: JobRecord, *, with_meta: bool = False) -> JSON:
        doc = job.job
        stub = {
            "ID": job.id,
            "ParentID": doc.get("ParentID") or "",
            "Name": doc.get("Name") or job.id,
            "Namespace": NAMESPACE,
            "Datacenters": doc.get("Datacenters"),
            "Type": doc.get("Type") or "service",
            "Priority": doc.get("Priority") or 50,
            "Periodic": False,
            "ParameterizedJob": False,
            "Stop": job.stop,
            "Status": job.status,
            "StatusDescription": "",
            "JobSummary": self.job_summary(job),
            "CreateIndex": job.create_index,
            "ModifyIndex": job.modify_index,
            "JobModifyIndex": job.job_modify_index,
            "SubmitTime": job.submit_time,
        }
        if with_meta:
            stub["Meta"] = doc.get("Meta")
        out = fill("JobListStub", stub)
        if not with_meta:
            # Nomad only sends Meta when asked (?meta=true); it is omitempty otherwise.
            out.pop("Meta", None)
        return out

    def eval_json(self, ev: EvalRecord) -> JSON:
        return fill(
            "Evaluation",
            {
                "ID": ev.id,
                "Priority": ev.priority,
                "Type": ev.type,
                "TriggeredBy": ev.triggered_by,
                "Namespace": NAMESPACE,
                "JobID": ev.job_id,
                "JobModifyIndex": ev.job_modify_index,
                "NodeID": ev.node_id,
                "NodeModifyIndex": ev.node_modify_index,
                "Status": ev.status,
                "StatusDescription": ev.status_description,
                "NextEval": ev.next_eval,
                "PreviousEval": ev.previous_eval,
                "BlockedEval": ev.blocked_eval,
                "FailedTGAllocs": ev.failed_tg_allocs,
                "ClassEligibility": ev.class_eligibility,
                "EscapedComputedClass": ev.escaped_computed_class,
                "QueuedAllocations": ev.queued_allocations,
                "SnapshotIndex": ev.modify_index,
                "CreateIndex": ev.create_index,
                "ModifyIndex": ev.modify_index,
                "CreateTime": ev.create_time,
                "ModifyTime": ev.modify_time,
            },
        )

    def alloc_json(self, alloc: AllocRecord) -> JSON:
        return fill(
            "Allocation",
            {
                "ID": alloc.id,
                "Namespace": NAMESPACE,
                "EvalID": alloc.eval_id,
                "Name": alloc.name,
                "NodeID": alloc.node_id,
                "NodeName": alloc.node_name,
                "JobID": alloc.job_id,
                "Job": alloc.job,
                "TaskGroup": alloc.task_group,
                "AllocatedResources": alloc.allocated,
                "Metrics": alloc.metrics,
                "DesiredStatus": alloc.desired_status,
                "DesiredDescription": alloc.desired_description,
                "DesiredTransition": alloc.desired_transition,
                "ClientStatus": alloc.client_status,
                "ClientDescription": alloc.client_description,
                "TaskStates": {name: ts.as_json() for name, ts in alloc.task_states.items()} or None,
                "AllocStates": list(alloc.alloc_states) or None,
                "PreviousAllocation": alloc.previous_allocation,
                "NextAllocation": alloc.next_allocation,
                "FollowupEvalID": alloc.followup_eval_id,
                "RescheduleTracker": {"Events": alloc.reschedule_events, "LastReschedule": ""}
                if alloc.reschedule_events
                else None,
                "DeploymentID": alloc.deployment_id,
                "DeploymentStatus": _deployment_status(alloc),
                "CreateIndex": alloc.create_index,
                "ModifyIndex": alloc.modify_index,
                "AllocModifyIndex": alloc.alloc_modify_index,
                "CreateTime": alloc.create_time,
                "ModifyTime": alloc.modify_time,
            },
        )

    def alloc_stub(self, alloc: AllocRecord, *, resources: bool = False) -> JSON:
        """An AllocListStub as Nomad lists it: ``AllocatedResources`` is left out (null here)
        unless asked for, which only ``GET /v1/allocations?resources=true`` can do."""
        return fill(
            "AllocationListStub",
            {
                "ID": alloc.id,
                "EvalID": alloc.eval_id,
                "Name": alloc.name,
                "Namespace": NAMESPACE,
                "NodeID": alloc.node_id,
                "NodeName": alloc.node_name,
                "JobID": alloc.job_id,
                "JobType": alloc.job.get("Type") or "service",
                "JobVersion": alloc.job_version,
                "TaskGroup": alloc.task_group,
                "AllocatedResources": alloc.allocated if resources else None,
                "DesiredStatus": alloc.desired_status,
                "DesiredDescription": alloc.desired_description,
                "ClientStatus": alloc.client_status,
                "ClientDescription": alloc.client_description,
                "TaskStates": {name: ts.as_json() for name, ts in alloc.task_states.items()} or None,
                "FollowupEvalID": alloc.followup_eval_id,
                "NextAllocation": alloc.next_allocation,
                "RescheduleTracker": {"Events": alloc.reschedule_events, "LastReschedule": ""}
                if alloc.reschedule_events
                else None,
                "DeploymentStatus": _deployment_status(alloc),
                "CreateIndex": alloc.create_index,
                "ModifyIndex": alloc.modify_index,
                "CreateTime": alloc.create_time,
                "ModifyTime": alloc.modify_time,
            },
        )

    def node_json(self, node: NodeRecord) -> JSON:
        spec = node.spec
        return fill(
            "Node",
            {
                "ID": node.id,
                "Datacenter": spec.datacenter,
                "Name": spec.name,
                "HTTPAddr": node.http_addr,
                "TLSEnabled": False,
                "Attributes": node.attributes,
                "NodeResources": self._node_resources(node),
                "ReservedResources": {
                    "Cpu": {"CpuShares": 0},
                    "Memory": {"MemoryMB": 0},
                    "Disk": {"DiskMB": 0},
                    "Networks": {"ReservedHostPorts": ""},
                },
                "Links": {},
                "Meta": node.meta,
                "NodeClass": spec.node_class,
                "NodePool": spec.node_pool,
                # No node drain or eligibility API here (see DESIGN.md): always schedulable.
                "Drain": False,
                "DrainStrategy": None,
                "SchedulingEligibility": "eligible",
                "Status": node.status,
                "StatusDescription": node.status_description,
                "StatusUpdatedAt": node.status_updated_at,
                "Events": node.events,
                "Drivers": node.drivers,
                "LastDrain": None,
                "HostVolumes": {
                    volume.name: {"ID": "", "Path": volume.path, "ReadOnly": volume.read_only}
                    for volume in spec.host_volumes
                },
                "HostNetworks": {},
                "CSIControllerPlugins": {},
                "CSINodePlugins": {},
                "CreateIndex": node.create_index,
                "ModifyIndex": node.modify_index,
            },
        )

    def node_stub(self, node: NodeRecord, *, resources: bool = False) -> JSON:
        stub = {
            "Address": node.attributes.get("unique.network.ip-address", "127.0.0.1"),
            "ID": node.id,
            "Attributes": None,
            "Datacenter": node.spec.datacenter,
            "Name": node.spec.name,
            "NodeClass": node.spec.node_class,
            "NodePool": node.spec.node_pool,
            "Version": node.attributes.get("nomad.version", ""),
            "Drain": False,
            "SchedulingEligibility": "eligible",
            "Status": node.status,
            "StatusDescription": node.status_description,
            "Drivers": node.drivers,
            "LastDrain": None,
            "CreateIndex": node.create_index,
            "ModifyIndex": node.modify_index,
        }
        if resources:
            stub["NodeResources"] = self._node_resources(node)
        return fill("NodeListStub", stub)

    @staticmethod
    def _node_resources(node: NodeRecord) -> JSON:
        spec = node.spec
        return {
            "Cpu": {"CpuShares": spec.cpu_shares, "TotalCpuCores": 64, "ReservableCpuCores": None},
            "Memory": {"MemoryMB": spec.memory_mb},
            "Disk": {"DiskMB": spec.disk_mb},
            "Networks": [{"Mode": "host", "Device": "lo", "IP": "127.0.0.1", "CIDR": "127.0.0.1/32"}],
            "Devices": node.devices or None,
            "MinDynamicPort": 20000,
            "MaxDynamicPort": 32000,
        }


def _deployment_status(alloc: AllocRecord) -> JSON | None:
    if alloc.deployment_healthy is None:
        return None
    return {
        "Healthy": alloc.deployment_healthy,
        "Timestamp": go_time(alloc.deployment_health_at),
        "Canary": False,
        "ModifyIndex": alloc.modify_index,
    }


class _Written(Protocol):
    """A record Nomad's state store stamps on every write (evaluations, allocations, deployments)."""

    create_index: int
    modify_index: int
    create_time: int
    modify_time: int


def _stamp(record: _Written, index: int, stamp: int) -> bool:
    """CreateIndex and CreateTime on the first write, ModifyIndex and ModifyTime on every
    one; True when this write created the record."""
    created = record.create_index == 0
    if created:
        record.create_index = index
        record.create_time = stamp
    record.modify_index = index
    record.modify_time = stamp
    return created


def _event(
    topic: str, kind: str, key: str, filter_keys: list[str] | None, namespace: str, index: int, payload: JSON
) -> JSON:
    # Real Nomad also sends "Namespace" (structs.Event has it; api.Event does not).
    return {
        "Topic": topic,
        "Type": kind,
        "Key": key,
        "Namespace": namespace,
        "FilterKeys": filter_keys,
        "Index": index,
        "Payload": payload,
    }
