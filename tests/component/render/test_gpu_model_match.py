"""A catalog's gpu.model places on the names NVIDIA's device plugin really reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.adapters.nomad import NomadClient
from llmgw.bundled import read_security_policy
from llmgw.core.catalog import catalog_digest, load_catalog
from llmgw.devcluster.nomad import NodeSpec, NomadServer, NomadStandIn, StandInConfig
from llmgw.render import Renderer, RenderSettings, ReplicaRequest
from llmgw.settings import NomadConnection

CATALOG = "models:\n  m:\n    profiles: [{engine: sim, tp: 2, gpu: {model: H100, memory_gb: 80}}]\n"


@pytest.mark.parametrize(
    ("reported", "places"),
    [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H100 PCIe", True),
        ("nvidia-h100-sxm", True),
        ("NVIDIA H1000", False),
        ("NVIDIA A100-SXM4-80GB", False),
    ],
)
async def test_the_model_is_a_whole_word_of_the_device_name(
    tmp_path: Path, reported: str, places: bool
) -> None:
    policy = read_security_policy()
    catalog = load_catalog(CATALOG, filename="c.yaml", policy=policy).catalog
    assert catalog is not None
    rendered = Renderer(RenderSettings(), policy).render(
        catalog, ReplicaRequest("m", 0, "0"), catalog_hash=catalog_digest(catalog)
    )
    node = NodeSpec(name="gpu-1", gpus=2, gpu_model=reported, gpu_memory_mib=81559)
    standin = NomadStandIn(StandInConfig(nodes=(node,), state_dir=tmp_path))
    async with NomadServer(standin) as server, NomadClient(NomadConnection(address=server.address)) as nomad:
        plan = await nomad.plan(await nomad.parse_hcl(rendered.hcl))
    assert plan.feasible is places, plan.explanation
    if not places:
        assert "2 nvidia/gpu (H100, >= 76293 MiB) free" in plan.explanation
