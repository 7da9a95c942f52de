"""API keys: issuing one, checking a presented one, and per-key rate limits.

Owns:

- ``new_api_key``: a random key and the ``ApiKeyRecord`` to store for it (only the
  SHA-256 of the key; the format is ``llmgw.core.api_keys``'s, which the Consul
  adapter issues with too). The key is shown once; nothing can recover it.
- ``KeyRing``: the records a router knows (from the watched key prefix), indexed
  by id, and by digest for keys issued without an id in them.
- ``authenticate``: the ``Authorization`` header to a record, or OpenAI's 401.
- ``RateLimiter``: requests and tokens per minute per key, token buckets on the
  event loop's clock (``now`` is a parameter), with a ``TokenHold`` per admitted
  request. Limits are per router: with N routers a key may use up to N times its
  limit.

Must not: log or keep a presented key (errors show its id and a mask only), or
talk to Consul (the admin API stores what ``new_api_key`` returns).
"""

from __future__ import annotations

import hmac
import math
import secrets
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from llmgw.core.api_keys import ID_BYTES, SECRET_BYTES, compose_key, key_id_of, masked
from llmgw.core.budgets import budget_fields
from llmgw.core.records import ApiKeyRecord, secret_sha256
from llmgw.gateway import errors


@dataclass(frozen=True, slots=True)
class NewKey:
    record: ApiKeyRecord
    key: str = field(repr=False)  # hand to the user once; only its digest is stored


