"""Observing Nomad: llmgw's jobs, their allocations and the nodes, as core values.

Owns: the view (``ClusterView``) of every job carrying ``llmgw_managed_by = llmgw``, the
allocations of those jobs and every node, kept current by Nomad's event stream and
repaired by full resyncs (after every reconnect of the stream, and every
``resync_interval``); the parsing of Nomad's JSON into ``llmgw.core.planning`` values,
right here at the edge; and folding Consul's inputs (endpoints, drain marks, demand)
into the same ``Observed``.

Must not: decide anything, or act. Jobs without llmgw's meta never leave this module,
so nothing downstream can touch them.

Flow of an event: the stream yields a batch; a Node event replaces the node (its
payload is the whole node, meta included); an Allocation event replaces that
allocation when its job is known, else marks the job to fetch; a Job event replaces the
job (or, on deregistration, marks it to fetch, which finds it gone). Then the owner is
told (``on_change``) and runs a pass, which first fetches the marked jobs. A stream that
breaks, or goes silent past the client's read timeout (Nomad beats every 30 s, so silence
means a dead connection), is reopened at the last index + 1, and a full resync follows:
Nomad silently starts at its oldest retained event when that index has left its buffer.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from llmgw.control.metrics import ControlMetrics
from llmgw.control.ports import Clock, NomadPort
from llmgw.control.settings import ControlSettings
from llmgw.core import acl_refusals
from llmgw.core import conventions as c
from llmgw.core.client_settings import hint_for_driver_failure
from llmgw.core.planning import (
    JOB_PREFIX,
    AllocStatus,
    JobId,
    NodeId,
    NodeStatus,
    Observed,
    ObservedAlloc,
    ObservedJob,
    ObservedNode,
    ReplicaId,
)
from llmgw.core.records import DemandReport, DrainMark, EndpointSnapshot, HealthStatus
from llmgw.core.scaling import aggregate_demand

log = logging.getLogger(__name__)

JSON = Mapping[str, Any]
T = TypeVar("T")


class ParseError(ValueError):
    """A Nomad object without a field llmgw needs; the object is skipped and logged."""


# --- parsing Nomad's JSON -------------------------------------------------------------------------


def is_managed(raw: JSON) -> bool:
    meta = raw.get("Meta") or {}
    return isinstance(meta, Mapping) and meta.get(c.JOB_META_MANAGED_BY) == c.MANAGED_BY_VALUE


def parse_job(raw: JSON) -> ObservedJob | None:
    """A job or job list stub; None if llmgw did not create it."""
    if not is_managed(raw):
        return None
    meta: Mapping[str, Any] = raw["Meta"]
    job_id = _text(raw, "ID")
    model = meta.get(c.JOB_META_MODEL)
    if not isinstance(model, str) or not model:
        raise ParseError(f"job {job_id}: meta {c.JOB_META_MODEL} is missing")
    try:
        profile = int(meta.get(c.JOB_META_PROFILE, "0"))
    except (TypeError, ValueError):
        raise ParseError(f"job {job_id}: meta {c.JOB_META_PROFILE} is not a number") from None
    groups: list[str] = []
    for group in raw.get("TaskGroups") or []:
        if isinstance(group, Mapping) and isinstance(group.get("Name"), str):
            groups.append(group["Name"])
    if not groups:
        summary = (raw.get("JobSummary") or {}).get("Summary") or {}
        groups = sorted(summary)
    fabric = meta.get(c.JOB_META_FABRIC)
    try:
        generation = max(0, int(meta.get(c.JOB_META_RESTART_GENERATION, "0")))
    except (TypeError, ValueError):
        generation = 0  # a hand-edited value: the next restart replaces it
    return ObservedJob(
        job_id=JobId(job_id),
        model=model,
        replica_id=ReplicaId(str(meta.get(c.JOB_META_REPLICA, ""))),
        profile_index=profile,
        spec_hash=str(meta.get(c.JOB_META_SPEC_HASH, "")),
        catalog_hash=str(meta.get(c.JOB_META_CATALOG_HASH, "")),
        version=str(meta.get(c.JOB_META_VERSION, "")),
        fabric=fabric if isinstance(fabric, str) and fabric else None,
        groups=tuple(groups),
        submitted_at=_nanos(raw.get("SubmitTime")),
        stopped=bool(raw.get("Stop")) or raw.get("Status") == "dead",
        restart_generation=generation,
    )


def parse_alloc(raw: JSON) -> tuple[JobId, ObservedAlloc]:
    """An allocation or allocation list stub."""
    alloc_id = _text(raw, "ID")
    try:
        status = AllocStatus(raw.get("ClientStatus") or "pending")
    except ValueError:
        raise ParseError(f"allocation {alloc_id}: unknown ClientStatus {raw.get('ClientStatus')!r}") from None
    states = raw.get("TaskStates") or {}
    started: list[float] = []
    finished: list[float] = []
    running: list[str] = []
    restarted: list[float] = []
    restarts = 0
    for name, state in states.items() if isinstance(states, Mapping) else ():
        if not isinstance(state, Mapping):
            continue
        restarts += int(state.get("Restarts") or 0)
        if state.get("Restarts"):
            at = parse_time(state.get("LastRestart"))
            if at is not None:
                restarted.append(at)
        if state.get("State") == "running":
            running.append(str(name))
            at = parse_time(state.get("StartedAt"))
            if at is not None:
                started.append(at)
        elif state.get("State") == "dead" and not state.get("Failed"):
            at = parse_time(state.get("FinishedAt"))
            if at is not None:
                finished.append(at)
    running_since = max(started) if started and status is AllocStatus.RUNNING else None
    # In a pending allocation only a prestart task can have finished: the main tasks
    # start once every prestart task that is not a sidecar is done (Nomad v2.0.6-dev,
    # ``client/allocrunner/tasklifecycle/coordinator.go``).
    prestart_done_at = max(finished) if finished and status is AllocStatus.PENDING else None
    failed_task, failure = _task_failure(states)
    return JobId(_text(raw, "JobID")), ObservedAlloc(
        alloc_id=alloc_id,
        group=_text(raw, "TaskGroup"),
        node_id=NodeId(str(raw.get("NodeID") or "")),
        client_status=status,
        desired_run=(raw.get("DesiredStatus") or "run") == "run",
        created_at=_nanos(raw.get("CreateTime")),
        running_since=running_since,
        restarts=restarts,
        gpus=_gpus(raw),
        failed_task=failed_task,
        failure=failure,
        prestart_done_at=prestart_done_at,
        running_tasks=tuple(sorted(running)),
        unknown_since=last_unknown(raw.get("AllocStates")) if status is AllocStatus.UNKNOWN else None,
        restarted_at=max(restarted) if restarted else None,
    )


# AllocStateFieldClientStatus, the only AllocStateField (a uint8 iota: 0 on the wire).
_CLIENT_STATUS_FIELD = 0


def last_unknown(states: object) -> float | None:
    """Nomad's ``Allocation.LastUnknown`` (nomad/structs/alloc.go, v2.0.5) from the
    allocation's ``AllocStates``: walking back from the newest client-status entry, the
    earliest ``unknown`` of the latest run of them, the moment its ``lost_after`` counts
    from. None when the document has none: list stubs never carry ``AllocStates``, only a
    whole allocation (``GET /v1/allocation/:id``, an Allocation event) does."""
    if not isinstance(states, list):
        return None
    found: float | None = None
    for entry in reversed(states):
        if not isinstance(entry, Mapping) or entry.get("Field", _CLIENT_STATUS_FIELD) != _CLIENT_STATUS_FIELD:
            continue
        if entry.get("Value") == "unknown":
            found = parse_time(entry.get("Time")) or found
        elif found is not None:
            break
    return found


# Task events that say what happened to a task that failed; the rest (Not Restarting,
# Killing, Sibling Task Failed...) say what Nomad did about it.
_TELLING_EVENTS = frozenset(
    {
        "Terminated",
        "Driver Failure",
        "Setup Failure",
        "Failed Validation",
        "Failed Artifact Download",
        "Task hook failed",
    }
)


def _telling(event: Mapping[str, Any]) -> bool:
    # A template that cannot read is the one Killing event that says what happened: the
    # template manager kills the task with "Template failed: ..." (Nomad v2.0.5
    # client/allocrunner/taskrunner/template/template.go, handleFirstRender).
    if event.get("Type") == "Killing":
        return str(event.get("DisplayMessage") or "").startswith("Template failed")
    return event.get("Type") in _TELLING_EVENTS


def _task_failure(states: object) -> tuple[str | None, str]:
    """An allocation's first failed task and what happened to it, in Nomad's words."""
    failed: list[tuple[float, str, Mapping[str, Any]]] = []
    for name, state in states.items() if isinstance(states, Mapping) else ():
        if isinstance(state, Mapping) and state.get("Failed"):
            failed.append((parse_time(state.get("FinishedAt")) or float("inf"), str(name), state))
    if not failed:
        return None, ""
    _, name, state = min(failed, key=lambda f: (f[0], f[1]))
    events = state.get("Events") or []
    told = next(
        (
            str(e.get("DisplayMessage") or e.get("Type"))
            for e in reversed(events if isinstance(events, list) else [])
            if isinstance(e, Mapping) and _telling(e)
        ),
        "",
    )
    hint = hint_for_driver_failure(told) or acl_refusals.template_refused(told)
    return name, f"{told} (needs {hint})" if hint else told


def parse_node(raw: JSON) -> ObservedNode:
    """A node (detail or event payload); a list stub has no meta, so no fabric."""
    node_id = _text(raw, "ID")
    try:
        status = NodeStatus(raw.get("Status") or "initializing")
    except ValueError:
        status = NodeStatus.INITIALIZING
    meta = raw.get("Meta") or {}
    fabric = meta.get(c.NODE_META_FABRIC) if isinstance(meta, Mapping) else None
    updated = raw.get("StatusUpdatedAt")
    return ObservedNode(
        node_id=NodeId(node_id),
        name=str(raw.get("Name") or node_id),
        status=status,
        status_since=float(updated) if isinstance(updated, int | float) and updated > 0 else None,
        eligible=(raw.get("SchedulingEligibility") or "eligible") == "eligible",
        fabric=fabric if isinstance(fabric, str) and fabric else None,
    )


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(value: object) -> float | None:
    """Go's RFC 3339 time (nanoseconds, ``Z``) as unix seconds; Go's zero time is None."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), value, count=1)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _text(raw: JSON, key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise ParseError(f"Nomad object without {key}: {str(raw)[:200]}")
    return value


