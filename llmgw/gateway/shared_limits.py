"""API keys' rate limits that hold across every router, and each key's usage.

Owns: ``SharedLimits``, which admits a key's request against buckets every router
takes from (``adapters.redis.limits``), hands out a ``SharedHold`` that settles the
request's held tokens once its usage is known, counts each answered request's usage
by key and model, beats this router's heartbeat and sweeps dead routers' holds; and
the behaviour while Redis is unreachable, which the operator chooses (``StoreDown``),
logged once per change and counted.

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
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from enum import StrEnum
from typing import Any

from llmgw.adapters.redis.limits import LimitStoreUnreachable, RedisLimitStore
from llmgw.core.engine_usage import cached_tokens
from llmgw.core.records import ApiKeyRecord, KeyUsage
from llmgw.gateway import errors
from llmgw.gateway.keys import RateLimiter, TokenHold
from llmgw.gateway.upstream import token_counts

log = logging.getLogger(__name__)


class StoreDown(StrEnum):
    """What a router does while Redis cannot be reached."""

    # Admit on this router's share: each limit divided by the routers last seen alive.
    # Together the routers admit about the limit while traffic is spread over them as
    # it was; the outage's usage is not counted (it is logged and counted as errors).
    LOCAL_SHARE = "local-share"
    # Refuse every request of a limited key with 503 limits_unavailable until Redis answers.
    CLOSED = "closed"


class SharedHold:
    """``TokenHold``'s contract (``settle``, ``release``, ``keep``, ``open``) for tokens
    held from a shared bucket."""

    __slots__ = ("_limits", "_record", "_settled", "held", "hold_id")

    def __init__(self, limits: SharedLimits, record: ApiKeyRecord, held: int, hold_id: str) -> None:
        self._limits = limits
        self._record = record
        self._settled = False
        self.held = held
        self.hold_id = hold_id

    @property
    def open(self) -> bool:
        return not self._settled

    def settle(self, used: int) -> None:
        """The answer's usage is known: charge that instead of what was held."""
        if not self._settled:
            self._settled = True
            self._limits.settle_later(self._record, self.held, max(0, used), self.hold_id)

    def release(self) -> None:
        """No engine generated anything for the request: the budget gets it all back."""
        self.settle(0)

    def keep(self) -> None:
        """An engine generated but its usage never came: charge what was held."""
        self.settle(self.held)


Hold = TokenHold | SharedHold


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

    async def start(self) -> None:
        await self._beat_and_sweep()
        self._keep_alive_task = asyncio.create_task(self._keep_alive(), name="shared-limits")

    async def close(self) -> None:
        if self._keep_alive_task is not None:
            self._keep_alive_task.cancel()
            await asyncio.gather(self._keep_alive_task, return_exceptions=True)
        await self.drain()
        with contextlib.suppress(LimitStoreUnreachable):  # else its heartbeat expires on its own
            await self._store.leave(self.router_id)
        await self._store.close()

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
        if record.requests_per_minute is None and record.tokens_per_minute is None:
            return SharedHold(self, record, 0, "")
        if not self.up:
            # Known down: no request waits for Redis's timeout; the heartbeat, every
            # fifth of its TTL, finds out when Redis answers again.
            return self._admit_while_down(record, tokens, unbounded=unbounded)
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
            )
        except LimitStoreUnreachable as exc:
            self._went_down(exc)
            return self._admit_while_down(record, tokens, unbounded=unbounded)
        self._came_back()
        if not admission.admitted:
            seconds = max(1, -int(-admission.wait // 1))
            if admission.kind == "tokens" and record.tokens_per_minute is not None:
                held = admission.held
                raise errors.rate_limited("tokens", record.tokens_per_minute, seconds, requested=held)
            raise errors.rate_limited("requests", record.requests_per_minute or 0, seconds)
        return SharedHold(self, record, admission.held, hold_id)

    def _admit_while_down(self, record: ApiKeyRecord, tokens: int, *, unbounded: bool) -> Hold:
        if self.store_down is StoreDown.CLOSED:
            raise errors.limits_unavailable()
        share = self.routers_alive

        def part(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // share)

        local = replace(
            record,
            requests_per_minute=part(record.requests_per_minute),
            tokens_per_minute=part(record.tokens_per_minute),
        )
        hold = self._local.admit(local, time.monotonic(), tokens, unbounded=unbounded)
        return hold if hold is not None else SharedHold(self, record, 0, "")

    def settle_later(self, record: ApiKeyRecord, held: int, used: int, hold_id: str) -> None:
        if record.tokens_per_minute is None or not hold_id or held == used == 0:
            return
        self._later(
            self._store.settle(
                record.key_id,
                self.router_id,
                hold_id,
                tokens_per_minute=record.tokens_per_minute,
                held=held,
                used=used,
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
        self._later(self._store.count_usage(record.key_id, model, counts))

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
            log.warning("router %s: Redis for shared limits answers again", self.router_id)
