"""``unavailable_models``: what the leader tells routers it cannot serve now, driven through
the pure core against the simulated Nomad (``control.testing.Simulation``).

A model is listed when Nomad's plan said no profile fits and capacity has not changed
since, or when an operator drained it; anything else (placed, never tried, capacity
moved, a failed register, a "does not fit" while stopping allocations still hold GPUs) is
not listed, so routers wait for loads as before."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.core.catalog import Catalog
from llmgw.core.planning import Desired, PlacementHold
from llmgw.core.planning.actions import Candidate, Done, PlaceReplica, PlaceWhy, StopReplica, Unplaceable
from llmgw.core.planning.observed import JobId, ReplicaId
from llmgw.core.planning.state import ModelMemo, PlannerState, record_outcomes
from llmgw.core.planning.unavailable import unavailable_models
from llmgw.core.records import Unavailability
from tests.support.control import FakeCluster, Simulation


def gpu_model(gpu: str, *, min: int, max: int) -> dict[str, Any]:
    return {
        "profiles": [{"engine": "sim", "tp": 1, "gpu": {"model": gpu}}],
        "scaling": {"min": min, "max": max},
    }


def simulation() -> Simulation:
    cluster = FakeCluster(start_delay=2.0, load_delay=10.0)
    cluster.add_node("n0", gpus=2, gpu_model="H100")
    catalog = Catalog.model_validate(
        {
            "models": {
                "fits": gpu_model("H100", min=1, max=1),
                "nowhere": gpu_model("B200", min=1, max=1),  # no such card in the cluster
                "nowhere-on-demand": gpu_model("B200", min=0, max=1),
            }
        }
    )
    return Simulation(catalog, cluster, catalog_hash="c" * 64)


def desired(sim: Simulation) -> Desired:
    assert sim.desired is not None
    return replace(sim.desired, commands=dict(sim.commands))


def published(sim: Simulation) -> dict[str, Any]:
    doc = unavailable_models(desired(sim), sim.state, sim.capacity_version, sim.now)
    assert doc.catalog_sha256 == "c" * 64 and doc.published_at == sim.now
    return {m.model: m for m in doc.models}


def test_a_model_nomad_cannot_place_is_listed_with_nomads_reason_since_the_first_try() -> None:
    sim = simulation()
    first = sim.now
    sim.run(5)
    listed = published(sim)
    assert set(listed) == {"nowhere"}  # placed, and never tried (no demand), are not listed
    assert listed["nowhere"].why is Unavailability.UNPLACEABLE
    assert listed["nowhere"].reason.startswith("no profile fits: ")
    assert first <= listed["nowhere"].since <= first + 1.0
    # A wake makes the on-demand one tried, and listed.
    sim.use("nowhere-on-demand", wake=True, queued=1)
    sim.run(2)
    assert set(published(sim)) == {"nowhere", "nowhere-on-demand"}


def test_a_capacity_change_withdraws_the_claim_until_nomad_is_asked_again() -> None:
    sim = simulation()
    sim.run(5)
    assert "nowhere" in published(sim)
    sim.capacity_version += 1  # a node came or an allocation ended: it might fit now
    assert "nowhere" not in published(sim)


def test_a_drained_model_is_listed_as_drained_by_whom_and_since_when() -> None:
    sim = simulation()
    sim.run(30)
    sim.drain("fits", by="alice")
    drained_at = sim.now
    sim.run(2)
    listed = published(sim)
    assert listed["fits"].why is Unavailability.DRAINED
    assert (listed["fits"].reason, listed["fits"].since) == ("drained by alice", drained_at)
    sim.restart("fits")
    assert "fits" not in published(sim)


def test_no_catalog_lists_nothing_and_a_failed_register_is_not_unplaceable() -> None:
    sim = simulation()
    doc = unavailable_models(None, sim.state, 0, sim.now)
    assert (doc.catalog_sha256, doc.models) == ("", ())
    hold = PlacementHold("register failed: 500", since=1.0, retry_at=9.0, attempts=1, capacity_version=None)
    state = PlannerState(models={"fits": ModelMemo(hold=hold)})
    assert unavailable_models(desired(sim), state, 0, sim.now).models == ()


def test_a_multi_node_model_with_no_fabric_to_run_on_is_listed_without_asking_nomad() -> None:
    cluster = FakeCluster()
    for i in range(2):
        cluster.add_node(f"n{i}", gpus=8, gpu_model="H100")  # no llmgw_fabric: no two-node replica
    two_node = {
        "profiles": [{"engine": "sim", "tp": 8, "pp": 2, "nodes": 2, "gpu": {"model": "H100"}}],
        "scaling": {"min": 1, "max": 1},
    }
    catalog = Catalog.model_validate(
        {"models": {"big": two_node, "idle": {**two_node, "scaling": {"min": 0, "max": 1}}}}
    )
    sim = Simulation(catalog, cluster, catalog_hash="c" * 64)
    planned: list[object] = []
    plan = cluster.plan
    cluster.plan = lambda job: planned.append(job) or plan(job)  # type: ignore[method-assign]
    decision = sim.step()
    assert set(decision.unplaceable) == {"big"}  # the on-demand one wants nothing yet
    assert "needs 2 ready nodes on one fabric" in decision.unplaceable["big"]
    assert planned == []  # judged without asking Nomad
    first = unavailable_models(
        desired(sim), sim.state, sim.capacity_version, sim.now, unplaceable=decision.unplaceable
    )
    (listed,) = first.models
    assert (listed.model, listed.why) == ("big", Unavailability.UNPLACEABLE)
    assert listed.reason == decision.unplaceable["big"] and listed.since == sim.now

    # Later passes with the same reason keep the first "since": the document does not change.
    sim.run(30)
    later = unavailable_models(
        desired(sim), sim.state, sim.capacity_version, sim.now,
        unplaceable=sim.decisions[-1].unplaceable, previous=first,
    )  # fmt: skip
    assert later.models == first.models

    # A fabric with room: the claim is gone and the replica is placed.
    for i in range(2):
        cluster.add_node(f"f{i}", gpus=8, gpu_model="H100", fabric="ib-0")
    sim.run(30)
    assert sim.decisions[-1].unplaceable == {}
    assert unavailable_models(
        desired(sim), sim.state, sim.capacity_version, sim.now,
        unplaceable=sim.decisions[-1].unplaceable, previous=later,
    ).models == ()  # fmt: skip
    assert sim.cluster.healthy_jobs("big")


def test_a_model_whose_replicas_keep_failing_is_listed_until_its_backoff_ends() -> None:
    sim = simulation()
    sim.run(30)
    assert "fits" not in published(sim)
    for _ in range(2):  # crash the fresh replica each time one runs: the backoff grows
        (job,) = sim.cluster.running_jobs("fits")
        sim.cluster.crash(job, "rank0")
        sim.run(1)
        memo = sim.state.models["fits"]
        assert memo.backoff is not None
        listed = published(sim)["fits"]
        assert listed.why is Unavailability.FAILING and listed.until == memo.backoff.retry_at
        assert listed.reason.startswith(f"{memo.backoff.failures} failure(s) in a row; the last: ")
        sim.run(memo.backoff.retry_at - sim.now + 15)  # the backoff ends: a new replica is placed
        assert "fits" not in published(sim)


def test_a_model_that_does_not_fit_while_gpus_are_given_back_waits_for_them() -> None:
    # Nomad counts a stopping allocation's GPUs until its tasks exit (ProposedAllocs): a
    # "does not fit" then is a wait, and routers keep answering "loading".
    sim = simulation()
    sim.step(replace(sim.observe(), gpus_freeing=2))
    hold = sim.state.models["nowhere"].hold
    assert hold is not None and hold.freeing
    assert hold.reason.startswith("waiting for GPUs that stopping allocations give back (2 still held")
    assert "nowhere" not in published(sim)
    # Their end moves capacity; asked again with nothing freeing, Nomad's answer stands.
    sim.capacity_version += 1
    sim.step()
    listed = published(sim)
    assert listed["nowhere"].why is Unavailability.UNPLACEABLE
    assert listed["nowhere"].reason.startswith("no profile fits: ")


def test_a_replica_stopped_in_the_same_pass_makes_a_does_not_fit_a_wait() -> None:
    sim = simulation()
    place = PlaceReplica(
        model="nowhere",
        replica_id=ReplicaId("r1"),
        job_id=JobId("llmgw-nowhere-r1"),
        candidates=(Candidate(0, None),),
        claim=frozenset(),
        why=PlaceWhy.REPLACE,
        reason="rebuild",
    )
    stop = StopReplica(JobId("llmgw-nowhere-r0"), "nowhere", "failed: rebuilt whole")
    outcomes = [Done(stop), Unplaceable(place, "devices: no devices match request")]
    state = record_outcomes(PlannerState(), outcomes, sim.now, sim.settings, capacity_version=7)
    hold = state.models["nowhere"].hold
    assert hold is not None and hold.freeing
    assert unavailable_models(desired(sim), state, 7, sim.now).models == ()
    alone = record_outcomes(PlannerState(), outcomes[1:], sim.now, sim.settings, capacity_version=7)
    (listed,) = unavailable_models(desired(sim), alone, 7, sim.now).models
    assert listed.why is Unavailability.UNPLACEABLE