def _nanos(value: object) -> float:
    return float(value) / 1e9 if isinstance(value, int | float) and value > 0 else 0.0


def _gpus(raw: JSON) -> tuple[str, ...]:
    tasks = ((raw.get("AllocatedResources") or {}).get("Tasks")) or {}
    out: list[str] = []
    for task in tasks.values() if isinstance(tasks, Mapping) else ():
        for device in (task or {}).get("Devices") or []:
            out.extend(str(d) for d in device.get("DeviceIDs") or [])
    return tuple(sorted(out))


def health_by_job(snapshot: EndpointSnapshot | None) -> dict[JobId, HealthStatus]:
    """The best status among each replica's endpoints (a replica serves if one instance passes)."""
    out: dict[JobId, HealthStatus] = {}
    for endpoint in snapshot.endpoints if snapshot else ():
        job = JobId(endpoint.replica)
        known = out.get(job)
        if known is None or endpoint.status.severity < known.severity:
            out[job] = endpoint.status
    return out


def build_observed(
    jobs: Mapping[JobId, ObservedJob],
    nodes: Mapping[NodeId, ObservedNode],
    *,
    endpoints: EndpointSnapshot | None,
    marks: Mapping[str, DrainMark] | None,
    demand: Iterable[DemandReport],
    in_flight: Mapping[JobId, int],
    capacity_version: int,
    now: float,
    demand_stale_after: float,
    gpus_freeing: int = 0,
) -> Observed:
    return Observed(
        jobs=jobs,
        nodes=nodes,
        health=health_by_job(endpoints),
        drain_marks={JobId(k): m.since for k, m in (marks or {}).items()},
        demand=aggregate_demand(demand, now, demand_stale_after),
        in_flight=in_flight,
        capacity_version=capacity_version,
        gpus_freeing=gpus_freeing,
    )


