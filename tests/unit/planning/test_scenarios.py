"""The decision core driven through many passes against the in-memory Nomad simulator.

Every test runs on a synthetic clock (``cluster.now``): ``sim.run(seconds)`` makes a pass
every simulated second. Assertions are about what an operator would see: which jobs run
where, which are healthy, what was stopped and why, what the status says.
"""

from __future__ import annotations

from typing import Any

from llmgw.core.catalog import Catalog
from llmgw.core.planning import (
    MarkDraining,
    Phase,
    PlaceReplica,
    PlanningSettings,
    StopReplica,
)
from tests.support.control import FakeCluster, FakeRenderer, Simulation


def catalog(models: dict[str, Any], **rest: Any) -> Catalog:
    return Catalog.model_validate({"models": models, **rest})


def gpu_model(
    tp: int = 1, *, min: int = 1, max: int | None = None, nodes: int | None = None, **scaling: Any
) -> dict[str, Any]:
    profile: dict[str, Any] = {"engine": "sim", "tp": tp, "gpu": {"model": "H100"}}
    if nodes:
        profile["nodes"] = nodes
    return {"profiles": [profile], "scaling": {"min": min, "max": max if max is not None else min, **scaling}}


def cluster(nodes: int = 2, *, gpus: int = 8, fabric: str | None = None) -> FakeCluster:
    c = FakeCluster(start_delay=2.0, load_delay=10.0)
    for i in range(nodes):
        c.add_node(f"n{i}", gpus=gpus, fabric=fabric)
    return c


def stops(sim: Simulation, model: str | None = None) -> list[str]:
    return [a.action.reason for a in sim.actions(StopReplica, model=model)]


def status_of(sim: Simulation, model: str) -> Any:
    return next(m for m in sim.decisions[-1].status.models if m.model == model)


# --- placing -------------------------------------------------------------------------------------


def test_min_replicas_are_placed_and_become_healthy() -> None:
    sim = Simulation(catalog({"m": gpu_model(min=2)}), cluster())
    sim.run(30)
    assert len(sim.cluster.healthy_jobs("m")) == 2
    st = status_of(sim, "m")
    assert (st.desired, st.healthy, st.waiting) == (2, 2, None)
    assert all(r.phase is Phase.HEALTHY and r.nodes for r in st.replicas)


def test_a_second_pass_with_nothing_changed_does_nothing() -> None:
    sim = Simulation(catalog({"m": gpu_model(min=1)}), cluster())
    sim.run(30)
    before = len(sim.applied)
    sim.run(60)
    assert len(sim.applied) == before
    assert sim.decisions[-1].next_pass_at is None  # no timer pending: nothing to wake for


def test_gpu_placements_are_never_planned_from_the_same_snapshot() -> None:
    # Three single-GPU models on one 2-GPU node: whatever the order, no card is handed out twice,
    # and the one that does not fit is told so in words.
    models = {name: gpu_model(tp=1) for name in ("a", "b", "c")}
    sim = Simulation(catalog(models), cluster(nodes=1, gpus=2))
    sim.run(30)
    assert all(len(holders) == 1 for holders in sim.cluster.gpus_in_use().values())
    assert len(sim.cluster.healthy_jobs()) == 2
    waiting = [m for m in sim.decisions[-1].status.models if m.healthy == 0]
    assert len(waiting) == 1
    assert "no profile fits" in (waiting[0].waiting or "")
    assert "no ready node with 1 free H100 GPUs" in (waiting[0].waiting or "")


def test_competing_placements_in_one_pass_are_deferred_after_the_first_registers() -> None:
    models = {name: gpu_model(tp=1) for name in ("a", "b")}
    sim = Simulation(catalog(models), cluster(nodes=1))
    sim.step()
    first_pass = [type(a.outcome).__name__ for a in sim.actions(PlaceReplica)]
    assert first_pass == ["Placed", "Deferred"]


