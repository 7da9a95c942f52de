"""What every llmgw KV store shares: safe key parts, record decoding, and prefix watches.

Owns :func:`key_part` (an id that becomes the last part of a key cannot climb
out of its prefix), :class:`CorruptRecord` (a stored value that is not the record
it should be) and :func:`watch_prefix` (one blocking query on a prefix, decoded
into a mapping; an unreadable entry is skipped with one warning, never fatal,
since KV content is untrusted).

Must not: know a particular store's rules (each store module does).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

from llmgw.adapters.consul.client import ConsulClient, ConsulError, KvEntry
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.records import R, RecordDecodeError, from_json

log = logging.getLogger(__name__)

# Router ids, job ids, key ids: what Nomad allows in a job id plus ":" and "@"
# (host:pid, user@host); no "/" so an id cannot name a key outside its prefix.
_KEY_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$")


class CorruptRecord(ConsulError):
    """A value in Consul KV is not the record llmgw expects there (someone wrote
    it by hand, or a newer, incompatible llmgw did). The message names the key."""

    temporary = False


def key_part(value: str, what: str) -> str:
    """``value`` if it is safe as one key segment; ValueError saying what is allowed otherwise."""
    if not _KEY_PART.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} cannot be part of a Consul key: use 1-200 letters, digits, '.', '_', ':', '@' "
            "or '-', starting with a letter or digit"
        )
    return value


def decode_entry(kind: type[R], entry: KvEntry) -> R:
    """The record stored at ``entry``; CorruptRecord (naming the key) if it is not one."""
    try:
        return from_json(kind, entry.value)
    except RecordDecodeError as exc:
        raise CorruptRecord(f"Consul KV {entry.key!r}: {exc}") from None


def decode_prefix(
    kind: type[R],
    prefix: str,
    entries: list[KvEntry],
    id_of: Callable[[R], str],
    warned: dict[str, str],
) -> dict[str, R]:
    """Records under ``prefix`` by the id that ends their key. An entry whose
    value does not decode, or whose record names another id than its key, is
    skipped; ``warned`` remembers what was already logged so each problem is
    logged once while it lasts."""
    out: dict[str, R] = {}
    bad: dict[str, str] = {}
    for entry in entries:
        suffix = entry.key[len(prefix) :]
        if not suffix or "/" in suffix:
            continue  # a "folder" or a deeper key: not ours to read
        try:
            record = decode_entry(kind, entry)
            if id_of(record) != suffix:
                raise CorruptRecord(
                    f"Consul KV {entry.key!r}: the record names {id_of(record)!r}, not {suffix!r}"
                )
        except CorruptRecord as exc:
            bad[entry.key] = str(exc)
            if warned.get(entry.key) != str(exc):
                log.warning("%s (skipped)", exc)
            continue
        out[suffix] = record
    warned.clear()
    warned.update(bad)
    return out


def watch_key(
    client: ConsulClient, key: str, kind: type[R], settings: WatchSettings | None = None
) -> Watch[R | None]:
    """A watch (not yet started) of the one ``kind`` record at ``key`` (None while there
    is none). A corrupt value leaves the watch unhealthy with the last good record kept."""
    settings = settings or WatchSettings()

    async def fetch(index: int, wait: float) -> tuple[R | None, int]:
        entry, meta = await client.kv_get(key, index=index, wait=wait, stale=settings.stale)
        return (None if entry is None else decode_entry(kind, entry)), meta.index

    return Watch(f"kv/{key}", fetch, settings)


def watch_prefix(
    client: ConsulClient,
    prefix: str,
    kind: type[R],
    id_of: Callable[[R], str],
    settings: WatchSettings | None = None,
) -> Watch[Mapping[str, R]]:
    """A watch (not yet started) of every ``kind`` record under ``prefix``, by id."""
    settings = settings or WatchSettings()
    warned: dict[str, str] = {}

    async def fetch(index: int, wait: float) -> tuple[Mapping[str, R], int]:
        entries, meta = await client.kv_list(prefix, index=index, wait=wait, stale=settings.stale)
        return decode_prefix(kind, prefix, entries, id_of, warned), meta.index

    return Watch(f"kv/{prefix}", fetch, settings)
