"""The reconcile loop: one pass at a time, triggers coalesce, timers come back as values.

Owns: the pass (refresh the Nomad view, read the watched Consul inputs (the operator's
model commands among them: until they have been read once, nothing is decided, since a
drained model must not look like one to place), ``decide``,
execute, fold the outcomes into the state, publish the status and the models it cannot
serve now (``llmgw/unavailable``, for routers), count metrics), the
catalog as the planner sees it (loaded and cached per catalog version, with the spec
oracle that renders what a running replica would run now), and the loop that runs
passes: after a trigger (debounced), when the decision's ``next_pass_at`` is due, or
at least every ``idle_pass_interval``.

Must not: decide (``llmgw.core.planning``), talk to Nomad or Consul other than through
the view, the executor and the ports, or run without a leadership term (``plane``
starts and cancels it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace

from llmgw.cancellation import cancel_and_wait
from llmgw.control.executing import Executor, LeadershipLost
from llmgw.control.metrics import ControlMetrics
from llmgw.control.observing import ClusterView, build_observed, health_by_job
from llmgw.control.ports import (
    CatalogText,
    CatalogWatch,
    Clock,
    CommandWatch,
    DemandWatch,
    DrainMarkWatch,
    EndpointWatch,
    InFlightProbe,
    JobRenderer,
    StatusSink,
    UnavailableSink,
)
from llmgw.control.settings import ControlSettings
from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.planning import (
    EMPTY_STATE,
    Decision,
    Desired,
    Done,
    JobId,
    Observed,
    PlannerState,
    StatusReport,
    StopReplica,
    decide,
    desired_from_catalog,
    record_outcomes,
)
from llmgw.core.planning.status import to_json
from llmgw.core.planning.unavailable import unavailable_models
from llmgw.core.records import HealthStatus, UnavailableModels
from llmgw.render import RenderError, ReplicaRequest

log = logging.getLogger(__name__)

CATALOG_FILENAME = "consul:llmgw/catalog/current"


class SpecCache:
    """The ``SpecOracle`` of one catalog version: renders a replica's job and keeps its hash."""

    def __init__(self, renderer: JobRenderer, catalog: Catalog, catalog_hash: str) -> None:
        self._renderer = renderer
        self._catalog = catalog
        self._catalog_hash = catalog_hash
        # The spec hash leaves out the replica id and the fabric, so one render per
        # profile (and per fabric or none) answers for every replica of it.
        self._known: dict[tuple[str, int, bool], str | None] = {}

    def __call__(self, model: str, profile_index: int, replica_id: str, fabric: str | None) -> str | None:
        key = (model, profile_index, fabric is not None)
        if key not in self._known:
            try:
                request = ReplicaRequest(model, profile_index, replica_id, fabric)
                rendered = self._renderer.render(self._catalog, request, catalog_hash=self._catalog_hash)
                self._known[key] = rendered.spec_hash
            except RenderError as exc:
                # It cannot be rendered now: keep the replica as it is rather than roll into nothing.
                log.warning("cannot render %s profile %s to compare specs: %s", model, profile_index, exc)
                self._known[key] = None
        return self._known[key]


@dataclass(frozen=True, slots=True)
class PlannedCatalog:
    """The catalog the planner works from, or why there is none."""

    catalog: Catalog | None
    desired: Desired | None
    catalog_hash: str
    note: str


class CatalogReader:
    """Loads the watched catalog once per version (its sha256)."""

    def __init__(
        self, watch: CatalogWatch, renderer: JobRenderer, policy: SecurityPolicy, settings: ControlSettings
    ) -> None:
        self._watch = watch
        self._renderer = renderer
        self._policy = policy
        self._settings = settings
        self._cached: tuple[str, PlannedCatalog] | None = None

    def current(self) -> PlannedCatalog:
        if self._watch.generation == 0:
            return PlannedCatalog(None, None, "", "the catalog has not been read from Consul yet")
        version: CatalogText | None = self._watch.latest
        if version is None:
            return PlannedCatalog(None, None, "", "no catalog has been applied (llmgw catalog apply)")
        if self._cached is not None and self._cached[0] == version.sha256:
            return self._cached[1]
        result = load_catalog(version.text, filename=CATALOG_FILENAME, policy=self._policy)
        if result.catalog is None:
            first = result.errors[0] if result.errors else None
            planned = PlannedCatalog(
                None,
                None,
                version.sha256,
                f"catalog version {version.version} does not load"
                + (f": {first}" if first else "")
                + "; nothing is placed or stopped until a good one is applied",
            )
        else:
            oracle = SpecCache(self._renderer, result.catalog, version.sha256)
            desired = desired_from_catalog(result.catalog, version.sha256, oracle, self._settings.planning)
            planned = PlannedCatalog(result.catalog, desired, version.sha256, "")
        self._cached = (version.sha256, planned)
        return planned


