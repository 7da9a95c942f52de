"""The models the control plane cannot serve now, in Consul KV, for every router.

Owns ``llmgw/unavailable``: :class:`UnavailableStore` lets the leading control plane
put one :class:`UnavailableModels` document (every unplaceable or drained model) and
routers read or watch it: one key, so one blocking query per router whatever the
number of models.

Must not: decide which models are unavailable (``llmgw.core.planning.unavailable``)
or whether a router may trust the document (``llmgw.core.records.unavailable_now``).
"""

from __future__ import annotations

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import decode_entry, watch_key
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.conventions import KV_UNAVAILABLE
from llmgw.core.records import UnavailableModels, to_json


class UnavailableStore:
    def __init__(self, client: ConsulClient) -> None:
        self._client = client

    async def publish(self, document: UnavailableModels) -> None:
        """Replace the document. Only the leader should call this."""
        await self._client.kv_put(KV_UNAVAILABLE, to_json(document).encode("utf-8"))

    async def read(self) -> UnavailableModels | None:
        """The last published document (None if none was ever published)."""
        entry, _ = await self._client.kv_get(KV_UNAVAILABLE)
        return None if entry is None else decode_entry(UnavailableModels, entry)

    def watch(self, settings: WatchSettings | None = None) -> Watch[UnavailableModels | None]:
        """A watch (not yet started) of the document. A corrupt value leaves the watch
        unhealthy with the last good document kept, which then ages out in routers."""
        return watch_key(self._client, KV_UNAVAILABLE, UnavailableModels, settings)
