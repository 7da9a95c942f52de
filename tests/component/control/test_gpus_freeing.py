"""The view's count of GPUs that stopping allocations still hold (``Observed.gpus_freeing``).

Nomad counts a stopping allocation's devices as used until its client reports its tasks
exited (``ProposedAllocs``), purged jobs' allocations included: the view follows them from
allocation events and the resync's list, whether or not their job is still in the view."""

from __future__ import annotations

from typing import Any

from llmgw.control import ClusterView, ControlMetrics, ControlSettings
from tests.support.control import FakeCluster, FakeNomad, ManualClock


def alloc_event(alloc_id: str, job_id: str, desired: str, client: str, gpus: list[str]) -> dict[str, Any]:
    return {
        "Topic": "Allocation",
        "Type": "AllocationUpdated",
        "Key": alloc_id,
        "Payload": {
            "Allocation": {
                "ID": alloc_id,
                "JobID": job_id,
                "TaskGroup": "rank-0",
                "NodeID": "n0",
                "DesiredStatus": desired,
                "ClientStatus": client,
                "AllocatedResources": {"Tasks": {"engine": {"Devices": [{"DeviceIDs": gpus}]}}},
            }
        },
    }


def view() -> ClusterView:
    return ClusterView(FakeNomad(FakeCluster()), ControlSettings(), ManualClock(), ControlMetrics())


def test_a_purged_replicas_stopping_allocation_counts_until_its_client_reports_it_finished() -> None:
    v = view()
    v.apply_events([alloc_event("a1", "llmgw-m-r0", "run", "running", ["g0", "g1"])], 10)
    assert v.gpus_freeing == 0, "running as wanted: not freeing"
    # Stopped and purged (the job is not in the view): its tasks still run shutdown_delay.
    v.apply_events([alloc_event("a1", "llmgw-m-r0", "stop", "running", ["g0", "g1"])], 11)
    assert v.gpus_freeing == 2
    v.apply_events([alloc_event("a1", "llmgw-m-r0", "stop", "complete", ["g0", "g1"])], 12)
    assert v.gpus_freeing == 0
    # Not llmgw's job, no GPUs, or on an unreachable node (unknown): not counted.
    v.apply_events(
        [
            alloc_event("b1", "other-job", "stop", "running", ["g2"]),
            alloc_event("c1", "llmgw-cpu-r0", "stop", "running", []),
            alloc_event("d1", "llmgw-m-r1", "stop", "unknown", ["g3"]),
        ],
        13,
    )
    assert v.gpus_freeing == 0
