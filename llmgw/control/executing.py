"""The one place the control plane changes the world: applying a decision's actions, in order.

Owns: turning each action into Nomad and Consul calls, idempotently ("already exists"
with llmgw's meta and the same spec, and "already gone", are success), and reporting an
outcome per action. Checks leadership before every change it makes and stops the
moment it is lost (``LeadershipLost``), so two leaders never act at once.

Must not: decide. Its one rule of its own is the one ``llmgw.core.planning.actions``
states: after a placement registers, later placements with a conflicting GPU claim in
the same batch are ``Deferred`` (the next pass plans them from a snapshot that holds the
first one's allocations).

A placement: render the first candidate (profile, fabric), check the job locally, let
Nomad parse it, ask Nomad's plan whether it fits; register the first that fits. The
model's restart generation goes into the parsed job's meta here, not through the
renderer: it is not part of what the replica runs (nor of its spec hash). So do the
spread's constraints (``${node.unique.id} != <node>`` per node the candidate keeps away
from): they follow where the other replicas run, and putting them in the spec hash would
roll a replica whenever another one moved. What does not fit is explained in words, per
candidate, in the ``Unplaceable`` outcome; a replica placed without the spread after the
candidates with it did not fit says why in ``Placed.spread_refused``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from llmgw.control.metrics import ControlMetrics
from llmgw.control.observing import is_managed
from llmgw.control.ports import JSON, Clock, CommandsPort, DrainMarksPort, JobRenderer, LeaderPort, NomadPort
from llmgw.control.settings import ControlSettings
from llmgw.core import acl_refusals, engine_keys
from llmgw.core import conventions as c
from llmgw.core.catalog import Catalog
from llmgw.core.engine_keys import EngineKeys
from llmgw.core.planning import (
    Action,
    Candidate,
    Claim,
    ClearDrainMark,
    Deferred,
    Done,
    EndDrain,
    Failed,
    MarkDraining,
    Outcome,
    Placed,
    PlaceReplica,
    StopReplica,
    Unplaceable,
    claims_conflict,
)
from llmgw.core.records import DrainMark
from llmgw.render import RenderError, ReplicaRequest

log = logging.getLogger(__name__)
T = TypeVar("T")


def with_spread(job: JSON, candidate: Candidate) -> JSON:
    """The parsed job with one job-level ``${node.unique.id} != <node>`` constraint per node
    the candidate keeps away from: every group of the replica stays off those nodes."""
    if not candidate.away_from:
        return job
    spread = [
        {"LTarget": "${node.unique.id}", "Operand": "!=", "RTarget": str(node)}
        for node in candidate.away_from
    ]
    return {**job, "Constraints": [*(job.get("Constraints") or []), *spread]}


def describe_candidate(candidate: Candidate) -> str:
    where = f"profile {candidate.profile_index}" + (
        f" on fabric {candidate.fabric}" if candidate.fabric else ""
    )
    if candidate.away_from:
        where += f" away from {len(candidate.away_from)} node(s) of the model's other replicas"
    return where


class LeadershipLost(Exception):
    """This instance no longer leads: stop acting at once."""


class RuleMissing(Exception):
    """Nomad refused a call with 403: its words, and the ops/acl rule the call needs."""


def _refused(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 403


class Executor:
    def __init__(
        self,
        nomad: NomadPort,
        renderer: JobRenderer,
        marks: DrainMarksPort,
        leader: LeaderPort,
        settings: ControlSettings,
        clock: Clock,
        metrics: ControlMetrics,
        commands: CommandsPort | None = None,
        engine_keys: EngineKeys | None = None,
    ) -> None:
        self._nomad = nomad
        self._engine_keys = engine_keys
        self._commands = commands
        self._renderer = renderer
        self._marks = marks
        self._leader = leader
        self._settings = settings
        self._clock = clock
        self._metrics = metrics

    async def apply(
        self, actions: Sequence[Action], catalog: Catalog | None, catalog_hash: str
    ) -> list[Outcome]:
        outcomes: list[Outcome] = []
        registered: list[Claim] = []
        for action in actions:
            self._check_leader()
            outcome: Outcome
            if isinstance(action, PlaceReplica):
                if any(claims_conflict(action.claim, claim) for claim in registered):
                    outcome = Deferred(action)
                elif catalog is None:
                    outcome = Failed(action, "no catalog to render from")
                else:
                    outcome = await self._guard(action, self._place(action, catalog, catalog_hash))
                    if isinstance(outcome, Placed):
                        registered.append(action.claim)
            elif isinstance(action, StopReplica):
                outcome = await self._guard(action, self._stop(action))
            elif isinstance(action, MarkDraining):
                outcome = await self._guard(action, self._mark(action))
            elif isinstance(action, EndDrain):
                outcome = await self._guard(action, self._end_drain(action))
            else:
                outcome = await self._guard(action, self._clear(action))
            self._metrics.actions.labels(kind=str(action.kind), outcome=_outcome_name(outcome)).inc()
            if isinstance(outcome, Failed):
                log.warning("%s %s failed: %s", action.kind, _subject(action), outcome.error)
            elif not isinstance(outcome, Deferred):
                log.info("%s %s: %s", action.kind, _subject(action), _describe(outcome))
            outcomes.append(outcome)
        return outcomes

    def _check_leader(self) -> None:
        if not self._leader.is_leader:
            raise LeadershipLost("leadership lost; the executor stops before its next action")

    async def _guard(self, action: Action, work: Awaitable[Outcome]) -> Outcome:
        """Any error of one action is that action's outcome, not the end of the pass."""
        try:
            return await work
        except LeadershipLost:
            raise
        except Exception as exc:
            return Failed(action, f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc))

    async def _call(self, work: Awaitable[T], needs: str | None = None) -> T:
        """``work`` within the action timeout; a 403 says it ``needs`` (the ops/acl rule)."""
        try:
            return await asyncio.wait_for(work, self._settings.action_timeout)
        except Exception as exc:
            if needs is not None and _refused(exc):
                raise RuleMissing(f"{exc}: {needs}") from exc
            raise

    async def _place(self, action: PlaceReplica, catalog: Catalog, catalog_hash: str) -> Outcome:
        existing = await self._call(self._nomad.job(action.job_id))
        explanations: list[str] = []
        refused: list[str] = []  # why the candidates with the spread did not fit
        for cand in action.candidates:
            where = describe_candidate(cand)
            try:
                request = ReplicaRequest(action.model, cand.profile_index, action.replica_id, cand.fabric)
                rendered = self._renderer.render(catalog, request, catalog_hash=catalog_hash)
                self._renderer.check(rendered, model=action.model)
            except RenderError as exc:
                explanations.append(f"{where}: cannot render ({exc})")
                continue
            if rendered.job_id != action.job_id:
                return Failed(
                    action, f"the renderer names the job {rendered.job_id}, the plan {action.job_id}"
                )
            if existing is not None:
                # A register that went through before a crash or a lost answer: adopt it.
                meta = existing.get("Meta") or {}
                if is_managed(existing) and meta.get(c.JOB_META_SPEC_HASH) == rendered.spec_hash:
                    return Placed(action, cand.profile_index, cand.fabric, rendered.spec_hash)
                return Failed(action, f"a job {action.job_id} exists already and is not this replica")
            job = await self._call(self._nomad.parse_hcl(rendered.hcl))
            if action.restart_generation > 0:
                meta = {**(job.get("Meta") or {})}
                meta[c.JOB_META_RESTART_GENERATION] = str(action.restart_generation)
                job = {**job, "Meta": meta}
            job = with_spread(job, cand)
            namespace = str(job.get("Namespace") or "default")
            plan = await self._call(self._nomad.plan(job), acl_refusals.nomad_call_refused("plan", namespace))
            if not plan.feasible:
                explanations.append(f"{where}: {plan.explanation}")
                if cand.away_from:
                    refused.append(f"{where}: {plan.explanation}")
                continue
            self._check_leader()
            if self._engine_keys is not None:
                # Before the job exists, so its engine task finds its key when it starts.
                path = engine_keys.variable_path(action.job_id)
                await self._call(
                    self._nomad.put_variable(
                        path, {engine_keys.KEY_ITEM: self._engine_keys.for_replica(action.job_id)}
                    ),
                    acl_refusals.nomad_call_refused("write variable", namespace, path),
                )
            registered = await self._call(
                self._nomad.register(job), acl_refusals.register_refused(job, namespace)
            )
            # Nomad's only word on what it ignores or doubts in a job (the plan and the
            # register run the same checks; a register may add a policy's): kept in the status.
            warnings = tuple(dict.fromkeys((*plan.warnings, *registered.warnings)))
            for warning in warnings:
                log.warning("Nomad warns about job %s: %s", action.job_id, warning)
            spread_refused = "" if cand.away_from else "; ".join(refused)
            return Placed(
                action, cand.profile_index, cand.fabric, rendered.spec_hash, warnings, spread_refused
            )
        return Unplaceable(action, "; ".join(explanations) or "no candidate to try")

    async def _stop(self, action: StopReplica) -> Outcome:
        existing = await self._call(self._nomad.job(action.job_id))
        if existing is None:
            if self._engine_keys is not None:  # a job purged by hand leaves its key behind
                await self._call(self._nomad.delete_variable(engine_keys.variable_path(action.job_id)))
            return Done(action)  # already gone
        if not is_managed(existing):
            return Failed(action, f"job {action.job_id} does not carry llmgw's meta; llmgw leaves it alone")
        self._check_leader()
        await self._call(self._nomad.deregister(action.job_id, purge=True))
        if self._engine_keys is not None:
            await self._call(self._nomad.delete_variable(engine_keys.variable_path(action.job_id)))
        return Done(action)

    async def _mark(self, action: MarkDraining) -> Outcome:
        mark = DrainMark(
            job_id=action.job_id, model=action.model, since=self._clock.time(), reason=action.reason
        )
        await self._call(self._marks.set(mark))
        return Done(action)

    async def _clear(self, action: ClearDrainMark) -> Outcome:
        await self._call(self._marks.clear(action.job_id))
        return Done(action)

    async def _end_drain(self, action: EndDrain) -> Outcome:
        if self._commands is None:
            return Failed(action, "this control plane has no command store to write to")
        await self._call(self._commands.end_drain(action.model, action.drained_key))
        return Done(action)


def _outcome_name(outcome: Outcome) -> str:
    return type(outcome).__name__.lower()


def _subject(action: Action) -> str:
    return f"model {action.model}" if isinstance(action, EndDrain) else str(action.job_id)


def _describe(outcome: Outcome) -> str:
    if isinstance(outcome, Placed):
        fabric = f" on fabric {outcome.fabric}" if outcome.fabric else ""
        return f"registered profile {outcome.profile_index}{fabric} ({outcome.action.reason})"
    if isinstance(outcome, Unplaceable):
        return f"does not fit: {outcome.explanation}"
    if isinstance(outcome, Done):
        return outcome.action.reason
    return ""
