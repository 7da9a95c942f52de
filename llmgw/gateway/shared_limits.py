"""API keys' rate limits that hold across every router, and each key's usage.

Owns: ``SharedLimits``, which admits a key's request against buckets and the key's
token budget every router takes from (``adapters.redis.limits``), hands out a
``SharedHold`` that settles the request's held tokens once its usage is known,
counts each answered request's usage by key and model, beats this router's heartbeat
and sweeps dead routers' holds; and the behaviour while Redis is unreachable, which
the operator chooses (``StoreDown``), logged once per change and counted, and the
usage answered meanwhile, sent once Redis answers again.

Must not: wait in a hold's callbacks (they come from the answer's path: settles and
counts go to Redis from tasks kept here), or admit past a limit while Redis answers.

Why a single shared balance and not leased shares: see ``gateway/DESIGN.md``,
"Limits across routers".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from enum import StrEnum
from typing import Any

from llmgw.adapters.redis.limits import (
    BUDGET_KEPT_AFTER_PERIOD,
    USAGE_FIELDS,
    BudgetHold,
    LimitStoreUnreachable,
    RedisLimitStore,
)
from llmgw.core.budgets import BudgetWindow, budget_decision, budget_window
from llmgw.core.durations import format_utc
from llmgw.core.engine_usage import cached_tokens
from llmgw.core.records import ApiKeyRecord, KeyUsage
from llmgw.gateway import errors
from llmgw.gateway.keys import RateLimiter, TokenHold
from llmgw.gateway.upstream import token_counts

log = logging.getLogger(__name__)


class StoreDown(StrEnum):
    """What a router does while Redis cannot be reached."""

    # Admit on this router's share: each limit divided by the routers last seen alive,
    # and of what each budgeted key had left when Redis last answered (a key it never
    # saw is refused). Together the routers admit about the limit while traffic is
    # spread over them as it was; the outage's usage is added once Redis answers.
    LOCAL_SHARE = "local-share"
    # Refuse every request of a limited key with 503 limits_unavailable until Redis answers.
    CLOSED = "closed"


class SharedHold:
    """``TokenHold``'s contract (``settle``, ``release``, ``keep``, ``open``) for tokens
    held from a shared bucket."""

    __slots__ = ("_limits", "_record", "_settled", "budget", "held", "hold_id")

    def __init__(
        self,
        limits: SharedLimits,
        record: ApiKeyRecord,
        held: int,
        hold_id: str,
        budget: BudgetHold | None = None,
    ) -> None:
        self._limits = limits
        self._record = record
        self._settled = False
        self.held = held
        self.hold_id = hold_id
        self.budget = budget  # what it holds from the key's budget period

    @property
    def open(self) -> bool:
        return not self._settled

    def settle(self, used: int, *, budget_used: int | None = None) -> None:
        """The answer's usage is known: charge that instead of what was held
        (``budget_used``: charge the budget period that instead)."""
        if not self._settled:
            self._settled = True
            self._limits.settle_later(
                self._record, self.held, max(0, used), self.hold_id, self.budget, budget_used=budget_used
            )

    def release(self) -> None:
        """No engine generated anything for the request: the budget gets it all back."""
        self.settle(0)

    def keep(self) -> None:
        """An engine generated but its usage never came: charge what was held, from the
        token bucket and from the budget period each."""
        self.settle(self.held, budget_used=None if self.budget is None else self.budget.tokens)


Hold = TokenHold | SharedHold


def _budget_hold(record: ApiKeyRecord, tokens: int, now: float) -> BudgetHold | None:
    """What a request of ``record`` holding ``tokens`` takes from its budget period at ``now``."""
    period = record.budget
    if period is None or record.token_budget is None:
        return None
    window = budget_window(period, record.created_at, now)
    keep_for = 0 if window.end is None else max(1, int(window.end + BUDGET_KEPT_AFTER_PERIOD - now))
    return BudgetHold(record.token_budget, window.start, window.end, max(0, tokens), keep_for)


def _exhausted(budget: BudgetHold, period: str, left: int, now: float) -> errors.ApiError:
    ends = budget.window_end
    return errors.budget_exhausted(
        budget.budget,
        period,
        left,
        budget.tokens,
        None if ends is None else format_utc(ends),
        None if ends is None else BudgetWindow(budget.window_start, ends).seconds_left(now),
    )


class SharedLimits:
    """One per router: ``start`` before serving, ``close`` after."""

    def __init__(
        self,
        store: RedisLimitStore,
        router_id: str,
        *,
        store_down: StoreDown = StoreDown.LOCAL_SHARE,
        heartbeat_ttl: float = 5.0,
        on_store_error: Any = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.router_id = router_id
        self.store_down = store_down
        self._heartbeat_ttl = heartbeat_ttl
        self._on_store_error = on_store_error
        self._pending: set[asyncio.Task[None]] = set()
        self._keep_alive_task: asyncio.Task[None] | None = None
        self.up = True  # Redis answered the last call
        self.routers_alive = 1  # as last seen, this one included
        self.reaped_holds = 0
        # While Redis is down: this router's share of each limit, on its own clock.
        self._local = RateLimiter()
        # Budget periods are found from this router's wall clock (routers' clocks agree
        # to NTP's accuracy: a request in the last moments of a period may count in it
        # on one router and in the next on another).
        self._wall_clock = wall_clock
        # Each budgeted key's period and tokens left, as Redis last said; while Redis is
        # down, this router spends its share of that, and counts what it spent here.
        self._budget_seen: dict[str, tuple[int, int]] = {}
        self._spent_while_down: dict[tuple[str, int], int] = {}
        # The usage of requests answered while Redis was known down (per key and model,
        # and per budget period), added to Redis once it answers again. A count sent
        # as Redis stopped answering is not kept: it may have been applied (at most once).
        self._unsent_usage: dict[tuple[str, str], dict[str, int]] = {}
        self._unsent_budget: dict[tuple[str, int], tuple[int, int]] = {}
        self._unanswered: list[tuple[ApiKeyRecord, str, BudgetHold | None]] = []

    async def start(self) -> None:
        await self._beat_and_sweep()
        await self._check_persistence()
        self._keep_alive_task = asyncio.create_task(self._keep_alive(), name="shared-limits")

    async def close(self) -> None:
        if self._keep_alive_task is not None:
            self._keep_alive_task.cancel()
            await asyncio.gather(self._keep_alive_task, return_exceptions=True)
        await self.drain()
        with contextlib.suppress(LimitStoreUnreachable):  # else its heartbeat expires on its own
            await self._store.leave(self.router_id)
        await self._store.close()

    async def _check_persistence(self) -> None:
        try:
            kept = await self._store.persistence()
        except LimitStoreUnreachable:
            return
        if kept.durable is False:
            log.warning(
                'router %s: the Redis of shared limits keeps nothing on disk (appendonly no, save ""): '
                "keys' usage and budgets are lost when it restarts; turn on its AOF (appendonly yes)",
                self.router_id,
            )
        elif kept.durable is None:
            log.info("router %s: cannot read whether Redis persists (CONFIG refused)", self.router_id)

    async def _keep_alive(self) -> None:
        # Five beats per TTL: one late beat under load does not make a router look dead.
        while True:
            await asyncio.sleep(self._heartbeat_ttl / 5)
            await self._beat_and_sweep()

    async def _beat_and_sweep(self) -> None:
        try:
            await self._store.beat(self.router_id, self._heartbeat_ttl)
            swept = await self._store.sweep()
        except LimitStoreUnreachable as exc:
            self._went_down(exc)
            return
        self._came_back()
        self.routers_alive = max(1, swept.alive)
        if swept.reaped_holds:
            log.warning("returned %d token holds of routers whose heartbeat expired", swept.reaped_holds)
            self.reaped_holds += swept.reaped_holds

    async def admit(self, record: ApiKeyRecord, tokens: int = 0, *, unbounded: bool = False) -> Hold:
        """As ``RateLimiter.admit``, against the buckets every router shares; the hold
        it returns is also how the request's usage gets counted."""
        period = record.budget
        if record.requests_per_minute is None and record.tokens_per_minute is None and period is None:
            return SharedHold(self, record, 0, "")
        now = self._wall_clock()
        budget = _budget_hold(record, tokens, now)
        if not self.up:
            # Known down: no request waits for Redis's timeout; the heartbeat, every
            # fifth of its TTL, finds out when Redis answers again.
            return self._admit_while_down(record, tokens, unbounded=unbounded, budget=budget)
        hold_id = secrets.token_hex(8)
        try:
            admission = await self._store.admit(
                record.key_id,
                self.router_id,
                hold_id,
                requests_per_minute=record.requests_per_minute,
                tokens_per_minute=record.tokens_per_minute,
                tokens=tokens,
                unbounded=unbounded,
                budget=budget,
            )
        except LimitStoreUnreachable as exc:
            # Redis may yet run the admission it did not answer: once it answers again,
            # whatever that took is given back (settled with nothing used).
            self._unanswered.append((record, hold_id, budget))
            self._went_down(exc)
            return self._admit_while_down(record, tokens, unbounded=unbounded, budget=budget)
        self._came_back()
        if budget is not None:
            self._budget_seen[record.key_id] = (budget.window_start, admission.budget_left)
        if not admission.admitted and admission.kind == "budget" and budget is not None:
            raise _exhausted(budget, str(period), admission.budget_left, now)
        if not admission.admitted:
            seconds = max(1, -int(-admission.wait // 1))
            if admission.kind == "tokens" and record.tokens_per_minute is not None:
                held = admission.held
                raise errors.rate_limited("tokens", record.tokens_per_minute, seconds, requested=held)
            raise errors.rate_limited("requests", record.requests_per_minute or 0, seconds)
        return SharedHold(self, record, admission.held, hold_id, budget)

    def _admit_while_down(
        self, record: ApiKeyRecord, tokens: int, *, unbounded: bool, budget: BudgetHold | None
    ) -> Hold:
        if self.store_down is StoreDown.CLOSED:
            raise errors.limits_unavailable()
        share = self.routers_alive
        if budget is not None:
            self._spend_share_while_down(record, budget, share)

        def part(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // share)

        local = replace(
            record,
            requests_per_minute=part(record.requests_per_minute),
            tokens_per_minute=part(record.tokens_per_minute),
        )
        hold = self._local.admit(local, time.monotonic(), tokens, unbounded=unbounded)
        return hold if hold is not None else SharedHold(self, record, 0, "")

    def _spend_share_while_down(self, record: ApiKeyRecord, budget: BudgetHold, share: int) -> None:
        """This router's share of what the key's budget had left when Redis last answered
        (the whole budget in a period begun since); a key never seen is refused: nothing
        says what it has left."""
        seen = self._budget_seen.get(record.key_id)
        if seen is None:
            raise errors.limits_unavailable()
        start, left = seen
        if start != budget.window_start:
            left = budget.budget  # a new period began during the outage
        spent_key = (record.key_id, budget.window_start)
        spent = self._spent_while_down.get(spent_key, 0)
        decision = budget_decision(left // share, spent, budget.tokens)
        if not decision.admitted:
            raise _exhausted(budget, record.budget_period, decision.left, self._wall_clock())
        self._spent_while_down[spent_key] = spent + budget.tokens

    def settle_later(
        self,
        record: ApiKeyRecord,
        held: int,
        used: int,
        hold_id: str,
        budget: BudgetHold | None = None,
        *,
        budget_used: int | None = None,
        force: bool = False,
    ) -> None:
        """``budget_used``: what the budget period is charged, when not ``used``;
        ``force``: settle even what looks like nothing held (an admission Redis did not
        answer: what it held, if it ran, is read from Redis)."""
        if not hold_id or (record.tokens_per_minute is None and budget is None):
            return
        if not force and held == used == 0 and (budget is None or budget.tokens == 0):
            return
        self._later(
            self._store.settle(
                record.key_id,
                self.router_id,
                hold_id,
                tokens_per_minute=record.tokens_per_minute,
                held=held,
                used=used,
                budget=budget,
                budget_used=budget_used,
            )
        )

    def count_usage(self, record: ApiKeyRecord, model: str, usage: Mapping[str, object] | None) -> None:
        """Count one request of ``record`` that ``model`` answered (usage None: an
        answer without counts, e.g. an engine's error, still counts as a request)."""
        if not model:
            return
        prompt, completion = token_counts(dict(usage) if usage is not None else None)
        counts = {
            "requests": 1,
            "input_tokens": prompt,
            "output_tokens": completion,
            "cached_tokens": cached_tokens(usage) if usage is not None else 0,
        }
        if not self.up:
            self._keep_unsent(record, model, counts)
            return
        self._later(self._store.count_usage(record.key_id, model, counts))

    def _keep_unsent(self, record: ApiKeyRecord, model: str, counts: Mapping[str, int]) -> None:
        kept = self._unsent_usage.setdefault((record.key_id, model), dict.fromkeys(USAGE_FIELDS, 0))
        for name, count in counts.items():
            kept[name] += count
        budget = _budget_hold(record, 0, self._wall_clock())
        if budget is not None:
            where = (record.key_id, budget.window_start)
            before, _ = self._unsent_budget.get(where, (0, 0))
            used = counts["input_tokens"] + counts["output_tokens"]
            self._unsent_budget[where] = (before + used, budget.keep_for)

    async def usage(self, key_id: str) -> list[KeyUsage]:
        return await self._store.usage(key_id)

    async def drain(self) -> None:
        """Wait for every settle and count sent so far."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    def _later(self, call: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await call
            except LimitStoreUnreachable as exc:
                self._went_down(exc)

        task = asyncio.get_running_loop().create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _went_down(self, exc: BaseException) -> None:
        if self._on_store_error is not None:
            self._on_store_error()
        if self.up:
            self.up = False
            log.error(
                "router %s: Redis for shared limits is unreachable (%s): %s",
                self.router_id,
                exc,
                "admitting on this router's share of each limit (--limits-store-down local-share)"
                if self.store_down is StoreDown.LOCAL_SHARE
                else "refusing limited keys' requests (--limits-store-down closed)",
            )

    def _came_back(self) -> None:
        if not self.up:
            self.up = True
            self._spent_while_down.clear()
            if self._unsent_usage or self._unsent_budget:
                usage, budgets = self._unsent_usage, self._unsent_budget
                self._unsent_usage, self._unsent_budget = {}, {}
                self._later(self._store.add_counts(usage, budgets))
            unanswered, self._unanswered = self._unanswered, []
            for record, hold_id, budget in unanswered:
                self.settle_later(record, 0, 0, hold_id, budget, force=True)
            log.warning("router %s: Redis for shared limits answers again", self.router_id)
