"""Draining marks in Consul KV: the control plane sets them, every router reads them.

Owns ``llmgw/draining/<job id>``: :class:`DrainingMarks` sets and clears a
:class:`DrainMark` and lists or watches all of them. A router sends no new
requests to a marked replica; the control plane stops the job once its in-flight
requests are done (or a deadline passes) and then clears the mark.

Must not: decide what to drain (the control plane does).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import decode_prefix, key_part, watch_prefix
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.conventions import KV_DRAINING_PREFIX
from llmgw.core.records import DrainMark, to_json


def drain_key(job_id: str) -> str:
    return KV_DRAINING_PREFIX + key_part(job_id, "job id")


class DrainingMarks:
    def __init__(self, client: ConsulClient) -> None:
        self._client = client

    async def set(self, mark: DrainMark) -> None:
        """Mark ``mark.job_id`` as draining (replacing an earlier mark for it)."""
        await self._client.kv_put(drain_key(mark.job_id), to_json(mark).encode("utf-8"))

    async def clear(self, job_id: str) -> None:
        """Remove the mark; clearing a mark that is not there is fine."""
        await self._client.kv_delete(drain_key(job_id))

    async def list(self) -> Mapping[str, DrainMark]:
        """Every readable mark, by job id (unreadable ones are skipped with a warning)."""
        entries, _ = await self._client.kv_list(KV_DRAINING_PREFIX)
        return decode_prefix(DrainMark, KV_DRAINING_PREFIX, entries, lambda m: m.job_id, {})

    def watch(self, settings: WatchSettings | None = None) -> Watch[Mapping[str, DrainMark]]:
        """A watch (not yet started) of every mark, by job id."""
        return watch_prefix(self._client, KV_DRAINING_PREFIX, DrainMark, lambda m: m.job_id, settings)
