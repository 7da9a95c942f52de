"""The published side of every watch an adapter keeps: :class:`WatchedState`.

Owns what the router's ``Watched`` port (``llmgw.gateway.ports``) reads of a watch:
the latest value, how many distinct values have been published (``generation``),
whether the last attempt succeeded (``healthy``), the last failure's message
(``last_error``, kept after recovery), the event-loop time of the last success
(``last_success_at``), and waiting for the next value (:meth:`wait_changed`, which
raises :class:`WatchClosed` once the watch stops), and running the subclass's
loop (``_run``) as one background task between :meth:`start` and :meth:`stop`.
Consul's blocking-query ``Watch`` and Nomad's ``AllocationWatch`` are both one:
they subclass it, write ``_run``, and call :meth:`_publish`, :meth:`_succeeded`
and :meth:`_failed` from it.

Must not: fetch, retry or back off (the loops that subclass it do), or read a
clock of its own (a loop passes the time it read).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Generic, TypeVar, cast

from llmgw.cancellation import cancel_and_wait

T = TypeVar("T")


class WatchClosed(RuntimeError):
    """The watch was stopped while someone waited on it."""


class WatchedState(Generic[T]):
    """The latest value of a watch, its generation and health, and the task of its loop.

    ``same(old, new)`` says two values are equal (default ``==``): publishing a
    value equal to the latest changes nothing, since Consul and Nomad also answer
    on timeouts and on writes that change nothing. ``task_name`` names the loop's
    task (what a task dump shows).
    """

    def __init__(self, name: str, *, task_name: str, same: Callable[[T, T], bool] | None = None) -> None:
        self.name = name
        self._task_name = task_name
        self._task: asyncio.Task[None] | None = None
        self._same: Callable[[T, T], bool] = same if same is not None else _equal
        self._latest: T | None = None
        self._generation = 0
        self._healthy = False
        self._last_error: str | None = None
        self._last_success_at: float | None = None
        self._changed = asyncio.Event()
        self._closed = False

    # ------------------------------------------------------------------ reading

    @property
    def latest(self) -> T | None:
        return self._latest

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def last_success_at(self) -> float | None:
        return self._last_success_at

    async def wait_changed(self, generation: int) -> T:
        """The latest value once more than ``generation`` values have been published
        (pass :attr:`generation` as you last saw it). Raises WatchClosed on stop: every
        waiter, and every later one, gets it instead of a value."""
        while self._generation <= generation:
            if self._closed:
                raise WatchClosed(f"watch {self.name} stopped")
            await self._changed.wait()
        # generation > 0: a value was published (it may itself be None for an optional T).
        return cast(T, self._latest)

    async def wait_ready(self) -> T:
        """The first value (at once if there is one already)."""
        return await self.wait_changed(0)

    async def values(self) -> AsyncIterator[T]:
        """The current value (once there is one), then every new one. A slow consumer
        skips intermediate values: it always gets the latest."""
        seen = 0
        while True:
            try:
                value = await self.wait_changed(seen)
            except WatchClosed:
                return
            seen = self._generation
            yield value

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._task is None:
            self._closed = False
            self._task = asyncio.create_task(self._run(), name=self._task_name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        self._closed = True
        self._wake()

    async def __aenter__(self) -> WatchedState[T]:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ for the loop

    async def _run(self) -> None:
        """The subclass's loop: runs until cancelled, never raises."""
        raise NotImplementedError

    def _publish(self, value: T, *, even_if_same: bool = False) -> bool:
        """Make ``value`` the latest and wake every waiter, unless it equals the latest
        (``even_if_same``: publish anyway, e.g. to announce a change of health)."""
        if self._generation and not even_if_same and self._same(cast(T, self._latest), value):
            return False
        self._latest = value
        self._generation += 1
        self._wake()
        return True

    def _succeeded(self, at: float) -> None:
        self._healthy = True
        self._last_success_at = at

    def _failed(self, message: str) -> bool:
        """Record a failure; True when its message differs from the last one (worth a log line)."""
        changed = message != self._last_error
        self._healthy = False
        self._last_error = message
        return changed

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()


def _equal(a: T, b: T) -> bool:
    return a == b
