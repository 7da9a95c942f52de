"""The KV stores against the Consul stand-in: demand, draining marks, API keys,
the catalog (with its compare-and-set) and the leader's status."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from llmgw.adapters.consul import (
    ApiKeyNotFound,
    ApiKeyStore,
    CatalogConflict,
    CatalogStore,
    ConsulClient,
    CorruptRecord,
    DemandPublisher,
    DemandReader,
    DrainingMarks,
    StatusPublisher,
    WatchSettings,
)
from llmgw.core import conventions as c
from llmgw.core.records import (
    ApiKeyRecord,
    CatalogVersion,
    DemandReport,
    DrainMark,
    ModelUse,
    secret_sha256,
    to_json,
)
from llmgw.devcluster.consul import ConsulStandIn

if TYPE_CHECKING:
    from conftest import Eventually

NOW = 1_700_000_000.0


def report(router: str, sent_at: float = NOW, *, wake: bool = False) -> DemandReport:
    return DemandReport(
        router_id=router,
        sent_at=sent_at,
        models=(ModelUse(model="m1", last_used=sent_at - 1, in_flight=2, queued=0, wake=wake),),
    )


# ------------------------------------------------------------------ demand


async def test_demand_from_every_router_with_one_watch_and_stale_reports_ignored(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    clock = [NOW]
    a, b = DemandPublisher(client, "router-a"), DemandPublisher(client, "router-b:7")
    async with DemandReader(client, max_age=30, settings=fast_watch, wall_clock=lambda: clock[0]) as reader:
        await reader.watch.wait_ready()
        assert reader.reports() == ()
        await a.publish(report("router-a"))
        await b.publish(report("router-b:7", NOW - 20))
        await eventually(lambda: len(reader.reports()) == 2)
        assert [r.router_id for r in reader.reports()] == ["router-a", "router-b:7"]

        clock[0] = NOW + 15  # router-b:7's report is now 35 s old: it is gone or cut off
        assert [r.router_id for r in reader.reports()] == ["router-a"]

        generation = reader.watch.generation
        await a.publish(report("router-a", NOW + 15, wake=True))
        await reader.watch.wait_changed(generation)
        assert reader.reports()[0].models[0].wake is True

        await a.withdraw()
        await eventually(lambda: reader.reports() == ())


async def test_demand_reader_skips_what_it_cannot_trust(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually, caplog: pytest.LogCaptureFixture
) -> None:
    await client.kv_put(c.KV_DEMAND_PREFIX + "garbage", b"{not json")
    # A report filed under another router's key: refused, a router speaks only for itself.
    await client.kv_put(c.KV_DEMAND_PREFIX + "router-x", to_json(report("router-y")).encode())
    await DemandPublisher(client, "router-a").publish(report("router-a"))
    async with DemandReader(client, settings=fast_watch, wall_clock=lambda: NOW) as reader:
        await eventually(lambda: [r.router_id for r in reader.reports()] == ["router-a"])
        assert reader.watch.healthy
    text = caplog.text
    assert "llmgw/demand/garbage" in text and "not valid JSON" in text
    assert "names 'router-y', not 'router-x'" in text


async def test_demand_publisher_speaks_only_for_its_router(client: ConsulClient) -> None:
    with pytest.raises(ValueError, match="cannot be part of a Consul key"):
        DemandPublisher(client, "../catalog/current")
    with pytest.raises(ValueError, match="published as"):
        await DemandPublisher(client, "router-a").publish(report("router-b"))


# ------------------------------------------------------------------ draining


async def test_draining_marks_set_clear_and_watch(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    marks = DrainingMarks(client)
    mark = DrainMark(job_id="llmgw-m1-r1", model="m1", since=NOW, reason="scale down")
    async with marks.watch(fast_watch) as watch:
        await watch.wait_ready()
        await marks.set(mark)
        await eventually(lambda: watch.latest == {"llmgw-m1-r1": mark})
        assert await marks.list() == {"llmgw-m1-r1": mark}
        await marks.clear("llmgw-m1-r1")
        await marks.clear("llmgw-m1-r1")  # clearing twice is fine
        await eventually(lambda: watch.latest == {})


# ------------------------------------------------------------------ API keys


async def test_api_keys_create_list_revoke_watch_and_the_secret_is_never_stored(
    standin: ConsulStandIn, client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    store = ApiKeyStore(client, wall_clock=lambda: NOW)
    async with store.watch(fast_watch) as watch:
        await watch.wait_ready()
        issued = await store.create("team-a", models=("m1",), requests_per_minute=60)
        other = await store.create("team-b")
        assert issued.secret.startswith("sk-llmgw-") and issued.secret not in repr(issued)
        assert issued.record.secret_sha256 == secret_sha256(issued.secret)
        await eventually(lambda: watch.latest is not None and len(watch.latest) == 2)
        assert (await store.list())[issued.record.key_id] == issued.record

        revoked = await store.revoke(issued.record.key_id)
        assert revoked.revoked_at == NOW and not revoked.allows("m1")
        assert await store.revoke(issued.record.key_id) == revoked  # idempotent
        await eventually(
            lambda: watch.latest is not None and watch.latest[issued.record.key_id].revoked_at == NOW
        )
        assert (await store.get(other.record.key_id)) == other.record
        with pytest.raises(ApiKeyNotFound):
            await store.revoke("k-missing")

    entries, _ = await client.kv_list(c.KV_ROOT)
    stored = b"".join(e.value for e in entries)
    assert issued.secret.encode() not in stored and other.secret.encode() not in stored
    assert (
        json.loads(next(e.value for e in entries if e.key.endswith(issued.record.key_id)))["name"] == "team-a"
    )


async def test_a_revoke_does_not_undo_a_concurrent_change(client: ConsulClient) -> None:
    store = ApiKeyStore(client, wall_clock=lambda: NOW)
    issued = await store.create("team-a")
    results = await asyncio.gather(*(store.revoke(issued.record.key_id) for _ in range(5)))
    assert {r.revoked_at for r in results} == {NOW}
    record = await store.get(issued.record.key_id)
    assert isinstance(record, ApiKeyRecord) and record.revoked_at == NOW


# ------------------------------------------------------------------ catalog


def version(n: int, text: str | None = None) -> CatalogVersion:
    return CatalogVersion.of(n, text if text is not None else f"models: []  # v{n}\n", "alice@host", NOW + n)


async def test_catalog_apply_chain_history_and_conflicts(client: ConsulClient) -> None:
    store = CatalogStore(client)
    assert await store.current() is None
    await store.apply(version(1), expected_version=None)
    await store.apply(version(2), expected_version=1)
    assert await store.current() == version(2)

    with pytest.raises(CatalogConflict) as stale:
        await store.apply(version(3), expected_version=1)
    assert (stale.value.expected, stale.value.actual) == (1, 2)
    with pytest.raises(CatalogConflict):
        await store.apply(version(1), expected_version=None)  # "first apply" when one exists
    with pytest.raises(ValueError, match="next catalog version is 3"):
        await store.apply(version(5), expected_version=2)
    tampered = CatalogVersion(3, version(3).sha256, "other text", "x", NOW)
    with pytest.raises(ValueError, match="does not match"):
        await store.apply(tampered, expected_version=2)

    await store.apply(version(3), expected_version=2)
    assert [v.version for v in await store.history(limit=10)] == [3, 2, 1]
    assert [v.version for v in await store.history(limit=2)] == [3, 2]


@pytest.mark.parametrize("writers", [2, 5])
async def test_concurrent_applies_on_the_same_version_exactly_one_wins(
    client: ConsulClient, writers: int
) -> None:
    store = CatalogStore(client)
    await store.apply(version(1), expected_version=None)
    for round_ in range(5):
        base = 1 + round_
        candidates = [version(base + 1, f"writer {w} round {round_}\n") for w in range(writers)]
        results = await asyncio.gather(
            *(store.apply(v, expected_version=base) for v in candidates), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, CatalogVersion)]
        losers = [r for r in results if isinstance(r, CatalogConflict)]
        assert len(winners) == 1 and len(losers) == writers - 1, results
        current = await store.current()
        assert current == winners[0]
        history = await store.history(limit=1)
        assert history == [winners[0]]  # the history holds the winner, not a loser's text


async def test_a_missing_history_entry_is_written_by_the_next_apply(client: ConsulClient) -> None:
    store = CatalogStore(client)
    await store.apply(version(1), expected_version=None)
    # As if the writer died between winning current and writing history:
    assert await client.kv_delete(c.KV_CATALOG_HISTORY_PREFIX + "00000001")
    assert [v.version for v in await store.history()] == []
    await store.apply(version(2), expected_version=1)
    assert [v.version for v in await store.history()] == [2, 1]


async def test_a_corrupt_current_catalog_is_reported_not_trusted(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    store = CatalogStore(client)
    await store.apply(version(1), expected_version=None)
    async with store.watch(fast_watch) as watch:
        assert await watch.wait_ready() == version(1)
        doc = json.loads(to_json(version(1)))
        doc["text"] = "models: [evil]\n"  # text changed, digest not
        await client.kv_put(c.KV_CATALOG_CURRENT, json.dumps(doc).encode())
        await eventually(lambda: not watch.healthy)
        assert watch.latest == version(1)  # the last good version is kept
        assert watch.last_error is not None and "does not match the text" in watch.last_error
        with pytest.raises(CorruptRecord, match="llmgw/catalog/current"):
            await store.current()


async def test_a_catalog_too_large_for_consul_is_refused_before_sending(client: ConsulClient) -> None:
    store = CatalogStore(client, max_value_bytes=1024)
    with pytest.raises(ValueError, match="KV value limit"):
        await store.apply(version(1, "x" * 2000), expected_version=None)
    assert await store.current() is None


# ------------------------------------------------------------------ status


async def test_status_publish_and_read(
    client: ConsulClient, fast_watch: WatchSettings, eventually: Eventually
) -> None:
    status = StatusPublisher(client)
    assert await status.read() is None
    async with status.watch(fast_watch) as watch:
        assert await watch.wait_ready() is None
        await status.publish(json.dumps({"leader": "ctl-1", "models": 3}))
        await eventually(lambda: watch.latest is not None)
    doc = await status.read()
    assert doc is not None and json.loads(doc.text) == {"leader": "ctl-1", "models": 3}
    with pytest.raises(ValueError, match="not a JSON object"):
        await status.publish("[1, 2]")


async def test_kv_values_travel_as_consul_stores_them(standin: ConsulStandIn, client: ConsulClient) -> None:
    """What llmgw writes is the record's compact JSON, readable by `consul kv get`."""
    mark = DrainMark(job_id="j1", model="m1", since=NOW, reason="r")
    await DrainingMarks(client).set(mark)
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{standin.url}/v1/kv/llmgw/draining/j1") as resp:
        body = await resp.json()
    assert base64.b64decode(body[0]["Value"]).decode() == to_json(mark)


