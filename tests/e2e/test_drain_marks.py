"""What a drain mark means to the router, on the dev stand-ins with real sims.

The control plane marks a replica it drains at ``llmgw/draining/<job id>`` and stops it
once routers have stopped sending it requests. Here the control plane is stopped after
placing the replicas (so nothing else changes), a mark is written as it writes one, and
the router's answers say which replica served them (``x-llmgw-replica``).
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from llmgw.adapters.consul import DrainingMarks
from llmgw.core import conventions as c
from llmgw.core.catalog import SecurityPolicy
from llmgw.core.records import DrainMark

from .harness import Stack, eventually, nodes, replicas, settled

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-chat:
    roles: [chat]
    profiles:
      - engine: sim
        sim: {tokens_per_second: 400, load_seconds: 0.5}
    scaling: {min: 2, max: 2}
"""


async def test_the_router_sends_nothing_to_a_replica_marked_draining(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(2)) as stack:
        async with stack.services("cp-1"):
            await stack.apply(CATALOG)

            async def running() -> bool:
                status = await stack.status()
                return status is not None and settled(status, "sim-chat")

            await eventually(running, 60, "two replicas")
        marked = sorted(await replicas(stack.nomad, "sim-chat"))[0]
        replica_id = marked.rsplit("-", 1)[1]
        await DrainingMarks(stack.consul).set(DrainMark(marked, "sim-chat", time.time(), "e2e"))
        assert c.KV_DRAINING_PREFIX + marked in [
            e.key for e in (await stack.consul.kv_list(c.KV_DRAINING_PREFIX))[0]
        ]

        async with aiohttp.ClientSession() as http:

            async def served_by() -> str:
                body = {"model": "sim-chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
                async with http.post(f"{stack.router_url}/v1/chat/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    return response.headers["x-llmgw-replica"]

            async def avoided() -> bool:
                return all([await served_by() not in (marked, replica_id) for _ in range(12)])

            await eventually(avoided, 15, "twelve answers in a row from the replica not marked")
