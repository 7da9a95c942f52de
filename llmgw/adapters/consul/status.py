"""The leader's published status in Consul KV, so ``llmgw status`` works from anywhere.

Owns the status's storage: :class:`StatusPublisher` lets the leader put a JSON
document and anyone read it whole. The document's shape belongs to the control
plane (it encodes and decodes it); this store only insists it is a JSON object,
since whatever is stored is shown to operators.

Consul refuses a value over 512 KiB (``kv_max_value_size``), and a 2,000-model
status is several MiB, so the document is stored in pieces (DESIGN.md, "Status"):

- ``llmgw/status/parts/<generation>/<nnnn>``: the document's bytes cut into pieces of
  at most :data:`PART_BYTES`, written first;
- ``llmgw/status``: the head, written last, ``{"generation", "parts", "bytes", "sha256"}``;
  the one write that makes a new generation visible;
- then every other generation's pieces are deleted.

A reader reads the head, then the generation's pieces in one listing, and accepts
them only if their count, length and SHA-256 are the head's; if a newer publish
deleted them in between, it reads the new head and tries again. So a reader never
sees pieces of two generations.

Must not: define what the status says.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Final

from llmgw.adapters.consul.client import ConsulClient, KvEntry
from llmgw.adapters.consul.kv import CorruptRecord
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.conventions import KV_STATUS, KV_STATUS_PARTS_PREFIX

# Consul's kv_max_value_size is 512 KiB; half of it leaves room for an operator who
# lowered the limit, and keeps one listing of a 2,000-model status to ~20 pieces.
PART_BYTES: Final = 256 * 1024
# A status larger than this is refused before anything is written (it would mean a
# catalog far past anything llmgw is sized for, or a bug): 64 MiB, 256 pieces.
MAX_STATUS_BYTES: Final = 64 * 1024 * 1024
# A reader whose pieces were replaced under it reads the new head; a publish takes
# well under a second, so a few tries suffice unless the leader publishes in a loop.
READ_ATTEMPTS: Final = 5


@dataclass(frozen=True, slots=True)
class StatusDocument:
    text: str  # a JSON object, as the leader wrote it
    modify_index: int  # the head's: changes whenever the document is rewritten


@dataclass(frozen=True, slots=True)
class _Head:
    generation: str
    parts: int
    size: int
    sha256: str


def _check(raw: bytes, what: str) -> str:
    if len(raw) > MAX_STATUS_BYTES:
        raise ValueError(f"{what}: {len(raw)} bytes, more than {MAX_STATUS_BYTES}")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError(f"{what}: not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: not a JSON object")
    return raw.decode("utf-8")


def _head(entry: KvEntry) -> _Head:
    where = f"Consul KV {KV_STATUS!r}"
    try:
        doc = json.loads(entry.value)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise CorruptRecord(f"{where}: not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"generation", "parts", "bytes", "sha256"}:
        raise CorruptRecord(
            f"{where}: not a status head (generation, parts, bytes, sha256); an llmgw older than "
            "this one may have written it: it is replaced at the leader's next publish"
        )
    generation, parts, size, digest = doc["generation"], doc["parts"], doc["bytes"], doc["sha256"]
    if not (
        isinstance(generation, str)
        and len(generation) == 32
        and all(ch in "0123456789abcdef" for ch in generation)
        and type(parts) is int
        and 0 < parts <= MAX_STATUS_BYTES // PART_BYTES + 1
        and type(size) is int
        and 0 < size <= MAX_STATUS_BYTES
        and isinstance(digest, str)
    ):
        raise CorruptRecord(f"{where}: a status head with impossible values")
    return _Head(generation, parts, size, digest)


def _part_key(generation: str, number: int) -> str:
    return f"{KV_STATUS_PARTS_PREFIX}{generation}/{number:04d}"


class StatusPublisher:
    def __init__(self, client: ConsulClient) -> None:
        self._client = client

    async def publish(self, text: str) -> None:
        """Replace the status with ``text`` (a JSON object). Only the leader should call this."""
        raw = text.encode("utf-8")
        _check(raw, "status")
        generation = uuid.uuid4().hex
        pieces = [raw[i : i + PART_BYTES] for i in range(0, len(raw), PART_BYTES)]
        for number, piece in enumerate(pieces):
            await self._client.kv_put(_part_key(generation, number), piece)
        head = {
            "generation": generation,
            "parts": len(pieces),
            "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
        await self._client.kv_put(KV_STATUS, json.dumps(head, sort_keys=True).encode("utf-8"))
        # Older generations (this leader's last one, or a previous leader's) go now; a
        # reader still on one of them reads the new head and tries again.
        stale = {
            key[len(KV_STATUS_PARTS_PREFIX) :].split("/", 1)[0]
            for key in await self._client.kv_keys(KV_STATUS_PARTS_PREFIX)
        } - {generation}
        for old in sorted(stale):
            await self._client.kv_delete(f"{KV_STATUS_PARTS_PREFIX}{old}/", recurse=True)

    async def read(self) -> StatusDocument | None:
        """The last published status, whole, or None if none was ever published."""
        entry, _ = await self._client.kv_get(KV_STATUS)
        return None if entry is None else await self._assemble(entry)

    async def _assemble(self, entry: KvEntry) -> StatusDocument:
        """The document ``entry`` (a head) names; if its pieces were replaced meanwhile,
        the newest head's. CorruptRecord if no consistent set can be read."""
        for _ in range(READ_ATTEMPTS):
            head = _head(entry)
            prefix = f"{KV_STATUS_PARTS_PREFIX}{head.generation}/"
            pieces, _ = await self._client.kv_list(prefix)
            raw = b"".join(p.value for p in sorted(pieces, key=lambda p: p.key))
            if (
                [p.key for p in sorted(pieces, key=lambda p: p.key)]
                == [_part_key(head.generation, n) for n in range(head.parts)]
                and len(raw) == head.size
                and hashlib.sha256(raw).hexdigest() == head.sha256
            ):
                try:
                    text = _check(raw, f"the status in Consul KV {prefix!r}")
                except (ValueError, UnicodeDecodeError) as exc:
                    raise CorruptRecord(str(exc)) from None
                return StatusDocument(text=text, modify_index=entry.modify_index)
            newer, _ = await self._client.kv_get(KV_STATUS)
            if newer is None or newer.modify_index == entry.modify_index:
                break  # the same head, and its pieces are not what it says
            entry = newer
        raise CorruptRecord(
            f"Consul KV {KV_STATUS!r}: its pieces under {KV_STATUS_PARTS_PREFIX!r} are missing or do not "
            "match it (written by hand, or a publish cut short); the leader's next publish replaces them"
        )

    def watch(self, settings: WatchSettings | None = None) -> Watch[StatusDocument | None]:
        """A watch (not yet started) of the status document: it blocks on the head."""

        async def fetch(index: int, wait: float) -> tuple[StatusDocument | None, int]:
            entry, meta = await self._client.kv_get(KV_STATUS, index=index, wait=wait)
            if entry is None:
                return None, meta.index
            return await self._assemble(entry), meta.index

        return Watch(f"kv/{KV_STATUS}", fetch, settings)
