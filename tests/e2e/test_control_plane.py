"""The control plane end to end on the dev stand-ins, with a load through the router the whole time.

Each test runs the whole system in process (``tests/e2e/harness.py``): the Nomad and Consul
stand-ins whose allocations are real ``llmgw sim`` processes, the router, and control
planes as ``llmgw serve`` wires them. While requests keep flowing through the router:

- a restarted control plane restarts nothing (same jobs, same allocations, same
  JobModifyIndex, no action at all from the new one);
- of two instances one leads; when the leader loses Consul (a dead machine or a
  partition: it cannot even release its lock) the other takes over within seconds, and
  again when the new leader stops cleanly; each new leader acts on a catalog change
  applied after it took over; no two instances ever act at once;
- a catalog change that changes what a replica runs rolls the replicas one at a time, a
  new one healthy before an old one drains;
- the admin API's drain and restart of a model, honoured by a new leader too;

and not one request fails.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.adapters.consul import ElectionSettings
from llmgw.core import conventions as c
from llmgw.core.catalog import SecurityPolicy

from .harness import (
    LeadershipWatch,
    Load,
    NotYet,
    Stack,
    Timeline,
    eventually,
    model_status,
    nodes,
    replicas,
    unsettled,
)

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-chat:
    roles: [chat, completion]
    profiles:
      - engine: sim
        sim: {tokens_per_second: 200, load_seconds: 0.5}
    scaling: {min: 2, max: 2}
"""
TWO_NODE = """
  sim-two-node:
    roles: [chat]
    profiles:
      - engine: sim
        tp: 2
        nodes: 2
        sim: {tokens_per_second: 200, load_seconds: 0.5}
    scaling: {min: 1, max: 1}
"""
SPARE = """
  sim-spare:
    roles: [chat]
    profiles:
      - engine: sim
        sim: {tokens_per_second: 200, load_seconds: 0.5}
    scaling: {min: 1, max: 1}
"""


def actions_taken(plane: Any) -> dict[tuple[str, str], float]:
    """The plane's ``llmgw_control_actions_total`` by (kind, outcome), where non-zero."""
    out: dict[tuple[str, str], float] = {}
    for metric in plane.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "llmgw_control_actions_total" and sample.value:
                out[(sample.labels["kind"], sample.labels["outcome"])] = sample.value
    return out


async def test_a_restarted_control_plane_restarts_nothing(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(4)) as stack:
        load = Load(stack.router_url, "sim-chat")
        try:
            async with stack.services("cp-1") as first:
                await stack.apply(CATALOG + TWO_NODE)
                await eventually(
                    _settled(stack, "sim-chat", "sim-two-node", leader="cp-1"), 90, "the catalog running"
                )
                await load.start()
                await load.wait_answers(10)
                before = await replicas(stack.nomad)
                assert len(before) == 3 and first.control is not None
            # cp-1 stopped cleanly (it resigned); a new instance starts on the same cluster.
            async with stack.services("cp-2") as second:
                plane = second.control
                assert plane is not None
                await eventually(lambda: plane.reconciler is not None, 30, "cp-2 leading")
                # It has looked at everything several times over and found nothing to do.
                await eventually(
                    lambda: plane.reconciler is not None and plane.reconciler.passes >= 3, 30, "passes"
                )
                await eventually(
                    _settled(stack, "sim-chat", "sim-two-node", leader="cp-2"), 30, "cp-2's status"
                )
                await load.wait_answers(10)
                after = await replicas(stack.nomad)
                assert actions_taken(plane) == {}
        finally:
            await load.stop()
        assert after == before  # same job ids, JobModifyIndex and allocation ids
        assert load.failures == [], load.failures[:5]


