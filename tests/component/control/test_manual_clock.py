"""``ManualClock``, the virtual time of the control plane's component tests: ``advance``
returns once what the moved time woke has run to its next wait, however many hops it takes."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.control import ManualClock


async def test_advance_returns_after_a_long_chain_of_woken_tasks_has_run() -> None:
    clock = ManualClock()
    hops = 200  # far more loop iterations than any fixed number of yields would cover
    events = [asyncio.Event() for _ in range(hops + 1)]
    reached: list[int] = []

    async def relay(i: int) -> None:
        await events[i].wait()
        reached.append(i)
        events[i + 1].set()

    async def first() -> None:
        await clock.sleep(5)
        events[0].set()

    tasks = [asyncio.create_task(relay(i)) for i in range(hops)]
    tasks.append(asyncio.create_task(first()))
    await clock.advance(4)
    assert reached == []  # not due yet
    await clock.advance(1)
    assert reached == list(range(hops)) and events[hops].is_set()
    await asyncio.gather(*tasks)


async def test_a_sleeper_woken_by_the_advance_runs_before_the_next_deadline_passes() -> None:
    clock = ManualClock()
    seen: list[float] = []

    async def ticker() -> None:
        for _ in range(3):
            await clock.sleep(1)
            seen.append(clock.time())

    task = asyncio.create_task(ticker())
    await clock.advance(10)
    assert seen == [clock.now - 9, clock.now - 8, clock.now - 7]
    await task


async def test_a_task_that_never_waits_fails_the_advance_instead_of_hanging_it() -> None:
    clock = ManualClock()
    spins = 0

    async def spin() -> None:
        nonlocal spins
        while spins < 1_000_000:  # a busy loop that yields but never waits on anything
            spins += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(spin())
    with pytest.raises(AssertionError, match="never went idle"):
        await clock.advance(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
