"""The control plane's loops on recorded fakes of Nomad and Consul, on virtual time.

The simulated cluster answers in Nomad's JSON and emits Nomad's events; the catalog,
endpoints, drain marks and demand are Consul watches the tests set. Time is a
``ManualClock``: no test sleeps for real, and "within a second" is virtual seconds.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from llmgw.control import ControlSettings
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.planning import JobId, PlanningSettings
from tests.support.control import ControlHarness, FakeDrainMarks, FakeLeader, FakeWatch, ManualClock

CATALOG = """
models:
  chat:
    profiles:
      - engine: sim
        tp: 1
        gpu: {model: H100}
    scaling: {min: 2, max: 2}
"""

FAST = ControlSettings(
    planning=PlanningSettings(backoff_base=5.0, backoff_jitter=0.0, drain_min=1.0, drain_timeout=60.0),
    resync_interval=600.0,
)


def harness(policy: SecurityPolicy, text: str | None = CATALOG, **kw: object) -> ControlHarness:
    h = ControlHarness(text, policy, settings=FAST, **kw)  # type: ignore[arg-type]
    for i in range(3):
        h.cluster.add_node(f"n{i}")
    return h


async def test_the_plane_places_the_catalog_and_publishes_status(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        assert len(h.cluster.healthy_jobs("chat")) == 2
        status = h.status.last()
        (model,) = status["models"]
        assert (model["model"], model["desired"], model["healthy"]) == ("chat", 2, 2)
        assert status["leader"] == "control-1"
        metrics = h.plane.metrics.registry
        assert metrics.get_sample_value("llmgw_control_leader") == 1
        assert metrics.get_sample_value("llmgw_control_passes_total", {"result": "ok"}) >= 1
        assert (
            metrics.get_sample_value("llmgw_control_actions_total", {"kind": "place", "outcome": "placed"})
            == 2
        )
        assert metrics.get_sample_value("llmgw_control_replicas", {"phase": "healthy"}) == 2


async def test_the_status_keeps_each_replicas_gpus_across_periodic_resyncs(
    test_policy: SecurityPolicy,
) -> None:
    """Nomad's allocation list stubs carry AllocatedResources only with ``resources=true``
    (and job allocation lists never): a resync must not turn every replica's GPUs into []."""
    settings = replace(FAST, resync_interval=30.0)
    async with ControlHarness(CATALOG, test_policy, settings=settings) as h:
        for i in range(3):
            h.cluster.add_node(f"n{i}")
        await h.advance(20)

        def gpus() -> dict[str, list[str]]:
            (model,) = h.status.last()["models"]
            return {r["job_id"]: r["gpus"] for r in model["replicas"]}

        placed = gpus()
        assert len(placed) == 2 and all(len(g) == 1 for g in placed.values()), placed
        await h.advance(100)  # three periodic resyncs, passes after each
        reg = h.plane.metrics.registry
        assert reg.get_sample_value("llmgw_control_resyncs_total", {"reason": "periodic"}) >= 3
        assert gpus() == placed
        assert set(h.nomad.called("allocations")) == {"resources"}


async def test_a_job_read_on_its_own_keeps_its_gpus(test_policy: SecurityPolicy) -> None:
    """A job the view fetches by itself (an allocation event of a job it did not know, or a
    stop to confirm) is read with ``/v1/job/:id/allocations``, whose stubs never carry
    AllocatedResources on Nomad: the GPUs come from the view, or from the allocation itself."""
    async with ControlHarness(None, test_policy, settings=FAST) as h:
        h.cluster.add_node("n0")
        await h.advance(2)
        view = h.plane.view
        job = {
            "ID": "llmgw-chat-31e06f7d-r1",
            "Meta": {"llmgw_managed_by": "llmgw", "llmgw_model": "chat", "llmgw_replica": "r1"},
            "TaskGroups": [
                {"Name": "rank0", "Tasks": [{"Name": "engine", "Resources": {"Devices": [{"Count": 2}]}}]}
            ],
        }
        h.cluster.register(job)
        h.cluster.advance(5)
        view.refetch(JobId(job["ID"]))
        await view.refresh()
        jobs, _ = view.snapshot()
        (alloc,) = jobs[JobId(job["ID"])].allocs
        assert alloc.gpus == ("n0-gpu0", "n0-gpu1")
        assert h.nomad.called("allocation") == [alloc.alloc_id]
        view.refetch(JobId(job["ID"]))
        await view.refresh()
        jobs, _ = view.snapshot()
        assert jobs[JobId(job["ID"])].allocs[0].gpus == ("n0-gpu0", "n0-gpu1")
        assert h.nomad.called("allocation") == [alloc.alloc_id], "an allocation keeps its devices: read once"