def new_api_key(
    name: str,
    *,
    now: float,
    models: Collection[str] | None = None,
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
    token_budget: int | None = None,
    budget_period: str | None = None,
    token_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> NewKey:
    """A fresh key and its record. ``models`` None: every model; a limit None: unlimited."""
    for limit in (requests_per_minute, tokens_per_minute):
        if limit is not None and limit < 1:
            raise ValueError("a per-minute limit must be at least 1, or None for no limit")
    budget, period = budget_fields(token_budget, budget_period)
    key_id, key = compose_key(token_bytes(ID_BYTES), token_bytes(SECRET_BYTES))
    record = ApiKeyRecord(
        key_id=key_id,
        name=name,
        secret_sha256=secret_sha256(key),
        models=None if models is None else tuple(models),
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        created_at=now,
        revoked_at=None,
        token_budget=budget,
        budget_period=period,
    )
    return NewKey(record=record, key=key)


class KeyRing:
    """The key records this router knows, replaced whole on every change."""

    def __init__(self, records: Mapping[str, ApiKeyRecord] | None = None) -> None:
        self._by_id: Mapping[str, ApiKeyRecord] = {}
        self._by_digest: Mapping[str, ApiKeyRecord] = {}
        self.replace(records or {})

    def replace(self, records: Mapping[str, ApiKeyRecord]) -> None:
        self._by_id = dict(records)
        self._by_digest = {r.secret_sha256: r for r in records.values()}

    def __len__(self) -> int:
        return len(self._by_id)

    def find(self, presented: str) -> ApiKeyRecord | None:
        """The record whose digest matches the key (revoked ones too), else None."""
        digest = secret_sha256(presented)
        key_id = key_id_of(presented)
        if key_id is not None:
            record = self._by_id.get(key_id)
            if record is not None and hmac.compare_digest(record.secret_sha256, digest):
                return record
            return None
        # A key issued without its id inside: found by digest. A dict lookup by a
        # SHA-256 of a 256-bit secret leaks nothing an attacker can use.
        return self._by_digest.get(digest)


def authenticate_headers(
    authorization: str | None, api_key: str | None, ring: KeyRing, *, anthropic: bool = False
) -> ApiKeyRecord:
    """The key record for ``Authorization: Bearer`` or ``x-api-key`` (Anthropic's
    clients send the key there; Claude Code with ANTHROPIC_AUTH_TOKEN sends a bearer).
    A request with both must carry the same key in each: otherwise a client could
    present a key it owns beside one it found, and the router would have to pick one
    (the refusal names neither). ``anthropic``: the missing key's message names
    ``x-api-key`` first."""
    if api_key is None:
        if authorization is None and anthropic:
            raise errors.missing_key_anthropic()
        return authenticate(authorization, ring)
    presented = api_key.strip()
    if authorization is not None:
        scheme, _, bearer = authorization.partition(" ")
        if scheme.lower() != "bearer" or bearer.strip() != presented:
            raise errors.conflicting_keys()
    if not presented:
        raise errors.missing_key_anthropic() if anthropic else errors.missing_key()
    record = ring.find(presented)
    if record is None or record.revoked:
        raise errors.invalid_key(masked(presented))
    return record


def authenticate(header: str | None, ring: KeyRing) -> ApiKeyRecord:
    """The key record for an ``Authorization: Bearer`` header, or the 401 to answer."""
    if not header:
        raise errors.missing_key()
    scheme, _, presented = header.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        raise errors.missing_key()
    record = ring.find(presented)
    if record is None or record.revoked:
        raise errors.invalid_key(masked(presented))
    return record


# --- rate limits ----------------------------------------------------------------------------------


class _Bucket:
    """A token bucket holding up to ``limit``, refilled at ``limit`` per minute."""

    __slots__ = ("level", "limit", "stamp")

    def __init__(self, limit: int, now: float) -> None:
        self.limit = limit
        self.level = float(limit)
        self.stamp = now

    def refill(self, limit: int, now: float) -> None:
        if limit != self.limit:  # the key's limit changed: keep the fill ratio sane
            self.limit = limit
            self.level = min(self.level, float(limit))
        self.level = min(float(limit), self.level + (now - self.stamp) * limit / 60.0)
        self.stamp = now

    def seconds_until(self, level: float) -> int:
        return max(1, math.ceil((level - self.level) * 60.0 / self.limit))


class TokenHold:
    """Tokens set aside from a key's budget for one admitted request until its usage
    is known. Without it, concurrent requests all start on one positive balance, and
    a client that leaves mid-stream (no usage event ever comes) pays nothing."""

    __slots__ = ("_bucket", "held")

    def __init__(self, bucket: _Bucket, held: int) -> None:
        self._bucket: _Bucket | None = bucket
        self.held = held

    @property
    def open(self) -> bool:
        return self._bucket is not None

    def settle(self, used: int) -> None:
        """The answer's usage is known: charge that instead of what was held."""
        bucket = self._bucket
        if bucket is not None:
            self._bucket = None
            bucket.level = min(float(bucket.limit), bucket.level + self.held - max(0, used))

    def release(self) -> None:
        """No engine generated anything for the request: the budget gets it all back."""
        self.settle(0)

    def keep(self) -> None:
        """An engine generated but its usage never came: charge what was held."""
        self._bucket = None


class RateLimiter:
    """Per key: a request needs one request token, and the tokens it may use (its
    prompt's estimate and its ``max_tokens``, at most the whole per-minute limit) are
    held from the token budget at admission; ``TokenHold`` settles them once the
    answer's ``usage`` is known."""

    def __init__(self, max_concurrent: int = 64) -> None:
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self._max_concurrent = max_concurrent
        self._in_progress: dict[str, int] = {}

    def enter(self, record: ApiKeyRecord) -> None:
        """One more request of the key in progress, or the 429 when it has
        ``max_concurrent`` already; every ``enter`` that returns is paired with a ``leave``."""
        running = self._in_progress.get(record.key_id, 0)
        if running >= self._max_concurrent:
            raise errors.too_many_at_once(self._max_concurrent)
        self._in_progress[record.key_id] = running + 1

    def leave(self, record: ApiKeyRecord) -> None:
        running = self._in_progress.pop(record.key_id, 0) - 1
        if running > 0:
            self._in_progress[record.key_id] = running

    def admit(
        self, record: ApiKeyRecord, now: float, tokens: int = 0, *, unbounded: bool = False
    ) -> TokenHold | None:
        """Take one request and hold ``tokens`` (None for a key without a token limit),
        or raise the 429 to answer (with Retry-After); a refused request takes nothing.
        An ``unbounded`` request (no max_tokens: its answer is as long as the model
        makes it) needs ``tokens`` to be admitted and holds all the key has left: the
        key's other requests wait for its usage, so together they cannot overshoot
        the budget by more than that one answer's excess (they all started on one
        balance and each held 1,024 tokens: 12,004 tokens served on a 5,000 key)."""
        hold_from: _Bucket | None = None
        held = 0
        if record.tokens_per_minute is not None:
            hold_from = self._bucket(self._tokens, record.key_id, record.tokens_per_minute, now)
            # A request may hold at most the whole limit, so a large max_tokens waits for
            # a full budget instead of never fitting.
            held = min(max(0, tokens), record.tokens_per_minute)
            if hold_from.level < held:  # held >= 0: a budget below zero admits nothing
                raise errors.rate_limited(
                    "tokens", record.tokens_per_minute, hold_from.seconds_until(float(held)), requested=held
                )
        if record.requests_per_minute is not None:
            bucket = self._bucket(self._requests, record.key_id, record.requests_per_minute, now)
            if bucket.level < 1:
                raise errors.rate_limited("requests", record.requests_per_minute, bucket.seconds_until(1.0))
            bucket.level -= 1
        if hold_from is None:
            return None
        if unbounded:
            held = max(held, int(hold_from.level))
        hold_from.level -= held
        return TokenHold(hold_from, held)

    @staticmethod
    def _bucket(buckets: dict[str, _Bucket], key_id: str, limit: int, now: float) -> _Bucket:
        bucket = buckets.get(key_id)
        if bucket is None:
            bucket = buckets[key_id] = _Bucket(limit, now)
        else:
            bucket.refill(limit, now)
        return bucket
