"""The blocking-query loop's rules, driven by a scripted fetch: Consul's index rules,
the rate limit, backoff that keeps the last good value, de-duplication, stopping."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from llmgw.adapters.consul import ConsulUnavailable, Watch, WatchClosed, WatchSettings
from llmgw.adapters.consul.watch import next_index
from tests.support.waiting import awaited, eventually

QUICK = WatchSettings(wait=1.0, min_interval=0.0, backoff_initial=0.01, backoff_max=0.02)


@pytest.mark.parametrize(
    ("previous", "returned", "expected"),
    [
        (0, 12, 12),  # first answer
        (12, 12, 12),  # timeout: block again on the same index
        (12, 15, 15),  # changed
        (12, 5, 0),  # backwards: restart with a non-blocking read
        (0, 0, 1),  # an index of 0 (a Consul bug) must still block next time
        (5, 0, 1),  # even after a higher one: blocking on 1 is always safe
        (1, 0, 1),  # and stays so while Consul keeps answering 0 (no busy loop)
    ],
)
def test_next_index_follows_consuls_rules(previous: int, returned: int, expected: int) -> None:
    assert next_index(previous, returned) == expected


class Script:
    """A fetch that answers from a list: (value, index) or an exception, then blocks."""

    def __init__(self, answers: list[tuple[str, int] | Exception]) -> None:
        self.answers = answers
        self.calls: list[tuple[int, float]] = []  # (index asked, loop time)
        self.done = asyncio.Event()

    async def __call__(self, index: int, wait: float) -> tuple[str, int]:
        self.calls.append((index, asyncio.get_running_loop().time()))
        if not self.answers:
            self.done.set()
            await asyncio.Event().wait()  # blocks until the watch is stopped
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_indexes_sent_follow_the_answers_and_equal_values_are_not_republished() -> None:
    script = Script([("a", 10), ("a", 10), ("a", 11), ("b", 5), ("b", 0), ("c", 0)])
    async with Watch("t", script, QUICK) as watch:
        await asyncio.wait_for(script.done.wait(), 5)
        assert [i for i, _ in script.calls] == [0, 10, 10, 11, 0, 1, 1]
        assert watch.latest == "c"
        assert watch.generation == 3  # a, b, c: repeats of a value are not news


async def test_errors_keep_the_last_value_and_back_off_with_growing_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[tuple[str, int] | Exception] = [
        ConsulUnavailable("Consul GET x: 500 No cluster leader")
    ] * 5
    script = Script([("good", 3), *failures, ("better", 4)])
    settings = WatchSettings(wait=1.0, min_interval=0.0, backoff_initial=0.02, backoff_max=0.08)
    async with Watch("t", script, settings) as watch:
        assert await watch.wait_ready() == "good"
        await eventually(lambda: not watch.healthy, 5, "the watch unhealthy while its fetches fail")
        assert watch.latest == "good"  # the last value is kept meanwhile
        await awaited(script.done.wait(), "the script played to its end", 5)
        assert watch.latest == "better" and watch.healthy
        assert watch.last_error == "Consul GET x: 500 No cluster leader"
    times = [t for _, t in script.calls]
    pauses = [b - a for a, b in itertools.pairwise(times[1:])][:5]
    # Equal jitter: each pause is at least half its step (0.02, 0.04, 0.08, 0.08, 0.08).
    for pause, step in zip(pauses, [0.02, 0.04, 0.08, 0.08, 0.08], strict=False):
        assert pause >= step / 2 - 0.002
    # The index is kept across errors: the retry blocks where the last good answer left off.
    assert {i for i, _ in script.calls[1:6]} == {3}
    assert sum("No cluster leader" in r.getMessage() for r in caplog.records) == 1  # not once per retry


async def test_the_rate_limit_lets_a_burst_through_then_spaces_requests() -> None:
    script = Script([(str(i), i) for i in range(1, 8)])
    settings = WatchSettings(wait=1.0, min_interval=0.03, burst=2)
    async with Watch("t", script, settings):
        await asyncio.wait_for(script.done.wait(), 5)
    times = [t for _, t in script.calls]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= 0.03 - 0.002 for g in gaps[2:]), gaps  # after the burst: one per interval


async def test_a_fetch_bug_is_logged_and_the_watch_lives_on(caplog: pytest.LogCaptureFixture) -> None:
    script = Script([("a", 2), KeyError("oops"), ("b", 3)])
    async with Watch("t", script, QUICK) as watch:
        await asyncio.wait_for(script.done.wait(), 5)
        assert watch.latest == "b"
    assert any(r.levelno == logging.ERROR and "unexpected error" in r.getMessage() for r in caplog.records)


async def test_stopping_interrupts_a_blocked_fetch_and_releases_waiters() -> None:
    script = Script([("a", 2)])
    watch = Watch("t", script, QUICK)
    await watch.start()
    await asyncio.wait_for(script.done.wait(), 5)
    waiter = asyncio.create_task(watch.wait_changed(watch.generation))
    values = [v async for v in _take(watch, 1)]
    assert values == ["a"]
    await asyncio.wait_for(watch.stop(), 1)
    with pytest.raises(WatchClosed):
        await asyncio.wait_for(waiter, 1)
    # A stopped watch hands out its last value and ends, instead of hanging.
    assert [v async for v in watch.values()] == ["a"]


async def _take(watch: Watch[str], n: int):  # type: ignore[no-untyped-def]
    async for value in watch.values():
        yield value
        n -= 1
        if n == 0:
            return
