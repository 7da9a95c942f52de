"""A crashed engine of an old single-node replica is restarted in place, end to end (issue 27).

Tried as a new user would: ``llmgw dev crash`` on a replica older than ``placement_timeout``
rebuilt it, because the restarting task put its allocation back to ``pending`` and the
placement window counted from the job's register. Here the window is shortened to 15 s
(the rendered restart delay is 10 s) so "older than the window" takes seconds; the crash
is the stand-in's ``crash_task``, what ``llmgw dev crash`` calls through ``/_dev/``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.core.catalog import SecurityPolicy

from .harness import Stack, eventually, healthy_jobs, nodes, replicas

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-crash:
    roles: [chat]
    profiles:
      - engine: sim
        tp: 1
        sim: {tokens_per_second: 200, load_seconds: 0.2}
    scaling: {min: 1, max: 1}
"""
MODEL = "sim-crash"
WINDOW = 15.0


async def test_an_old_single_node_replica_is_restarted_in_place_after_a_crash(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(2)) as stack:
        planning = replace(stack.control_settings.planning, placement_timeout=WINDOW)
        stack.control_settings = replace(stack.control_settings, planning=planning)
        assert stack.cluster.nomad is not None
        async with stack.services("cp-1"):
            await stack.apply(CATALOG)

            async def one_healthy() -> set[str] | None:
                healthy = await healthy_jobs(stack.consul, MODEL)
                return healthy if len(healthy) == 1 else None

            (job,) = await eventually(one_healthy, 90, "the replica healthy")
            (alloc,) = (await replicas(stack.nomad, MODEL))[job].allocs
            submitted = int(((await stack.nomad.job(job)) or {})["SubmitTime"]) / 1e9

            async def older_than_the_window() -> bool:
                return time.time() - submitted > WINDOW + 1

            await eventually(older_than_the_window, 60, "the replica older than placement_timeout")
            await stack.cluster.nomad.crash_task(alloc)

            async def restarted() -> dict[str, object] | None:
                whole = await stack.nomad.allocation(alloc) or {}
                engine = (whole.get("TaskStates") or {}).get("engine") or {}
                return (
                    whole if engine.get("Restarts") == 1 and whole.get("ClientStatus") == "running" else None
                )

            await eventually(restarted, 60, "the engine restarted in place by its restart policy")
            await eventually(one_healthy, 60, "the replica healthy again")
            assert set(await replicas(stack.nomad, MODEL)) == {job}  # the same job: not rebuilt
            assert await healthy_jobs(stack.consul, MODEL) == {job}
