"""The simulated scheduler: which sequences run, which wait, and what happened to each.

Owns: the running/waiting admission under ``max_num_seqs``, the prefill of a
prompt's tokens its ``PrefixCache`` does not hold (``prefill_token_time`` each),
the pacing of tokens at the configured rate, and the counters behind /metrics and
/sim/stats (requests, completions, cancellations, failures, tokens).

Must not: know HTTP or JSON. Handlers call it; it never calls them. All of its
state lives on the event loop's thread, so it needs no locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

from llmgw.sim.prefix_cache import Prefill, PrefixCache


@dataclass(frozen=True)
class EngineSnapshot:
    running: int
    waiting: int
    requests_total: int
    completed: int
    cancelled: int
    failed: int
    prompt_tokens: int
    generation_tokens: int


class Engine:
    """One per app. Each sequence takes a slot for its whole life; the rest queue FIFO."""

    def __init__(
        self,
        max_num_seqs: int,
        token_rate: float,
        cache: PrefixCache | None = None,
        prefill_token_time: float = 0.0,
    ) -> None:
        self.cache = cache if cache is not None else PrefixCache(0)
        self._prefill_token_time = prefill_token_time
        self._slots = asyncio.Semaphore(max_num_seqs)
        self._token_interval = 1.0 / token_rate
        self.max_num_seqs = max_num_seqs
        self._running = 0
        self._waiting = 0
        self._requests_total = 0
        self._completed = 0
        self._cancelled = 0
        self._failed = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(
            running=self._running,
            waiting=self._waiting,
            requests_total=self._requests_total,
            completed=self._completed,
            cancelled=self._cancelled,
            failed=self._failed,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
        )

    def count_arrival(self) -> int:
        """Count an API request as it arrives; returns its ordinal (1 for the first)."""
        self._requests_total += 1
        return self._requests_total

    def count_failure(self) -> None:
        self._failed += 1

    def count_cancellation(self) -> None:
        """A client left (or shutdown cancelled it) before its answer was complete."""
        self._cancelled += 1

    def count_completion(self) -> None:
        self._completed += 1

    def count_tokens(self, prompt: int = 0, generated: int = 0) -> None:
        self._prompt_tokens += prompt
        self._generation_tokens += generated

    def prefill(self, prompt: str, record: Prefill) -> None:
        """Admit ``prompt`` to the prefix cache as its sequence starts: ``record`` gets the
        tokens read from cache and the prefill time of the rest."""
        tokens = prompt.split()  # the sim's tokens (``vocabulary.count_tokens``)
        record.cached_tokens = self.cache.admit(tokens)
        record.seconds = (len(tokens) - record.cached_tokens) * self._prefill_token_time

    @asynccontextmanager
    async def sequence(self) -> AsyncIterator[None]:
        """Hold a running slot for the body; wait (counted as waiting) while none is free.

        Leaving through cancellation or a reset connection counts the request as
        cancelled, whether it was still waiting or already running.
        """
        self._waiting += 1
        try:
            await self._slots.acquire()
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            yield
        except (asyncio.CancelledError, ConnectionResetError):
            self._cancelled += 1
            raise
        finally:
            self._running -= 1
            self._slots.release()

    async def generate(
        self,
        prompt_tokens: int,
        pieces: Iterable[str],
        first_token_delay: float,
        wait_while_hung: Callable[[], Awaitable[bool]],
        prompt: str = "",
        record: Prefill | None = None,
    ) -> list[str]:
        """A whole (unstreamed) answer: a running slot, the prompt counted (and, with a
        ``record``, prefilled past its cached prefix), every piece decoded at the token
        rate, the completion counted."""
        async with self.sequence():
            self.count_tokens(prompt=prompt_tokens)
            if record is not None:
                self.prefill(prompt, record)
                first_token_delay += record.seconds
            tokens = self.decode(pieces, first_token_delay, wait_while_hung)
            async with aclosing(tokens):
                said = [piece async for piece in tokens]
        self.count_completion()
        return said

    async def decode(
        self,
        pieces: Iterable[str],
        first_token_delay: float,
        wait_while_hung: Callable[[], Awaitable[bool]],
    ) -> AsyncGenerator[str, None]:
        """Yield each piece when the simulated GPU would have produced it.

        Times are deadlines from the start (not sleeps per token), so pacing does
        not drift. A hang pauses decoding; after it the schedule restarts from
        the moment decoding resumed instead of bursting to catch up.
        """
        loop = asyncio.get_running_loop()
        start = loop.time() + first_token_delay
        for index, piece in enumerate(pieces):
            if await wait_while_hung():
                start = loop.time() - index * self._token_interval
            delay = start + (index + 1) * self._token_interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._generation_tokens += 1
            yield piece