def test_the_first_profile_nomad_can_place_wins() -> None:
    # The preferred profile wants A100s, which the cluster does not have: the second one runs.
    model = {
        "profiles": [
            {"engine": "sim", "tp": 1, "gpu": {"model": "A100"}},
            {"engine": "sim", "tp": 1, "gpu": {"model": "H100"}},
        ],
        "scaling": {"min": 1, "max": 1},
    }
    sim = Simulation(catalog({"m": model}), cluster())
    sim.run(20)
    (replica,) = status_of(sim, "m").replicas
    assert replica.profile == 1 and replica.phase is Phase.HEALTHY


def test_multi_node_replicas_go_to_a_fabric_with_room_for_every_rank() -> None:
    c = FakeCluster()
    c.add_node("a0", fabric="fab-a")  # fab-a has one node only
    for i in range(2):
        c.add_node(f"b{i}", fabric="fab-b")
    sim = Simulation(catalog({"big": gpu_model(tp=16, nodes=2)}), c)
    sim.run(30)
    (replica,) = status_of(sim, "big").replicas
    assert replica.fabric == "fab-b" and replica.nodes == ("b0", "b1")
    # One allocation a node, named in the status for `llmgw dev crash` and people.
    assert replica.allocations == tuple(
        sorted(a.alloc_id for a in c.allocs.values() if a.job_id == replica.job_id)
    )
    assert len(replica.allocations) == 2
    assert replica.phase is Phase.HEALTHY


def test_multi_node_replicas_try_fabrics_in_a_stable_order_through_plan() -> None:
    c = FakeCluster()
    for fab in ("fab-a", "fab-b"):
        for i in range(2):
            c.add_node(f"{fab}-{i}", fabric=fab)
    c.start_foreign_job("training", node="fab-a-0", gpus=8)  # fab-a is full, as only plan knows
    sim = Simulation(catalog({"big": gpu_model(tp=16, nodes=2)}), c)
    sim.run(30)
    (replica,) = status_of(sim, "big").replicas
    assert replica.fabric == "fab-b"


def test_a_multi_node_model_with_no_fabric_big_enough_says_so() -> None:
    sim = Simulation(catalog({"big": gpu_model(tp=16, nodes=2)}), cluster(nodes=1, fabric="fab-a"))
    sim.run(10)
    st = status_of(sim, "big")
    assert st.healthy == 0
    assert "needs 2 ready nodes on one fabric" in (st.waiting or "")
    assert not sim.actions(PlaceReplica)


# --- failures -------------------------------------------------------------------------------------


def test_a_failed_shard_fails_the_whole_replica_and_backoff_grows_on_the_model() -> None:
    settings = PlanningSettings(backoff_base=30.0, backoff_jitter=0.0)
    c = cluster(nodes=3, fabric="f")
    sim = Simulation(catalog({"big": gpu_model(tp=16, nodes=2)}), c, settings=settings)
    sim.run(20)
    (job,) = c.healthy_jobs("big")
    c.crash(job, "rank1")
    sim.run(1)
    assert job not in c.jobs  # every shard stopped, every GPU given back
    assert any("group rank1 failed" in r for r in stops(sim, "big"))
    st = status_of(sim, "big")
    assert st.backoff is not None and st.backoff.failures == 1
    assert "backing off" in (st.waiting or "")
    sim.run(25)
    assert not c.running_jobs("big")  # still inside the 30 s backoff
    sim.run(10)
    (rebuilt,) = c.running_jobs("big")
    assert rebuilt != job
    # A second failure doubles the wait.
    sim.run(20)
    c.crash(rebuilt, "rank0")
    sim.run(1)
    assert status_of(sim, "big").backoff.failures == 2
    sim.run(55)
    assert not c.running_jobs("big")
    sim.run(10)
    assert c.running_jobs("big")


def test_backoff_resets_after_the_model_has_been_healthy_for_a_while() -> None:
    settings = PlanningSettings(backoff_base=10.0, backoff_jitter=0.0, backoff_reset_after=120.0)
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model()}), c, settings=settings)
    sim.run(20)
    c.crash(c.running_jobs("m")[0], "rank0")
    sim.run(40)
    assert c.healthy_jobs("m") and status_of(sim, "m").backoff is not None
    sim.run(130)
    assert status_of(sim, "m").backoff is None


