"""The service scheduler: evaluations in, allocation placements and stops out.

Owns: Nomad's reconciler rules for service (and simple batch) jobs — count, destructive
versus in-place updates, lost allocations on down nodes (replaced unless the group
says ``prevent_reschedule_on_lost`` or ``disconnect { replace = false }``, and always
once their ``lost_after`` ran out), failed allocations (rescheduled only as the group's
``reschedule`` policy allows), migration of allocations told to stop, deployments (created for
the first run of a job version whose groups have an update strategy; after a failed
one only lost allocations are replaced) — and turning one evaluation into a
``PlanOutcome``. ``apply``
writes an outcome (a PlanResult transaction, then an EvaluationUpdated one), creating
or refreshing the job's blocked evaluation when something could not be placed.

``compute`` is pure given the store snapshot; ``plan`` (``/v1/job/:id/plan``) uses it
without applying.

Must not: run processes, talk to Consul or speak HTTP.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.devcluster.nomad.feasibility import Metric, Placement, Placer, usage_of
from llmgw.devcluster.nomad.state import (
    EV_EVAL_UPDATED,
    EV_PLAN_RESULT,
    AllocRecord,
    DeploymentRecord,
    EvalRecord,
    JobRecord,
    Store,
    TaskStateRecord,
)

JSON = dict[str, Any]

DESC_NOT_NEEDED = "alloc not needed due to job update"
DESC_UPDATING = "alloc is being updated due to job update"
DESC_LOST = "alloc is lost since its node is down"
DESC_MIGRATING = "alloc is being migrated"
DESC_RESCHEDULED = "alloc was rescheduled because it failed"

NS_PER_S = 1_000_000_000


@dataclass
class Place:
    group: JSON
    index: int
    previous: AllocRecord | None = None
    reschedule: bool = False
    lost: bool = False  # replaces an allocation lost (or disconnected) with its node


@dataclass
class Stop:
    alloc: AllocRecord
    description: str
    client_status: str = ""  # "lost" when the node is gone
    expired: bool = False  # lost because its disconnect { lost_after } ran out


@dataclass
class PlanOutcome:
    job: JobRecord | None
    places: list[tuple[Place, Placement]] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    inplace: list[AllocRecord] = field(default_factory=list)
    failed: dict[str, Metric] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    desired: dict[str, dict[str, int]] = field(default_factory=dict)
    reschedule_later: dict[str, float] = field(default_factory=dict)  # alloc id -> delay seconds
    # The job version's deployment: created by this plan, or the active one new
    # allocations join (None: no update strategy, or the deployment is over).
    deployment: DeploymentRecord | None = None
    new_deployment: bool = False

    def bump(self, group: str, key: str, n: int = 1) -> None:
        row = self.desired.setdefault(group, {})
        row[key] = row.get(key, 0) + n


def group_fingerprint(job: JSON, group: JSON) -> str:
    """What makes an update destructive: the group's spec plus job-level fields tasks see."""
    relevant = {"group": group, "meta": job.get("Meta"), "constraints": job.get("Constraints")}
    relevant["group"] = {k: v for k, v in group.items() if k not in ("Count", "Update", "Migrate", "Scaling")}
    return json.dumps(relevant, sort_keys=True, default=str)


_SERVER_FIELDS = (
    "Status",
    "StatusDescription",
    "Stop",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
)


def spec_key(job: JSON) -> str:
    """The job's spec without server-managed fields, for "did it change?"."""
    return json.dumps({k: v for k, v in job.items() if k not in _SERVER_FIELDS}, sort_keys=True, default=str)


def reschedule_allowed(group: JSON, alloc: AllocRecord, now_ns: int) -> bool:
    policy = group.get("ReschedulePolicy") or {}
    if policy.get("Unlimited"):
        return True
    attempts = int(policy.get("Attempts") or 0)
    if attempts <= 0:
        return False
    interval = int(policy.get("Interval") or 0)
    recent = [
        e for e in alloc.reschedule_events if interval <= 0 or now_ns - int(e["RescheduleTime"]) < interval
    ]
    return len(recent) < attempts


