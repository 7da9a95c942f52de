"""API keys in Consul KV: issued and revoked by operators, read by every router.

Owns ``llmgw/keys/<key id>``: :class:`ApiKeyStore` creates a key (a random
secret shown once to the caller, only its SHA-256 stored), lists, revokes (a
compare-and-set on the record, so a revoke never undoes a concurrent change) and
watches keys.

Secrets are 256 random bits, so a plain SHA-256 is enough to store them (nobody
can guess one from its digest); a slow password hash would only slow routers.

Must not: store, log or put in an exception a secret; check requests against
keys (the router does).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import decode_entry, decode_prefix, key_part, watch_prefix
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.api_keys import ID_BYTES, SECRET_BYTES, compose_key
from llmgw.core.budgets import budget_fields
from llmgw.core.conventions import KV_KEYS_PREFIX
from llmgw.core.records import ApiKeyRecord, secret_sha256, to_json

# Tries to find an unused random key id; a clash among 64-bit ids means a broken RNG.
_CREATE_ATTEMPTS = 3


class ApiKeyNotFound(LookupError):
    """No key with that id (it was never created, or was deleted by hand)."""


class ApiKeyConflict(RuntimeError):
    """The key changed under us too many times in a row; try again."""


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A new key: the record as stored, and the secret to hand to its user exactly once."""

    record: ApiKeyRecord
    secret: str = field(repr=False)


def api_key_path(key_id: str) -> str:
    return KV_KEYS_PREFIX + key_part(key_id, "key id")


class ApiKeyStore:
    def __init__(
        self,
        client: ConsulClient,
        *,
        wall_clock: Callable[[], float] = time.time,
        attempts: int = 5,  # read-modify-write retries of a revoke that lost a race
    ) -> None:
        self._client = client
        self._wall_clock = wall_clock
        self._attempts = attempts

    async def create(
        self,
        name: str,
        *,
        models: tuple[str, ...] | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        token_budget: int | None = None,
        budget_period: str | None = None,
    ) -> IssuedKey:
        """Issue a key. ``models`` None: every model; limits None: unlimited."""
        for limit in (requests_per_minute, tokens_per_minute):
            if limit is not None and limit < 1:
                raise ValueError("a per-minute limit must be at least 1 (or None for no limit)")
        budget, period = budget_fields(token_budget, budget_period)
        for _ in range(_CREATE_ATTEMPTS):
            key_id, secret = compose_key(secrets.token_bytes(ID_BYTES), secrets.token_bytes(SECRET_BYTES))
            record = ApiKeyRecord(
                key_id=key_id,
                name=name,
                secret_sha256=secret_sha256(secret),
                models=models,
                requests_per_minute=requests_per_minute,
                tokens_per_minute=tokens_per_minute,
                created_at=self._wall_clock(),
                revoked_at=None,
                token_budget=budget,
                budget_period=period,
            )
            # cas=0: only if no key has this id yet.
            if await self._client.kv_put(api_key_path(key_id), to_json(record).encode("utf-8"), cas=0):
                return IssuedKey(record=record, secret=secret)
        raise ApiKeyConflict("could not find an unused key id; is the random number generator broken?")

    async def get(self, key_id: str) -> ApiKeyRecord | None:
        entry, _ = await self._client.kv_get(api_key_path(key_id))
        return None if entry is None else decode_entry(ApiKeyRecord, entry)

    async def list(self) -> Mapping[str, ApiKeyRecord]:
        """Every readable key record, by key id, revoked ones included."""
        entries, _ = await self._client.kv_list(KV_KEYS_PREFIX)
        return decode_prefix(ApiKeyRecord, KV_KEYS_PREFIX, entries, lambda k: k.key_id, {})

    async def revoke(self, key_id: str) -> ApiKeyRecord:
        """Mark the key revoked (routers refuse it from their next update on).
        Revoking a revoked key changes nothing and returns it."""
        path = api_key_path(key_id)
        for _ in range(self._attempts):
            entry, _ = await self._client.kv_get(path)
            if entry is None:
                raise ApiKeyNotFound(f"no API key {key_id!r}")
            record = decode_entry(ApiKeyRecord, entry)
            if record.revoked_at is not None:
                return record
            revoked = replace(record, revoked_at=self._wall_clock())
            if await self._client.kv_put(path, to_json(revoked).encode("utf-8"), cas=entry.modify_index):
                return revoked
        raise ApiKeyConflict(f"API key {key_id!r} kept changing while being revoked; try again")

    async def set_budget(
        self, key_id: str, token_budget: int | None, budget_period: str | None
    ) -> ApiKeyRecord:
        """Give the key a token budget, change it, or (``token_budget`` None) remove it;
        ``budget_period`` None keeps the key's period (monthly for a key without one);
        ``core.budgets.budget_fields`` checks both. The period's usage so far stays
        counted: a larger budget leaves the key more this period, a smaller one less."""
        budget_fields(token_budget, budget_period)  # refused before anything is read
        path = api_key_path(key_id)
        for _ in range(self._attempts):
            entry, _ = await self._client.kv_get(path)
            if entry is None:
                raise ApiKeyNotFound(f"no API key {key_id!r}")
            record = decode_entry(ApiKeyRecord, entry)
            kept = record.budget_period if token_budget is not None and record.budget_period else None
            budget, period = budget_fields(token_budget, budget_period if budget_period is not None else kept)
            changed = replace(record, token_budget=budget, budget_period=period)
            if changed == record:
                return record
            if await self._client.kv_put(path, to_json(changed).encode("utf-8"), cas=entry.modify_index):
                return changed
        raise ApiKeyConflict(f"API key {key_id!r} kept changing while its budget was set; try again")

    def watch(self, settings: WatchSettings | None = None) -> Watch[Mapping[str, ApiKeyRecord]]:
        """A watch (not yet started) of every key record, by key id."""
        return watch_prefix(self._client, KV_KEYS_PREFIX, ApiKeyRecord, lambda k: k.key_id, settings)
