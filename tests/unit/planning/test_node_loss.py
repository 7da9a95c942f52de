"""A replica lost with its node: rebuilt elsewhere at once, and not held against the model.

Found with ``bench/failover_time.py`` on the dev stand-ins: when a node of a two-node
replica died, the surviving rank restarted (its peer was gone) before Nomad called the
lost node's allocation lost, and the planner counted that restart as the model's own
failure: the rebuild waited out the model's backoff (30 s by default) and the backoff grew.
"""

from __future__ import annotations

from typing import Any

from llmgw.core.catalog import Catalog
from llmgw.core.planning import Phase, PlaceReplica, PlanningSettings, StopReplica
from tests.support.control import FakeCluster, Simulation

SLOW_BACKOFF = PlanningSettings(backoff_base=300.0, backoff_jitter=0.0, node_lost_grace=120.0)


def catalog(nodes: int) -> Catalog:
    profile: dict[str, Any] = {"engine": "sim", "tp": 8 * nodes, "gpu": {"model": "H100"}}
    if nodes > 1:
        profile["nodes"] = nodes
    return Catalog.model_validate({"models": {"m": {"profiles": [profile], "scaling": {"min": 1, "max": 1}}}})


def cluster(count: int) -> FakeCluster:
    c = FakeCluster(start_delay=2.0, load_delay=10.0)
    for i in range(count):
        c.add_node(f"n{i}", fabric="f")
    return c


def node_of(c: FakeCluster, job: str, group: str) -> str:
    alloc = next(a for a in c.allocs.values() if a.job_id == job and a.group == group)
    return next(n.name for n in c.nodes.values() if n.node_id == alloc.node_id)


def test_a_rank_that_restarts_after_its_peers_node_died_is_lost_with_the_node() -> None:
    c = cluster(4)
    sim = Simulation(catalog(nodes=2), c, settings=SLOW_BACKOFF)
    sim.run(30)
    (job,) = c.healthy_jobs("m")
    c.fail_node(node_of(c, job, "rank1"), disconnect=True)  # allocation unknown, node disconnected
    sim.run(5)
    assert c.running_jobs("m") == [job]  # only unreachable so far: kept within the grace
    c.restart_task(job, "rank0")  # the surviving rank lost its peer
    sim.run(2)
    (stop,) = [a.action.reason for a in sim.actions(StopReplica, model="m")]
    assert stop.startswith("lost: node") and "group rank0" in stop
    sim.run(30)
    (rebuilt,) = c.healthy_jobs("m")
    assert rebuilt != job
    assert sim.decisions[-1].status.models[0].backoff is None


def test_a_node_lost_for_the_grace_rebuilds_at_once_without_backoff() -> None:
    c = cluster(2)
    sim = Simulation(catalog(nodes=1), c, settings=SLOW_BACKOFF)
    sim.run(30)
    (job,) = c.healthy_jobs("m")
    c.fail_node(node_of(c, job, "rank0"), disconnect=True)
    sim.run(SLOW_BACKOFF.node_lost_grace + 2)
    assert job not in c.jobs
    placed = [a.at for a in sim.actions(PlaceReplica, model="m")]
    stopped = [a.at for a in sim.actions(StopReplica, model="m")]
    assert len(placed) == 2 and placed[1] - stopped[0] <= 1.0  # the next pass, not 300 s later
    sim.run(30)
    (model,) = sim.decisions[-1].status.models
    assert model.backoff is None and model.replicas[0].phase is Phase.HEALTHY


def test_a_rank_that_crashes_on_its_own_still_counts_against_the_model() -> None:
    c = cluster(4)
    sim = Simulation(catalog(nodes=2), c, settings=SLOW_BACKOFF)
    sim.run(30)
    (job,) = c.healthy_jobs("m")
    c.crash(job, "rank1")  # every node is fine: the engine itself failed
    sim.run(2)
    assert sim.decisions[-1].status.models[0].backoff is not None


def test_a_rank_that_fails_before_nomad_calls_its_peers_node_down_is_rebuilt_at_the_down() -> None:
    # On the dev stand-ins the surviving rank notices its dead peer at once, about 2 s before
    # Nomad's heartbeat grace ends: the failure looked like the model's own, and the rebuild
    # waited out the first backoff (the 2.9 to 5.0 s bench/failover_time.py showed).
    c = cluster(4)
    sim = Simulation(catalog(nodes=2), c, settings=SLOW_BACKOFF)
    sim.run(30)
    (job,) = c.healthy_jobs("m")
    dying = node_of(c, job, "rank1")
    c.crash(job, "rank0")  # every node still looks ready
    sim.run(2)
    assert job not in c.jobs  # stopped whole at once: it cannot serve
    (model,) = sim.decisions[-1].status.models
    assert model.backoff is not None and model.waiting is not None and "backing off" in model.waiting
    c.fail_node(dying)
    lost_at = sim.now
    sim.run(2)
    rebuilt = [a for a in sim.actions(PlaceReplica, model="m") if a.at >= lost_at]
    assert len(rebuilt) == 1 and rebuilt[0].at - lost_at <= 1.0  # the next pass, not 300 s later
    assert "went down: lost with it, rebuilt without backoff" in rebuilt[0].action.reason
    assert job in sim.decisions[-2].lost or job in sim.decisions[-1].lost
    sim.run(30)
    (model,) = sim.decisions[-1].status.models
    assert model.backoff is None and model.healthy == 1


def test_a_failure_is_the_models_own_when_no_node_of_it_goes_down_within_the_window() -> None:
    settings = PlanningSettings(
        backoff_base=300.0, backoff_jitter=0.0, node_lost_grace=120.0, lost_node_window=10.0
    )
    c = cluster(4)
    sim = Simulation(catalog(nodes=2), c, settings=settings)
    sim.run(30)
    (job,) = c.healthy_jobs("m")
    dying = node_of(c, job, "rank1")
    c.crash(job, "rank0")
    sim.run(settings.lost_node_window + 2)
    c.fail_node(dying)  # too late to be the cause
    sim.run(5)
    (model,) = sim.decisions[-1].status.models
    assert model.backoff is not None and model.backoff.failures == 1
    assert len(sim.actions(PlaceReplica, model="m")) == 1  # still backing off
