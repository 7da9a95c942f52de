"""The one backoff policy: how long to wait before the next try, as a value.

Owns: the arithmetic of every retry delay in llmgw (exponential, capped, jittered),
for the loops' retries (a failed reconcile pass, a dropped Nomad event stream, a
failed Consul watch or election request, a worker joining its head) and the
planner's rebuild backoff and placement hold. Must not: sleep, read a clock or draw
random numbers. The caller passes the jitter draw, a number in [0, 1): an adapter
its own ``random.Random``, the planner a hash of the model's name (the same in every
run, yet different models spread out).

One jitter knob covers the three styles in use: a delay lies in
``[step * (1 - jitter), step]``, so ``jitter=0`` is no jitter, ``0.5`` is "equal
jitter" (at least half the step, never a busy loop) and ``1`` is "full jitter"
(AWS's "Exponential Backoff And Jitter", 2015).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass


class BackoffError(ValueError):
    """A policy that cannot be: say which number is off and what it must be."""


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Try ``attempt`` (1 is the first retry) waits ``initial * factor**(attempt-1)``,
    at most ``cap``, less up to ``jitter`` of it."""

    initial: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial >= 0):
            raise BackoffError(
                f"a backoff's initial delay must be a number of seconds >= 0, got {self.initial}"
            )
        if not (math.isfinite(self.cap) and self.cap >= self.initial):
            raise BackoffError(
                f"a backoff's cap must be at least its initial delay {self.initial}, got {self.cap}"
            )
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise BackoffError(f"a backoff's factor must be at least 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise BackoffError(f"a backoff's jitter must be a fraction from 0 to 1, got {self.jitter}")

    def step(self, attempt: int) -> float:
        """The un-jittered delay before try ``attempt``; at most ``cap``, whatever the count."""
        if attempt <= 1:
            return self.initial
        try:
            grown = self.initial * self.factor ** (attempt - 1)
        except OverflowError:  # an absurd count: long past the cap
            return self.cap
        return min(grown, self.cap)

    def bounds(self, attempt: int) -> tuple[float, float]:
        """``(shortest, longest)`` delay before try ``attempt``."""
        step = self.step(attempt)
        return step * (1.0 - self.jitter), step

    def delay(self, attempt: int, draw: float) -> float:
        """The delay before try ``attempt`` for a jitter ``draw`` in [0, 1) (0: the full step)."""
        if not 0 <= draw <= 1:
            raise BackoffError(f"a jitter draw must lie in [0, 1), got {draw}")
        return self.step(attempt) * (1.0 - self.jitter * draw)


def stable_draw(key: str, attempt: int) -> float:
    """A jitter draw in [0, 1) that is a hash of ``key`` and ``attempt``: the same in every
    run and in tests, different for different keys (the planner's models)."""
    digest = hashlib.sha256(f"{key}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
