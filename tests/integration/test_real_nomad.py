"""The same jobs against a real `nomad agent -dev`, where one can run.

No Nomad runs on llmgw's CI machines (no binary, no Docker), so these skip with
the reason; the stand-in tests (tests/component/render, tests/component/
adapters_nomad) exercise the same behaviour against the Nomad-strict stand-in.
Run them on a workstation with `nomad` on PATH: they start a dev agent on free
ports, parse, plan and register a rendered sim job, and stop it.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.adapters.nomad import NomadClient, NomadError
from llmgw.apispec import check_document
from llmgw.bundled import read_security_policy
from llmgw.core.catalog import catalog_digest, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest
from llmgw.settings import NomadConnection
from tests.support.waiting import NOT_YET, eventually_sync

NOMAD = shutil.which("nomad")
pytestmark = pytest.mark.skipif(
    NOMAD is None,
    reason="needs a real Nomad: no `nomad` binary on PATH (and no Docker for testcontainers) on this "
    "machine; the Nomad-strict stand-in tests cover the same behaviour",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def nomad_dev_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert NOMAD is not None
    http = _free_port()
    config = tmp_path_factory.mktemp("nomad") / "agent.hcl"
    config.write_text(
        f"ports {{\n  http = {http}\n  rpc = {_free_port()}\n  serf = {_free_port()}\n}}\n"
        'plugin "raw_exec" {\n  config {\n    enabled = true\n  }\n}\n'
    )
    process = subprocess.Popen(
        [NOMAD, "agent", "-dev", "-config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{http}"
    try:

        def answering() -> bool:
            asyncio.run(_leader(address))
            return True

        eventually_sync(
            answering, 60, "nomad agent -dev answering", every=0.5, retry_on=(NomadError, *NOT_YET)
        )
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _leader(address: str) -> None:
    async with NomadClient(NomadConnection(address=address)) as nomad:
        await nomad.nodes()


async def test_a_rendered_job_parses_plans_and_registers_on_real_nomad(nomad_dev_agent: str) -> None:
    policy = read_security_policy()
    text = (Path(__file__).resolve().parents[2] / "examples" / "catalog.yaml").read_text()
    catalog = load_catalog(text, filename="catalog.yaml", policy=policy).catalog
    assert catalog is not None
    renderer = Renderer(RenderSettings(llmgw_command=("llmgw",)), policy)
    rendered = renderer.render(
        catalog, ReplicaRequest("sim-on-demand", 0, "0"), catalog_hash=catalog_digest(catalog)
    )
    async with NomadClient(NomadConnection(address=nomad_dev_agent)) as nomad:
        job = await nomad.parse_hcl(rendered.hcl)
        # What real Nomad returns, key-exact against its own API package.
        assert check_document(job, "Job") == []
        assert job["Meta"]["llmgw_spec_hash"] == rendered.spec_hash
        plan = await nomad.plan(job)
        assert plan.explanation
        await nomad.register(job)
        assert (await nomad.job(rendered.job_id)) is not None
        await nomad.deregister(rendered.job_id)
