"""The operator's drain and restart of a model, decided by the pure core against the simulator.

``sim.drain(model)`` / ``sim.restart(model)`` record the command as the admin API does
(``ModelCommand`` in ``Desired.commands``); every test then runs passes on the synthetic
clock and looks at what an operator would see: which jobs run, which drained first, what
the status says.
"""

from __future__ import annotations

from typing import Any

from llmgw.core import conventions as c
from llmgw.core.catalog import Catalog
from llmgw.core.planning import EndDrain, MarkDraining, ModelCommand, PlaceReplica, StopReplica
from tests.support.control import FakeCluster, Simulation


def catalog(models: dict[str, Any]) -> Catalog:
    return Catalog.model_validate({"models": models})


def gpu_model(*, min: int = 1, max: int | None = None, args: list[str] | None = None) -> dict[str, Any]:
    profile: dict[str, Any] = {"engine": "sim", "tp": 1, "gpu": {"model": "H100"}}
    if args:
        profile["args"] = args
    return {"profiles": [profile], "scaling": {"min": min, "max": max if max is not None else min}}


def cluster(nodes: int = 3, *, gpus: int = 8) -> FakeCluster:
    c = FakeCluster(start_delay=2.0, load_delay=10.0)
    for i in range(nodes):
        c.add_node(f"n{i}", gpus=gpus)
    return c


def status_of(sim: Simulation, model: str) -> Any:
    return next(m for m in sim.decisions[-1].status.models if m.model == model)


def generation(sim: Simulation, job_id: str) -> int:
    return int(sim.cluster.jobs[job_id].job["Meta"].get(c.JOB_META_RESTART_GENERATION, "0"))


# --- drain ---------------------------------------------------------------------------------------


def test_a_drained_model_drains_every_replica_and_places_none_until_restarted() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=2), "other": gpu_model()}), c)
    sim.run(40)
    drained = set(c.healthy_jobs("m"))
    other = c.running_jobs("other")
    assert len(drained) == 2

    sim.drain("m", by="ops via ci")
    sim.step()
    # Both serving replicas are marked at once (routers stop sending to them), none stopped yet.
    assert {a.action.job_id for a in sim.actions(MarkDraining, model="m")} == drained
    assert not sim.actions(StopReplica, model="m")
    sim.run(120)
    assert c.running_jobs("m") == []
    assert {a.action.job_id for a in sim.actions(StopReplica, model="m")} == drained
    assert not [a for a in sim.actions(PlaceReplica, model="m") if a.at > sim.actions(MarkDraining)[0].at]
    st = status_of(sim, "m")
    assert (st.desired, st.healthy, st.replicas) == (0, 0, ())
    assert "drained by ops via ci" in st.scaling
    assert c.running_jobs("other") == other  # nothing else is touched


def test_a_drained_replica_says_why_in_one_flat_sentence() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model()}), c)
    sim.run(40)
    (job,) = c.healthy_jobs("m")
    sim.in_flight[job] = 2
    sim.drain("m", by="ops (no token)")
    sim.run(5)
    (replica,) = (r for r in status_of(sim, "m").replicas if r.job_id == job)
    assert replica.reason.startswith("draining, 2 request(s) in flight: scaling down to 0: drained by ops")
    assert "((" not in replica.reason and "(scaling" not in replica.reason


def test_a_drain_outlasts_a_new_leader_and_an_on_demand_wake() -> None:
    c = cluster()
    sim = Simulation(catalog({"od": gpu_model(min=0, max=1)}), c)
    sim.use("od", wake=True)
    sim.run(30)
    assert c.healthy_jobs("od")
    sim.drain("od")
    sim.idle("od")
    sim.run(60)
    assert c.running_jobs("od") == []
    sim.restart_leader()  # a new leader has no memory, only the recorded command
    sim.use("od", wake=True)
    sim.run(60)
    assert c.running_jobs("od") == []
    assert not sim.actions(PlaceReplica, model="od")[1:]