class Trigger:
    """Coalescing wake-ups: any number of pokes before the loop looks become one pass."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def poke(self) -> None:
        self._event.set()

    @property
    def pending(self) -> bool:
        return self._event.is_set()

    def take(self) -> bool:
        was = self._event.is_set()
        self._event.clear()
        return was

    async def wait(self) -> None:
        await self._event.wait()


class Reconciler:
    """Owns the planner state of one leadership term. A new term starts a new Reconciler."""

    def __init__(
        self,
        settings: ControlSettings,
        *,
        view: ClusterView,
        executor: Executor,
        catalog: CatalogReader,
        endpoints: EndpointWatch,
        marks: DrainMarkWatch,
        demand: DemandWatch,
        status: StatusSink,
        probe: InFlightProbe,
        clock: Clock,
        metrics: ControlMetrics,
        trigger: Trigger,
        leader_id: str,
        commands: CommandWatch | None = None,
        unavailable: UnavailableSink | None = None,
    ) -> None:
        self.settings = settings
        self._commands = commands
        self._unavailable = unavailable
        self._view = view
        self._executor = executor
        self._catalog = catalog
        self._endpoints = endpoints
        self._marks = marks
        self._demand = demand
        self._status = status
        self._probe = probe
        self._clock = clock
        self._metrics = metrics
        self._trigger = trigger
        self._leader_id = leader_id
        self.state: PlannerState = EMPTY_STATE
        self.last: Decision | None = None
        self.passes = 0
        self._published: tuple[str, float] | None = None
        self._published_unavailable: tuple[UnavailableModels, float] | None = None

    async def run_pass(self) -> Decision:
        """Observe, decide, act, remember, publish: one pass."""
        started = time.perf_counter()
        await self._view.refresh()
        planned = self._catalog.current()
        desired, note = self._with_commands(planned)
        now = self._clock.time()
        observed = await self._observe(now)
        t0 = time.perf_counter()
        decision = decide(desired, observed, self.state, now, self.settings.planning)
        self._metrics.decide_seconds.observe(time.perf_counter() - t0)
        # The decision's state is the memory from here on, even if acting fails half-way.
        self.state = decision.state
        if decision.lost:
            self._metrics.replicas_lost.inc(len(decision.lost))
            log.info("lost with a node, rebuilding without backoff: %s", ", ".join(decision.lost))
        outcomes = await self._executor.apply(decision.actions, planned.catalog, planned.catalog_hash)
        stopped = [
            o.action.job_id for o in outcomes if isinstance(o, Done) and isinstance(o.action, StopReplica)
        ]
        for job_id in stopped:
            # Its purge may come with no event: read it again, and soon, so it leaves the
            # view (and the status) at once rather than at the next resync.
            self._view.refetch(job_id)
        if stopped:
            self._trigger.poke()
        self.state = record_outcomes(
            decision.state,
            outcomes,
            self._clock.time(),
            self.settings.planning,
            capacity_version=observed.capacity_version,
            gpus_freeing=observed.gpus_freeing,
        )
        # The reader's note says why there is no catalog more precisely than the decision can.
        report = replace(decision.status, leader=self._leader_id, note=note or decision.status.note)
        await self._publish(report)
        await self._publish_unavailable(
            unavailable_models(
                desired,
                self.state,
                observed.capacity_version,
                self._clock.time(),
                unplaceable=decision.unplaceable,
                previous=self._published_unavailable[0] if self._published_unavailable else None,
            )
        )
        self._metrics.observe_status(report.models)
        self._metrics.pass_seconds.observe(time.perf_counter() - started)
        self.last = decision
        self.passes += 1
        return decision

    def _with_commands(self, planned: PlannedCatalog) -> tuple[Desired | None, str]:
        if planned.desired is None or self._commands is None:
            return planned.desired, planned.note
        if self._commands.generation == 0:
            return None, (
                "the operator's model commands (Consul KV llmgw/commands/) have not been read yet; "
                "nothing is placed or stopped until they are"
            )
        commands = self._commands.latest or {}
        if not commands:
            return planned.desired, planned.note
        return replace(planned.desired, commands=commands), planned.note

    async def _observe(self, now: float) -> Observed:
        jobs, nodes = self._view.snapshot()
        endpoints = self._endpoints.latest
        marks = self._marks.latest or {}
        in_flight: dict[JobId, int] = {}
        # Ask the engines of draining replicas how much they still serve.
        health = health_by_job(endpoints)
        for job_id in marks:
            jid = JobId(job_id)
            if health.get(jid) is not HealthStatus.PASSING or endpoints is None:
                continue
            endpoint = next((e for e in endpoints.endpoints if e.replica == job_id and e.passing), None)
            if endpoint is None:
                continue
            with contextlib.suppress(Exception):
                count = await asyncio.wait_for(self._probe.in_flight(endpoint), self.settings.probe_timeout)
                if count is not None:
                    in_flight[jid] = count
        demand = (self._demand.latest or {}).values()
        return build_observed(
            jobs,
            nodes,
            endpoints=endpoints,
            marks=marks,
            demand=demand,
            in_flight=in_flight,
            capacity_version=self._view.capacity_version,
            gpus_freeing=self._view.gpus_freeing,
            now=now,
            demand_stale_after=self.settings.planning.demand_stale_after,
        )

    async def _publish(self, report: StatusReport) -> None:
        text = to_json(report)
        comparable = to_json(replace(report, generated_at=0.0))
        now = self._clock.time()
        if (
            self._published is not None
            and self._published[0] == comparable
            and now - self._published[1] < self.settings.status_refresh
        ):
            return
        try:
            await self._status.publish(text)
            self._published = (comparable, now)
        except Exception as exc:  # the status is advisory: never fail a pass for it
            log.warning("could not publish the status: %s", exc)

    async def _publish_unavailable(self, document: UnavailableModels) -> None:
        """Write ``llmgw/unavailable`` when it changed, and every ``status_refresh`` anyway:
        routers trust it only while it is fresh (``unavailable_stale_after``)."""
        if self._unavailable is None:
            return
        last = self._published_unavailable
        if (
            last is not None
            and replace(last[0], published_at=document.published_at) == document
            and document.published_at - last[1] < self.settings.status_refresh
        ):
            return
        try:
            await self._unavailable.publish(document)
            self._published_unavailable = (document, document.published_at)
        except Exception as exc:  # routers then wait for loads as before: never fail a pass for it
            log.warning("could not publish the unavailable models: %s", exc)

    async def run(self) -> None:
        """Passes until cancelled or leadership is lost."""
        s = self.settings
        failures = 0
        wake_at: float | None = None  # wall time of the next due pass
        last_start: float | None = None
        self._trigger.poke()  # the first pass at once
        while True:
            now = self._clock.time()
            wait_for = s.idle_pass_interval if wake_at is None else max(0.0, wake_at - now)
            triggered = await self._wait(wait_for)
            if triggered:
                await self._clock.sleep(s.debounce)
            if last_start is not None:
                gap = s.min_pass_interval - (self._clock.time() - last_start)
                if gap > 0:
                    await self._clock.sleep(gap)
            self._trigger.take()
            last_start = self._clock.time()
            try:
                decision = await self.run_pass()
            except LeadershipLost:
                log.info("leadership lost during a pass; stopping")
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = s.pass_backoff.step(failures)
                self._metrics.passes.labels(result="error").inc()
                log.warning("reconcile pass failed (%s); retrying in %.1fs", exc, delay)
                wake_at = self._clock.time() + delay
                continue
            failures = 0
            self._metrics.passes.labels(result="ok").inc()
            wake_at = decision.next_pass_at

    async def _wait(self, seconds: float) -> bool:
        """True if poked, False if the timeout passed first."""
        if self._trigger.pending:
            return True
        waiter = asyncio.ensure_future(self._trigger.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(waiter, sleeper)
        return self._trigger.pending
