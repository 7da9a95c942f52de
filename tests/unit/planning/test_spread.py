"""Replicas of one model on distinct nodes: each replica is a Nomad job of its own, so Nomad's
``distinct_hosts`` and ``spread`` (which look within a job) never kept them apart, and the
placement packs: a ``min: 2`` model had both replicas on one node, and that node's loss took
the model down (issue 18). The planner asks for the nodes without the model's other replicas
first and falls back to any node, saying why in the status."""

from __future__ import annotations

from typing import Any

from llmgw.control.executing import with_spread
from llmgw.core.catalog import Catalog
from llmgw.core.planning import Candidate, NodeId, PlaceReplica
from tests.support.control import FakeCluster, Simulation


def catalog(*, replicas: int, nodes: int = 1, tp: int = 1) -> Catalog:
    profile: dict[str, Any] = {"engine": "sim", "tp": tp, "gpu": {"model": "H100"}}
    if nodes > 1:
        profile["nodes"] = nodes
    scaling = {"min": replicas, "max": replicas}
    return Catalog.model_validate({"models": {"m": {"profiles": [profile], "scaling": scaling}}})


def cluster(count: int, *, gpus: int = 8) -> FakeCluster:
    c = FakeCluster(start_delay=2.0, load_delay=5.0)
    for i in range(count):
        c.add_node(f"n{i}", gpus=gpus, fabric="f")
    return c


def nodes_by_job(c: FakeCluster, model: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    names = {n.node_id: n.name for n in c.nodes.values()}
    for job in c.running_jobs(model):
        out[job] = {
            names[a.node_id]
            for a in c.allocs.values()
            if a.job_id == job and a.desired_status == "run" and a.client_status == "running"
        }
    return out


def test_two_replicas_that_fit_on_one_node_go_on_two() -> None:
    c = cluster(3)  # 8 GPUs each: first fit would put both 1-GPU replicas on n0
    sim = Simulation(catalog(replicas=2), c)
    sim.run(60)
    placed = nodes_by_job(c, "m")
    assert len(c.healthy_jobs("m")) == 2
    first, second = placed.values()
    assert len(first) == len(second) == 1 and not first & second
    (model,) = sim.decisions[-1].status.models
    assert model.spread == ""
    assert sorted(n for r in model.replicas for n in r.nodes) == sorted(first | second)


def test_the_second_placement_keeps_away_from_the_first_and_can_fall_back() -> None:
    c = cluster(3)
    sim = Simulation(catalog(replicas=2), c)
    sim.run(60)
    first, second = (a.action for a in sim.actions(PlaceReplica, model="m"))
    assert isinstance(first, PlaceReplica) and isinstance(second, PlaceReplica)
    assert all(not cand.away_from for cand in first.candidates)  # nothing to keep away from yet
    n0 = NodeId(c.node_named("n0").node_id)
    assert second.candidates == (Candidate(0, None, (n0,)), Candidate(0, None))


def test_multi_node_replicas_share_no_node() -> None:
    c = cluster(4)
    sim = Simulation(catalog(replicas=2, nodes=2, tp=2), c)
    sim.run(60)
    assert len(c.healthy_jobs("m")) == 2
    first, second = nodes_by_job(c, "m").values()
    assert len(first) == len(second) == 2 and not first & second
    assert sim.decisions[-1].status.models[0].spread == ""


def test_replicas_share_a_node_when_no_other_fits_and_the_status_says_why() -> None:
    c = cluster(1)  # one node: the model still gets both replicas
    sim = Simulation(catalog(replicas=2), c)
    sim.run(60)
    assert len(c.healthy_jobs("m")) == 2
    (model,) = sim.decisions[-1].status.models
    first, second = sorted(model.replicas, key=lambda r: r.job_id)
    assert first.nodes == second.nodes == ("n0",)
    assert "share node n0" in model.spread
    assert first.replica_id in model.spread and second.replica_id in model.spread
    # Nothing away from n0 is even worth a plan on a one-node cluster: the why says so.
    assert "too few ready nodes without the model's other replicas" in model.spread


def test_a_full_spread_falls_back_with_nomads_words_in_the_status() -> None:
    c = FakeCluster(start_delay=2.0, load_delay=5.0)
    c.add_node("n0", gpus=2, fabric="f")  # room for both replicas, on one node
    c.add_node("n1", gpus=1, fabric="f")
    c.start_foreign_job("other", node="n1", gpus=1)  # n1 is ready but full
    sim = Simulation(catalog(replicas=2), c)
    sim.run(60)
    assert len(c.healthy_jobs("m")) == 2
    (model,) = sim.decisions[-1].status.models
    assert model.spread, model
    assert "no node away from the others fitted" in model.spread
    assert "no ready node with 1 free H100 GPUs" in model.spread  # the plan's own words


def test_the_spread_is_a_job_constraint_on_each_node_to_avoid() -> None:
    job = {"ID": "j", "Constraints": [{"LTarget": "${attr.kernel.name}", "Operand": "=", "RTarget": "linux"}]}
    out = with_spread(job, Candidate(0, None, (NodeId("a"), NodeId("b"))))
    assert out["Constraints"][1:] == [
        {"LTarget": "${node.unique.id}", "Operand": "!=", "RTarget": "a"},
        {"LTarget": "${node.unique.id}", "Operand": "!=", "RTarget": "b"},
    ]
    assert job["Constraints"] == out["Constraints"][:1]  # the parsed job is not changed in place
    assert with_spread(job, Candidate(0, None)) is job


def test_a_new_leader_says_the_replicas_sharing_a_node_were_placed_before_it() -> None:
    c = cluster(1)
    sim = Simulation(catalog(replicas=2), c)
    sim.run(60)
    assert "too few ready nodes" in sim.decisions[-1].status.models[0].spread
    sim.restart_leader()
    sim.run(5)
    (model,) = sim.decisions[-1].status.models
    assert model.spread.endswith("share node n0: placed before this leader took over"), model.spread