def test_a_replica_whose_groups_do_not_all_run_in_time_is_stopped_whole() -> None:
    settings = PlanningSettings(placement_timeout=60.0, backoff_jitter=0.0)
    c = cluster(nodes=2, fabric="f")
    sim = Simulation(catalog({"big": gpu_model(tp=16, nodes=2)}), c, settings=settings)
    # Nomad placed rank0 but rank1's node went away just after the plan: half a replica.
    sim.step()
    (job,) = c.running_jobs("big")
    c.fail_node("n1")
    c.node_named("n1").status = "ready"  # back, but its allocation is gone: rank1 stays queued
    for alloc in list(c.allocs.values()):
        if alloc.group == "rank1":
            del c.allocs[alloc.alloc_id]
    c.jobs[job].queued.append("rank1")
    c.start_foreign_job("other", node="n1", gpus=8)  # and someone else took its GPUs
    sim.run(59)
    assert job in c.jobs
    assert status_of(sim, "big").replicas[0].phase is Phase.PLACING
    sim.run(2)
    assert job not in c.jobs
    assert any("not every group running" in r for r in stops(sim, "big"))


def test_a_replica_that_never_becomes_healthy_is_rebuilt_after_its_load_timeout() -> None:
    model = {
        "profiles": [{"engine": "sim", "tp": 1, "gpu": {"model": "H100"}, "load_timeout": "2m"}],
        "scaling": {"min": 1, "max": 1},
    }
    c = cluster()
    c.model_load_delay["m"] = None  # the engine never passes its check
    sim = Simulation(catalog({"m": model}), c, settings=PlanningSettings(backoff_jitter=0.0))
    sim.run(100)
    (job,) = c.running_jobs("m")
    assert status_of(sim, "m").replicas[0].phase is Phase.LOADING
    sim.run(30)
    assert job not in c.jobs
    assert any("load timeout" in r for r in stops(sim, "m"))


# --- nodes ---------------------------------------------------------------------------------------


def test_an_unreachable_node_keeps_its_replicas_and_a_lost_one_gets_them_rebuilt() -> None:
    settings = PlanningSettings(node_lost_grace=300.0, backoff_base=5.0, backoff_jitter=0.0)
    c = cluster(nodes=2)
    sim = Simulation(catalog({"m": gpu_model()}), c, settings=settings)
    sim.run(20)
    (job,) = c.running_jobs("m")
    c.fail_node("n0", disconnect=True)
    sim.run(290)
    assert c.running_jobs("m") == [job]  # kept through the blip
    st = status_of(sim, "m")
    assert st.replicas[0].phase is Phase.UNREACHABLE and "n0 is disconnected" in st.replicas[0].reason
    sim.run(30)
    assert job not in c.jobs
    assert any("for more than 300s" in r for r in stops(sim, "m"))
    sim.run(30)
    assert len(c.healthy_jobs("m")) == 1
    assert status_of(sim, "m").replicas[0].nodes == ("n1",)


def test_a_node_that_comes_back_within_the_grace_keeps_everything() -> None:
    c = cluster(nodes=2)
    sim = Simulation(catalog({"m": gpu_model()}), c, settings=PlanningSettings(node_lost_grace=300.0))
    sim.run(20)
    (job,) = c.running_jobs("m")
    c.fail_node("n0", disconnect=True)
    sim.run(100)
    c.restore_node("n0")
    sim.run(400)
    assert c.healthy_jobs("m") == [job]
    assert not stops(sim)


# --- draining -------------------------------------------------------------------------------------


def test_scale_down_marks_draining_waits_for_in_flight_then_stops() -> None:
    settings = PlanningSettings(drain_min=5.0, drain_timeout=300.0)
    c = cluster()
    sim = Simulation(
        catalog({"m": gpu_model(min=1, max=2, target_in_flight=4, scale_window="30s")}), c, settings=settings
    )
    sim.use("m", in_flight=20)
    sim.run(120)
    assert len(c.healthy_jobs("m")) == 2
    sim.use("m", in_flight=1)
    sim.run(31)
    (mark,) = sim.actions(MarkDraining, model="m")
    draining = mark.action.job_id
    assert draining in sim.marks and draining in c.jobs
    sim.in_flight[draining] = 3  # the engine still serves three requests
    sim.run(60)
    assert draining in c.jobs
    assert "3 request(s) in flight" in next(
        r.reason for r in status_of(sim, "m").replicas if r.job_id == draining
    )
    sim.in_flight[draining] = 0
    sim.run(2)
    assert draining not in c.jobs
    sim.run(2)
    assert draining not in sim.marks  # the mark is cleared once the job is gone


