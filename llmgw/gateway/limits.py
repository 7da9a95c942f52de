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


class _Admission:
    """The ``async with`` of ``ModelGates.admit``: a class, not a generator context
    manager, since every request enters one."""

    __slots__ = ("_gate", "_gates", "_model")

    def __init__(self, gates: ModelGates, model: str) -> None:
        self._gates = gates
        self._model = model
        self._gate: _Gate | None = None

    async def __aenter__(self) -> None:
        self._gate = await self._gates._enter(self._model)

    async def __aexit__(self, *exc: object) -> None:
        if self._gate is not None:
            gate, self._gate = self._gate, None
            self._gates._release(self._model, gate)


class ModelGates:
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

    def admit(self, model: str) -> _Admission:
        """``async with gates.admit(model):`` holds one of the model's slots, waiting in
        the FIFO queue (bounded in length and time) when all are taken."""
        return _Admission(self, model)

    async def _enter(self, model: str) -> _Gate:
        gate = self._gates.get(model)
        if gate is None:
            gate = self._gates[model] = _Gate()
        if gate.running < self._concurrency and not gate.waiters:
            gate.running += 1
        else:
            await self._wait(model, gate)
        return gate

    async def _wait(self, model: str, gate: _Gate) -> None:
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
                self._release(model, gate)
            else:
                waiter.cancel()
                gate.waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise errors.queue_full(model, self._retry_after) from None
            raise

    def _release(self, model: str, gate: _Gate) -> None:
        while gate.waiters:
            waiter = gate.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to the waiter: running stays the same
                return
        gate.running -= 1
        if gate.running == 0 and not gate.waiters:
            del self._gates[model]
