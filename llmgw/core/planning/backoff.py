"""Delays as values: the rebuild backoff of a model and the retry delay of an unplaceable one.

Owns: the arithmetic (exponential, capped, jittered). Must not: sleep or draw random
numbers. The jitter is a hash of the model's name and the attempt, so it is the same
in every run and in tests, yet different models spread out instead of retrying together.
"""

from __future__ import annotations

import hashlib


def jitter_fraction(model: str, attempt: int) -> float:
    """A stable number in [0, 1) for this model and attempt."""
    digest = hashlib.sha256(f"{model}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def exponential(base: float, cap: float, attempt: int) -> float:
    """``base * 2**(attempt-1)``, at most ``cap``; attempt 1 is the first retry."""
    if attempt <= 1:
        return min(base, cap)
    # 2**64 already exceeds any cap; avoid overflowing floats on absurd counts.
    return min(base * 2.0 ** min(attempt - 1, 64), cap)


def rebuild_delay(model: str, failures: int, base: float, cap: float, jitter: float) -> float:
    """The wait before the model's next placement after its ``failures``-th failure in a row."""
    delay = exponential(base, cap, failures)
    return delay * (1.0 - jitter * jitter_fraction(model, failures))
