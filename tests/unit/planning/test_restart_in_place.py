"""A task Nomad's restart policy restarts is a restart, not a placement failure (issue 27).

Found as a new user tries it: ``llmgw dev crash`` on a replica older than
``placement_timeout`` rebuilt it ("not every group running 120s after it was
registered"). A restarting task puts its allocation back to ``pending`` for the policy's
``delay`` (Nomad's ``getClientStatus``: running only while a task runs), and the placement
deadline counted from the job's register, so the job's own ``restart { attempts = 2 }``
only ever ran for replicas younger than the window. It counts from the task's
``LastRestart`` now; the policy itself bounds the tries (``mode = "fail"`` fails the
allocation after its attempts, and that failure rebuilds the replica).
"""

from __future__ import annotations

import pytest

from llmgw.core.catalog import Catalog
from llmgw.core.planning import Phase, PlanningSettings, StopReplica
from tests.support.control import FakeCluster, Simulation

# llmgw dev's window; the rendered jobs' restart delay (RenderSettings.restart_delay_s).
SETTINGS = PlanningSettings(placement_timeout=120.0, backoff_jitter=0.0)
RESTART_DELAY = 10.0


def simulation() -> tuple[FakeCluster, Simulation]:
    catalog = Catalog.model_validate(
        {"models": {"m": {"profiles": [{"engine": "sim", "tp": 8}], "scaling": {"min": 1, "max": 1}}}}
    )
    cluster = FakeCluster(start_delay=2.0, load_delay=5.0)
    cluster.add_node("n0")
    cluster.add_node("n1")
    return cluster, Simulation(catalog, cluster, settings=SETTINGS)


@pytest.mark.parametrize("age", [30.0, 300.0], ids=["young", "older than placement_timeout"])
def test_a_crashed_single_node_replica_is_restarted_in_place_whatever_its_age(age: float) -> None:
    cluster, sim = simulation()
    sim.run(age)
    (job,) = cluster.healthy_jobs("m")
    cluster.restart_task(job, "rank0", delay=RESTART_DELAY)  # SIGKILL; the policy restarts it
    sim.run(2)
    (replica,) = sim.decisions[-1].status.models[0].replicas
    assert replica.phase is Phase.PLACING and "restarting under its restart policy" in replica.reason
    sim.run(RESTART_DELAY + 10)
    assert sim.actions(StopReplica, model="m") == []
    assert cluster.healthy_jobs("m") == [job]  # the same job, its allocation restarted in place
    (alloc,) = [a for a in cluster.allocs.values() if a.job_id == job]
    assert alloc.restarts == 1


def test_a_restart_that_never_runs_again_still_fails_after_the_window() -> None:
    cluster, sim = simulation()
    sim.run(300)
    (job,) = cluster.healthy_jobs("m")
    restarted_at = cluster.now
    cluster.restart_task(job, "rank0", delay=10 * SETTINGS.placement_timeout)  # stuck pending
    sim.run(SETTINGS.placement_timeout + 2)
    (stop,) = sim.actions(StopReplica, model="m")
    assert "not every group running" in stop.action.reason
    assert stop.at - restarted_at >= SETTINGS.placement_timeout  # the window, from the restart
