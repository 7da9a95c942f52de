"""The one loop that keeps the Consul stand-in's time moving.

Owns :class:`Supervisor`: on every change to the store and at every deadline the
store names, it calls ``state.advance(now)`` (sessions expire, TTL checks lapse,
the reaper reaps, an outage ends), makes the check runners match the store, and
runs an optional extra step (the stand-in uses it to close or reopen listeners
for a REFUSE outage). One loop, so nothing here races with itself.

Must not: answer HTTP or hold data (the store does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from llmgw.cancellation import cancel_and_wait
from llmgw.devcluster.consul.blocking import ChangeFeed
from llmgw.devcluster.consul.checks import CheckRunners
from llmgw.devcluster.consul.state import ConsulState

log = logging.getLogger(__name__)

ExtraStep = Callable[[], Awaitable[None]]


class Supervisor:
    def __init__(self, state: ConsulState, feed: ChangeFeed, extra_step: ExtraStep | None = None) -> None:
        self._state = state
        self._feed = feed
        self._extra_step = extra_step
        self._runners = CheckRunners(state, state.settings)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="consul-standin-supervisor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await self._runners.close()

    async def step(self) -> None:
        """One pass: apply what is due, match the runners, run the extra step."""
        loop = asyncio.get_running_loop()
        self._state.advance(loop.time())
        self._runners.reconcile()
        if self._extra_step is not None:
            await self._extra_step()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._feed.closed:
            event = self._feed.snapshot()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep time moving; a bug shows in the log, not as a frozen cluster
                log.exception("Consul stand-in supervisor step failed")
            deadline = self._state.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            await self._feed.wait(event, timeout)
