"""What held up an event loop, seen from another thread: :class:`LoopStalls`.

A callback beats on the loop every ``beat`` seconds. A stretch of more than ``threshold``
seconds between two beats is a stall (no callback of that loop ran meanwhile, so every
timer fired late and every connection was seen late). For each one it keeps how long it
lasted, the loop thread's CPU time in it (little: the process got no CPU, or waited in a
blocking call; about all of it: Python code ran), the time the cycle collector took in it
(which holds the GIL: the watchdog sees such a stall only once it is over), and the loop
thread's stack as a watchdog thread first saw it held up.

The e2e tests run one per test on the test's loop and print its report under a test that
failed: it costs a beat and a thread wake-up every 50 ms, and prints nothing otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Stall:
    at: float  # the loop's clock at the last beat before the stall
    seconds: float
    cpu_seconds: float  # the loop thread's CPU time during the stall
    gc_seconds: float  # the cycle collector's time during the stall
    stack: str  # the loop thread's stack then ("" if the stall ended before the watchdog looked)

    def __str__(self) -> str:
        head = (
            f"at loop time {self.at:.2f}: {self.seconds:.2f}s, {self.cpu_seconds:.2f}s of it on the CPU"
            f"{f', {self.gc_seconds:.2f}s in the cycle collector' if self.gc_seconds else ''}"
        )
        return head + ("\n" + self.stack if self.stack else "")


@dataclass(slots=True)
class _Seen:
    beat: float  # the stamp of the beat the stall followed
    stack: str


class LoopStalls:
    """``start()`` on the loop to watch (from a coroutine running on it), ``stop()`` when done."""

    def __init__(
        self, *, threshold: float = 0.5, beat: float = 0.05, kept: int = 8, frames: int = 14
    ) -> None:
        self.threshold = threshold
        self._beat_every = beat
        self._kept = kept
        self._frames = frames
        self.stalls: list[Stall] = []  # the longest ``kept``, longest first
        self.count = 0
        self.total_seconds = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop_thread = 0
        self._last_beat = 0.0  # time.monotonic()
        self._last_cpu = 0.0  # the loop thread's time.thread_time()
        self._gc_started = 0.0
        self._gc_seconds = 0.0  # the cycle collector's time since start()
        self._last_gc = 0.0  # ... at the last beat
        self._seen: _Seen | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._last_beat, self._last_cpu = time.monotonic(), time.thread_time()
        self._handle = self._loop.call_later(self._beat_every, self._beat)
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._watch, name="loop-stall-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def report(self) -> str:
        if not self.count:
            return f"no stall of the event loop over {self.threshold:g}s"
        lines = [
            f"{self.count} stalls of the event loop over {self.threshold:g}s, "
            f"{self.total_seconds:.1f}s in all; the longest {len(self.stalls)}:"
        ]
        lines += [str(stall) for stall in self.stalls]
        return "\n".join(lines)

    # ------------------------------------------------------------------ on the loop

    def _beat(self) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        gap = now - self._last_beat - self._beat_every
        if gap > self.threshold:
            seen = self._seen if self._seen is not None and self._seen.beat == self._last_beat else None
            assert self._loop is not None
            stall = Stall(
                at=self._loop.time() - gap,
                seconds=gap,
                cpu_seconds=cpu - self._last_cpu,
                gc_seconds=self._gc_seconds - self._last_gc,
                stack=seen.stack if seen else "",
            )
            self.count += 1
            self.total_seconds += gap
            self.stalls = sorted([*self.stalls, stall], key=lambda s: -s.seconds)[: self._kept]
        self._last_beat, self._last_cpu, self._last_gc = now, cpu, self._gc_seconds
        if not self._stopping.is_set() and self._loop is not None:
            self._handle = self._loop.call_later(self._beat_every, self._beat)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.monotonic()
        else:
            self._gc_seconds += time.monotonic() - self._gc_started

    # ------------------------------------------------------------------ the watchdog thread

    def _watch(self) -> None:
        while not self._stopping.wait(self._beat_every):
            beat = self._last_beat
            late = time.monotonic() - beat - self._beat_every
            if late > self.threshold and (self._seen is None or self._seen.beat != beat):
                frame = sys._current_frames().get(self._loop_thread)
                if frame is None:  # the loop's thread has ended
                    return
                # Names and line numbers only while the frames are held; their source lines
                # are read afterwards (reading files lets the loop thread run on).
                summary = traceback.StackSummary.extract(
                    traceback.walk_stack(frame), limit=self._frames, lookup_lines=False
                )
                del frame
                summary.reverse()
                self._seen = _Seen(beat, "".join(summary.format()).rstrip("\n"))
