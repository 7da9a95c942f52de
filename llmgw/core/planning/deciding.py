"""One reconcile pass as a pure function: ``decide(desired, observed, state, now) -> Decision``.

Owns: every choice the control plane makes — how many replicas each model runs (through
``llmgw.core.scaling``), which replicas to stop, drain, roll or rebuild, which to place
and with which profiles and fabrics to try, the model's rebuild backoff, and the status
that explains it all in words.

Must not: do I/O, read a clock, draw random numbers, or keep a copy of the cluster's
allocations to guess what fits (Nomad's plan is the oracle: a placement carries its
candidates in order of preference and the executor asks Nomad). Nothing here is async.

The rules, in the order a pass applies them per model:

1. A stopped job is purged. A FAILED replica (see ``replicas``) is stopped whole and the
   model's backoff grows (once per pass), unless it was already draining (a node lost
   under a draining replica is not a failure of the model) or lost with a node. A failure
   followed within ``lost_node_window`` by Nomad calling one of the replica's nodes down
   was the node's: the backoff goes back to what it was (``ModelMemo.suspect``).
2. Draining replicas are stopped once their requests finished (at least ``drain_min``
   after the mark, so routers saw it) or ``drain_timeout`` passed.
3. A model the catalog no longer has is drained away (serving replicas) or stopped.
4. Replicas beyond the wanted count are retired, least useful first.
5. A changed spec rolls one replica at a time: one extra replica of the new spec is
   placed, and an old one drains only when the healthy ones left are still enough.
   If Nomad says twice that the extra one does not fit (the retry comes when capacity
   changes, or after ``unplaceable_retry``), the roll goes in place (drain, then place).
6. Missing replicas are placed, unless the model is backing off or on hold.
   An operator's drain (``Desired.commands``) makes the wanted count 0; a restart makes
   every replica placed before it outdated, so it rolls as in 5.
7. Placements that compete for the same GPUs never come from one snapshot: one at a
   time per claim, and none while an earlier one is still settling.
8. A placement keeps away from the nodes of the model's other replicas first, and falls
   back to any node (``_spread``); the status names replicas that share a node, and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from llmgw.core.backoff import BackoffPolicy, stable_draw
from llmgw.core.catalog.model import ScalingMode
from llmgw.core.planning.actions import (
    Action,
    Candidate,
    ClearDrainMark,
    EndDrain,
    MarkDraining,
    PlaceReplica,
    PlaceWhy,
    StopReplica,
)
from llmgw.core.planning.commands import ModelCommand
from llmgw.core.planning.desired import ANY_GPU, Claim, Desired, ModelTarget, claims_conflict
from llmgw.core.planning.observed import (
    AllocStatus,
    JobId,
    NodeId,
    NodeStatus,
    Observed,
    ObservedJob,
    ReplicaId,
    replica_job_id,
)
from llmgw.core.planning.replicas import Assessment, assess
from llmgw.core.planning.settings import DEFAULT_PLANNING, PlanningSettings
from llmgw.core.planning.state import Backoff, ModelMemo, PlannerState, ReplicaMemo, SuspectFailure
from llmgw.core.planning.status import (
    BackoffStatus,
    ModelStatus,
    Phase,
    ReplicaStatus,
    StatusReport,
)
from llmgw.core.records import HealthStatus
from llmgw.core.scaling import ModelDemand, ScaleDecision, scale

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_V = TypeVar("_V", bound="DataclassInstance")


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]  # in the order to apply them: stops, marks, clears, placements
    state: PlannerState  # remember this; fold the executor's outcomes in (``record_outcomes``)
    status: StatusReport
    next_pass_at: float | None  # the earliest time a timer changes a judgement, with no event
    # Models that want a replica for which no profile is even worth asking Nomad about
    # (a multi-node profile without enough ready nodes on one fabric): why, by model.
    unplaceable: Mapping[str, str] = field(default_factory=dict)
    # Replicas judged lost with a node in this pass (rebuilt at once, without backoff),
    # failures taken back because a node of theirs went down included.
    lost: tuple[JobId, ...] = ()


def decide(
    desired: Desired | None,
    observed: Observed,
    state: PlannerState,
    now: float,
    settings: PlanningSettings = DEFAULT_PLANNING,
) -> Decision:
    """The actions that move the cluster toward ``desired``, and the state to remember.

    ``desired`` None means the catalog could not be read: nothing is stopped or placed
    (an unreadable catalog must never look like an empty one).
    """
    return _Pass(desired, observed, state, now, settings).run()


# --- the working view of one pass -------------------------------------------------------------


@dataclass(slots=True)
class _Replica:
    job_id: JobId
    model: str
    memo: ReplicaMemo
    job: ObservedJob | None
    assessment: Assessment
    profile_index: int
    fabric: str | None
    spec_hash: str
    submitted_at: float
    outdated: bool = False
    restarting: bool = False  # outdated because the operator asked for a restart after it started
    draining: bool = False
    stopping: bool = False
    note: str = ""  # overrides the assessment's reason in the status

    @property
    def phase(self) -> Phase:
        return self.assessment.phase

    @property
    def healthy(self) -> bool:
        return self.assessment.phase is Phase.HEALTHY


@dataclass(frozen=True, slots=True)
class _Request:
    why: PlaceWhy
    model: str
    target: ModelTarget
    candidates: tuple[Candidate, ...]
    reason: str


_RETIRE_ORDER = {
    Phase.REGISTERED: 0,
    Phase.PLACING: 0,
    Phase.LOADING: 1,
    Phase.UNREACHABLE: 2,
    Phase.UNHEALTHY: 3,
    Phase.HEALTHY: 4,
}


class _Pass:
    def __init__(
        self,
        desired: Desired | None,
        observed: Observed,
        state: PlannerState,
        now: float,
        settings: PlanningSettings,
    ) -> None:
        self.desired = desired
        self.observed = observed
        self.state = state
        self.now = now
        self.s = settings
        self.stops: list[Action] = []
        self.marks: list[Action] = []
        self.clears: list[Action] = []
        self.commands: list[Action] = []
        self.requests: list[_Request] = []
        self.deadlines: list[float] = []
        self.replica_memos: dict[JobId, ReplicaMemo] = {}
        self.model_memos: dict[str, ModelMemo] = {}
        self.waiting: dict[str, str] = {}
        self.unplaceable: dict[str, str] = {}
        self.by_model: dict[str, list[_Replica]] = {}
        self.node_down_since: dict[NodeId, float] = {}
        self.lost: list[JobId] = []
        self.rebuild_notes: dict[str, str] = {}
        self._fabric_counts: dict[str, int] | None = None

    # -- the pass ---------------------------------------------------------------------------

    def run(self) -> Decision:
        self._track_nodes()
        replicas = self._replicas()
        for r in replicas:
            self.by_model.setdefault(r.model, []).append(r)
        if self.desired is None:
            return self._idle(replicas)

        scaled = self._scale_all(self.desired)
        names = sorted(set(self.desired.models) | set(self.by_model))
        for name in names:
            self._model(name, self.desired.models.get(name), scaled.get(name))
        self._clear_orphan_marks()
        self._end_stale_drains(self.desired)
        placements = self._admit(replicas)

        statuses = tuple(self._model_status(name, scaled.get(name)) for name in names)
        actions = (*self.stops, *self.marks, *self.clears, *self.commands, *placements)
        future = [d for d in self.deadlines if d is not None]
        return Decision(
            actions=actions,
            state=PlannerState(
                models=self.model_memos,
                replicas=self.replica_memos,
                node_down_since=self.node_down_since,
            ),
            status=StatusReport(
                generated_at=self.now,
                catalog_hash=self.desired.catalog_hash,
                leader=None,
                models=statuses,
            ),
            next_pass_at=max(self.now, min(future)) if future else None,
            unplaceable=self.unplaceable,
            lost=tuple(self.lost),
        )

    def _idle(self, replicas: list[_Replica]) -> Decision:
        """No catalog: keep everything, report what runs."""
        statuses = tuple(self._model_status(name, None, mode="unknown") for name in sorted(self.by_model))
        return Decision(
            actions=(),
            state=PlannerState(
                models=dict(self.state.models),
                replicas=self.replica_memos,
                node_down_since=self.node_down_since,
            ),
            status=StatusReport(
                generated_at=self.now,
                catalog_hash=None,
                leader=None,
                models=statuses,
                note="no catalog: nothing is placed or stopped until one is applied",
            ),
            next_pass_at=None,
        )

    # -- observation into replicas ----------------------------------------------------------

    def _track_nodes(self) -> None:
        for node_id, node in self.observed.nodes.items():
            if node.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED):
                known = self.state.node_down_since.get(node_id)
                seen = node.status_since if node.status_since is not None else self.now
                self.node_down_since[node_id] = min(known, seen) if known is not None else seen

    def _replicas(self) -> list[_Replica]:
        out: list[_Replica] = []
        desired_models = self.desired.models if self.desired else {}
        for job_id, job in self.observed.jobs.items():
            old = self.state.replicas.get(job_id)
            memo = old or ReplicaMemo(model=job.model, replica_id=job.replica_id, first_seen=self.now)
            target = desired_models.get(job.model)
            profile = target.profile(job.profile_index) if target else None
            load_timeout = profile.load_timeout if profile else max(self.s.load_timeouts.values())
            health = self.observed.health.get(job_id)
            unhealthy_since = None
            if memo.was_healthy and health is not HealthStatus.PASSING:
                unhealthy_since = memo.unhealthy_since if memo.unhealthy_since is not None else self.now
            a = assess(
                job,
                health,
                self.observed.nodes,
                self.node_down_since,
                unhealthy_since=unhealthy_since,
                first_seen=memo.first_seen,
                load_timeout=load_timeout,
                now=self.now,
                settings=self.s,
            )
            mark_since = self.observed.drain_marks.get(job_id)
            memo = _update(
                memo,
                registered_at=None,
                profile_index=job.profile_index,
                spec_hash=job.spec_hash,
                restart_generation=job.restart_generation,
                fabric=job.fabric,
                claim=memo.claim or (profile.claim if profile else frozenset({ANY_GPU})),
                was_healthy=memo.was_healthy or a.phase is Phase.HEALTHY,
                unhealthy_since=unhealthy_since,
            )
            if mark_since is not None:
                memo = replace(
                    memo,
                    draining_since=memo.draining_since if memo.draining_since is not None else mark_since,
                    drain_reason=memo.drain_reason or "marked draining before this leader took over",
                    marked=True,
                )
            self.replica_memos[job_id] = memo
            out.append(self._replica(job_id, memo, job, a))
        for job_id, memo in self.state.replicas.items():
            if job_id in self.observed.jobs or memo.registered_at is None:
                continue
            expires = memo.registered_at + self.s.register_observe_timeout
            if self.now >= expires:
                continue  # the register was lost: forget it
            self.replica_memos[job_id] = memo
            self.deadlines.append(expires)
            a = Assessment(Phase.REGISTERED, "registered; Nomad's view does not show it yet", expires, (), ())
            out.append(self._replica(job_id, memo, None, a))
        return out

    def _replica(self, job_id: JobId, memo: ReplicaMemo, job: ObservedJob | None, a: Assessment) -> _Replica:
        if a.deadline is not None:
            self.deadlines.append(a.deadline)
        target = self.desired.models.get(memo.model) if self.desired else None
        profile = target.profile(memo.profile_index) if target else None
        outdated = profile is None
        if self.desired is not None and profile is not None:
            expected = self.desired.expected_spec(
                memo.model, memo.profile_index, memo.replica_id, memo.fabric
            )
            outdated = expected is not None and expected != memo.spec_hash
        restarting = target is not None and memo.restart_generation < self._restart_generation(memo.model)
        return _Replica(
            job_id=job_id,
            model=memo.model,
            memo=memo,
            job=job,
            assessment=a,
            profile_index=memo.profile_index,
            fabric=memo.fabric,
            spec_hash=memo.spec_hash,
            submitted_at=job.submitted_at if job else (memo.registered_at or memo.first_seen),
            outdated=outdated or restarting,
            restarting=restarting and not outdated,
            draining=memo.draining_since is not None,
            stopping=memo.stop_sent_at is not None,
        )

    # -- how many ---------------------------------------------------------------------------

    def _scale_all(self, desired: Desired) -> dict[str, ScaleDecision]:
        out: dict[str, ScaleDecision] = {}
        for name, target in desired.models.items():
            memo = self.state.models.get(name, ModelMemo())
            serving = sum(1 for r in self.by_model.get(name, ()) if r.healthy and not r.draining)
            decision = scale(
                target.policy,
                self.observed.demand.get(name),
                memo.scale,
                self.now,
                serving=serving,
                down_ratio=self.s.scale_down_ratio,
            )
            if decision.wake_at is not None:
                self.deadlines.append(decision.wake_at)
            out[name] = decision
        # A judge stays loaded while any model it guards is loaded (or wanted).
        for name, target in desired.models.items():
            if not target.guarded or out[name].replicas >= 1 or target.policy.max < 1:
                continue
            loaded = [
                g
                for g in target.guarded
                if (g in out and out[g].replicas > 0) or any(not r.stopping for r in self.by_model.get(g, ()))
            ]
            if loaded:
                out[name] = replace(out[name], replicas=1, reason=f"judge of {', '.join(loaded)}")
        # The operator's drain wins over every count, a judge's included: it was asked for by name.
        for name, target in desired.models.items():
            command = self._drain(target)
            if command is not None:
                out[name] = replace(
                    out[name],
                    replicas=0,
                    reason=f"drained by {command.drained_by or 'an operator'}; "
                    "runs again after a restart or a catalog change to the model",
                )
        return out

    # -- the operator's commands -------------------------------------------------------------

    def _command(self, model: str) -> ModelCommand | None:
        return self.desired.commands.get(model) if self.desired is not None else None

    def _restart_generation(self, model: str) -> int:
        command = self._command(model)
        return command.restart_generation if command is not None else 0

    def _drain(self, target: ModelTarget) -> ModelCommand | None:
        """The operator's drain of the model, if it holds for the model as the catalog has it."""
        command = self._command(target.name)
        return command if command is not None and command.drains(target.key) else None

    def _end_stale_drains(self, desired: Desired) -> None:
        """A drain ends with an apply that changes (or removes) the model: clear the record, so
        that applying the drained text again later does not drain the model again."""
        for name in sorted(desired.commands):
            command = desired.commands[name]
            if not command.drain_requested:
                continue
            target = desired.models.get(name)
            if target is not None and command.drains(target.key):
                continue
            change = "was removed from" if target is None else "changed in"
            self.commands.append(
                EndDrain(name, command.drained_key, f"the model {change} the catalog since it was drained")
            )

    # -- one model ----------------------------------------------------------------------------

    def _model(self, name: str, target: ModelTarget | None, scaled: ScaleDecision | None) -> None:
        memo = self.state.models.get(name, ModelMemo())
        if target is not None:
            spec_key = tuple(p.key for p in target.profiles)
            generation = self._restart_generation(name)
            if (memo.spec_key and memo.spec_key != spec_key) or memo.restart_generation < generation:
                # A new spec deserves a fresh try: the operator may just have fixed the failure.
                # So does a restart the operator asked for.
                memo = ModelMemo(scale=memo.scale)
            memo = _update(memo, spec_key=spec_key, restart_generation=generation)
        if scaled is not None:
            memo = _update(memo, scale=scaled.state)

        failed_now = ""
        failed: list[_Replica] = []
        live: list[_Replica] = []
        draining: list[_Replica] = []
        for r in self.by_model.get(name, ()):
            if r.stopping:
                self._stop_again(r)
                continue
            if r.phase is Phase.STOPPED:
                self._stop(r, "the job is stopped in Nomad; purging it")
            elif r.phase is Phase.FAILED:
                if r.draining:
                    self._stop(r, f"was draining; {r.assessment.reason}")
                elif r.assessment.lost_node:
                    # Lost with a node: rebuilt elsewhere at once; the model did nothing wrong,
                    # so its backoff does not grow.
                    self._stop(r, f"lost: {r.assessment.reason}; rebuilding it elsewhere")
                    self.lost.append(r.job_id)
                else:
                    failed_now = failed_now or r.assessment.reason
                    failed.append(r)
                    self._stop(r, f"failed: {r.assessment.reason}; rebuilding it whole")
            elif r.draining:
                draining.append(r)
            else:
                live.append(r)

        if failed_now:
            failures = (memo.backoff.failures if memo.backoff else 0) + 1
            rebuild = BackoffPolicy(self.s.backoff_base, self.s.backoff_max, jitter=self.s.backoff_jitter)
            delay = rebuild.delay(failures, stable_draw(name, failures))
            memo = replace(
                memo,
                backoff=Backoff(failures=failures, retry_at=self.now + delay, last_failure=failed_now),
                healthy_since=None,
                suspect=SuspectFailure(
                    # Every node it was placed on, the failed rank's own included (a node
                    # can fail its engine a moment before it stops answering).
                    nodes=frozenset(
                        a.node_id for r in failed if r.job is not None for a in r.job.allocs if a.desired_run
                    ),
                    until=self.now + self.s.lost_node_window,
                    backoff_before=memo.backoff,
                    replicas=tuple(r.job_id for r in failed),
                ),
            )
        memo = self._judge_suspect(name, memo)

        for r in draining:
            self._progress_drain(r)

        if target is None or scaled is None:
            for r in live:
                self._retire(r, "the model is no longer in the catalog")
            if live or draining or self.by_model.get(name):
                self.model_memos[name] = memo
            return

        memo = self._health_memo(memo, live, bool(failed_now))
        wanted = scaled.replicas
        if self._drain(target) is not None:
            # Drained: everything goes, at once; nothing is worth rolling.
            up, old = list(live), []
        else:
            up = [r for r in live if not r.outdated]
            old = [r for r in live if r.outdated]
        # An outdated replica that serves nothing is replaced at once; only serving ones roll.
        for r in [r for r in old if not r.healthy]:
            self._retire(
                r,
                "started before the restart and is not serving"
                if r.restarting
                else "runs an outdated spec and is not serving",
            )
            live.remove(r)
            old.remove(r)

        drained_now = False
        excess = len(live) - wanted - (1 if old else 0)
        if excess > 0:
            victims = sorted(live, key=lambda r: (not r.outdated, _RETIRE_ORDER[r.phase], -r.submitted_at))
            for r in victims[:excess]:
                drained_now = drained_now or r.healthy
                self._retire(r, f"scaling down to {wanted}: {scaled.reason}")
                live.remove(r)
                if r in old:
                    old.remove(r)
                else:
                    up.remove(r)

        up_starting = any(r.phase.starting for r in up)
        # One old replica drains at a time.
        if old and not draining and not drained_now:
            healthy = sum(1 for r in live if r.healthy)
            victim = min(old, key=lambda r: r.submitted_at)
            if healthy - 1 >= wanted:
                self._retire(victim, f"replaced by a {self._newer(victim)}")
                live.remove(victim)
                old.remove(victim)
            elif memo.surge_blocked and not up_starting:
                self._retire(victim, "rolling in place: no room for an extra replica of the new spec")
                live.remove(victim)
                old.remove(victim)

        deficit = wanted - len(live)
        requests: list[tuple[PlaceWhy, str]] = []
        if deficit > 0:
            demand = self.observed.demand.get(name, ModelDemand())
            if failed_now or len(live) < target.policy.min:
                why = PlaceWhy.REPLACE
            elif target.policy.mode is ScalingMode.ON_DEMAND and not live:
                why = PlaceWhy.WAKE if demand.wake else PlaceWhy.REPLACE
            else:
                why = PlaceWhy.SCALE_UP
            note = self.rebuild_notes.get(name)
            reason = f"{len(live)} of {wanted} replicas ({scaled.reason})" + (f"; {note}" if note else "")
            requests = [(why, reason)] * deficit
        elif old and not up_starting and not memo.surge_blocked and len(live) <= wanted:
            requests = [(PlaceWhy.ROLL, f"a {self._newer(old[0])} before an old one drains")]
        elif old and up_starting:
            self.waiting[name] = "rolling: waiting for the new replica to become healthy"

        if requests:
            self._request(name, target, memo, requests)
        self.model_memos[name] = memo

    def _judge_suspect(self, name: str, memo: ModelMemo) -> ModelMemo:
        """A failure followed by the loss of a node the replica ran on was the node's: the
        backoff it caused is taken back, so the rebuild is not held against the model."""
        suspect = memo.suspect
        if suspect is None:
            return memo
        if self.now >= suspect.until:
            return replace(memo, suspect=None)
        down = sorted(n for n in suspect.nodes if n in self.node_down_since)
        if not down:
            return memo
        names = ", ".join(self._node_name(n) for n in down)
        self.lost.extend(suspect.replicas)
        self.rebuild_notes[name] = (
            f"{', '.join(suspect.replicas)} failed as node {names} went down: lost with it, "
            "rebuilt without backoff"
        )
        return replace(memo, backoff=suspect.backoff_before, suspect=None)

    def _node_name(self, node_id: NodeId) -> str:
        node = self.observed.nodes.get(node_id)
        return node.name if node is not None else str(node_id)

    def _newer(self, old: _Replica) -> str:
        if old.restarting:
            command = self._command(old.model)
            by = command.restarted_by if command is not None and command.restarted_by else "an operator"
            return f"new replica (restart asked by {by})"
        return "replica of the new spec"

    def _health_memo(self, memo: ModelMemo, live: list[_Replica], failed_now: bool) -> ModelMemo:
        """The backoff resets once the model has served, with no failure, for a while."""
        if failed_now or not any(r.healthy for r in live):
            return _update(memo, healthy_since=None)
        since = memo.healthy_since if memo.healthy_since is not None else self.now
        memo = _update(memo, healthy_since=since)
        if memo.backoff is not None:
            reset_at = since + self.s.backoff_reset_after
            if self.now >= reset_at:
                return replace(memo, backoff=None)
            self.deadlines.append(reset_at)
        return memo

    def _request(
        self, name: str, target: ModelTarget, memo: ModelMemo, wanted: list[tuple[PlaceWhy, str]]
    ) -> None:
        if memo.backoff is not None and self.now < memo.backoff.retry_at:
            self.deadlines.append(memo.backoff.retry_at)
            self.waiting[name] = (
                f"backing off after {memo.backoff.failures} failure(s) in a row "
                f"(last: {memo.backoff.last_failure}); next try in "
                f"{memo.backoff.retry_at - self.now:.0f}s"
            )
            return
        hold = memo.hold
        if (
            hold is not None
            and self.now < hold.retry_at
            and (hold.capacity_version is None or hold.capacity_version == self.observed.capacity_version)
        ):
            self.deadlines.append(hold.retry_at)
            self.waiting[name] = f"{hold.reason}; asking Nomad again in {hold.retry_at - self.now:.0f}s"
            return
        if hold is not None:
            # Asked again (capacity changed, or the hold ran out): until a plan succeeds (or
            # the catalog changes the model, which drops the hold), Nomad's last answer is
            # still why the model has no replica; the scaling reason would hide it.
            self.waiting[name] = f"{hold.reason}; asking Nomad again now"
        candidates, why_none = self._candidates(target)
        if not candidates:
            self.waiting[name] = why_none
            self.unplaceable[name] = why_none
            return
        for why, reason in wanted:
            self.requests.append(_Request(why, name, target, candidates, reason))

    def _candidates(self, target: ModelTarget) -> tuple[tuple[Candidate, ...], str]:
        fabrics = self._fabrics()
        out: list[Candidate] = []
        short: list[str] = []
        for p in target.profiles:
            if p.nodes > 1:
                # A multi-node replica runs on one fabric (node meta llmgw_fabric); only
                # fabrics with enough ready nodes are worth a plan.
                fits = [f for f in sorted(fabrics) if fabrics[f] >= p.nodes]
                out.extend(Candidate(p.index, f) for f in fits)
                if not fits:
                    short.append(f"profile {p.index} needs {p.nodes} ready nodes on one fabric")
            else:
                out.append(Candidate(p.index, None))
        return tuple(out), "; ".join(short) + f" (fabrics: {_fabric_list(fabrics)})"

    def _fabrics(self) -> dict[str, int]:
        """Ready, eligible nodes per fabric: which fabrics are worth asking Nomad about at all."""
        if self._fabric_counts is None:
            counts: dict[str, int] = {}
            for node in self.observed.nodes.values():
                if node.fabric is not None and node.status is NodeStatus.READY and node.eligible:
                    counts[node.fabric] = counts.get(node.fabric, 0) + 1
            self._fabric_counts = counts
        return self._fabric_counts

    # -- retiring, draining, stopping -------------------------------------------------------------

    def _retire(self, r: _Replica, reason: str) -> None:
        """Drain a serving replica; stop one that serves nothing."""
        if r.healthy:
            self._start_drain(r, reason)
        else:
            self._stop(r, reason)

    def _start_drain(self, r: _Replica, reason: str) -> None:
        r.draining = True
        memo = replace(r.memo, draining_since=self.now, drain_reason=reason, marked=False)
        r.memo = memo
        self.replica_memos[r.job_id] = memo
        self.marks.append(MarkDraining(r.job_id, r.model, reason))
        self.deadlines.append(self.now + self.s.drain_min)

    def _progress_drain(self, r: _Replica) -> None:
        memo = r.memo
        since = memo.draining_since if memo.draining_since is not None else self.now
        if not memo.marked and r.job_id not in self.observed.drain_marks:
            self.marks.append(MarkDraining(r.job_id, r.model, memo.drain_reason))
        in_flight = self._in_flight(r)
        waited = self.now - since
        if waited >= self.s.drain_min and in_flight == 0:
            self._stop(r, f"drained ({memo.drain_reason})")
        elif waited >= self.s.drain_timeout:
            self._stop(
                r,
                f"drain timeout with {in_flight if in_flight is not None else 'unknown'} "
                f"request(s) in flight; {memo.drain_reason}",
            )
        else:
            if in_flight == 0:
                self.deadlines.append(since + self.s.drain_min)
            else:
                self.deadlines.append(
                    min(since + self.s.drain_timeout, self.now + self.s.drain_check_interval)
                )
            left = "unknown" if in_flight is None else str(in_flight)
            # The reason last: it may hold a colon or parentheses of its own (flat, not nested).
            r.note = f"draining, {left} request(s) in flight: {memo.drain_reason}"

    def _in_flight(self, r: _Replica) -> int | None:
        if not r.healthy:
            return 0  # routers send nothing to a replica that does not pass its check
        probed = self.observed.in_flight.get(r.job_id)
        if probed is not None:
            return probed
        demand = self.observed.demand.get(r.model)
        if demand is None or demand.in_flight == 0:
            # No router reports a request of the model in flight (routers report every model
            # they have requests of): nothing of it is in flight anywhere.
            return 0
        return None

    def _stop(self, r: _Replica, reason: str) -> None:
        r.stopping = True
        memo = replace(r.memo, stop_sent_at=self.now, stop_reason=reason)
        r.memo = memo
        self.replica_memos[r.job_id] = memo
        self.stops.append(StopReplica(r.job_id, r.model, reason))
        self.deadlines.append(self.now + self.s.stop_retry)

    def _stop_again(self, r: _Replica) -> None:
        sent = r.memo.stop_sent_at if r.memo.stop_sent_at is not None else self.now
        if r.job is None and r.memo.registered_at is None:
            return
        if self.now - sent >= self.s.stop_retry:
            self._stop(r, r.memo.stop_reason)
        else:
            self.deadlines.append(sent + self.s.stop_retry)

    def _clear_orphan_marks(self) -> None:
        for job_id in sorted(self.observed.drain_marks):
            if job_id not in self.observed.jobs and job_id not in self.replica_memos:
                self.clears.append(ClearDrainMark(job_id, "the replica is gone"))

    # -- placements -------------------------------------------------------------------------------

    def _admit(self, replicas: list[_Replica]) -> list[PlaceReplica]:
        settling = [r.memo.claim for r in replicas if self._settling(r)]
        taken = {r.job_id for r in replicas} | set(self.replica_memos)
        budget = self.s.placement_attempts_per_pass
        out: list[PlaceReplica] = []
        gpu_models: set[str] = set()
        ordered = sorted(enumerate(self.requests), key=lambda ir: (ir[1].why.priority, ir[1].model, ir[0]))
        for _, req in ordered:
            claim: Claim = req.target.claim
            if any(claims_conflict(claim, c) for c in settling):
                self.waiting.setdefault(
                    req.model, "waiting for a placement that competes for the same GPUs to settle"
                )
                continue
            if claim and req.model in gpu_models:
                # One GPU placement per model per pass; the next pass places the next.
                self.waiting.setdefault(req.model, "placing one replica at a time")
                continue
            if budget <= 0:
                self.waiting.setdefault(req.model, "waiting for its turn to be placed")
                continue
            budget -= 1
            if claim:
                gpu_models.add(req.model)
            replica_id = self._new_replica_id(req.model, taken)
            job_id = replica_job_id(req.model, replica_id)
            taken.add(job_id)
            candidates, unspread = self._spread(req.target, req.candidates)
            out.append(
                PlaceReplica(
                    model=req.model,
                    replica_id=replica_id,
                    job_id=job_id,
                    candidates=candidates,
                    claim=claim,
                    why=req.why,
                    reason=req.reason,
                    restart_generation=self._restart_generation(req.model),
                    unspread=unspread,
                )
            )
        return out

    def _spread(
        self, target: ModelTarget, candidates: tuple[Candidate, ...]
    ) -> tuple[tuple[Candidate, ...], str]:
        """Away from the nodes of the model's other replicas first, then the same candidates
        without: a replica that cannot spread still runs (the status says why it shares).

        Each replica is a Nomad job of its own, so Nomad's ``distinct_hosts`` and ``spread``
        (which look within one job) cannot keep them apart; the candidates carry the nodes
        to avoid, and Nomad's plan says whether that fits. A candidate that could not fit
        anyway (fewer ready nodes without the model's replicas, on its fabric, than the
        profile has ranks) is not worth a plan and is left out; when none is left, the
        second value says why."""
        occupied = sorted(
            {n for r in self.by_model.get(target.name, ()) if not r.stopping for n in _live_nodes(r.job)}
        )
        if not occupied:
            return candidates, ""
        away: list[Candidate] = []
        for cand in candidates:
            profile = target.profile(cand.profile_index)
            free = [
                n
                for n in self.observed.nodes.values()
                if n.status is NodeStatus.READY
                and n.eligible
                and n.node_id not in occupied
                and (cand.fabric is None or n.fabric == cand.fabric)
            ]
            if profile is not None and len(free) >= profile.nodes:
                away.append(replace(cand, away_from=tuple(occupied)))
        if not away:
            return candidates, "too few ready nodes without the model's other replicas to keep away from them"
        return (*away, *candidates), ""

    def _settling(self, r: _Replica) -> bool:
        """Registered, and Nomad has not yet given every group an allocation (for a while)."""
        if r.stopping or not r.memo.claim:
            return False
        if r.job is None:
            return r.phase is Phase.REGISTERED
        if self.now - r.job.submitted_at >= self.s.placement_settle:
            return False
        placed = {a.group for a in r.job.allocs if a.desired_run}
        if all(g in placed for g in r.job.groups):
            return False
        self.deadlines.append(r.job.submitted_at + self.s.placement_settle)
        return True

    def _new_replica_id(self, model: str, taken: set[JobId]) -> ReplicaId:
        # Derived from the time, so ids do not repeat across leaders and restarts (a purged
        # job's id reused at once could meet its own stopping allocations).
        # Lowercase letters and digits, at most 12 (the renderer's rule for replica ids):
        # "r" and the milliseconds in base 36 (8 digits until the year 2059), then a counter.
        base = _base36(int(self.now * 1000))
        k = 0
        while True:
            rid = ReplicaId(f"r{base}" if k == 0 else f"r{base}{_base36(k)}")
            if replica_job_id(model, rid) not in taken:
                return rid
            k += 1

    # -- status -----------------------------------------------------------------------------------

    def _model_status(self, name: str, scaled: ScaleDecision | None, mode: str | None = None) -> ModelStatus:
        target = self.desired.models.get(name) if self.desired else None
        memo = self.model_memos.get(name) or self.state.models.get(name)
        reps = sorted(self.by_model.get(name, ()), key=lambda r: r.job_id)
        backoff = memo.backoff if memo else None
        return ModelStatus(
            model=name,
            mode=mode or (str(target.policy.mode) if target else "removed"),
            desired=scaled.replicas if scaled else 0,
            healthy=sum(1 for r in reps if r.healthy and not r.draining and not r.stopping),
            replicas=tuple(self._replica_status(r) for r in reps),
            scaling=scaled.reason if scaled else ("not in the catalog" if self.desired else "no catalog"),
            waiting=self.waiting.get(name),
            backoff=None
            if backoff is None
            else BackoffStatus(backoff.failures, backoff.retry_at, backoff.last_failure),
            spread=self._shared_nodes(reps),
        )

    def _shared_nodes(self, reps: list[_Replica]) -> str:
        """In words: which replicas of the model share a node (one loss takes them all), and why."""
        holders: dict[NodeId, list[_Replica]] = {}
        for r in reps:
            if not r.stopping:
                for node_id in _live_nodes(r.job):
                    holders.setdefault(node_id, []).append(r)
        notes: list[str] = []
        for node_id in sorted(holders, key=self._node_name):
            sharing = sorted(holders[node_id], key=lambda r: (r.submitted_at, r.job_id))
            if len(sharing) < 2:
                continue
            last = sharing[-1]
            if last.memo.spread_refused:
                why = f"no node away from the others fitted when {last.memo.replica_id} was placed " + (
                    f"({last.memo.spread_refused})"
                )
            elif not last.memo.placed_here:
                why = "placed before this leader took over"
            else:
                why = f"the others' nodes were not known yet when {last.memo.replica_id} was placed"
            ids = ", ".join(r.memo.replica_id for r in sharing)
            notes.append(f"{ids} share node {self._node_name(node_id)}: {why}")
        return "; ".join(notes)

    def _replica_status(self, r: _Replica) -> ReplicaStatus:
        health = self.observed.health.get(r.job_id)
        reason = r.memo.stop_reason if r.stopping else (r.note or r.assessment.reason)
        return ReplicaStatus(
            job_id=r.job_id,
            replica_id=r.memo.replica_id,
            profile=r.profile_index,
            fabric=r.fabric,
            phase=r.phase,
            health=str(health) if health is not None else None,
            nodes=r.assessment.nodes,
            gpus=r.assessment.gpus,
            draining=r.draining,
            stopping=r.stopping,
            outdated=r.outdated,
            reason=reason,
            warnings=r.memo.warnings,
            allocations=_live_allocs(r.job),
        )