def test_a_drain_ends_at_its_timeout_even_with_requests_in_flight() -> None:
    settings = PlanningSettings(drain_timeout=60.0)
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=1, max=2)}), c, settings=settings)
    sim.run(30)
    sim.set_catalog(catalog({"m": gpu_model(min=0, max=0)}))
    sim.use("m", in_flight=5)
    sim.run(59)
    assert c.running_jobs("m")
    sim.run(3)
    assert not c.running_jobs("m")
    assert any("drain timeout with unknown request(s) in flight" in r for r in stops(sim, "m"))


def test_a_node_lost_while_its_replica_drains_stops_it_without_a_rebuild_or_backoff() -> None:
    settings = PlanningSettings(node_lost_grace=30.0, drain_timeout=600.0)
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=1)}), c, settings=settings)
    sim.run(20)
    (job,) = c.running_jobs("m")
    sim.use("m", in_flight=2)
    sim.set_catalog(catalog({}))  # removed: it drains
    sim.run(5)
    assert job in sim.marks
    c.fail_node("n0")
    sim.run(40)
    assert job not in c.jobs
    # Unreachable, it serves nothing: the drain ends there, before the node even counts as lost.
    assert any("drain" in r for r in stops(sim))
    assert not sim.actions(PlaceReplica)[1:]  # nothing rebuilt
    assert all(m.backoff is None for m in sim.decisions[-1].status.models)


# --- catalog changes -------------------------------------------------------------------------------


def test_a_changed_profile_rolls_one_replica_at_a_time_new_healthy_before_old_drains() -> None:
    c = cluster(nodes=3)
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    old = set(c.healthy_jobs("m"))
    assert len(old) == 2
    changed = gpu_model(min=2)
    changed["profiles"][0]["args"] = ["--max-model-len", "8192"]
    sim.set_catalog(catalog({"m": changed}))
    healthy_counts = []
    for _ in range(120):
        sim.run(1)
        healthy_counts.append(len(c.healthy_jobs("m")))
        live_old = old & set(c.running_jobs("m"))
        draining_old = [j for j in live_old if j in sim.marks]
        assert len(draining_old) <= 1  # one at a time
    assert min(healthy_counts) >= 2  # never below the wanted count
    assert not old & set(c.running_jobs("m"))
    assert len(c.healthy_jobs("m")) == 2


def test_an_unchanged_catalog_applied_again_does_nothing() -> None:
    models = {"m": gpu_model(min=2)}
    c = cluster()
    sim = Simulation(catalog(models), c)
    sim.run(40)
    before = len(sim.applied)
    sim.set_catalog(catalog(models), catalog_hash="catalog-again")
    sim.run(60)
    assert len(sim.applied) == before


def test_a_removed_model_drains_and_stops() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(), "keep": gpu_model()}), c)
    sim.run(30)
    sim.set_catalog(catalog({"keep": gpu_model()}))
    sim.run(20)
    assert not c.running_jobs("m") and c.healthy_jobs("keep")
    assert sim.actions(MarkDraining, model="m")
    assert any("no longer in the catalog" in r for r in stops(sim, "m"))


def test_jobs_llmgw_did_not_create_are_never_touched() -> None:
    c = cluster()
    c.start_foreign_job("llmgw-lookalike-but-not-ours", node="n1", gpus=2)
    sim = Simulation(catalog({}), c)
    sim.run(30)
    assert "llmgw-lookalike-but-not-ours" in c.jobs
    assert not sim.applied


def test_no_catalog_means_nothing_is_stopped() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model()}), c)
    sim.run(20)
    sim.set_catalog(None)
    sim.run(60)
    assert c.healthy_jobs("m")
    assert "no catalog" in sim.decisions[-1].status.note


