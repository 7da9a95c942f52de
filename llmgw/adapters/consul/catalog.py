"""The applied catalog in Consul KV: the current version, and every earlier one.

Owns ``llmgw/catalog/current`` and ``llmgw/catalog/history/<version:08d>``.
:meth:`CatalogStore.apply` is atomic against other writers: the compare-and-set
of ``current`` on the ModifyIndex just read is the single point where an apply
wins, so of two applies based on the same version exactly one succeeds and the
other gets :class:`CatalogConflict`. The history entry is written after the win
(the version number is then owned by the winner, so the write cannot clash); if
the writer dies in between, the next apply writes the missing entry first.

(Consul's ``PUT /v1/txn`` could write both keys in one step; the dev stand-in
does not speak it, and the order above gives the same guarantee for current.)

Must not: validate the catalog's content (``llmgw.core.catalog`` does, before apply).
"""

from __future__ import annotations

import logging

from llmgw.adapters.consul.client import ConsulClient, ConsulError, KvEntry
from llmgw.adapters.consul.kv import decode_entry, watch_key
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.conventions import KV_CATALOG_CURRENT, KV_CATALOG_HISTORY_PREFIX
from llmgw.core.records import CatalogVersion, catalog_sha256, to_json

log = logging.getLogger(__name__)

# Consul refuses KV values over 512 KiB unless its kv_max_value_size is raised.
DEFAULT_MAX_VALUE_BYTES = 512 * 1024


class CatalogConflict(RuntimeError):
    """Another apply got there first: the current version is not the expected one.
    Read the current catalog, merge, and apply again."""

    def __init__(self, expected: int | None, actual: int | None) -> None:
        def show(v: int | None) -> str:
            return "none" if v is None else str(v)

        super().__init__(
            f"the catalog changed meanwhile: expected version {show(expected)}, found {show(actual)}; "
            "review the current catalog and apply again"
        )
        self.expected = expected
        self.actual = actual


def history_key(version: int) -> str:
    return f"{KV_CATALOG_HISTORY_PREFIX}{version:08d}"


class CatalogStore:
    def __init__(self, client: ConsulClient, *, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        self._client = client
        self._max_value_bytes = max_value_bytes

    async def _current_entry(self) -> tuple[KvEntry | None, CatalogVersion | None]:
        entry, _ = await self._client.kv_get(KV_CATALOG_CURRENT)
        if entry is None:
            return None, None
        return entry, decode_entry(CatalogVersion, entry)

    async def current(self) -> CatalogVersion | None:
        """The applied catalog, or None before the first apply. CorruptRecord if unreadable."""
        _, current = await self._current_entry()
        return current

    async def apply(self, new: CatalogVersion, expected_version: int | None) -> CatalogVersion:
        """Make ``new`` current if the current version is still ``expected_version``
        (None: there must be no catalog yet). ``new.version`` must be the next number.
        Raises CatalogConflict when another writer won, ValueError when ``new`` is not
        a valid next version, ConsulError when Consul could not be asked."""
        if new.sha256 != catalog_sha256(new.text):
            raise ValueError("CatalogVersion.sha256 does not match its text; build it with CatalogVersion.of")
        body = to_json(new).encode("utf-8")
        if len(body) > self._max_value_bytes:
            raise ValueError(
                f"the catalog is {len(body)} bytes stored, more than Consul's {self._max_value_bytes}-byte "
                "KV value limit (kv_max_value_size); split it or raise the limit"
            )
        entry, current = await self._current_entry()
        actual = current.version if current is not None else None
        if actual != expected_version:
            raise CatalogConflict(expected_version, actual)
        wanted = (actual or 0) + 1
        if new.version != wanted:
            raise ValueError(f"the next catalog version is {wanted}, not {new.version}")
        if current is not None:
            # Heal a history gap left by a writer that died after winning (cas=0: only if missing).
            await self._client.kv_put(history_key(current.version), to_json(current).encode("utf-8"), cas=0)
        won = await self._client.kv_put(KV_CATALOG_CURRENT, body, cas=entry.modify_index if entry else 0)
        if not won:
            _, now_current = await self._current_entry()
            raise CatalogConflict(expected_version, now_current.version if now_current else None)
        try:
            await self._client.kv_put(history_key(new.version), body)
        except ConsulError as exc:
            log.warning(
                "catalog version %d applied, but its history entry was not written (%s); "
                "the next apply writes it",
                new.version,
                exc,
            )
        return new

    async def history(self, limit: int = 20) -> list[CatalogVersion]:
        """Up to ``limit`` earlier and current versions, newest first (unreadable ones skipped)."""
        if limit <= 0:
            return []
        versions: list[int] = []
        for key in await self._client.kv_keys(KV_CATALOG_HISTORY_PREFIX):
            suffix = key[len(KV_CATALOG_HISTORY_PREFIX) :]
            if len(suffix) == 8 and suffix.isdigit():
                versions.append(int(suffix))
        out: list[CatalogVersion] = []
        for version in sorted(versions, reverse=True)[:limit]:
            entry, _ = await self._client.kv_get(history_key(version))
            if entry is None:
                continue
            try:
                record = decode_entry(CatalogVersion, entry)
            except ConsulError as exc:
                log.warning("%s (skipped)", exc)
                continue
            if record.version != version:
                log.warning("catalog history %s holds version %d (skipped)", entry.key, record.version)
                continue
            out.append(record)
        return out

    def watch(self, settings: WatchSettings | None = None) -> Watch[CatalogVersion | None]:
        """A watch (not yet started) of the current catalog (None before the first apply).
        A corrupt value leaves the watch unhealthy with the last good version kept."""
        return watch_key(self._client, KV_CATALOG_CURRENT, CatalogVersion, settings)