def _live_allocs(job: ObservedJob | None) -> tuple[str, ...]:
    """The ids of the job's allocations that stand, as ``_live_nodes`` counts them."""
    if job is None:
        return ()
    return tuple(
        sorted(
            a.alloc_id
            for a in job.allocs
            if a.desired_run and (not a.client_status.terminal or a.client_status is AllocStatus.LOST)
        )
    )


def _live_nodes(job: ObservedJob | None) -> tuple[NodeId, ...]:
    """The nodes where the job has an allocation Nomad wants running and that has not ended
    (an unreachable node's ``unknown`` or ``lost`` one included: it still stands there)."""
    if job is None:
        return ()
    return tuple(
        sorted(
            {
                a.node_id
                for a in job.allocs
                if a.desired_run and (not a.client_status.terminal or a.client_status is AllocStatus.LOST)
            }
        )
    )


def _fabric_list(fabrics: Mapping[str, int]) -> str:
    if not fabrics:
        return "none"
    return ", ".join(f"{name} with {count} ready" for name, count in sorted(fabrics.items()))


def _update(value: _V, **changes: object) -> _V:
    """``dataclasses.replace``, skipped when nothing changes (most passes change nothing, and
    replace is the costliest call of a pass over a thousand models)."""
    for name, new in changes.items():
        if getattr(value, name) != new:
            return replace(value, **changes)
    return value


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    if n <= 0:
        return "0"
    out = []
    while n:
        n, d = divmod(n, 36)
        out.append(_DIGITS[d])
    return "".join(reversed(out))
