"""The leader's published status in Consul KV, so ``llmgw status`` works from anywhere.

Owns ``llmgw/status``: :class:`StatusPublisher` lets the leader put a JSON document
and anyone read it. The document's shape belongs to the control plane (it
encodes and decodes it); this store only insists it is a JSON object of
reasonable size, since whatever is stored is shown to operators.

Must not: define what the status says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import CorruptRecord
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.conventions import KV_STATUS

MAX_STATUS_BYTES = 512 * 1024


@dataclass(frozen=True, slots=True)
class StatusDocument:
    text: str  # a JSON object, as the leader wrote it
    modify_index: int  # changes whenever the document is rewritten


def _check(text: str | bytes, what: str) -> str:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    if len(raw) > MAX_STATUS_BYTES:
        raise ValueError(f"{what}: {len(raw)} bytes, more than {MAX_STATUS_BYTES}")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError(f"{what}: not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: not a JSON object")
    return raw.decode("utf-8")


class StatusPublisher:
    def __init__(self, client: ConsulClient) -> None:
        self._client = client

    async def publish(self, text: str) -> None:
        """Replace the status with ``text`` (a JSON object). Only the leader should call this."""
        await self._client.kv_put(KV_STATUS, _check(text, "status").encode("utf-8"))

    async def read(self) -> StatusDocument | None:
        """The last published status, or None if none was ever published."""
        entry, _ = await self._client.kv_get(KV_STATUS)
        if entry is None:
            return None
        try:
            text = _check(entry.value, f"Consul KV {KV_STATUS!r}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptRecord(str(exc)) from None
        return StatusDocument(text=text, modify_index=entry.modify_index)

    def watch(self, settings: WatchSettings | None = None) -> Watch[StatusDocument | None]:
        """A watch (not yet started) of the status document."""

        async def fetch(index: int, wait: float) -> tuple[StatusDocument | None, int]:
            entry, meta = await self._client.kv_get(KV_STATUS, index=index, wait=wait)
            if entry is None:
                return None, meta.index
            try:
                text = _check(entry.value, f"Consul KV {KV_STATUS!r}")
            except (ValueError, UnicodeDecodeError) as exc:
                raise CorruptRecord(str(exc)) from None
            return StatusDocument(text=text, modify_index=entry.modify_index), meta.index

        return Watch(f"kv/{KV_STATUS}", fetch, settings)