def test_a_drained_judge_is_not_kept_loaded_for_the_models_it_guards() -> None:
    # The operator's drain names the model: it wins over the rule that keeps a judge loaded.
    models = {"chat": gpu_model(), "judge": gpu_model(min=0, max=1)}
    cat = Catalog.model_validate(
        {"models": models, "guard_policies": {"g": {"judge": "judge", "models": ["chat"]}}}
    )
    c = cluster()
    sim = Simulation(cat, c)
    sim.run(40)
    assert c.healthy_jobs("judge")
    sim.drain("judge")
    sim.run(60)
    assert c.running_jobs("judge") == [] and c.healthy_jobs("chat")


def test_restart_ends_a_drain() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    sim.drain("m")
    sim.run(60)
    assert c.running_jobs("m") == []
    sim.restart("m")
    sim.run(40)
    back = c.healthy_jobs("m")
    assert len(back) == 2
    assert all(generation(sim, j) == 1 for j in back)
    assert "drained" not in status_of(sim, "m").scaling


def test_a_catalog_change_to_the_model_ends_its_drain_for_good() -> None:
    c = cluster()
    first = {"m": gpu_model(min=1), "other": gpu_model()}
    sim = Simulation(catalog(first), c)
    sim.run(40)
    sim.drain("m")
    sim.run(60)
    assert c.running_jobs("m") == []

    # Changing another model does not end the drain.
    sim.set_catalog(catalog({**first, "other": gpu_model(args=["--max-model-len", "4096"])}), "catalog-2")
    sim.run(60)
    assert c.running_jobs("m") == [] and sim.commands["m"].drain_requested

    # Changing the model does: the record is cleared and replicas are placed again.
    changed = {**first, "m": gpu_model(min=1, args=["--max-model-len", "8192"])}
    sim.set_catalog(catalog(changed), "catalog-3")
    sim.run(40)
    assert c.healthy_jobs("m")
    (end,) = sim.actions(EndDrain)
    assert "changed in the catalog" in end.action.reason
    assert sim.commands["m"] == ModelCommand("m")

    # Applying the drained text again later is an ordinary change, not a drain.
    sim.set_catalog(catalog(first), "catalog-4")
    sim.run(60)
    assert len(c.healthy_jobs("m")) == 1


def test_a_drain_the_catalog_ended_is_not_cleared_if_it_was_drained_again_meanwhile() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model()}), c)
    sim.run(30)
    sim.drain("m")
    sim.set_catalog(catalog({"m": gpu_model(args=["--x", "1"])}), "catalog-2")
    sim.drain("m")  # drained again under the new catalog before a pass saw the change
    sim.run(60)
    assert not sim.actions(EndDrain)
    assert c.running_jobs("m") == []


# --- restart -------------------------------------------------------------------------------------


def test_restart_replaces_replicas_one_at_a_time_new_healthy_before_old_drains() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    old = set(c.healthy_jobs("m"))
    assert len(old) == 2
    sim.restart("m", by="ops")
    healthy_counts = []
    for _ in range(150):
        sim.run(1)
        healthy_counts.append(len(c.healthy_jobs("m")))
        assert len([j for j in old & set(c.running_jobs("m")) if j in sim.marks]) <= 1
    assert min(healthy_counts) >= 2  # never below the wanted count
    new = set(c.running_jobs("m"))
    assert len(new) == 2 and not new & old
    assert all(generation(sim, j) == 1 for j in new)
    drains = [a.action.reason for a in sim.actions(MarkDraining, model="m")]
    assert drains == ["replaced by a new replica (restart asked by ops)"] * 2
    # Done: nothing more happens, and the status shows nothing outdated.
    before = len(sim.applied)
    sim.run(60)
    assert len(sim.applied) == before
    assert not any(r.outdated for r in status_of(sim, "m").replicas)


def test_a_new_leader_continues_a_restart_without_replacing_the_new_replicas() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    old = set(c.healthy_jobs("m"))
    sim.restart("m")
    sim.run(20)  # the first new replica is up, an old one drains
    sim.restart_leader()
    sim.run(120)
    new = set(c.running_jobs("m"))
    assert len(new) == 2 and not new & old
    placed_since = {a.action.job_id for a in sim.actions(PlaceReplica, model="m")} - old
    assert placed_since == new  # no replica of the restart was itself replaced


