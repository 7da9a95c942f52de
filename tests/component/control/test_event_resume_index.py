"""Where the control plane's view resumes Nomad's event stream after a resync.

Nomad's list reads answer with their own table's index (``state.Index("jobs")``,
``"allocs"``, ``"nodes"`` in ``nomad/job_endpoint.go``, ``alloc_endpoint.go``,
``node_endpoint.go``, v2.0.5) while an event batch carries the Raft index of its write
(``nomad/state/events.go``). The view reads jobs, then allocations, then nodes: a job
written between the first and second read has a lower index than the later reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from llmgw.control import ClusterView, ControlMetrics, ControlSettings
from llmgw.core import conventions as c
from tests.support.control import FakeEventBatch, FakePage, ManualClock

JOB_ID = "llmgw-m-r0"


def job(version: str) -> dict[str, Any]:
    meta = {c.JOB_META_MANAGED_BY: c.MANAGED_BY_VALUE, c.JOB_META_MODEL: "m", c.JOB_META_VERSION: version}
    return {"ID": JOB_ID, "Meta": meta, "TaskGroups": [{"Name": "rank-0"}], "Status": "running"}


def alloc(client_status: str) -> dict[str, Any]:
    return {
        "ID": "a1",
        "JobID": JOB_ID,
        "TaskGroup": "rank-0",
        "NodeID": "n0",
        "DesiredStatus": "run",
        "ClientStatus": client_status,
    }


class StaggeredNomad:
    """The three reads of a resync at the indexes a busy cluster gives them: the jobs table
    last written at 100; then the job changed (105) and an allocation (110) before the
    allocations read; the nodes table last written at 90. Records where streams start."""

    def __init__(self) -> None:
        self.stream_starts: list[int] = []
        self.batches = [
            FakeEventBatch(
                105, [{"Topic": "Job", "Type": "JobRegistered", "Key": JOB_ID, "Payload": {"Job": job("v2")}}]
            ),
            FakeEventBatch(
                108,
                [
                    {
                        "Topic": "Allocation",
                        "Type": "AllocationUpdated",
                        "Key": "a1",
                        "Payload": {"Allocation": alloc("pending")},
                    }
                ],
            ),
        ]

    async def jobs(self, *, prefix: str | None = None) -> FakePage:
        return FakePage([job("v1")], 100)

    async def allocations(self, *, resources: bool = False) -> FakePage:
        return FakePage([alloc("running")], 110)

    async def nodes(self) -> FakePage:
        return FakePage([], 90)

    async def events(self, topics: Sequence[str], *, index: int = 0) -> AsyncIterator[FakeEventBatch]:
        self.stream_starts.append(index)
        for batch in self.batches:
            if batch.index >= index:  # Nomad includes the batch at the index asked
                yield batch


async def test_the_stream_resumes_after_the_oldest_read_and_skips_what_each_read_holds() -> None:
    nomad = StaggeredNomad()
    view = ClusterView(nomad, ControlSettings(), ManualClock(), ControlMetrics())  # type: ignore[arg-type]
    await view.resync("start")
    async for batch in nomad.events(["Job", "Allocation", "Node"], index=view.event_index + 1):
        view.apply_events(batch.events, batch.index)
    assert nomad.stream_starts == [91]  # after the nodes read, the oldest of the three
    jobs, _ = view.snapshot()
    # The job's change after its read (105 > 100) is applied...
    assert jobs[JOB_ID].version == "v2"
    # ...and an allocation event older than the allocations read (108 <= 110) is not: the
    # read holds a newer state, which an older event must not replace even for a moment.
    assert [a.client_status.value for a in jobs[JOB_ID].allocs] == ["running"]
    assert view.event_index == 108