def lost_after_ns(alloc: AllocRecord) -> int:
    """The group's ``disconnect { lost_after }`` as the allocation's job has it (0: none)."""
    for group in alloc.job.get("TaskGroups") or []:
        if group.get("Name") == alloc.task_group:
            disconnect = group.get("Disconnect") or {}
            return int(disconnect.get("LostAfter") or 0)
    return 0


def disconnect_expired(alloc: AllocRecord, now_ns: int) -> bool:
    """Nomad's ``Allocation.Expired`` (nomad/structs/alloc.go): an ``unknown`` allocation whose
    ``lost_after`` has run out since it became unknown."""
    if alloc.client_status != "unknown" or not alloc.unknown_since:
        return False
    return alloc.unknown_since + lost_after_ns(alloc) <= now_ns


def has_update_strategy(group: JSON) -> bool:
    """Nomad's ``!UpdateStrategy.IsEmpty()`` (nomad/structs/structs.go): a group deploys unless
    its strategy is missing or has ``max_parallel = 0``. With no ``update`` block Nomad's
    default strategy applies (``api.DefaultUpdateStrategy``: max_parallel 1), so it deploys."""
    update = group.get("Update") or {}
    return int(update.get("MaxParallel") or 0) != 0


def replace_lost(group: JSON) -> bool:
    # max_client_disconnect and prevent_reschedule_on_lost never get here: Nomad 2.0 drops
    # them at register (``as_registered``), so only ``disconnect`` decides.
    disconnect = group.get("Disconnect") or {}
    return disconnect.get("Replace") is not False