def test_a_restart_of_a_replica_still_loading_replaces_it_at_once() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model(min=1)}), c)
    sim.run(5)  # registered and starting, not healthy yet
    (loading,) = c.running_jobs("m")
    sim.restart("m")
    sim.step()
    assert [a.action.reason for a in sim.actions(StopReplica, model="m")] == [
        "started before the restart and is not serving"
    ]
    sim.run(30)
    (fresh,) = c.healthy_jobs("m")
    assert fresh != loading and generation(sim, fresh) == 1


def test_restart_gives_a_backing_off_model_a_fresh_try() -> None:
    c = cluster()
    sim = Simulation(catalog({"m": gpu_model()}), c)
    sim.run(30)
    (job,) = c.running_jobs("m")
    c.crash(job, "rank0")
    sim.run(3)
    assert status_of(sim, "m").backoff is not None
    sim.restart("m")
    sim.step()
    assert status_of(sim, "m").backoff is None
    assert sim.actions(PlaceReplica, model="m")[-1].at == sim.now


# --- rolling when the extra replica does not fit -------------------------------------------------------


def test_a_roll_waits_for_capacity_a_moment_short_rather_than_going_in_place() -> None:
    # The spare GPU is held for a moment (as by a replica whose allocation is still stopping):
    # the extra replica does not fit once, and the roll waits for capacity instead of
    # draining an old replica first and serving with one fewer.
    c = cluster(nodes=3, gpus=1)  # room for the two replicas and one extra
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    spare = next(n for n in c.nodes.values() if not any(a.node_id == n.node_id for a in c.allocs.values()))
    c.start_foreign_job("stopping-elsewhere", node=spare.name, gpus=1)
    sim.restart("m")
    sim.run(5)
    assert status_of(sim, "m").healthy == 2 and not sim.actions(MarkDraining)
    c.deregister("stopping-elsewhere")
    sim.capacity_version += 1  # the allocation ended: capacity changed
    healthy = []
    for _ in range(120):
        sim.run(1)
        healthy.append(len(c.healthy_jobs("m")))
    assert min(healthy) >= 2
    assert all(generation(sim, j) == 1 for j in c.running_jobs("m"))


def test_a_roll_waits_for_the_gpus_a_stopped_replica_gives_back_instead_of_going_in_place() -> None:
    # Room for one extra replica: the roll places it, drains and stops an old one, and places
    # the second new one where the old one ran. Nomad counts the stopped allocation's GPUs
    # until its tasks exit (ProposedAllocs), so that plan says "does not fit" for a while,
    # however often it is asked; that is a wait, not a full cluster, and must not make the
    # roll drain the last old replica before its replacement is healthy.
    c = cluster(nodes=3, gpus=1)
    c.stop_delay = 3 * 60.0  # a long shutdown_delay + kill_timeout: many retries while freeing
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    sim.restart("m")
    healthy = []
    for _ in range(600):
        sim.run(1)
        healthy.append(len(c.healthy_jobs("m")))
    drains = [a.action.reason for a in sim.actions(MarkDraining, model="m")]
    assert len(drains) == 2 and not any("rolling in place" in r for r in drains), drains
    assert min(healthy[5:]) >= 2
    assert all(generation(sim, j) == 1 for j in c.running_jobs("m"))


def test_a_roll_with_no_room_for_an_extra_replica_goes_in_place_after_a_second_try() -> None:
    c = cluster(nodes=2, gpus=1)  # room for the two replicas, none for an extra one
    sim = Simulation(catalog({"m": gpu_model(min=2)}), c)
    sim.run(40)
    old = set(c.running_jobs("m"))
    sim.restart("m")
    sim.run(5)
    assert not sim.actions(MarkDraining)  # one "does not fit" is not enough
    sim.run(sim.settings.unplaceable_retry + 150)
    drains = [a.action.reason for a in sim.actions(MarkDraining, model="m")]
    assert drains and all("rolling in place" in r for r in drains)
    new = set(c.healthy_jobs("m"))
    assert len(new) == 2 and not new & old
