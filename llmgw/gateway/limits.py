"""Per-model admission on this router: at most N requests forwarded at once, at most
M more waiting, each waiting at most T seconds; beyond that 429 with Retry-After.

Owns: the running and queued counts per model (also what the demand report
publishes) and the FIFO hand-off of a freed slot to the longest waiter.

Must not: know about endpoints (the book) or HTTP beyond raising ``ApiError``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from llmgw.gateway import errors


@dataclass
class _Gate:
    running: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


class ModelGates:
    """Every admitted request releases its slot once::

        if not gates.enter_now(model):
            await gates.enter(model)
        try:
            ...
        finally:
            gates.release(model)

    Two steps, not one ``async with``: most requests find a free slot, and taking it
    is then one plain call, with no coroutine (every request enters a gate)."""

    def __init__(self, concurrency: int, queue: int, queue_timeout: float, retry_after: int) -> None:
        self._concurrency = concurrency
        self._queue = queue
        self._queue_timeout = queue_timeout
        self._retry_after = retry_after
        self._gates: dict[str, _Gate] = {}

    def running(self, model: str) -> int:
        gate = self._gates.get(model)
        return gate.running if gate else 0

    def queued(self, model: str) -> int:
        gate = self._gates.get(model)
        return len(gate.waiters) if gate else 0

    def enter_now(self, model: str) -> bool:
        """Takes one of the model's slots if one is free and nobody waits for it."""
        gate = self._gates.get(model)
        if gate is None:
            gate = self._gates[model] = _Gate()
        if gate.running < self._concurrency and not gate.waiters:
            gate.running += 1
            return True
        return False

    async def enter(self, model: str) -> None:
        """Takes one of the model's slots, waiting for one in the FIFO queue (bounded in
        length and time: ``queue_full`` beyond either) when none is free."""
        if self.enter_now(model):
            return
        gate = self._gates[model]
        if len(gate.waiters) >= self._queue:
            raise errors.queue_full(model, self._retry_after)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gate.waiters.append(waiter)
        try:
            async with asyncio.timeout(self._queue_timeout):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over as we were cancelled or timed out: pass it on.
                self.release(model)
            else:
                waiter.cancel()
                gate.waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise errors.queue_full(model, self._retry_after) from None
            raise

    def release(self, model: str) -> None:
        """Gives back a slot taken by ``enter_now`` or ``enter``: to the longest waiter, if any."""
        gate = self._gates[model]
        while gate.waiters:
            waiter = gate.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to the waiter: running stays the same
                return
        gate.running -= 1
        if gate.running == 0 and not gate.waiters:
            del self._gates[model]
