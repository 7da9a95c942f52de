"""``UnavailableStore`` on the Consul stand-in: the leader's ``llmgw/unavailable`` document,
written, read and watched as routers watch it; a corrupt value keeps the last good one
(which then ages out in routers) and says why."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from llmgw.adapters.consul import ConsulClient, CorruptRecord, UnavailableStore, WatchSettings
from llmgw.core import conventions as c
from llmgw.core.records import Unavailability, UnavailableModel, UnavailableModels

if TYPE_CHECKING:
    from conftest import Eventually

DOC = UnavailableModels(
    catalog_sha256="a" * 64,
    published_at=1_700_000_000.0,
    models=(
        UnavailableModel("big", Unavailability.UNPLACEABLE, "no profile fits: no B200", 1_699_999_000.0),
    ),
)


async def test_publish_read_and_watch(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    store = UnavailableStore(client)
    assert await store.read() is None
    async with store.watch(fast_watch) as watch:
        assert await watch.wait_ready() is None
        await store.publish(DOC)
        await eventually(lambda: watch.latest == DOC)
    assert await store.read() == DOC


async def test_a_corrupt_document_keeps_the_last_good_one_and_says_why(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    store = UnavailableStore(client)
    await store.publish(DOC)
    async with store.watch(fast_watch) as watch:
        assert await watch.wait_ready() == DOC
        await client.kv_put(c.KV_UNAVAILABLE, b'{"catalog_sha256": "x", "models": []}')
        await eventually(lambda: not watch.healthy)
        assert watch.latest == DOC
        assert watch.last_error is not None and "llmgw/unavailable" in watch.last_error
    with pytest.raises(CorruptRecord, match="llmgw/unavailable"):
        await store.read()