async def test_a_nomad_event_is_acted_on_within_a_second(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        job = h.cluster.healthy_jobs("chat")[0]
        h.cluster.crash(job, "rank0")
        await h.clock.advance(1.0)
        assert h.nomad.called("deregister") == [job]


async def test_triggers_during_a_pass_coalesce_into_one_more_pass(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        reconciler = h.plane.reconciler
        assert reconciler is not None
        before = reconciler.passes
        for _ in range(50):
            h.plane.trigger.poke()
        await h.clock.advance(2.0)
        assert reconciler.passes == before + 1


async def test_nomads_warnings_at_register_are_logged_and_kept_in_each_replicas_status(
    test_policy: SecurityPolicy, caplog: pytest.LogCaptureFixture
) -> None:
    warning = 'task "engine" in group "rank-0" defines services, but has no shutdown_delay set'
    async with harness(test_policy) as h:
        h.cluster.warnings = (warning,)
        with caplog.at_level("WARNING", logger="llmgw.control.executing"):
            await h.advance(20)
        replicas = h.status.last()["models"][0]["replicas"]
        assert len(replicas) == 2
        assert [r["warnings"] for r in replicas] == [[warning], [warning]]
        logged = [r.getMessage() for r in caplog.records if "Nomad warns about job" in r.getMessage()]
        assert len(logged) == 2 and all(m.endswith(warning) for m in logged)


async def test_an_event_stream_gap_is_repaired_by_the_resync_after_reconnect(
    test_policy: SecurityPolicy,
) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        job = h.cluster.healthy_jobs("chat")[0]
        # The connection drops; meanwhile a shard fails and Nomad's buffer moves past it.
        h.nomad.buffer = 1
        h.nomad.break_stream()
        await asyncio.sleep(0)
        h.cluster.crash(job, "rank0")
        h.cluster.add_node("n9")  # one more event: the crash's has left the buffer
        await h.advance(5)
        assert h.nomad.streams >= 2
        reg = h.plane.metrics.registry
        assert reg.get_sample_value("llmgw_control_resyncs_total", {"reason": "reconnect"}) >= 1
        assert job in h.nomad.called("deregister")


async def test_a_failing_nomad_makes_the_pass_retry_later(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        h.nomad.fail["jobs"] = ConnectionError("Nomad is unreachable")
        h.plane.view.request_resync("test")
        await h.advance(20)
        reg = h.plane.metrics.registry
        assert reg.get_sample_value("llmgw_control_passes_total", {"result": "error"}) >= 1
        assert len(h.cluster.healthy_jobs("chat")) == 2


async def test_losing_leadership_stops_acting_and_the_standby_takes_over_without_restarts(
    test_policy: SecurityPolicy,
) -> None:
    clock = ManualClock()
    marks = FakeDrainMarks(FakeWatch({}))
    first = harness(test_policy, clock=clock, marks=marks, instance_id="control-1")
    second = harness(
        test_policy,
        clock=clock,
        marks=marks,
        cluster=first.cluster,
        leader=FakeLeader("control-2"),
        instance_id="control-2",
    )
    second.cluster = first.cluster
    async with first, second:
        await first.advance(20)
        running = first.cluster.running_jobs()
        assert len(running) == 2 and second.nomad.called("register") == []
        first.leader.revoke()
        await first.advance(1)
        assert first.plane.reconciler is None
        assert first.plane.metrics.registry.get_sample_value("llmgw_control_leader") == 0
        # The old leader acts no more, whatever happens.
        first.apply_catalog(CATALOG.replace("min: 2, max: 2", "min: 3, max: 3"))
        first.plane.trigger.poke()
        await first.advance(5)
        assert len(first.nomad.called("register")) == 2
        second.leader.grant()
        await second.advance(5)
        assert first.cluster.running_jobs() == running  # adopted: nothing restarted
        assert second.nomad.called("deregister") == []
        assert json.loads(second.status.published[-1])["leader"] == "control-2"


async def test_the_executor_checks_leadership_before_each_action(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        # Leadership is gone (the term has not noticed yet): the next action is refused.
        h.leader.lose_quietly()  # is_leader is False while the loop still runs
        await h.advance(5)
        assert h.nomad.called("register") == []


async def test_a_restarted_control_plane_adopts_and_restarts_nothing(test_policy: SecurityPolicy) -> None:
    first = harness(test_policy)
    async with first:
        await first.advance(20)
    running = first.cluster.running_jobs()
    again = harness(test_policy, cluster=first.cluster, clock=first.clock)
    again.cluster = first.cluster
    async with again:
        await again.advance(20)
        assert again.cluster.running_jobs() == running
        assert again.nomad.called("register") == []
        assert again.nomad.called("deregister") == []


async def test_no_catalog_yet_means_no_action(test_policy: SecurityPolicy) -> None:
    h = harness(test_policy, text=None)
    h.cluster.add_node("extra")
    async with h:
        await h.advance(10)
        assert h.nomad.called("register") == []
        assert "no catalog" in h.status.last()["note"]


async def test_scale_down_drains_through_consul_and_the_engine_probe(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        h.use("chat", in_flight=4)
        h.apply_catalog(CATALOG.replace("min: 2, max: 2", "min: 1, max: 1"))
        await h.advance(2)
        (marked,) = [job for op, job in h.marks.calls if op == "set"]
        h.probe.counts[marked] = 2
        await h.advance(10)
        assert marked in h.cluster.running_jobs()
        h.probe.counts[marked] = 0
        await h.advance(6)  # the probe is polled every drain_check_interval (5 s)
        assert marked not in h.cluster.running_jobs()
        await h.advance(3)
        assert ("clear", marked) in h.marks.calls


@pytest.mark.parametrize("gone", [True, False])
async def test_the_executor_is_idempotent_and_leaves_foreign_jobs_alone(
    test_policy: SecurityPolicy, gone: bool
) -> None:
    from llmgw.core.planning import JobId, StopReplica

    async with harness(test_policy) as h:
        if not gone:
            h.cluster.start_foreign_job("llmgw-not-ours", node="n0", gpus=1)
        outcomes = await h.plane.executor.apply(
            [StopReplica(JobId("llmgw-not-ours"), "chat", "test")], None, ""
        )
        assert h.nomad.called("deregister") == []
        assert type(outcomes[0]).__name__ == ("Done" if gone else "Failed")


async def test_each_replica_gets_its_engine_key_in_its_own_variable_before_it_is_registered(
    test_policy: SecurityPolicy,
) -> None:
    from llmgw.core.engine_keys import EngineKeys, variable_path

    keys = EngineKeys("s" * 32)
    async with harness(test_policy, engine_keys=keys) as h:
        await h.advance(20)
        jobs = h.nomad.called("register")
        assert len(jobs) == 2
        for job_id in jobs:
            path = variable_path(job_id)
            assert h.cluster.variables[path] == {"engine_api_key": keys.for_replica(job_id)}
            # Written first: the job's engine task reads it when it starts.
            order = [
                (m, a) for m, a in h.nomad.calls if (m, a) in {("put_variable", path), ("register", job_id)}
            ]
            assert order == [("put_variable", path), ("register", job_id)]
        assert len({h.cluster.variables[variable_path(j)]["engine_api_key"] for j in jobs}) == 2
        h.apply_catalog(CATALOG.replace("min: 2, max: 2", "min: 0, max: 2"))
        await h.advance(120)
        stopped = h.nomad.called("deregister")
        assert stopped
        for job_id in stopped:
            assert variable_path(job_id) not in h.cluster.variables
            assert h.nomad.called("delete_variable") and variable_path(job_id) in h.nomad.called(
                "delete_variable"
            )


class _EveryCall(dict[str, Exception]):
    """``FakeNomad.fail`` that raises on every call instead of the next one only."""

    def pop(self, key: str, default: Exception | None = None) -> Exception | None:  # type: ignore[override]
        return self.get(key, default)


async def test_a_standby_that_cannot_read_nomad_retries_with_backoff_not_every_second(
    test_policy: SecurityPolicy,
) -> None:
    h = harness(test_policy, leader=FakeLeader("control-2"))  # a standby: only its view reads Nomad
    h.nomad.fail = _EveryCall(jobs=ConnectionError("Nomad is unreachable"))
    async with h:
        await h.advance(31)
        # events_backoff: 1 s doubling, so reads at 0, 1, 3, 7, 15 and 31 s (not 32 reads).
        assert 5 <= len(h.nomad.called("jobs")) <= 7
        h.nomad.fail = {}
        await h.advance(33)
        assert h.nomad.streams >= 1  # read at last, and following Nomad's events
