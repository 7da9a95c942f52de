"""Waiting in tests: the one wait-until helper, async and sync.

A test that needs something to have happened first waits on the event that says it
happened (``EndpointBook.wait_processed``, a stand-in's count of parked blocking
queries, an event a fake engine sets) through ``awaited``; where nothing announces it
(another process, an HTTP API), it polls with ``eventually``. Never a bare sleep: a
sleep is too short on a busy machine and too long on an idle one. A sleep stays only
where time itself is under test (a slow client, a timeout), with a comment saying so.

``eventually`` polls often at first and less often as it goes on (5 ms doubling up to
``every``), so a condition that holds at once costs nothing and a slow one costs little
CPU on a shared machine. The deadline only bounds a hang; it is not a timing assertion,
so it is generous. On timeout it raises AssertionError naming what it waited for and
the last value (or error) it saw.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import aiohttp

T = TypeVar("T")

# What a probe may raise while the thing it asks is not up yet: it is retried, and
# the last one is reported if the deadline passes.
NOT_YET: tuple[type[BaseException], ...] = (OSError, TimeoutError, aiohttp.ClientError)

_FIRST_PAUSE = 0.005


def _describe(probe: Callable[..., object]) -> str:
    """A probe's name, or a lambda's source line, for a timeout's message."""
    name = getattr(probe, "__qualname__", repr(probe))
    if "<lambda>" not in name:
        return name
    try:
        return inspect.getsource(probe).strip()
    except (OSError, TypeError):
        return name


def _timed_out(within: float, what: str | None, probe: Callable[..., object], last: object) -> AssertionError:
    return AssertionError(f"not within {within}s: {what or _describe(probe)} (last seen: {last!r})")


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    within: float = ...,
    what: str | None = ...,
    *,
    every: float = ...,
    retry_on: tuple[type[BaseException], ...] = ...,
) -> T: ...
@overload
async def eventually(
    probe: Callable[[], T],
    within: float = ...,
    what: str | None = ...,
    *,
    every: float = ...,
    retry_on: tuple[type[BaseException], ...] = ...,
) -> T: ...
async def eventually(
    probe: Callable[[], Any],
    within: float = 10.0,
    what: str | None = None,
    *,
    every: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """The first truthy result of ``probe()`` (sync or async). ``what`` names the
    condition in the failure message (the probe's name or source by default)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    pause = _FIRST_PAUSE
    last: object = None
    while True:
        try:
            result = probe()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = result
        except retry_on as exc:
            last = exc
        if loop.time() > deadline:
            raise _timed_out(within, what, probe, last)
        await asyncio.sleep(pause)
        pause = min(pause * 2, every)


def eventually_sync(
    probe: Callable[[], T],
    within: float = 10.0,
    what: str | None = None,
    *,
    every: float = 0.2,
    retry_on: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """``eventually`` for synchronous tests (a ``llmgw dev`` subprocess asked over HTTP)."""
    deadline = time.monotonic() + within
    pause = _FIRST_PAUSE
    last: object = None
    while True:
        try:
            result = probe()
            if result:
                return result
            last = result
        except retry_on as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _timed_out(within, what, probe, last)
        time.sleep(pause)
        pause = min(pause * 2, every)


async def awaited(awaitable: Awaitable[T], what: str | Callable[[], str], within: float = 10.0) -> T:
    """The result of an event's awaitable (``book.wait_processed(...)``, an event a fake
    sets), or AssertionError naming ``what`` (a callable is asked at the deadline, so it
    can tell how far things got) if it has not come within ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            return await awaitable
    except TimeoutError:
        said = what() if callable(what) else what
        raise AssertionError(f"not within {within}s: {said}") from None
