"""The stall watchdog names a stall of the loop: how long, on the CPU or not, and where."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from .loop_stalls import LoopStalls

# Alone under pytest-xdist: the stalls and CPU times these tests measure at 0.2 s are those
# of this process's loop, which another worker's load on the same cores would add stalls to.
pytestmark = pytest.mark.alone


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def _watched(block: float, *, spin: bool) -> LoopStalls:
    stalls = LoopStalls(threshold=0.2, beat=0.02)
    stalls.start()
    try:
        await asyncio.sleep(0.1)  # a few beats on time
        # The behaviour under test: the loop blocked, by a wait or by work on the CPU.
        _spin(block) if spin else time.sleep(block)
        await asyncio.sleep(0.1)  # the beat after the stall records it
    finally:
        stalls.stop()
    return stalls


async def test_a_blocking_wait_is_one_stall_off_the_cpu_with_the_line_that_waited() -> None:
    # 1.5 s: the watchdog thread names the line once the stall passes 0.2 s, so it has 1.3 s to
    # get a CPU (at 0.6 s, 0.4 s was too little for a niced run on a loaded machine once: the
    # stack it took was the loop's after the wait).
    stalls = await _watched(1.5, spin=False)
    assert stalls.count == 1, stalls.report()
    (stall,) = stalls.stalls
    assert stall.seconds > 1.2 and stall.cpu_seconds < 0.2
    assert "time.sleep(block)" in stall.stack and "_watched" in stall.stack
    assert stalls.report().startswith("1 stalls of the event loop over 0.2s")


async def test_work_on_the_cpu_is_a_stall_on_the_cpu() -> None:
    stalls = await _watched(0.4, spin=True)
    assert stalls.count == 1, stalls.report()
    (stall,) = stalls.stalls
    # A stall's length is its beat's lateness (the interval less one beat, 0.02 s); its
    # CPU time is the whole interval's, so it may pass the length by up to that beat.
    assert stall.cpu_seconds >= 0.35 and stall.seconds + 0.02 >= stall.cpu_seconds - 1e-3
    assert "_spin" in stall.stack


async def test_a_loop_that_keeps_turning_has_no_stall() -> None:
    stalls = LoopStalls(threshold=0.2, beat=0.02)
    stalls.start()
    for _ in range(20):
        await asyncio.sleep(0.01)
    stalls.stop()
    assert stalls.count == 0 and stalls.report() == "no stall of the event loop over 0.2s"


async def test_the_cycle_collector_s_share_of_a_stall_is_named() -> None:
    stalls = LoopStalls(threshold=0.2, beat=0.02)
    stalls.start()
    try:
        await asyncio.sleep(0.1)
        garbage = []
        for _ in range(200_000):  # cycles, so that the collector has work
            pair: list[object] = []
            pair.append(pair)
            garbage.append(pair)
        del garbage, pair
        time.sleep(0.3)  # a stall the collector's time then falls into
        gc.collect()
        await asyncio.sleep(0.1)
    finally:
        stalls.stop()
    (stall,) = stalls.stalls
    assert stall.gc_seconds > 0 and "in the cycle collector" in str(stall)
