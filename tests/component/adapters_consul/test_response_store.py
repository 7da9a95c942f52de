"""The Responses API's stored conversations in Consul KV (``ResponseKV``), on the stand-in."""

from __future__ import annotations

import pytest

from llmgw.adapters.consul import ConsulClient, ResponseKV
from llmgw.core import conventions as c


async def test_values_by_id_under_llmgw_responses(client: ConsulClient) -> None:
    store = ResponseKV(client)
    other = ResponseKV(client)  # another router's view of the same store
    one, two = "resp_" + "a" * 48, "resp_" + "b" * 48
    assert await store.get(one) is None
    await store.put(one, b'{"owner":"k"}')
    await store.put(two, b"{}")
    assert await other.get(one) == b'{"owner":"k"}'
    entry, _ = await client.kv_get(c.KV_RESPONSES_PREFIX + one)
    assert entry is not None and entry.value == b'{"owner":"k"}'
    assert sorted(await other.ids()) == [one, two]
    await other.delete(one)
    await other.delete(one)  # already gone: no error
    assert await store.get(one) is None and await store.ids() == [two]


async def test_an_id_cannot_name_a_key_outside_the_prefix(client: ConsulClient) -> None:
    store = ResponseKV(client)
    for bad in ("../keys/abc", "a/b", ""):
        with pytest.raises(ValueError, match="cannot be part of a Consul key"):
            await store.get(bad)
