"""The wait-until helper says what it waited for and what it last saw."""

from __future__ import annotations

import asyncio

import pytest

from .waiting import awaited, eventually, eventually_sync


async def test_eventually_returns_the_first_truthy_value_of_a_sync_or_async_probe() -> None:
    calls = 0

    def third_time() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    async def at_once() -> str:
        return "here"

    assert await eventually(third_time, 5) == 3
    assert await eventually(at_once, 5) == "here"


async def test_eventually_names_the_condition_and_the_last_value_or_error_on_timeout() -> None:
    with pytest.raises(AssertionError, match=r"not within 0.05s: three workers joined \(last seen: 0\)"):
        await eventually(lambda: 0, 0.05, "three workers joined")
    with pytest.raises(AssertionError, match=r"lambda: \[\]"):
        await eventually(lambda: [], 0.05)  # no `what`: the probe's own source says it

    def refused() -> bool:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(AssertionError, match="nobody listens"):
        await eventually(refused, 0.05, "a listener")


def test_eventually_sync_does_the_same_for_synchronous_tests() -> None:
    values = iter([None, "", "ready"])
    assert eventually_sync(lambda: next(values), 5) == "ready"
    with pytest.raises(AssertionError, match=r"not within 0.05s: never \(last seen: False\)"):
        eventually_sync(lambda: False, 0.05, "never")


async def test_awaited_names_the_event_that_never_came() -> None:
    never = asyncio.Event()
    with pytest.raises(AssertionError, match=r"not within 0.05s: the engine's go-ahead"):
        await awaited(never.wait(), "the engine's go-ahead", 0.05)
    opened = [1, 2]
    with pytest.raises(AssertionError, match="at most 2 were open"):  # asked at the deadline
        await awaited(never.wait(), lambda: f"at most {len(opened)} were open", 0.05)
