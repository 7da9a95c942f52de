"""The Redis store of API keys' limits and usage that every router shares.

Owns: the keys' buckets (one request bucket and one token bucket per API key, taken
from by ``admit.lua`` and paid back by ``settle.lua``, atomic scripts on the server's
clock), each router's open holds and heartbeat, the reaping of a dead router's holds
(``reap.lua``), each key's token budget counters (one per budget period, taken from at
admission by ``admit.lua`` and settled at the usage by ``settle.lua``), each key's usage
counters (requests, input, output and cached tokens per model, one hash per key), and
the check of what Redis keeps across its restarts (``persistence``). Every Redis
failure is raised as ``LimitStoreUnreachable``.

Must not: decide what a refusal says or what to do while Redis is down
(``gateway.shared_limits`` does), or see a presented key (only key ids reach Redis).

Redis's keys, all under ``llmgw:limits:``: ``key:<id>:requests`` and
``key:<id>:tokens`` (hashes ``level``/``stamp``, expiring when full again, so an
absent bucket reads as full), ``router:<id>:alive`` (the heartbeat, with a TTL),
``router:<id>:holds`` (hold id -> ``bucket held limit``, and ``<hold id>/budget`` ->
``budget <counter> held``), ``routers`` (a set), ``budget:<key id>:<period start>``
(tokens used in the period plus what open requests hold; expiring a week after the
period ends), and ``usage:<key id>`` (hash ``<model>\\t<counter>``). The scripts touch several keys, so
a Redis Cluster is not supported; a single Redis, or one with Sentinel, is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.core.records import KeyUsage

PREFIX = "llmgw:limits:"
ROUTERS = PREFIX + "routers"
USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "cached_tokens")


class LimitStoreUnreachable(Exception):
    """Redis did not answer (or answered with an error) within the store's timeout."""


def _script(name: str) -> str:
    return resources.files("llmgw.adapters.redis").joinpath(name).read_text(encoding="utf-8")


def bucket_key(key_id: str, kind: str) -> str:
    return f"{PREFIX}key:{key_id}:{kind}"


def usage_key(key_id: str) -> str:
    return f"{PREFIX}usage:{key_id}"


def budget_key(key_id: str, window_start: int) -> str:
    return f"{PREFIX}budget:{key_id}:{window_start}"


# A past period's counter is kept this long after the period ends: a router whose clock
# is behind still finds it, and an operator can read the last period's total.
BUDGET_KEPT_AFTER_PERIOD = 7 * 86400


@dataclass(frozen=True, slots=True)
class BudgetHold:
    """What ``admit`` takes from a key's budget period: ``tokens`` of ``budget`` in the
    period starting at ``window_start`` and ending at ``window_end`` (None: never),
    whose counter is kept ``keep_for`` seconds more (0: forever). A duration, not an
    instant: Redis's clock and the router's need not agree for the counter to last."""

    budget: int
    window_start: int
    window_end: int | None
    tokens: int
    keep_for: int


@dataclass(frozen=True, slots=True)
class Persistence:
    """What Redis keeps across its restarts, as ``CONFIG GET`` says (None: not readable,
    e.g. a managed Redis that renames CONFIG)."""

    appendonly: bool | None
    save: str | None

    @property
    def durable(self) -> bool | None:
        if self.appendonly is None and self.save is None:
            return None
        return bool(self.appendonly) or bool(self.save)


def heartbeat_key(router_id: str) -> str:
    return f"{PREFIX}router:{router_id}:alive"


def holds_key(router_id: str) -> str:
    return f"{PREFIX}router:{router_id}:holds"


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    kind: str  # what refused it: "requests" or "tokens" ("" when admitted)
    wait: float  # seconds until it would be admitted
    held: int  # tokens held (admitted) or asked (refused)
    budget_left: int = 0  # the budget period's tokens left after it (admitted) or before (refused)


@dataclass(frozen=True, slots=True)
class Sweep:
    alive: int  # routers whose heartbeat is live, the sweeper included
    reaped_holds: int  # holds of dead routers returned to their buckets