# --- the view ---------------------------------------------------------------------------------------


class ClusterView:
    """The one owner of the control plane's picture of Nomad. Not thread-safe; one event loop."""

    def __init__(
        self,
        nomad: NomadPort,
        settings: ControlSettings,
        clock: Clock,
        metrics: ControlMetrics,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._nomad = nomad
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._on_change = on_change
        self._jobs: dict[JobId, ObservedJob] = {}
        self._allocs: dict[str, tuple[JobId, ObservedAlloc]] = {}
        self._nodes: dict[NodeId, ObservedNode] = {}
        self._node_index: dict[NodeId, int] = {}
        self._dirty: set[JobId] = set()
        self._resync_reason: str | None = "start"
        self._last_resync: float | None = None
        self._event_index = 0
        self._read_index: dict[str, int] = {}  # by topic: the index of the last resync's read
        self._capacity_version = 0
        # GPUs of llmgw's allocations told to stop and not yet finished, by allocation id,
        # purged jobs' included (``Observed.gpus_freeing``).
        self._freeing: dict[str, int] = {}
        self._synced = asyncio.Event()

    @property
    def capacity_version(self) -> int:
        return self._capacity_version

    @property
    def gpus_freeing(self) -> int:
        return sum(self._freeing.values())

    def _track_freeing(self, alloc: ObservedAlloc) -> None:
        if alloc.gpus_giving_back:
            self._freeing[alloc.alloc_id] = alloc.gpus_giving_back
        else:
            self._freeing.pop(alloc.alloc_id, None)

    @property
    def event_index(self) -> int:
        return self._event_index

    def refetch(self, job_id: JobId) -> None:
        """Read this job again at the next refresh (it was just stopped: Nomad before 1.7.5
        sends no event when a job is purged, and its allocations' events keep it known)."""
        self._dirty.add(job_id)

    def request_resync(self, reason: str) -> None:
        self._resync_reason = self._resync_reason or reason
        self._on_change()

    async def refresh(self) -> None:
        """Bring the view up to date before a pass: a resync when due, then the marked jobs."""
        due = self._last_resync is None or (
            self._clock.time() - self._last_resync >= self._settings.resync_interval
        )
        if self._resync_reason is not None or due:
            await self.resync(self._resync_reason or "periodic")
        dirty, self._dirty = self._dirty, set()
        try:
            for job_id in sorted(dirty):
                await self._fetch_job(job_id)
        except BaseException:
            self._dirty |= dirty  # fetch them next time
            raise

    def snapshot(self) -> tuple[dict[JobId, ObservedJob], dict[NodeId, ObservedNode]]:
        per_job: dict[JobId, list[ObservedAlloc]] = {}
        for job_id, alloc in self._allocs.values():
            per_job.setdefault(job_id, []).append(alloc)
        jobs = {
            job_id: replace(job, allocs=tuple(sorted(per_job.get(job_id, ()), key=lambda a: a.alloc_id)))
            for job_id, job in self._jobs.items()
        }
        return jobs, dict(self._nodes)

    async def resync(self, reason: str) -> None:
        """Rebuild the whole view from list calls."""
        jobs_page = await self._nomad.jobs(prefix=JOB_PREFIX)
        jobs: dict[JobId, ObservedJob] = {}
        for raw in jobs_page.items:
            job = self._parse(parse_job, raw)
            if job is not None:
                jobs[job.job_id] = job
        # ``resources=True``: without it Nomad's list stubs carry no AllocatedResources, and
        # every replica would lose its GPUs from the view (and the status) at each resync.
        allocs_page = await self._nomad.allocations(resources=True)
        allocs: dict[str, tuple[JobId, ObservedAlloc]] = {}
        self._freeing = {}
        for raw in allocs_page.items:
            if not str(raw.get("JobID", "")).startswith(JOB_PREFIX):
                continue
            parsed = self._parse(parse_alloc, raw)
            if parsed is not None:
                self._track_freeing(parsed[1])  # a purged job's stopping allocation too
            if parsed is not None and parsed[0] in jobs:
                allocs[parsed[1].alloc_id] = (parsed[0], await self._with_unknown_since(parsed[1]))
        nodes_page = await self._nomad.nodes()
        nodes: dict[NodeId, ObservedNode] = {}
        node_index: dict[NodeId, int] = {}
        for raw in nodes_page.items:
            stub = self._parse(parse_node, raw)
            if stub is None:
                continue
            modify = int(raw.get("ModifyIndex") or 0)
            known = self._nodes.get(stub.node_id)
            if known is not None and self._node_index.get(stub.node_id) == modify:
                nodes[stub.node_id] = known
            else:
                # The list stub has no meta: read the node once per change for its fabric.
                detail = await self._nomad.node(stub.node_id)
                node = self._parse(parse_node, detail) if detail else None
                nodes[stub.node_id] = node or stub
            node_index[stub.node_id] = modify
        if _capacities(nodes) != _capacities(self._nodes) or allocs != self._allocs:
            self._capacity_version += 1
        self._jobs, self._allocs, self._nodes, self._node_index = jobs, allocs, nodes, node_index
        # Each list's X-Nomad-Index is its own table's index (jobs, allocs, nodes), and the
        # three reads follow one another: a job written after the jobs read may carry a
        # lower index than the allocs or nodes read. So the stream resumes after the
        # OLDEST read, and an event no newer than its own topic's read is not applied
        # again (the read holds that state or a newer one).
        self._read_index = {"Job": jobs_page.index, "Allocation": allocs_page.index, "Node": nodes_page.index}
        self._event_index = min(self._read_index.values())
        self._resync_reason = None
        self._last_resync = self._clock.time()
        self._metrics.resyncs.labels(reason=reason).inc()
        self._synced.set()

    async def follow_events(self) -> None:
        """Apply Nomad's event stream until cancelled; reconnect with backoff, resync after each."""
        await self._synced.wait()
        failures = 0
        while True:
            try:
                async for batch in self._nomad.events(
                    self._settings.event_topics, index=self._event_index + 1
                ):
                    failures = 0
                    self.apply_events(batch.events, batch.index)
                reason = "the event stream ended"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any transport error: the stream is reopened
                reason = f"the event stream failed: {exc}"
                if getattr(exc, "status", None) == 403:
                    # A refused subscription (the adapter names the rule): the token must
                    # change, so say it loudly; the full reads still keep the state current.
                    log.warning("Nomad %s; retrying with backoff", reason)
            failures += 1
            self._metrics.event_reconnects.inc()
            log.info("Nomad %s; reconnecting and resyncing", reason)
            self.request_resync("reconnect")
            await self._clock.sleep(self._settings.events_backoff.step(failures))

    def apply_events(self, events: Iterable[JSON], index: int) -> None:
        changed = False
        for event in events:
            if index <= self._read_index.get(str(event.get("Topic")), 0):
                continue  # the last resync's read of that table already holds it
            try:
                changed = self._apply_event(event) or changed
            except (ParseError, TypeError, ValueError, KeyError) as exc:
                log.warning("skipping a Nomad event llmgw cannot read (%s)", exc)
        self._event_index = max(self._event_index, index)
        if changed:
            self._on_change()

    def _apply_event(self, event: JSON) -> bool:
        topic = event.get("Topic")
        payload = event.get("Payload") or {}
        if topic == "Node":
            raw = payload.get("Node") or {}
            if event.get("Type") == "NodeDeregistration":
                gone = self._nodes.pop(NodeId(str(raw.get("ID") or event.get("Key"))), None)
                if gone is None:
                    return False
                self._capacity_version += 1
                return True
            node = parse_node(raw)
            known = self._nodes.get(node.node_id)
            if known == node:
                return False
            self._nodes[node.node_id] = node
            self._node_index[node.node_id] = int(raw.get("ModifyIndex") or 0)
            if known is not None and _capacity(known) == _capacity(node):
                # Only its timestamps moved: while a node is disconnected Nomad files a
                # "Node heartbeat missed" event and a new StatusUpdatedAt every heartbeat TTL
                # plus grace (nomad/heartbeat.go, invalidateHeartbeat, v2.0.5). Nothing was
                # freed or added, so no placement hold is released and no pass is needed.
                return False
            self._capacity_version += 1
            return True
        if topic == "Allocation":
            raw = payload.get("Allocation") or {}
            job_id, alloc = parse_alloc(raw)
            known_alloc = self._allocs.get(alloc.alloc_id)
            if alloc.client_status is AllocStatus.UNKNOWN and alloc.unknown_since is None and known_alloc:
                alloc = replace(alloc, unknown_since=known_alloc[1].unknown_since)
            if alloc.client_status.terminal or not alloc.desired_run:
                self._capacity_version += 1  # GPUs were (or are being) given back
            if str(job_id).startswith(JOB_PREFIX):
                self._track_freeing(alloc)
            if job_id in self._jobs:
                if self._allocs.get(alloc.alloc_id) == (job_id, alloc):
                    return False
                self._allocs[alloc.alloc_id] = (job_id, alloc)
                return True
            if job_id.startswith(JOB_PREFIX):
                self._dirty.add(job_id)
                return True
            return False
        if topic == "Job":
            raw = payload.get("Job") or {}
            job_id = JobId(str(raw.get("ID") or event.get("Key") or ""))
            if not job_id.startswith(JOB_PREFIX):
                return False
            if event.get("Type") in ("JobDeregistered", "JobBatchDeregistered") or not raw:
                self._dirty.add(job_id)  # purged or only stopped: the fetch tells
                return True
            job = parse_job(raw)
            if job is None:
                return self._forget(job_id)
            if self._jobs.get(job_id) != job:
                self._jobs[job_id] = job
                return True
            return False
        return False

    async def _fetch_job(self, job_id: JobId) -> None:
        raw = await self._nomad.job(job_id)
        job = self._parse(parse_job, raw) if raw else None
        if job is None:
            self._forget(job_id)
            return
        page = await self._nomad.job_allocations(job_id)
        fetched: dict[str, ObservedAlloc] = {}
        for raw_alloc in page.items:
            parsed = self._parse(parse_alloc, raw_alloc)
            if parsed is None:
                continue
            alloc = parsed[1]
            if raw_alloc.get("AllocatedResources") is None:
                # Nomad's job allocation stubs never say which GPUs an allocation holds. An
                # allocation keeps its devices for life: take them from the view, or read
                # the allocation once when it is new to the view.
                known = self._allocs.get(alloc.alloc_id)
                if known is not None:
                    alloc = replace(alloc, gpus=known[1].gpus)
                else:
                    detail = await self._nomad.allocation(alloc.alloc_id)
                    whole = self._parse(parse_alloc, detail) if detail else None
                    if whole is not None:
                        alloc = whole[1]
            fetched[alloc.alloc_id] = await self._with_unknown_since(alloc)
        self._jobs[job_id] = job
        for alloc_id in [a for a, (j, _) in self._allocs.items() if j == job_id]:
            del self._allocs[alloc_id]
        for alloc_id, alloc in fetched.items():
            self._allocs[alloc_id] = (job_id, alloc)

    async def _with_unknown_since(self, alloc: ObservedAlloc) -> ObservedAlloc:
        """An ``unknown`` allocation with Nomad's LastUnknown: list stubs lack AllocStates, so
        it is taken from the view, or read from the whole allocation once (there are only as
        many as allocations on disconnected nodes). A new leader's lost-node clock then
        counts from the disconnection, not from its own first sight of it."""
        if alloc.client_status is not AllocStatus.UNKNOWN or alloc.unknown_since is not None:
            return alloc
        known = self._allocs.get(alloc.alloc_id)
        if known is not None and known[1].unknown_since is not None:
            return replace(alloc, unknown_since=known[1].unknown_since)
        detail = await self._nomad.allocation(alloc.alloc_id)
        whole = self._parse(parse_alloc, detail) if detail else None
        since = whole[1].unknown_since if whole is not None else None
        return replace(alloc, unknown_since=since) if since is not None else alloc

    def _forget(self, job_id: JobId) -> bool:
        known = self._jobs.pop(job_id, None)
        stale = [a for a, (j, _) in self._allocs.items() if j == job_id]
        for alloc_id in stale:
            del self._allocs[alloc_id]
        if stale:
            self._capacity_version += 1
        return known is not None

    @staticmethod
    def _parse(parser: Callable[[JSON], T], raw: JSON) -> T | None:
        try:
            return parser(raw)
        except (ParseError, TypeError, ValueError, KeyError, AttributeError) as exc:
            log.warning("skipping a Nomad object llmgw cannot read (%s)", exc)
            return None


def _capacity(node: ObservedNode) -> tuple[NodeStatus, bool, str | None]:
    """What of a node decides where replicas fit: not its timestamps."""
    return node.status, node.eligible, node.fabric


def _capacities(nodes: Mapping[NodeId, ObservedNode]) -> dict[NodeId, tuple[NodeStatus, bool, str | None]]:
    return {node_id: _capacity(node) for node_id, node in nodes.items()}
