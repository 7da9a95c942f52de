"""The lost-node clock across a control-plane failover, at real Nomad's heartbeat timing (issue 27).

While a node is disconnected, Nomad's leader files "Node heartbeat missed" again every
heartbeat TTL plus grace, 20-30 s with the defaults, each time with a new
``StatusUpdatedAt`` (``nomad/heartbeat.go``, ``invalidateHeartbeat``; ``node_endpoint.go``,
``UpdateStatus``, v2.0.5). A control plane that starts its term in the middle of an outage
must still count ``node_lost_grace`` from the disconnection (the unknown allocation's
``LastUnknown``, the clock its ``lost_after`` runs on), or Nomad's ``lost_after`` fires first
and places a lone replacement. The whole plane runs on fakes and virtual time
(``ManualClock``): twenty minutes of outage take well under a second.
"""

from __future__ import annotations

from llmgw.control import ControlSettings
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.planning import PlanningSettings
from llmgw.render.settings import RenderSettings
from tests.support.control import ControlHarness, FakeCluster, FakeLeader, ManualClock

CATALOG = """
models:
  chat:
    profiles:
      - engine: sim
        tp: 8
        gpu: {model: H100}
    scaling: {min: 1, max: 1}
"""

# llmgw's defaults: node_lost_grace 10 min, the jobs' lost_after 15 min.
SETTINGS = ControlSettings(planning=PlanningSettings(backoff_jitter=0.0), resync_interval=600.0)
LOST_AFTER = float(RenderSettings().lost_after_s)
# Nomad's heartbeat TTL (min_heartbeat_ttl 10 s plus a stagger of up to one TTL) plus
# heartbeat_grace 10 s: 20-30 s (nomad/config.go DefaultConfig, nomad/heartbeat.go).
HEARTBEAT_REWRITE = 25.0


def real_nomad_cluster(clock: ManualClock) -> FakeCluster:
    cluster = FakeCluster(start=clock.now)
    cluster.heartbeat_rewrite = HEARTBEAT_REWRITE
    cluster.lost_after = LOST_AFTER
    for i in range(3):
        cluster.add_node(f"n{i}")
    return cluster


async def test_a_failover_at_minute_six_of_an_outage_still_rebuilds_before_lost_after(
    test_policy: SecurityPolicy,
) -> None:
    clock = ManualClock()
    cluster = real_nomad_cluster(clock)
    first = ControlHarness(CATALOG, test_policy, settings=SETTINGS, cluster=cluster, clock=clock)
    async with first:
        await first.advance(30)
        (job,) = cluster.healthy_jobs("chat")
        alloc = next(a for a in cluster.allocs.values() if a.job_id == job)
        node = next(n for n in cluster.nodes.values() if n.node_id == alloc.node_id)
        cluster.fail_node(node.name, disconnect=True)
        failed_at = clock.now
        await first.advance(6 * 60, step=5.0)
        assert cluster.running_jobs("chat") == [job]  # unreachable, kept within the grace
    # Nomad kept rewriting the node's status time: a new leader reading it sees a recent outage.
    assert node.status_updated_at - failed_at >= 6 * 60 - HEARTBEAT_REWRITE
    second = ControlHarness(
        CATALOG,
        test_policy,
        settings=SETTINGS,
        cluster=cluster,
        clock=clock,
        leader=FakeLeader("control-2", leader=True),
        instance_id="control-2",
    )
    async with second:
        await second.advance(LOST_AFTER + 120 - 6 * 60, step=5.0)
        stops = second.nomad.called("deregister")
        assert stops == [job]
        rebuilt = [j for j in cluster.running_jobs("chat") if j != job]
        assert len(rebuilt) == 1, cluster.running_jobs("chat")
        (status,) = second.status.last()["models"]
        assert status["healthy"] == 1
    assert cluster.replacements == [], "Nomad's lost_after fired first and placed a lone copy"


async def test_a_node_event_that_moves_only_timestamps_releases_no_placement_hold(
    test_policy: SecurityPolicy,
) -> None:
    clock = ManualClock()
    cluster = real_nomad_cluster(clock)
    # A model too big for any node: the plan says it does not fit, and it is held.
    big = CATALOG.replace("tp: 8", "tp: 16").replace("chat:", "huge:")
    h = ControlHarness(big, test_policy, settings=SETTINGS, cluster=cluster, clock=clock)
    async with h:
        await h.advance(10)
        planned = len(h.nomad.called("plan"))
        assert planned >= 1
        cluster.fail_node("n2", disconnect=True)  # a status change: capacity moved, planned again
        await h.advance(2)
        after_down = len(h.nomad.called("plan"))
        assert after_down > planned
        # Four heartbeat rewrites (a new StatusUpdatedAt each), well inside the hold's retry.
        await h.advance(4 * HEARTBEAT_REWRITE + 1, step=1.0)
        plans = h.nomad.called("plan")
        # Only the hold's own doubling retries ask again (after 30 s, then 60 s), never a rewrite.
        assert len(plans) - after_down <= 2, plans