class Scheduler:
    def __init__(self, store: Store, pick_port: Callable[[set[int]], int], now_ns: Callable[[], int]) -> None:
        self.store = store
        self.pick_port = pick_port
        self.now_ns = now_ns

    # -- computing -------------------------------------------------------

    def compute(self, job: JobRecord | None, job_id: str, *, job_doc: JSON | None = None) -> PlanOutcome:
        """What the scheduler would do for ``job`` now (``job_doc`` overrides the spec, for plans)."""
        store = self.store
        outcome = PlanOutcome(job)
        spec = job_doc if job_doc is not None else (job.job if job is not None else None)
        stopped = spec is None or (job_doc is None and (job is None or job.stop))
        allocs = [a for a in store.job_allocs(job_id) if not a.server_terminal()]
        self._stopped_on_down_nodes_lost(outcome, job_id)
        if stopped or spec is None:
            for alloc in allocs:
                outcome.stops.append(Stop(alloc, DESC_NOT_NEEDED))
                outcome.bump(alloc.task_group, "Stop")
            return outcome
        groups = {str(g["Name"]): g for g in spec.get("TaskGroups") or []}
        version = job.version if job is not None else 0
        for alloc in allocs:
            if alloc.task_group not in groups:
                outcome.stops.append(Stop(alloc, DESC_NOT_NEEDED))
                outcome.bump(alloc.task_group, "Stop")
        stopping = {s.alloc.id for s in outcome.stops}
        usage = usage_of(a for a in store.allocs.values() if a.id not in stopping)
        placer = Placer(list(store.nodes.values()), usage, store.region, self.pick_port)
        now = self.now_ns()
        current = store.latest_deployment(job) if job is not None and job_doc is None else None
        if current is not None and current.job_version != version:
            current = None  # an older version's: Nomad cancels it
        outcome.deployment = current if current is not None and current.active() else None
        # After a failed deployment Nomad places only replacements of lost allocations and
        # reschedules (reconcile_cluster.go placeAllocs: deploymentPlaceReady is false).
        deployment_failed = current is not None and current.status == "failed"
        first_run = not any(a.job_version == version for a in store.job_allocs(job_id))
        for name, group in groups.items():
            # Lost allocations that the group says not to replace keep their names taken.
            held = {
                a.index
                for a in store.job_allocs(job_id)
                if a.task_group == name
                and a.client_status == "lost"
                and not a.next_allocation
                and a.job_version == version
                and not a.expired
                and not replace_lost(group)
            }
            self._reconcile_group(
                outcome,
                spec,
                group,
                [a for a in allocs if a.task_group == name],
                version,
                job_doc is not None,
                placer,
                now,
                held,
                deployment_failed,
            )
        if job is not None and job_doc is None and current is None and first_run:
            self._create_deployment(outcome, job, groups, version)
        return outcome

    def _create_deployment(
        self, out: PlanOutcome, job: JobRecord, groups: dict[str, JSON], version: int
    ) -> None:
        """Nomad's createDeployment: the first run of a job version whose groups have an
        update strategy gets a deployment, one DeploymentState per such group."""
        states: dict[str, JSON] = {}
        for name, group in groups.items():
            if not has_update_strategy(group) or not out.desired.get(name, {}).get("Place"):
                continue  # (placed or not: a group still waiting for room deploys too)
            update = group["Update"]
            count = group.get("Count")
            states[name] = {
                "AutoRevert": bool(update.get("AutoRevert")),
                "Promoted": False,
                "PlacedCanaries": None,
                "DesiredCanaries": 0,
                "DesiredTotal": 1 if count is None else int(count),
                "PlacedAllocs": 0,
                "HealthyAllocs": 0,
                "UnhealthyAllocs": 0,
                "ProgressDeadline": int(update.get("ProgressDeadline") or 0),
                "RequireProgressBy": 0,  # unix ns; 0 until the first placement
            }
        if states:
            out.deployment = DeploymentRecord(
                id=str(uuid.uuid4()),
                job_id=job.id,
                job_version=version,
                job_create_index=job.create_index,
                job_modify_index=job.job_modify_index,
                groups=states,
            )
            out.new_deployment = True

    def _stopped_on_down_nodes_lost(self, out: PlanOutcome, job_id: str) -> None:
        """Nomad's ``updateNonTerminalAllocsToLost``: an alloc already told to stop whose node is
        down (or gone) can never report its stop, so the plan marks it lost. Not counted in
        DesiredTGUpdates (Nomad appends it to the plan outside the reconciler)."""
        for alloc in self.store.job_allocs(job_id):
            if not alloc.server_terminal() or alloc.client_status not in ("running", "pending"):
                continue
            node = self.store.nodes.get(alloc.node_id)
            if node is None or node.status == "down":
                out.stops.append(Stop(alloc, DESC_LOST, "lost"))

    def _reconcile_group(
        self,
        out: PlanOutcome,
        spec: JSON,
        group: JSON,
        allocs: list[AllocRecord],
        version: int,
        is_plan: bool,
        placer: Placer,
        now: int,
        held: set[int],
        deployment_failed: bool = False,
    ) -> None:
        name = str(group["Name"])
        raw_count = group.get("Count")
        count = 1 if raw_count is None else int(raw_count)
        fingerprint = group_fingerprint(spec, group)
        spec_text = spec_key(spec)
        keep: dict[int, AllocRecord] = {}
        replace: list[Place] = []

        def stop(alloc: AllocRecord, why: str, key: str, client_status: str = "") -> None:
            out.stops.append(Stop(alloc, why, client_status))
            out.bump(name, key)

        for alloc in sorted(allocs, key=lambda a: a.create_index):
            node = self.store.nodes.get(alloc.node_id)
            if disconnect_expired(alloc, now):
                # classifyAllocs puts an expired allocation in "expiring" before any disconnect
                # rule applies, and the reconciler adds it to the lost ones (lost =
                # lost.union(expiring)): stopped lost and replaced, whatever
                # disconnect { replace } and the reschedule policy say.
                out.stops.append(Stop(alloc, DESC_LOST, "lost", expired=True))
                out.bump(name, "Stop")
                if not alloc.next_allocation:
                    replace.append(Place(group, alloc.index, alloc, lost=True))
                    out.bump(name, "Place")
                continue
            if alloc.client_status == "unknown" and node is not None and node.status == "disconnected":
                # Disconnected but within lost_after: it keeps its slot; Nomad still places a
                # replacement unless disconnect { replace = false }.
                keep.setdefault(alloc.index, alloc)
                if replace_lost(group) and not alloc.next_allocation:
                    replace.append(Place(group, alloc.index, alloc, lost=True))
                    out.bump(name, "Place")
                continue
            lost = alloc.client_status == "lost" or (
                node is not None
                and not alloc.client_terminal()
                and (node.status == "down" or node.status == "disconnected")
            )
            if lost:
                stop(alloc, DESC_LOST, "Stop", "lost")
                if replace_lost(group) and not alloc.next_allocation:
                    replace.append(Place(group, alloc.index, alloc, lost=True))
                    out.bump(name, "Place")
                elif not replace_lost(group):
                    held.add(alloc.index)  # its name stays taken: nothing takes its place
                continue
            if alloc.desired_transition.get("Migrate"):
                stop(alloc, DESC_MIGRATING, "Migrate")
                replace.append(Place(group, alloc.index, alloc))
                continue
            if alloc.client_status == "failed":
                if alloc.next_allocation:
                    continue
                if reschedule_allowed(group, alloc, now):
                    delay_s = int((group.get("ReschedulePolicy") or {}).get("Delay") or 0) / NS_PER_S
                    if delay_s > 0 and not alloc.desired_transition.get("Reschedule"):
                        out.reschedule_later[alloc.id] = delay_s
                        out.bump(name, "RescheduleLater")
                        keep.setdefault(alloc.index, alloc)
                        continue
                    stop(alloc, DESC_RESCHEDULED, "RescheduleNow")
                    replace.append(Place(group, alloc.index, alloc, reschedule=True))
                    continue
                # Not reschedulable: the failed alloc keeps its slot and nothing replaces it.
                keep.setdefault(alloc.index, alloc)
                out.bump(name, "Ignore")
                continue
            if alloc.client_status == "complete":
                continue  # its slot is free again
            if alloc.index in keep:
                stop(alloc, DESC_NOT_NEEDED, "Stop")
                continue
            changed = spec_key(alloc.job) != spec_text if is_plan else alloc.job_version != version
            if changed and group_fingerprint(alloc.job, _group_of(alloc.job, name)) != fingerprint:
                stop(alloc, DESC_UPDATING, "DestructiveUpdate")
                replace.append(Place(group, alloc.index, alloc))
                continue
            if changed:
                out.inplace.append(alloc)
                out.bump(name, "InPlaceUpdate")
            else:
                out.bump(name, "Ignore")
            keep[alloc.index] = alloc
        # Scale to count: drop the highest names first, then fill the lowest free ones.
        slots = set(keep) | {p.index for p in replace} | held
        for index in sorted(slots, reverse=True):
            if len(slots) <= count:
                break
            if index in keep:
                stop(keep.pop(index), DESC_NOT_NEEDED, "Stop")
            replace = [p for p in replace if p.index != index]
            slots.discard(index)
        next_index = 0
        while len(slots) < count:
            while next_index in slots:
                next_index += 1
            replace.append(Place(group, next_index))
            out.bump(name, "Place")
            slots.add(next_index)
        if deployment_failed:
            kept = [p for p in replace if p.lost or p.reschedule]
            if len(kept) < len(replace):
                out.bump(name, "Place", len(kept) - len(replace))
                out.bump(name, "Ignore", len(replace) - len(kept))
            replace = kept
        for place in sorted(replace, key=lambda p: p.index):
            avoid = place.previous.node_id if place.previous is not None else ""
            result = placer.place(spec, group, avoid_node=avoid)
            if isinstance(result, Placement):
                out.places.append((place, result))
            else:
                if name in out.failed:
                    out.failed[name].coalesced += 1
                else:
                    out.failed[name] = result
                out.queued[name] = out.queued.get(name, 0) + 1

    # -- applying --------------------------------------------------------

    def apply(self, ev: EvalRecord, outcome: PlanOutcome) -> list[AllocRecord]:
        """Write the outcome; returns the new allocations."""
        store = self.store
        job = outcome.job
        created: list[AllocRecord] = []
        now = self.now_ns()
        deployment = outcome.deployment
        with store.txn(EV_PLAN_RESULT):
            if deployment is not None and outcome.new_deployment:
                store.touch_deployment(deployment)
            for stop in outcome.stops:
                alloc = stop.alloc
                alloc.desired_status = "stop"
                alloc.desired_description = stop.description
                alloc.expired = alloc.expired or stop.expired
                if stop.client_status:
                    alloc.client_status = stop.client_status
                    alloc.client_description = "alloc is lost since its node is down"
                    for ts in alloc.task_states.values():
                        if ts.state != "dead":
                            ts.state = "dead"
                            ts.finished_at = now
                store.touch_alloc(alloc, server=True)
            if job is not None:
                job_json = store.job_json(job)
                for alloc in outcome.inplace:
                    alloc.job = job_json
                    alloc.job_version = job.version
                    store.touch_alloc(alloc, server=True)
                for place, placement in outcome.places:
                    alloc = self._new_alloc(ev, job, job_json, place, placement)
                    if place.previous is not None:
                        prev = place.previous
                        prev.next_allocation = alloc.id
                        if place.reschedule or prev.client_status == "failed":
                            alloc.reschedule_events = [
                                *prev.reschedule_events,
                                {"RescheduleTime": now, "PrevAllocID": prev.id, "PrevNodeID": prev.node_id},
                            ]
                        store.touch_alloc(prev, server=True)
                    if deployment is not None:
                        self._join_deployment(deployment, alloc, now)
                    store.touch_alloc(alloc, server=True)
                    created.append(alloc)
            for alloc_id in outcome.reschedule_later:
                alloc = store.allocs[alloc_id]
                if not alloc.followup_eval_id:
                    alloc.followup_eval_id = str(uuid.uuid4())
                    store.touch_alloc(alloc, server=True)
        self._finish_eval(ev, outcome)
        return created

    def _join_deployment(self, deployment: DeploymentRecord, alloc: AllocRecord, now: int) -> None:
        """Nomad's updateDeploymentWithAlloc (nomad/state/state_store.go): a placement of a
        deploying group counts as placed, and the first one starts the progress deadline."""
        alloc.deployment_id = deployment.id
        state = deployment.groups.get(alloc.task_group)
        if state is None:
            return
        state["PlacedAllocs"] += 1
        deadline = int(state["ProgressDeadline"])
        if deadline and not state["RequireProgressBy"]:
            state["RequireProgressBy"] = now + deadline
        self.store.touch_deployment(deployment)

    def _finish_eval(self, ev: EvalRecord, outcome: PlanOutcome) -> None:
        store = self.store
        failed = {g: {**m.as_json()} for g, m in outcome.failed.items()} or None
        with store.txn(EV_EVAL_UPDATED):
            if failed:
                if ev.status == "blocked":
                    ev.failed_tg_allocs = failed
                    ev.queued_allocations = dict(outcome.queued)
                    store.touch_eval(ev)
                    return
                for other in store.job_evals(ev.job_id):
                    if other.status == "blocked" and other.id != ev.id:
                        other.status = "canceled"
                        other.status_description = "evaluation reblocked"
                        store.touch_eval(other)
                blocked = EvalRecord(
                    id=str(uuid.uuid4()),
                    job_id=ev.job_id,
                    triggered_by=ev.triggered_by,
                    priority=ev.priority,
                    type=ev.type,
                    status="blocked",
                    status_description="created to place remaining allocations",
                    previous_eval=ev.id,
                    job_modify_index=ev.job_modify_index,
                    failed_tg_allocs=failed,
                    queued_allocations=dict(outcome.queued),
                    class_eligibility={},
                    escaped_computed_class=False,
                )
                store.touch_eval(blocked)
                ev.blocked_eval = blocked.id
                ev.failed_tg_allocs = failed
            elif ev.status == "blocked":
                ev.failed_tg_allocs = None
            ev.status = "complete"
            ev.queued_allocations = dict(outcome.queued)
            store.touch_eval(ev)

    def _new_alloc(
        self, ev: EvalRecord, job: JobRecord, job_json: JSON, place: Place, placement: Placement
    ) -> AllocRecord:
        group = place.group
        tasks = group.get("Tasks") or []
        return AllocRecord(
            id=str(uuid.uuid4()),
            eval_id=ev.id,
            name=f"{job.id}.{group['Name']}[{place.index}]",
            node_id=placement.node.id,
            node_name=placement.node.spec.name,
            job_id=job.id,
            job=copy.deepcopy(job_json),
            job_version=job.version,
            task_group=str(group["Name"]),
            allocated=placement.allocated,
            metrics=placement.metric.as_json(),
            previous_allocation=place.previous.id if place.previous is not None else "",
            task_states={str(t["Name"]): TaskStateRecord() for t in tasks},
        )


def _group_of(job: JSON, name: str) -> JSON:
    for group in job.get("TaskGroups") or []:
        if group.get("Name") == name:
            return dict(group)
    return {}
