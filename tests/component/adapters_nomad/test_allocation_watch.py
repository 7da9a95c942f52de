"""The router's Nomad view (``AllocationWatch``) on a recorded fake of the Nomad client: the
full read, events applied in order, a re-sent old batch ignored, a broken stream kept as
the last view and followed by a full read, the 403 that names the token's missing rights."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from llmgw.adapters.nomad import AllocationWatch, AllocationWatchSettings, EventBatch, NomadError, Page
from llmgw.adapters.nomad.allocations import parse_allocation
from llmgw.adapters.watched import WatchClosed
from tests.support.waiting import eventually

FAST = AllocationWatchSettings(retry_initial=0.01, retry_max=0.02)


def alloc(
    alloc_id: str, status: str = "running", *, job: str = "llmgw-m-1234abcd-0", port: int = 24000
) -> dict[str, Any]:
    return {
        "ID": alloc_id,
        "JobID": job,
        "NodeID": "node-1",
        "ClientStatus": status,
        "DesiredStatus": "run",
        "AllocatedResources": {
            "Shared": {"Ports": [{"Label": "http", "Value": port, "To": 0, "HostIP": "10.0.0.1"}]}
        },
    }


class FakeNomad:
    """Answers the reads with what the test put there; streams the batches it queues, or fails."""

    def __init__(self) -> None:
        self.alloc_list: list[dict[str, Any]] = []
        self.node_list: list[dict[str, Any]] = []
        self.index = 10
        self.reads = 0
        self.fail_reads: NomadError | None = None
        self.streams: asyncio.Queue[EventBatch | Exception | None] = asyncio.Queue()
        self.opened_at: list[int] = []

    async def allocations(
        self, *, resources: bool = False, index: int | None = None, wait_s: float | None = None
    ) -> Page:
        assert resources  # without it Nomad's stubs carry no ports
        self.reads += 1
        if self.fail_reads is not None:
            raise self.fail_reads
        return Page(list(self.alloc_list), self.index)

    async def nodes(self, *, index: int | None = None, wait_s: float | None = None) -> Page:
        return Page(list(self.node_list), self.index)

    async def events(self, topics: Sequence[str], *, index: int = 0) -> AsyncIterator[EventBatch]:
        assert tuple(topics) == ("Allocation", "Node")
        self.opened_at.append(index)
        while True:
            item = await self.streams.get()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item


def alloc_event(index: int, raw: dict[str, Any]) -> EventBatch:
    return EventBatch(
        index, [{"Topic": "Allocation", "Type": "AllocationUpdated", "Payload": {"Allocation": raw}}]
    )


async def test_the_watch_reads_whole_then_follows_events_in_order() -> None:
    nomad = FakeNomad()
    nomad.alloc_list = [alloc("a1"), alloc("other", job="not-llmgw")]
    nomad.node_list = [{"ID": "node-2", "Status": "down"}]
    watch = AllocationWatch(nomad, FAST)
    await watch.start()
    try:
        view = await watch.wait_changed(0)
        assert set(view.allocations) == {"a1"}  # only llmgw's jobs
        assert view.nodes_gone == frozenset({"node-2"})
        assert view.allocations["a1"].addresses == frozenset({("10.0.0.1", 24000)})
        await eventually(lambda: watch.healthy)
        assert nomad.opened_at == [11]  # from the read's index + 1

        generation = watch.generation
        await nomad.streams.put(alloc_event(12, alloc("a1", "failed")))
        view = await watch.wait_changed(generation)
        assert view.allocations["a1"].client_status == "failed"
        # Nomad re-sends its newest batch to a stream opened past it: an old one changes nothing.
        generation = watch.generation
        await nomad.streams.put(alloc_event(12, alloc("a1", "running")))
        await nomad.streams.put(
            EventBatch(
                13,
                [
                    {
                        "Topic": "Node",
                        "Type": "NodeStreamEvent",
                        "Payload": {"Node": {"ID": "node-1", "Status": "disconnected"}},
                    }
                ],
            )
        )
        view = await watch.wait_changed(generation)
        assert view.allocations["a1"].client_status == "failed"
        assert view.nodes_gone == frozenset({"node-1", "node-2"})
    finally:
        await watch.stop()


async def test_a_broken_stream_keeps_the_last_view_says_so_and_reads_whole_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nomad = FakeNomad()
    nomad.alloc_list = [alloc("a1")]
    watch = AllocationWatch(nomad, FAST)
    caplog.set_level(logging.WARNING, "llmgw.adapters.nomad")
    await watch.start()
    try:
        await eventually(lambda: watch.healthy)
        nomad.fail_reads = NomadError("GET /v1/allocations: 403 Permission denied", 403)
        await nomad.streams.put(NomadError("event stream: lost the connection"))
        await eventually(lambda: not watch.healthy)
        assert watch.latest is not None and set(watch.latest.allocations) == {"a1"}  # the last view
        await eventually(lambda: "node read" in (watch.last_error or ""))
        warnings = [r.getMessage() for r in caplog.records]
        assert any("cannot follow Nomad" in w and "ops/README.md" in w for w in warnings), warnings
        reads = nomad.reads
        await eventually(lambda: nomad.reads > reads + 2)  # it keeps trying, with a backoff

        nomad.fail_reads = None
        nomad.alloc_list = [alloc("a1"), alloc("a2")]  # placed while the router could not see
        await eventually(lambda: watch.healthy)
        assert watch.latest is not None and set(watch.latest.allocations) == {"a1", "a2"}
    finally:
        await watch.stop()


async def test_the_stream_resumes_after_the_older_read_and_skips_what_each_read_holds() -> None:
    nomad = FakeNomad()
    nomad.alloc_list = [alloc("a1", "failed")]  # read at index 10
    watch = AllocationWatch(nomad, FAST)
    original_nodes = nomad.nodes

    async def older_nodes(**kwargs: Any) -> Page:
        page = await original_nodes(**kwargs)
        return Page(page.items, 5)  # the node table last changed at 5

    nomad.nodes = older_nodes  # type: ignore[method-assign]
    await watch.start()
    try:
        await eventually(lambda: watch.healthy)
        assert nomad.opened_at == [6]  # nothing between the two reads is missed
        generation = watch.generation
        # Replayed from the buffer: a8 is older than the allocation read (it already says
        # a1 failed) and is skipped; the node event at 9 is newer than the node read.
        await nomad.streams.put(alloc_event(8, alloc("a1", "running")))
        node = {
            "Topic": "Node",
            "Type": "NodeStreamEvent",
            "Payload": {"Node": {"ID": "n9", "Status": "down"}},
        }
        await nomad.streams.put(EventBatch(9, [node]))
        view = await watch.wait_changed(generation)
        assert view.allocations["a1"].client_status == "failed"
        assert view.nodes_gone == frozenset({"n9"})
        assert watch.generation == generation + 1  # the skipped batch published nothing
    finally:
        await watch.stop()


def test_an_allocation_without_its_ids_is_refused_and_old_style_networks_count() -> None:
    with pytest.raises(ValueError, match="without ID or JobID"):
        parse_allocation({"ID": "a1"})
    old = {
        "ID": "a1",
        "JobID": "llmgw-m-0",
        "AllocatedResources": {
            "Shared": {"Networks": [{"IP": "10.0.0.2", "DynamicPorts": [{"Label": "http", "Value": 25000}]}]}
        },
    }
    assert parse_allocation(old).addresses == frozenset({("10.0.0.2", 25000)})
    assert parse_allocation(old).client_status == "pending"


async def test_stopping_the_watch_releases_its_waiters_as_a_consul_watch_does() -> None:
    # Both watches share one published side (``llmgw.adapters.watched``): a waiter on a
    # stopped watch gets WatchClosed instead of hanging on a loop that is gone.
    nomad = FakeNomad()
    nomad.alloc_list = [alloc("a1")]
    watch = AllocationWatch(nomad, FAST)
    await watch.start()
    await watch.wait_changed(0)
    waiter = asyncio.create_task(watch.wait_changed(watch.generation))
    await watch.stop()  # stopping yields to the loop, so the waiter is parked by then
    async with asyncio.timeout(5):
        with pytest.raises(WatchClosed, match="watch nomad stopped"):
            await waiter
    with pytest.raises(WatchClosed):
        await watch.wait_changed(watch.generation)
    assert watch.latest is not None and set(watch.latest.allocations) == {"a1"}  # the last view stays