# --- restarts and leadership -------------------------------------------------------------------------


def test_a_restarted_leader_adopts_what_runs_and_restarts_nothing() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=2), "od": gpu_model(min=0, max=1)}), c)
    sim.use("od", wake=True)
    sim.run(40)
    running = c.running_jobs()
    sim.restart_leader()
    sim.run(60)
    assert c.running_jobs() == running
    assert not stops(sim)


def test_an_upgraded_llmgw_with_the_same_spec_does_not_roll() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c, renderer=FakeRenderer(version="0.1.0"))
    sim.run(40)
    running = c.running_jobs()
    sim.renderer.version = "0.2.0"
    sim.restart_leader()
    sim.run(60)
    assert c.running_jobs() == running


def test_a_template_change_rolls_the_replicas() -> None:
    c = cluster(nodes=3)
    sim = Simulation(catalog({"m": gpu_model(min=1)}), c)
    sim.run(30)
    (old,) = c.running_jobs()
    sim.renderer.template_version = "2"
    sim.set_catalog(sim.catalog, "catalog-1")  # same catalog, new templates: a fresh oracle
    sim.run(60)
    (new,) = c.healthy_jobs()
    assert new != old


def test_the_leader_dying_between_register_and_health_does_not_duplicate_or_restart() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=1)}), c)
    sim.step()  # registered, nothing healthy yet
    (job,) = c.running_jobs()
    sim.restart_leader()
    sim.run(5)
    assert c.running_jobs() == [job]
    assert status_of(sim, "m").replicas[0].phase in (Phase.PLACING, Phase.LOADING)
    assert status_of(sim, "m").healthy == 0  # adopted replicas count once they pass their check
    sim.run(20)
    assert c.healthy_jobs() == [job]


def test_a_register_not_yet_visible_is_not_registered_twice() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=1)}), c)
    empty = sim.observe()  # a view taken before the register
    sim.step()
    sim.step(observed=empty)  # the lagging view does not show the new job
    assert len(c.running_jobs()) == 1


def test_an_event_stream_gap_is_repaired_by_the_next_full_view() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=1)}), c, settings=PlanningSettings(backoff_jitter=0.0))
    sim.run(20)
    stale = sim.observe()
    (job,) = c.running_jobs()
    c.crash(job, "rank0")
    c.advance(1)
    sim.step(observed=stale)  # the crash event was missed
    assert job in c.jobs
    sim.run(1)  # a resync shows it
    assert job not in c.jobs


def test_a_catalog_change_during_a_rebuild_backoff_tries_the_new_spec_at_once() -> None:
    settings = PlanningSettings(backoff_base=600.0, backoff_jitter=0.0)
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model()}), c, settings=settings)
    sim.run(20)
    c.crash(c.running_jobs()[0], "rank0")
    sim.run(5)
    assert "backing off" in (status_of(sim, "m").waiting or "")
    fixed = gpu_model()
    fixed["profiles"][0]["args"] = ["--enforce-eager"]
    sim.set_catalog(catalog({"m": fixed}))
    sim.run(20)
    assert c.healthy_jobs("m")
    assert status_of(sim, "m").backoff is None


# --- demand -----------------------------------------------------------------------------------------


def test_an_on_demand_model_wakes_on_request_stays_while_used_and_unloads_when_idle() -> None:
    c = cluster()
    sim = Simulation(catalog({"od": gpu_model(min=0, max=1, idle_timeout="5m")}), c)
    sim.run(30)
    assert not c.running_jobs()
    assert status_of(sim, "od").scaling == "on demand: not requested"
    sim.use("od", wake=True, queued=1)
    sim.run(1)
    assert c.running_jobs("od")
    assert sim.actions(PlaceReplica)[0].action.why == "wake"
    sim.use("od", in_flight=1)
    sim.run(20)
    # Use keeps it: requests every four minutes for twenty minutes.
    for _ in range(5):
        sim.idle("od")
        sim.run(240)
        assert c.healthy_jobs("od")
        sim.use("od", in_flight=1)
        sim.run(1)
    sim.idle("od")
    sim.run(290)
    assert c.running_jobs("od")
    sim.run(20)
    assert not c.running_jobs("od")