async def test_a_key_the_store_issues_is_one_a_router_finds_by_its_id(client) -> None:  # type: ignore[no-untyped-def]
    from llmgw.adapters.consul import ApiKeyStore
    from llmgw.core.api_keys import key_id_of
    from llmgw.gateway.keys import KeyRing

    issued = await ApiKeyStore(client).create("ci")
    assert key_id_of(issued.secret) == issued.record.key_id
    ring = KeyRing(await ApiKeyStore(client).list())
    assert ring.find(issued.secret) == issued.record
    assert ring.find(issued.secret[:-1] + ("A" if issued.secret[-1] != "A" else "B")) is None


@pytest.mark.parametrize("value", ["k-1\n", "../k", "a/b", "", "-k", "k 1", "k\x00"])
def test_a_key_part_is_one_plain_segment(value: str) -> None:
    from llmgw.adapters.consul.kv import key_part

    with pytest.raises(ValueError, match="cannot be part of a Consul key"):
        key_part(value, "key id")
    assert key_part("k-0123456789abcdef", "key id") == "k-0123456789abcdef"


async def test_a_status_read_while_the_leader_publishes_is_always_one_whole_generation(
    standin: ConsulStandIn, client: ConsulClient, connector: Callable[..., ConsulClient]
) -> None:
    """The status is stored in pieces (Consul holds 512 KiB a value); a reader racing the
    publisher sees one document or the other, never pieces of two."""
    status = StatusPublisher(client)
    size = 3 * standin.settings.kv_max_value_size  # several pieces each
    docs = [json.dumps({"generation": g, "fill": str(g) * size}, sort_keys=True) for g in range(4)]
    await status.publish(docs[0])
    stop = asyncio.Event()
    seen: list[str] = []

    async def reader() -> None:
        async with connector(standin.url) as own:
            mine = StatusPublisher(own)
            while not stop.is_set():
                doc = await mine.read()
                assert doc is not None
                seen.append(doc.text)

    readers = [asyncio.create_task(reader()) for _ in range(2)]
    for round_ in range(12):
        await status.publish(docs[round_ % len(docs)])
    stop.set()
    await asyncio.gather(*readers)
    assert seen and all(text in docs for text in seen)


async def test_a_status_head_that_is_not_one_is_a_corrupt_record(client: ConsulClient) -> None:
    """An older llmgw's single-value status, or pieces missing, is named, not shown half."""
    from llmgw.adapters.consul import CorruptRecord

    await client.kv_put("llmgw/status", json.dumps({"leader": "old", "models": []}).encode())
    with pytest.raises(CorruptRecord, match="not a status head"):
        await StatusPublisher(client).read()
    await StatusPublisher(client).publish(json.dumps({"leader": "new"}))
    await client.kv_delete("llmgw/status/parts/", recurse=True)
    with pytest.raises(CorruptRecord, match="missing or do not match"):
        await StatusPublisher(client).read()