class RedisLimitStore:
    def __init__(self, url: str, *, timeout: float = 0.25, connections: int = 64, client: Any = None) -> None:
        # A short timeout: a Redis that does not answer must not hold requests long
        # before the router's outage policy applies. At most ``connections`` at once,
        # and a request past them waits for one (redis-py's default pool refuses it
        # with "Too many connections", which would read as Redis being down).
        if client is None:
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=connections,
                timeout=max(1.0, 4 * timeout),
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                decode_responses=True,
            )
            client = aioredis.Redis.from_pool(pool)
        self._redis: Any = client
        self._admit = self._redis.register_script(_script("admit.lua"))
        self._settle = self._redis.register_script(_script("settle.lua"))
        self._reap = self._redis.register_script(_script("reap.lua"))

    async def close(self) -> None:
        await self._redis.aclose()

    async def admit(
        self,
        key_id: str,
        router_id: str,
        hold_id: str,
        *,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        tokens: int,
        unbounded: bool,
        budget: BudgetHold | None = None,
    ) -> Admission:
        try:
            admitted, kind, wait, held, left = await self._admit(
                keys=[
                    bucket_key(key_id, "requests"),
                    bucket_key(key_id, "tokens"),
                    holds_key(router_id),
                    budget_key(key_id, budget.window_start if budget else 0),
                ],
                args=[
                    requests_per_minute or 0,
                    tokens_per_minute or 0,
                    max(0, tokens),
                    int(unbounded),
                    hold_id,
                    budget.budget if budget else 0,
                    max(0, budget.tokens) if budget else 0,
                    budget.keep_for if budget else 0,
                ],
            )
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc
        return Admission(int(admitted) == 1, str(kind), float(wait), int(held), int(left))

    async def settle(
        self,
        key_id: str,
        router_id: str,
        hold_id: str,
        *,
        tokens_per_minute: int | None,
        held: int,
        used: int,
        budget: BudgetHold | None = None,
        budget_used: int | None = None,
    ) -> None:
        """The request's usage is known: ``used`` replaces what it held from the key's
        token bucket (``held``) and from its budget period (``budget.tokens``; charged
        ``budget_used`` instead when given)."""
        try:
            await self._settle(
                keys=[
                    bucket_key(key_id, "tokens"),
                    holds_key(router_id),
                    budget_key(key_id, budget.window_start if budget else 0),
                ],
                args=[
                    tokens_per_minute or 0,
                    held,
                    used,
                    hold_id,
                    int(budget is not None),
                    used if budget_used is None else max(0, budget_used),
                    budget.keep_for if budget else 0,
                ],
            )
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc

    async def beat(self, router_id: str, ttl: float) -> None:
        """This router is alive for ``ttl`` seconds more."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(heartbeat_key(router_id), "1", px=max(1, int(ttl * 1000)))
                pipe.sadd(ROUTERS, router_id)
                await pipe.execute()
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc

    async def leave(self, router_id: str) -> None:
        """A clean stop: the router's heartbeat ends now; whatever it still holds is
        reaped by the next sweep."""
        try:
            await self._redis.delete(heartbeat_key(router_id))
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc

    async def sweep(self) -> Sweep:
        """Return the holds of every router whose heartbeat expired."""
        try:
            routers = await self._redis.smembers(ROUTERS)
            alive = reaped = 0
            for other in sorted(routers):
                keys = [heartbeat_key(other), holds_key(other), ROUTERS]
                count = int(await self._reap(keys=keys, args=[other]))
                if count < 0:
                    alive += 1
                else:
                    reaped += count
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc
        return Sweep(alive, reaped)

    async def count_usage(self, key_id: str, model: str, counts: dict[str, int]) -> None:
        """Add ``counts`` (by ``USAGE_FIELDS`` name) to the key's usage of ``model``."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                for name, count in counts.items():
                    if count and name in USAGE_FIELDS:
                        pipe.hincrby(usage_key(key_id), f"{model}\t{name}", count)
                await pipe.execute()
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc

    async def add_counts(
        self,
        usage: Mapping[tuple[str, str], Mapping[str, int]],
        budgets: Mapping[tuple[str, int], tuple[int, int]],
    ) -> None:
        """Add usage counted elsewhere (a router's, while Redis did not answer) in one
        transaction: ``usage`` by (key id, model) and ``USAGE_FIELDS`` name; ``budgets``
        by (key id, period start): (tokens used, seconds to keep the counter, 0: forever)."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                for (key_id, model), counts in sorted(usage.items()):
                    for name, count in counts.items():
                        if count and name in USAGE_FIELDS:
                            pipe.hincrby(usage_key(key_id), f"{model}\t{name}", count)
                for (key_id, start), (tokens, keep_for) in sorted(budgets.items()):
                    if tokens:
                        pipe.incrby(budget_key(key_id, start), tokens)
                        if keep_for:
                            pipe.expire(budget_key(key_id, start), keep_for)
                await pipe.execute()
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc

    async def budget_used(self, key_id: str, window_start: int) -> int:
        """Tokens used in the key's budget period that began at ``window_start``, with
        what open requests hold."""
        try:
            raw = await self._redis.get(budget_key(key_id, window_start))
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc
        return max(0, int(raw)) if raw is not None else 0

    async def persistence(self) -> Persistence:
        """Whether Redis writes what it holds to disk (AOF, or RDB snapshots)."""
        try:
            appendonly = await self._redis.config_get("appendonly")
            save = await self._redis.config_get("save")
        except RedisError as exc:
            if "unknown command" in str(exc).lower() or "noperm" in str(exc).lower():
                return Persistence(None, None)
            raise LimitStoreUnreachable(str(exc)) from exc
        aof = appendonly.get("appendonly")
        return Persistence(None if aof is None else aof == "yes", save.get("save"))

    async def usage(self, key_id: str) -> list[KeyUsage]:
        """Every model's usage by ``key_id``, sorted by model name."""
        try:
            raw: dict[str, str] = await self._redis.hgetall(usage_key(key_id))
        except RedisError as exc:
            raise LimitStoreUnreachable(str(exc)) from exc
        by_model: dict[str, dict[str, int]] = {}
        for field_name, value in raw.items():
            model, _, name = field_name.rpartition("\t")
            if model and name in USAGE_FIELDS:
                by_model.setdefault(model, {})[name] = int(value)
        return [
            KeyUsage(model, *(counts.get(name, 0) for name in USAGE_FIELDS))
            for model, counts in sorted(by_model.items())
        ]
