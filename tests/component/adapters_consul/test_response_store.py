"""The Responses API's stored conversations in Consul KV (``ResponseKV``), on the stand-in."""

from __future__ import annotations

import pytest

from llmgw.adapters.consul import ConsulClient, ResponseKV
from llmgw.core import conventions as c


async def test_values_by_name_under_llmgw_responses(client: ConsulClient) -> None:
    store = ResponseKV(client)
    other = ResponseKV(client)  # another router's view of the same store
    one, two = "k-1/resp_" + "a" * 48 + ".13", "k-2/resp_" + "b" * 48 + ".2"
    sealed = bytes(range(256))  # sealed values are bytes, not text
    assert await store.get(one) is None
    await store.put(one, sealed)
    await store.put(two, b"{}")
    assert await other.get(one) == sealed
    entry, _ = await client.kv_get(c.KV_RESPONSES_PREFIX + one)
    assert entry is not None and entry.value == sealed
    assert sorted(await other.names()) == [one, two]
    assert await other.names("k-1/") == [one] and await other.names("k-1/resp_" + "a" * 48 + ".") == [one]
    await other.delete(one)
    await other.delete(one)  # already gone: no error
    assert await store.get(one) is None and await store.names() == [two]


async def test_a_name_cannot_name_a_key_outside_the_prefix(client: ConsulClient) -> None:
    store = ResponseKV(client)
    for bad in ("../keys/abc", "k-1/../../keys/x", "a//b", "", "k-1/"):
        with pytest.raises(ValueError, match="cannot be part of a Consul key"):
            await store.get(bad)
        with pytest.raises(ValueError, match="cannot be part of a Consul key"):
            await store.put(bad, b"x")
