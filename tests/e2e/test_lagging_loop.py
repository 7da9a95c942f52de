"""The in-process stack rides out a lagging event loop, as a loaded machine makes it lag.

Everything of an e2e test runs on one event loop (``harness.py``), and on a loaded 2-core
machine that loop is held up for a second and more at a time (the cycle collector, the
process waiting for a CPU). aiohttp times a connect on that loop: a lag while a client
opens a connection fails the request although the server accepted it. A control plane
that starts opens all its connections at once, and so does the test's own client at its
first request; the harness's connect timeout must outlast such a lag.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from llmgw.core.catalog import SecurityPolicy

from .harness import Stack, eventually, nodes

pytestmark = pytest.mark.e2e

LAG = 1.5  # seconds: longer than stalls seen under a loaded full suite run, within the test's clocks


async def test_a_starting_instance_and_the_tests_first_read_ride_out_a_lagging_loop(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    async with Stack(tmp_path, shipped_policy, nodes(1)) as stack:
        started = await stack.instance("cp-b")
        reading = asyncio.ensure_future(stack.catalog_version())  # the test client's first request
        await asyncio.sleep(0)  # cp-b's first requests and this one are opening their connections...
        time.sleep(LAG)  # ...when the loop is held up: the behaviour under test
        assert await reading == 0  # no catalog yet, and an answer, not a timeout
        catalog = started.plane.deps.catalog
        await eventually(lambda: catalog.generation > 0, 10, "cp-b's catalog watch answered")
        assert catalog.last_error is None, catalog.last_error
