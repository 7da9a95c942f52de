"""A simulated replica of a mirror: source fetches and verifies like a real engine's, given a mirror."""

from __future__ import annotations

from typing import Any

from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

CATALOG = """
models:
  m:
    profiles:
      - engine: sim
        source: mirror:tiny@v1
  two-node:
    profiles:
      - engine: sim
        source: mirror:tiny@v1
        tp: 2
        nodes: 2
"""


def catalog(policy: SecurityPolicy) -> Catalog:
    loaded = load_catalog(CATALOG, filename="c", policy=policy)
    assert loaded.catalog is not None, loaded.diagnostics
    return loaded.catalog


def groups(renderer: Renderer, cat: Catalog, model: str, fabric: str | None = None) -> list[dict[str, Any]]:
    rendered = renderer.render(cat, ReplicaRequest(model, 0, "0", fabric), catalog_hash="h")
    job: dict[str, Any] = renderer.check(rendered, model=model)
    return list(job["TaskGroups"])


def test_without_a_mirror_the_simulator_runs_on_the_name_alone(shipped_policy: SecurityPolicy) -> None:
    [group] = groups(Renderer(RenderSettings(), shipped_policy), catalog(shipped_policy), "m")
    [engine] = group["Tasks"]
    args = engine["Config"]["args"]
    assert args[args.index("--model") + 1] == "mirror:tiny@v1"


def test_with_a_mirror_every_rank_fetches_into_the_model_cache_first(shipped_policy: SecurityPolicy) -> None:
    settings = RenderSettings(mirror_url="http://127.0.0.1:8900", model_cache_dir="/tmp/node-cache")
    renderer = Renderer(settings, shipped_policy)
    cat = catalog(shipped_policy)
    for model, fabric, ranks in (("m", None, 1), ("two-node", "fabric-a", 2)):
        rendered = groups(renderer, cat, model, fabric)
        assert len(rendered) == ranks
        for group in rendered:
            fetch, engine = group["Tasks"][0], group["Tasks"][-1]
            assert fetch["Name"] == "fetch-model"
            assert fetch["Lifecycle"] == {"Hook": "prestart", "Sidecar": False}
            assert fetch["Config"]["args"] == [
                "mirror",
                "fetch",
                "--mirror",
                "http://127.0.0.1:8900",
                "--ref",
                "tiny@v1",
                "--dest",
                "/tmp/node-cache/tiny/v1",
            ]
            assert engine["Name"] == "engine"
            args = engine["Config"]["args"]
            assert args[args.index("--model") + 1] == "/tmp/node-cache/tiny/v1"