async def test_one_of_two_instances_leads_and_the_other_takes_over_and_keeps_reconciling(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    loop = asyncio.get_running_loop()
    async with Stack(tmp_path, shipped_policy, nodes(4)) as stack:
        watch = LeadershipWatch(stack.acts)
        await watch.start()
        load = Load(stack.router_url, "sim-chat")
        try:
            # cp-a leads first (it campaigns alone), cp-b stands by.
            a = await stack.instance("cp-a", partitionable=True)
            await eventually(lambda: a.leading, 30, "cp-a leading")
            b = await stack.instance("cp-b")
            await stack.apply(CATALOG)
            await eventually(_settled(stack, "sim-chat", leader="cp-a"), 60, "cp-a running the catalog")
            assert watch.leaders() == ("cp-a",)
            await load.start()
            await load.wait_answers(10)
            before = await replicas(stack.nomad)

            # The leader loses Consul (a dead machine, or a partition; it keeps running).
            lost_at = loop.time()
            assert a.proxy is not None
            a.proxy.freeze()
            await eventually(lambda: b.leading, 30, "cp-b taking over")
            took_over = loop.time() - lost_at
            assert not a.leading
            # The new leader acts on a change applied after it took over.
            await stack.apply(CATALOG.replace("{min: 2, max: 2}", "{min: 3, max: 3}"))
            await eventually(_settled(stack, "sim-chat", leader="cp-b"), 60, "cp-b placing a third replica")
            assert [act.what for act in stack.acts.by("cp-b")] == ["register"]
            # The old leader is stopped without releasing anything (its Consul is gone).
            await stack.stop_instance(a)

            # A third instance stands by; the leader stops cleanly and hands over at once.
            cp_c = await stack.instance("cp-c")
            assert not cp_c.leading
            stopped_at = loop.time()
            await stack.stop_instance(b)
            await eventually(lambda: cp_c.leading, 30, "cp-c taking over")
            handed_over = loop.time() - stopped_at
            await stack.apply(CATALOG + SPARE)  # scale sim-chat back to 2, add a model
            await eventually(
                _settled(stack, "sim-chat", "sim-spare", leader="cp-c"), 60, "cp-c acting on the change"
            )
            await load.wait_answers(10)
            after = await replicas(stack.nomad)
        finally:
            await load.stop()
            await watch.stop()
        print(
            f"failover after the leader lost Consul: {took_over:.1f}s; after a clean stop: {handed_over:.1f}s"
        )

        assert watch.overlaps == []  # never two leaders at once...
        assert [act for act in stack.acts.acts if act.others_leading] == []  # ...nor while acting
        assert stack.acts.actors() == ["cp-a", "cp-b", "cp-c"]
        assert {"mark", "deregister", "register"} <= {act.what for act in stack.acts.by("cp-c")}
        # The failovers restarted nothing: the first two replicas run as they did.
        for job_id, replica in before.items():
            assert after[job_id] == replica
        assert load.failures == [], load.failures[:5]


async def test_after_a_leader_crash_another_leads_within_20_s_at_consuls_real_timing(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    """Nomad's and Consul's real default timing (``llmgw.devcluster.timing.real_defaults``:
    session TTL at least 10 s and enforced at up to 2 x TTL, lock-delay applied up to 60 s,
    a node down 30 s after its last heartbeat) and llmgw's real election settings: the
    leader's session is tied to its process's TTL check, so when nothing more comes from it
    (a crash) Consul invalidates the session within the check's TTL and the standby leads
    after lock-delay, not after 2 x TTL + lock-delay; and acts, never alongside the old one."""
    loop = asyncio.get_running_loop()
    election = ElectionSettings()
    async with Stack(tmp_path, shipped_policy, nodes(2), election=election, real_timing=True) as stack:
        watch = LeadershipWatch(stack.acts)
        await watch.start()
        try:
            a = await stack.instance("cp-a", partitionable=True)
            await eventually(lambda: a.leading, 30, "cp-a leading")
            b = await stack.instance("cp-b")
            assert a.proxy is not None
            a.proxy.freeze()  # from Consul's side, a crash: nothing more arrives from cp-a
            crashed_at = loop.time()
            await eventually(lambda: b.leading, 30, "cp-b taking over")
            took_over = loop.time() - crashed_at
            await stack.apply(SPARE.replace("  sim-spare:", "models:\n  sim-spare:", 1))
            await eventually(_settled(stack, "sim-spare", leader="cp-b"), 30, "cp-b placing sim-spare")
        finally:
            await watch.stop()
        print(f"failover after a crash at Consul's real timing: {took_over:.1f}s")
        assert election.lock_delay <= took_over < 20.0
        assert watch.overlaps == []
        assert [act for act in stack.acts.acts if act.others_leading] == []
        assert stack.acts.actors() == ["cp-b"]


async def test_a_catalog_change_rolls_replicas_one_at_a_time_with_no_failed_request(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    faster = CATALOG.replace("tokens_per_second: 200", "tokens_per_second: 400")
    async with Stack(tmp_path, shipped_policy, nodes(3)) as stack, stack.services("cp-1", admin=True) as cp:
        assert cp.admin is not None
        await stack.apply(CATALOG)
        await eventually(_settled(stack, "sim-chat", leader="cp-1"), 60, "the catalog running")
        old = await replicas(stack.nomad, "sim-chat")
        timeline = Timeline(stack.nomad, stack.consul, "sim-chat")
        load = Load(stack.router_url, "sim-chat")
        await load.start()
        await timeline.start()
        try:
            await load.wait_answers(10)
            # Applied through the admin API, as `llmgw ctl apply` does: If-Match on what was read.
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{cp.admin.url}/admin/v1/catalog") as response:
                    etag = response.headers["ETag"]
                async with http.put(
                    f"{cp.admin.url}/admin/v1/catalog",
                    json={"catalog": faster},
                    headers={"If-Match": etag, "X-Llmgw-Actor": "e2e"},
                ) as response:
                    assert response.status == 200, await response.text()
                    applied = await response.json()
            assert applied["applied"] is True
            assert [(m["model"], m["effect"]) for m in applied["diff"]["models"]] == [("sim-chat", "roll")]

            async def rolled() -> bool:
                now = await replicas(stack.nomad, "sim-chat")
                return (
                    len(now) == 2
                    and not set(now) & set(old)
                    and await _settled(stack, "sim-chat", leader="cp-1")()
                )

            await eventually(rolled, 90, "both replicas replaced")
            await load.wait_answers(10)
        finally:
            await timeline.stop()
            await load.stop()

        new = await replicas(stack.nomad, "sim-chat")
        for replica in new.values():
            job = await stack.nomad.job(replica.job_id)
            assert job is not None
            args = [a for g in job["TaskGroups"] for t in g["Tasks"] for a in t["Config"].get("args", [])]
            assert args[args.index("--token-rate") + 1] == "400.0", args
        # One at a time: never more than one extra replica, never two old ones draining.
        assert max(len(s.running) for s in timeline.samples) <= 3
        assert max(len(s.marked & set(old)) for s in timeline.samples) <= 1
        # Each old replica drained (was marked) before it stopped, and only after one more
        # new replica had become healthy than had replaced an old one before it.
        marked_at = sorted(timeline.first(j, "marked") or float("inf") for j in old)
        healthy_at = sorted(timeline.first(j, "healthy") or float("inf") for j in new)
        assert all(t < float("inf") for t in marked_at), "an old replica was stopped without a drain"
        assert healthy_at[0] <= marked_at[0] and healthy_at[1] <= marked_at[1], (healthy_at, marked_at)
        assert load.failures == [], load.failures[:5]


async def test_drain_and_restart_through_the_admin_api_hold_across_a_new_leader(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    one_chat = CATALOG.replace("{min: 2, max: 2}", "{min: 1, max: 1}")
    async with Stack(tmp_path, shipped_policy, nodes(3)) as stack, aiohttp.ClientSession() as http:

        async def command(admin_url: str, model: str, verb: str) -> dict[str, Any]:
            async with http.post(
                f"{admin_url}/admin/v1/models/{model}/{verb}", json={}, headers={"X-Llmgw-Actor": "e2e"}
            ) as response:
                assert response.status == 202, await response.text()
                return dict(await response.json())

        load = Load(stack.router_url, "sim-chat")
        try:
            async with stack.services("cp-1", admin=True) as cp:
                assert cp.admin is not None
                await stack.apply(one_chat + SPARE)
                await eventually(_settled(stack, "sim-chat", "sim-spare", leader="cp-1"), 60, "running")
                await load.start()
                await load.wait_answers(10)
                (chat_before,) = await replicas(stack.nomad, "sim-chat")
                (spare_before,) = await replicas(stack.nomad, "sim-spare")

                # Restart under load: a new replica, healthy before the old one drains.
                receipt = await command(cp.admin.url, "sim-chat", "restart")
                assert receipt["replicas"] == [chat_before]

                async def restarted() -> bool:
                    now = await replicas(stack.nomad, "sim-chat")
                    fresh = [r for r in now.values() if r.meta.get(c.JOB_META_RESTART_GENERATION) == "1"]
                    settled_now = await _settled(stack, "sim-chat", leader="cp-1")()
                    return len(now) == 1 and len(fresh) == 1 and bool(settled_now)

                await eventually(restarted, 60, "sim-chat replaced")
                await load.wait_answers(10)

                # Drain: its replica stops, and none comes back.
                receipt = await command(cp.admin.url, "sim-spare", "drain")
                assert receipt["replicas"] == [spare_before]

                async def drained() -> bool:
                    st = model_status(await stack.status(), "sim-spare")
                    gone = not await replicas(stack.nomad, "sim-spare")
                    return gone and st is not None and st["desired"] == 0 and st["replicas"] == []

                await eventually(drained, 60, "sim-spare drained")
                assert "drained by e2e" in (model_status(await stack.status(), "sim-spare") or {})["scaling"]

            # A new control plane honours the drain: it places nothing.
            async with stack.services("cp-2", admin=True) as cp2:
                assert cp2.admin is not None and cp2.control is not None
                plane = cp2.control
                await eventually(
                    lambda: plane.reconciler is not None and plane.reconciler.passes >= 3, 30, "cp-2"
                )
                await eventually(_settled(stack, "sim-chat", leader="cp-2"), 30, "cp-2's status")
                assert await replicas(stack.nomad, "sim-spare") == {}
                assert actions_taken(plane) == {}
                # Restart ends the drain.
                await command(cp2.admin.url, "sim-spare", "restart")

                async def back() -> bool:
                    st = model_status(await stack.status(), "sim-spare")
                    settled_now = await _settled(stack, "sim-spare", leader="cp-2")()
                    return st is not None and st["desired"] == 1 and bool(settled_now)

                await eventually(back, 60, "sim-spare back")
                (spare_after,) = (await replicas(stack.nomad, "sim-spare")).values()
                assert spare_after.meta[c.JOB_META_RESTART_GENERATION] == "1"
                await load.wait_answers(10)
        finally:
            await load.stop()
        assert load.failures == [], load.failures[:5]


def _settled(stack: Stack, *models: str, leader: str) -> Any:
    """A probe: the status ``leader`` published shows ``models`` settled (else why not)."""

    async def probe() -> bool | NotYet:
        status = await stack.status()
        if status is None or status.get("leader") != leader:
            return NotYet(f"status by {status and status.get('leader')}, not {leader}")
        why = unsettled(status, *models)
        return NotYet(why) if why else True

    return probe


async def test_the_control_plane_serves_its_metrics(tmp_path: Path, shipped_policy: SecurityPolicy) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(1)) as stack, stack.services("cp-metrics") as running:
        listener = running.control_metrics
        assert listener is not None
        async with aiohttp.ClientSession() as http:

            async def leading() -> bool:
                async with http.get(f"{listener.url}/health") as response:
                    return bool((await response.json())["leader"])

            await eventually(leading, 30, "the only instance leading")
            async with http.get(f"{listener.url}/metrics") as response:
                text = await response.text()
    assert "llmgw_control_leader 1.0" in text
    assert "llmgw_control_passes_total" in text