def test_a_guard_judge_stays_loaded_while_any_model_it_guards_is_loaded() -> None:
    models = {
        "judge": {
            "roles": ["guard"],
            "profiles": [{"engine": "sim", "tp": 1, "gpu": {"model": "H100"}}],
            "scaling": {"min": 0, "max": 1, "idle_timeout": "1m"},
        },
        "chat": gpu_model(min=0, max=1, idle_timeout="10m"),
    }
    c = cluster()
    sim = Simulation(catalog(models, guard_policies={"safety": {"judge": "judge", "models": ["chat"]}}), c)
    sim.use("chat", wake=True)
    sim.run(2)
    assert c.running_jobs("judge") and c.running_jobs("chat")
    sim.idle("chat")
    sim.run(300)  # the judge's own idle timeout passed; the chat model is still loaded
    assert c.running_jobs("judge")
    assert "judge of chat" in status_of(sim, "judge").scaling
    sim.run(400)
    assert not c.running_jobs("chat")
    sim.run(5)
    assert not c.running_jobs("judge")


def test_load_scales_up_after_a_window_above_target_and_down_after_a_window_below() -> None:
    c = cluster(nodes=2)
    m = gpu_model(min=1, max=3, target_in_flight=4, scale_window="60s")
    sim = Simulation(catalog({"m": m}), c)
    sim.run(20)
    sim.use("m", in_flight=10)
    sim.run(50)
    assert len(c.running_jobs("m")) == 1  # a short burst does not scale
    sim.use("m", in_flight=3)
    sim.run(30)
    sim.use("m", in_flight=10)
    sim.run(61)
    assert len(c.running_jobs("m")) == 2
    sim.run(80)
    assert len(c.running_jobs("m")) == 3
    # Hysteresis: 6 in flight over 3 replicas is under target, but with one fewer it would not
    # be comfortably under (6/2 = 3 >= 4 x 0.7): no scale down.
    sim.use("m", in_flight=6)
    sim.run(200)
    assert len(c.running_jobs("m")) == 3
    sim.use("m", in_flight=1)
    sim.run(61)

    def serving() -> list[str]:
        return [j for j in c.running_jobs("m") if j not in sim.marks]

    assert len(serving()) == 2  # one step at a time
    sim.run(61)
    assert len(serving()) == 1
    sim.run(400)  # the drained ones stop at the latest at the drain timeout
    assert len(c.running_jobs("m")) == 1


def test_status_explains_a_model_that_cannot_be_placed() -> None:
    c = cluster(nodes=1, gpus=4)
    sim = Simulation(catalog({"big": gpu_model(tp=8)}), c)
    sim.run(5)
    st = status_of(sim, "big")
    assert st.desired == 1 and st.healthy == 0
    assert st.waiting is not None
    assert "no profile fits: profile 0: group rank0: no ready node with 8 free H100 GPUs" in st.waiting


def test_the_reason_a_model_cannot_be_placed_stays_while_nomad_is_asked_again() -> None:
    # Nomad is asked again whenever capacity changes or the hold runs out; on those passes the
    # status must still say why the model has no replica, not fall back to its scaling reason.
    c = cluster(nodes=1, gpus=4)
    sim = Simulation(catalog({"big": gpu_model(tp=8)}), c)
    sim.run(3)
    whys: list[str | None] = []
    for second in range(200):
        if second % 7 == 0:
            sim.capacity_version += 1  # another allocation ended somewhere
        sim.run(1)
        whys.append(status_of(sim, "big").waiting)
    assert len(sim.actions(PlaceReplica, model="big")) >= 20  # it was asked again, many times
    assert all(w is not None and "no profile fits" in w and "8 free H100 GPUs" in w for w in whys), [
        w for w in whys if w is None or "no profile fits" not in w
    ][:3]
    # A plan that succeeds ends it.
    c.add_node("n9", gpus=8)
    sim.capacity_version += 1
    sim.run(30)
    st = status_of(sim, "big")
    assert (st.healthy, st.waiting) == (1, None)
