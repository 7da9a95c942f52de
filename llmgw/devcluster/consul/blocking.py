"""Blocking queries: waiting for a view's index to pass the client's, as Consul does.

Owns :class:`ChangeFeed` (one per store: every change wakes every waiter, who
re-reads its own view) and :func:`block_until_changed` (Consul's
``blockingquery.Query`` loop: return at once without ``?index=``, otherwise
wait until the view's index exceeds it or ``wait`` plus up to ``wait/16`` of
jitter passes, then answer with the current index whatever it is, so an index
from the future or from before a reset comes back lower and the client resets).

Must not: render or know which endpoint is asking.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from llmgw.devcluster.consul.durations import DurationError, parse_go_duration
from llmgw.devcluster.consul.model import ConsulError
from llmgw.devcluster.consul.settings import ConsulSettings
from llmgw.devcluster.consul.state import ConsulState

T = TypeVar("T")


class ChangeFeed:
    """Wakes waiters whenever the store changes (and all of them for good on close)."""

    def __init__(self, state: ConsulState) -> None:
        self._event = asyncio.Event()
        self._closed = False
        self._unsubscribe = state.subscribe(self._notify)
        # Requests parked on a change right now (``ConsulStandIn.blocked_queries``): a
        # test writes once its query is parked instead of sleeping first.
        self.waiting = 0

    def _notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release every waiter now and from now on (the stand-in is stopping)."""
        self._closed = True
        self._unsubscribe()
        self._event.set()

    def snapshot(self) -> asyncio.Event:
        """The event the next change sets; take it before reading, then wait on it."""
        return self._event

    async def wait(self, event: asyncio.Event, within: float | None) -> None:
        """Until ``event`` is set (a change since the snapshot) or ``within`` seconds pass."""
        if self._closed:
            return
        if within is not None and within <= 0:
            return
        self.waiting += 1
        try:
            await asyncio.wait_for(event.wait(), within)
        except TimeoutError:
            return
        finally:
            self.waiting -= 1

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds (re-checked after every change) or the feed closes."""
        while not predicate() and not self._closed:
            await self.wait(self.snapshot(), None)


@dataclass(frozen=True, slots=True)
class BlockingParams:
    min_index: int  # 0: answer at once
    wait: float  # seconds, before jitter


def parse_blocking(index: str | None, wait: str | None, settings: ConsulSettings) -> BlockingParams:
    """``?index=`` and ``?wait=`` with Consul's defaults, cap and error texts."""
    min_index = 0
    if index is not None and index != "":
        try:
            min_index = int(index)
        except ValueError:
            raise ConsulError(400, "Invalid index") from None
        if min_index < 0:
            raise ConsulError(400, "Invalid index")
    seconds = 0.0
    if wait:
        try:
            seconds = parse_go_duration(wait)
        except DurationError:
            raise ConsulError(400, "Invalid wait time") from None
    if seconds <= 0:
        seconds = settings.default_wait
    return BlockingParams(min_index=min_index, wait=min(seconds, settings.max_wait))


async def block_until_changed(
    feed: ChangeFeed, params: BlockingParams, settings: ConsulSettings, view: Callable[[], tuple[int, T]]
) -> tuple[int, T]:
    """Read ``view`` (which returns ``(index, result)``) until its index passes
    ``params.min_index`` or the wait ends; return the last reading."""
    event = feed.snapshot()
    index, result = view()
    if params.min_index == 0 or index > params.min_index:
        return index, result
    loop = asyncio.get_running_loop()
    jitter = 0.0
    if settings.jitter_fraction > 0:
        jitter = random.uniform(0, params.wait / settings.jitter_fraction)  # noqa: S311 (jitter, not secrets)
    deadline = loop.time() + params.wait + jitter
    while index <= params.min_index and not feed.closed:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await feed.wait(event, remaining)
        event = feed.snapshot()
        index, result = view()
    return index, result
