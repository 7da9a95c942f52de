"""The Responses API's stored conversations in Consul KV, under ``llmgw/responses/``.

Owns ``ResponseKV``: one value per stored response, under the name the router gives
(``llmgw/responses/<owner>/<response id>.<bytes>``), written and read by every
router, so a follow-up's ``previous_response_id`` finds its turn whichever router
takes it. The router keeps each value under its ``responses_max_bytes`` (below
Consul's 512 KiB value limit), so none needs pieces; values are sealed before they
reach here.

Must not: decide what is stored, for whom, or for how long (the router does: the
name carries its owner, the sealed value its expiry), or read any other prefix.
"""

from __future__ import annotations

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import key_part
from llmgw.core.conventions import KV_RESPONSES_PREFIX


class ResponseKV:
    def __init__(self, client: ConsulClient) -> None:
        self._client = client

    def _key(self, name: str) -> str:
        return KV_RESPONSES_PREFIX + "/".join(
            key_part(part, "stored response name") for part in name.split("/")
        )

    async def get(self, name: str) -> bytes | None:
        entry, _ = await self._client.kv_get(self._key(name))
        return None if entry is None else entry.value

    async def put(self, name: str, value: bytes) -> None:
        await self._client.kv_put(self._key(name), value)

    async def delete(self, name: str) -> None:
        await self._client.kv_delete(self._key(name))

    async def names(self, prefix: str = "") -> list[str]:
        keys = await self._client.kv_keys(KV_RESPONSES_PREFIX + prefix)
        return [key[len(KV_RESPONSES_PREFIX) :] for key in keys if key.startswith(KV_RESPONSES_PREFIX)]
