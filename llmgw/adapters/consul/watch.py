"""One blocking-query loop that keeps the latest value of something in Consul: :class:`Watch`.

Owns Consul's index rules for a long poll ("Blocking Queries", Implementation
Details): block on the last ``X-Consul-Index``; reset to 0 (a fresh, non-blocking
read) when an index goes backwards; never block on an index below 1; rate-limit
the loop with a token bucket (a burst, then one request per interval) instead of
sleeping on every pass. On errors it backs off with jitter and KEEPS the last good
value, reporting ``healthy``, ``last_error`` and ``last_success_at`` (event-loop
clock) so its owner can decide how long stale data stays usable.

The owner reads :attr:`Watch.latest` whenever it likes and waits for a change with
:meth:`Watch.wait_changed` or ``async for value in watch.values()``; a new value is
published only when it differs from the last one (Consul also answers on timeouts
and idempotent writes). That published side is ``llmgw.adapters.watched``'s
``WatchedState``, shared with Nomad's allocation watch.

Must not: know what it watches (a fetch function does), or raise out of its loop:
every failure is a status, never a dead task.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from llmgw.adapters.consul.client import ConsulError
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.watched import WatchedState

log = logging.getLogger(__name__)

T = TypeVar("T")

# fetch(index, wait) -> (value, X-Consul-Index of the answer). index 0: answer at once.
Fetch = Callable[[int, float], Awaitable[tuple[T, int]]]


@dataclass(frozen=True, slots=True)
class WatchStatus:
    """How a watch is doing, for health endpoints and logs."""

    name: str
    healthy: bool  # the last request succeeded
    last_error: str | None  # the last failure's message (kept after recovery)
    last_success_at: float | None  # event-loop clock
    index: int  # the index the next request blocks on
    generation: int  # how many distinct values have been published


def next_index(previous: int, returned: int) -> int:
    """The index to block on after an answer carrying ``returned``, per Consul's rules:
    an index below 1 is a Consul bug, and blocking on 1 is always safe (never 0 after
    an answer, or every request would return at once: a busy loop); backwards means
    the data was reset (snapshot restore, the newest key deleted...): start over
    with a non-blocking read."""
    if returned < 1:
        return 1
    if returned < previous:
        return 0
    return returned


class _TokenBucket:
    """``burst`` requests at once, then one per ``interval`` (event-loop clock)."""

    def __init__(self, burst: int, interval: float) -> None:
        self._capacity = float(burst)
        self._tokens = float(burst)
        self._interval = interval
        self._stamp: float | None = None

    async def take(self) -> None:
        if self._interval <= 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._stamp is not None:
            self._tokens = min(self._capacity, self._tokens + (now - self._stamp) / self._interval)
        self._stamp = now
        if self._tokens < 1:
            delay = (1 - self._tokens) * self._interval
            await asyncio.sleep(delay)
            self._stamp = loop.time()
            self._tokens = 1.0
        self._tokens -= 1


class Watch(WatchedState[T]):
    """The latest value of one blocking query, kept by a background task.

    ``async with watch:`` (or :meth:`start` / :meth:`stop`) runs the loop. Before
    the first success :attr:`latest` is None; :meth:`wait_ready` waits for it.
    """

    def __init__(
        self,
        name: str,
        fetch: Fetch[T],
        settings: WatchSettings | None = None,
        *,
        same: Callable[[T, T], bool] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name, task_name=f"consul-watch:{name}", same=same)
        self._fetch = fetch
        self._settings = settings or WatchSettings()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrets)
        self._index = 0

    # ------------------------------------------------------------------ reading

    @property
    def settings(self) -> WatchSettings:
        return self._settings

    def status(self) -> WatchStatus:
        return WatchStatus(
            name=self.name,
            healthy=self.healthy,
            last_error=self.last_error,
            last_success_at=self.last_success_at,
            index=self._index,
            generation=self.generation,
        )

    async def __aenter__(self) -> Watch[T]:
        await self.start()
        return self

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        bucket = _TokenBucket(self._settings.burst, self._settings.min_interval)
        failures = 0
        while True:
            await bucket.take()
            try:
                value, returned = await self._fetch(self._index, self._settings.wait)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self._fail(exc, failures)
                await asyncio.sleep(self._backoff(failures))
                continue
            if failures:
                log.info("Consul watch %s: answering again after %d failed requests", self.name, failures)
            failures = 0
            self._succeeded(loop.time())
            new_index = next_index(self._index, returned)
            if new_index == 0:
                log.info(
                    "Consul watch %s: index went back from %d to %d; reading afresh",
                    self.name,
                    self._index,
                    returned,
                )
            self._index = new_index
            self._publish(value)

    def _fail(self, exc: Exception, failures: int) -> None:
        message = str(exc) if isinstance(exc, ConsulError) else f"{type(exc).__name__}: {exc}"
        changed = self._failed(message)
        if not isinstance(exc, ConsulError):
            # A bug in a fetch function: say so loudly, but keep the watch alive.
            log.error("Consul watch %s: unexpected error", self.name, exc_info=exc)
        elif failures == 1 or changed:
            log.warning("Consul watch %s: %s (keeping the last good value)", self.name, message)

    def _backoff(self, failures: int) -> float:
        return self._settings.backoff.delay(failures, self._rng.random())
