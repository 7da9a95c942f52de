"""The Responses API's stored conversations in Consul KV, under ``llmgw/responses/``.

Owns ``ResponseKV``: one value per response id (``llmgw/responses/<id>``), written
and read by every router, so a follow-up's ``previous_response_id`` finds its turn
whichever router takes it. The router keeps each value under its
``responses_max_bytes`` (below Consul's 512 KiB value limit), so none needs pieces.

Must not: decide what is stored, for whom, or for how long (the router does: the
value carries its owner and expiry), or read any other prefix.
"""

from __future__ import annotations

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import key_part
from llmgw.core.conventions import KV_RESPONSES_PREFIX


class ResponseKV:
    def __init__(self, client: ConsulClient) -> None:
        self._client = client

    def _key(self, response_id: str) -> str:
        return KV_RESPONSES_PREFIX + key_part(response_id, "response id")

    async def get(self, response_id: str) -> bytes | None:
        entry, _ = await self._client.kv_get(self._key(response_id))
        return None if entry is None else entry.value

    async def put(self, response_id: str, value: bytes) -> None:
        await self._client.kv_put(self._key(response_id), value)

    async def delete(self, response_id: str) -> None:
        await self._client.kv_delete(self._key(response_id))

    async def ids(self) -> list[str]:
        keys = await self._client.kv_keys(KV_RESPONSES_PREFIX)
        return [key[len(KV_RESPONSES_PREFIX) :] for key in keys if key.startswith(KV_RESPONSES_PREFIX)]
