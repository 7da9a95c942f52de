from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import Catalog, load_catalog
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.consul import ConsulSettings
from llmgw.devcluster.nomad import NodeSpec, StandInConfig
from llmgw.render import Renderer, RenderSettings

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def example_catalog() -> Catalog:
    text = (REPO / "examples" / "catalog.yaml").read_text()
    catalog = load_catalog(text, filename="examples/catalog.yaml", policy=read_security_policy()).catalog
    assert catalog is not None
    return catalog


def dev_render_settings(**changes: object) -> RenderSettings:
    """What `llmgw dev` renders with: llmgw run by the node's Python, quick checks."""
    base = RenderSettings(
        llmgw_command=("${attr.driver.raw_exec.python}", "-m", "llmgw"),
        check_interval_s=1,
        check_timeout_s=1,
        kill_timeout_s=2,
        shutdown_delay_s=0,
        restart_attempts=0,
        lost_after_s=1,
    )
    return RenderSettings(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, **changes})  # type: ignore[arg-type]


@pytest.fixture
def renderer() -> Renderer:
    return Renderer(dev_render_settings(), read_security_policy())


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevCluster]:
    nodes = tuple(NodeSpec(name=f"gpu-{i}", gpus=8, gpu_model="H100", fabric="fabric-a") for i in range(1, 4))
    config = DevClusterConfig(
        nomad=StandInConfig(
            nodes=nodes,
            strict=True,
            heartbeat_grace_s=0.5,
            event_heartbeat_s=1.0,
            template_retry_s=0.2,
            kill_grace_s=2.0,
        ),
        consul=ConsulSettings.for_tests(),
        state_dir=tmp_path / "nomad",
    )
    cluster = DevCluster(config)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


__all__ = ["sys"]
