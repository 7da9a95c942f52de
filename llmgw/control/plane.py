"""The control plane as one object to start and stop: leader-gated reconciling over watched inputs.

Owns: the lifecycle (``ControlPlane.start`` / ``stop``; ``run_control_plane`` for ``llmgw
serve``), the wiring of view, executor and reconciler, the tasks that turn Nomad events
and Consul changes into triggers, and the leadership gate: every instance keeps its view
of Nomad warm; only the leader runs passes, a fresh ``Reconciler`` per term (adopting
what runs from Nomad and Consul, not from memory), cancelled the moment the term is lost.

Must not: parse flags or the environment (``llmgw.cli`` builds ``ControlSettings`` and
``ControlDeps``), or decide anything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.cancellation import cancel_and_wait
from llmgw.control.executing import Executor
from llmgw.control.metrics import ControlMetrics
from llmgw.control.observing import ClusterView
from llmgw.control.ports import (
    CatalogWatch,
    Clock,
    CommandsPort,
    CommandWatch,
    DemandWatch,
    DrainMarksPort,
    DrainMarkWatch,
    EndpointWatch,
    InFlightProbe,
    JobRenderer,
    LeaderPort,
    NomadPort,
    NoProbe,
    StatusSink,
    SystemClock,
    UnavailableSink,
    Watched,
)
from llmgw.control.reconciling import CatalogReader, Reconciler, Trigger
from llmgw.control.settings import ControlSettings
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.engine_keys import EngineKeys

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ControlDeps:
    """Everything the control plane talks to. The plane starts and stops the election and
    the watches it is given (their ``start`` is idempotent, so sharing one with a router in
    the same process is fine); the Nomad client and the renderer are the caller's."""

    nomad: NomadPort
    renderer: JobRenderer
    leader: LeaderPort
    catalog: CatalogWatch
    endpoints: EndpointWatch
    drain_marks: DrainMarkWatch
    drain_writer: DrainMarksPort
    demand: DemandWatch
    status: StatusSink
    policy: SecurityPolicy
    clock: Clock = field(default_factory=SystemClock)
    probe: InFlightProbe = field(default_factory=NoProbe)
    metrics: ControlMetrics = field(default_factory=ControlMetrics)
    # The operator's drain and restart commands, and where a drain the catalog ended is
    # cleared. None: no operator commands (tests of other things).
    commands: CommandWatch | None = None
    command_writer: CommandsPort | None = None
    # Where the leader tells routers which models it cannot serve now (llmgw/unavailable).
    # None: routers are not told (they wait for loads, as without a control plane).
    unavailable: UnavailableSink | None = None
    # Each replica's engine API key, written into its job's Nomad Variable before the job
    # is registered (llmgw.core.engine_keys). None: engines run without keys.
    engine_keys: EngineKeys | None = None


class ControlPlane:
    def __init__(self, settings: ControlSettings, deps: ControlDeps) -> None:
        self.settings = settings
        self.deps = deps
        self.metrics = deps.metrics
        self.trigger = Trigger()
        self.view = ClusterView(deps.nomad, settings, deps.clock, deps.metrics, on_change=self.trigger.poke)
        self.executor = Executor(
            deps.nomad,
            deps.renderer,
            deps.drain_writer,
            deps.leader,
            settings,
            deps.clock,
            deps.metrics,
            commands=deps.command_writer,
            engine_keys=deps.engine_keys,
        )
        self.catalog = CatalogReader(deps.catalog, deps.renderer, deps.policy, settings)
        self.reconciler: Reconciler | None = None  # the current term's, while leading
        self.terms = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[Watched[Any]] = [deps.catalog, deps.endpoints, deps.drain_marks, deps.demand]
        if deps.commands is not None:
            self._watches.append(deps.commands)

    async def start(self) -> None:
        if self._tasks:
            return
        for watch in self._watches:
            await watch.start()
        await self.deps.leader.start()
        self._spawn(self._keep_view, "control-view")
        for watch in self._watches:
            self._spawn(self._forwarder(watch), "control-watch")
        self._spawn(self._lead, "control-lead")

    async def stop(self) -> None:
        """Stop acting first (cancel the loop), then resign, then stop watching."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        self.metrics.leader.set(0)
        await self.deps.leader.stop()
        for watch in self._watches:
            await watch.stop()

    def _spawn(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        self._tasks.append(asyncio.create_task(self._supervised(work, name), name=name))

    async def _supervised(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        """A background loop that dies of a bug is logged and restarted, not lost silently."""
        while True:
            try:
                await work()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("control plane task %s crashed; restarting it", name)
                await self.deps.clock.sleep(self.settings.pass_retry)

    async def _keep_view(self) -> None:
        # The first resync happens in the first pass's refresh, or here for a standby.
        failures = 0
        while True:
            try:
                await self.view.refresh()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = self.settings.events_backoff.step(failures)
                log.warning("cannot read Nomad yet (%s); retrying in %.1fs", exc, delay)
                await self.deps.clock.sleep(delay)
        await self.view.follow_events()

    def _forwarder(self, watch: Watched[Any]) -> Callable[[], Awaitable[None]]:
        async def forward() -> None:
            seen = watch.generation
            while True:
                await watch.wait_changed(seen)
                seen = watch.generation
                self.trigger.poke()

        return forward

    async def _lead(self) -> None:
        while True:
            term = await self.deps.leader.wait_for_leadership()
            self.terms += 1
            self.metrics.leader.set(1)
            # A standby's view followed events without fetching the jobs they named: start
            # the term from a full, fresh read of Nomad.
            self.view.request_resync("leadership")
            log.info("leading (term %d): reconciling", self.terms)
            reconciler = Reconciler(
                self.settings,
                view=self.view,
                executor=self.executor,
                catalog=self.catalog,
                endpoints=self.deps.endpoints,
                marks=self.deps.drain_marks,
                demand=self.deps.demand,
                status=self.deps.status,
                probe=self.deps.probe,
                clock=self.deps.clock,
                metrics=self.metrics,
                trigger=self.trigger,
                leader_id=self.deps.leader.instance_id,
                commands=self.deps.commands,
                unavailable=self.deps.unavailable,
            )
            self.reconciler = reconciler
            loop = asyncio.create_task(reconciler.run(), name="control-reconcile")
            lost = asyncio.create_task(term.lost.wait(), name="control-term")
            try:
                await asyncio.wait({loop, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_and_wait(loop, lost)
                self.metrics.leader.set(0)
                self.reconciler = None
            log.info("leadership ended; standing by")
            if not term.lost.is_set():
                # The loop ended by itself (leadership seen lost by the executor): wait for the
                # election to notice before campaigning for the next term.
                await term.lost.wait()


async def run_control_plane(settings: ControlSettings, deps: ControlDeps) -> None:
    """Run until cancelled (``llmgw serve``'s control task), then stop cleanly."""
    plane = ControlPlane(settings, deps)
    await plane.start()
    try:
        await asyncio.Event().wait()
    finally:
        await plane.stop()
