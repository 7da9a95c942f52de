"""Demand reporting: which models this router uses, for the control plane's idle
unloading and for waking on-demand models.

Owns: the last use per model (wall clock), the models with a wake-up pending, and
the one loop that publishes ``DemandReport``s through the ``DemandSink``: every
``demand_interval`` seconds, and at once when a wake-up is requested. Simultaneous
requests for one sleeping model share one wake-up: a model already pending does
not trigger another publish, and there is only one publish in flight at a time.

Must not: decide to load or unload anything (the control plane does), or block a
request on Consul: ``record_use`` and ``wake`` only touch memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmgw.core.records import DemandReport, ModelUse
from llmgw.gateway.ports import Clock, DemandSink

log = logging.getLogger("llmgw.gateway.demand")


class DemandTracker:
    def __init__(
        self,
        router_id: str,
        sink: DemandSink,
        clock: Clock,
        interval: float,
        load: Callable[[str], tuple[int, int]],
        on_published: Callable[[bool], None] = lambda ok: None,
    ) -> None:
        """``load(model)`` gives (in flight, queued) for the report."""
        self._router_id = router_id
        self._sink = sink
        self._clock = clock
        self._interval = interval
        self._load = load
        self._on_published = on_published
        self._last_used: dict[str, float] = {}
        self._waiting: dict[str, int] = {}  # requests waiting for a model to load
        self._wake_pending: set[str] = set()  # woken since the last report went out
        self._urgent = asyncio.Event()
        self.wakeups = 0  # distinct wake-ups sent (what a test of coalescing counts)

    def record_use(self, model: str) -> None:
        self._last_used[model] = self._clock.wall()

    def wake(self, model: str) -> bool:
        """Ask for ``model`` to be loaded; True when this call started a new wake-up."""
        self.record_use(model)
        if model in self._wake_pending or self._waiting.get(model):
            return False
        self._wake_pending.add(model)
        self.wakeups += 1
        self._urgent.set()
        return True

    def waiting(self, model: str, delta: int) -> None:
        """A request starts (+1) or stops (-1) waiting for ``model`` to load."""
        count = self._waiting.get(model, 0) + delta
        if count > 0:
            self._waiting[model] = count
        else:
            self._waiting.pop(model, None)

    def report(self) -> DemandReport:
        models = []
        for model, last_used in sorted(self._last_used.items()):
            in_flight, queued = self._load(model)
            wake = model in self._wake_pending or model in self._waiting
            models.append(ModelUse(model, last_used, in_flight, queued + self._waiting.get(model, 0), wake))
        return DemandReport(router_id=self._router_id, sent_at=self._clock.wall(), models=tuple(models))

    async def publish_once(self) -> bool:
        self._urgent.clear()
        sent = set(self._wake_pending)
        report = self.report()
        try:
            await self._sink.publish(report)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("demand report not published (retrying in %.0fs): %s", self._interval, exc)
            self._on_published(False)
            return False
        # A wake-up stays pending until a report carrying it went out; one that
        # arrived during the publish stays for the next.
        self._wake_pending -= sent
        self._on_published(True)
        return True

    async def run(self) -> None:
        """Publish every interval, and at once on a wake-up; until cancelled."""
        while True:
            try:
                async with asyncio.timeout(self._interval):
                    await self._urgent.wait()
            except TimeoutError:
                pass
            await self.publish_once()

    async def withdraw(self) -> None:
        try:
            await self._sink.withdraw()
        except Exception as exc:
            log.warning("demand report not withdrawn: %s", exc)
