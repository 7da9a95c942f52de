"""vLLM and SGLang download a repository into the node's model cache (a Nomad host volume), on every rank."""

from __future__ import annotations

from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

CATALOG = """
models:
  vllm-2n:
    profiles: [{engine: vllm, source: org/big, tp: 8, nodes: 2}]
  sglang-2n:
    profiles: [{engine: sglang, source: org/big, tp: 16, nodes: 2}]
  mirrored:
    profiles: [{engine: vllm, source: "mirror:m@v1"}]
  gguf:
    profiles: [{engine: llamacpp, source: "https://example.com/m.gguf"}]
"""


def groups(policy: SecurityPolicy, model: str, settings: RenderSettings) -> list[dict]:  # type: ignore[type-arg]
    catalog = load_catalog(CATALOG, filename="c", policy=policy).catalog
    assert catalog is not None
    renderer = Renderer(settings, policy)
    rendered = renderer.render(catalog, ReplicaRequest(model, 0, "0", fabric="f"), catalog_hash="h")
    return list(renderer.check(rendered, model=model)["TaskGroups"])


def test_every_rank_mounts_the_cache_volume_where_hf_hub_cache_points(shipped_policy: SecurityPolicy) -> None:
    settings = RenderSettings(model_cache_volume="cache-a")
    for model in ("vllm-2n", "sglang-2n"):
        ranks = groups(shipped_policy, model, settings)
        assert len(ranks) == 2
        for group in ranks:
            assert group["Volumes"] == {
                "model-cache": {"Name": "model-cache", "Type": "host", "Source": "cache-a", "ReadOnly": False}
            }
            engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
            assert engine["VolumeMounts"] == [
                {"Volume": "model-cache", "Destination": "/llmgw-cache", "ReadOnly": False}
            ]
            assert engine["Env"]["HF_HUB_CACHE"] == "/llmgw-cache/hub"


def test_no_cache_volume_where_nothing_is_downloaded_or_the_operator_has_none(
    shipped_policy: SecurityPolicy,
) -> None:
    with_mirror = RenderSettings(mirror_url="http://mirror:8900")
    for model, settings in (
        ("mirrored", with_mirror),  # the mirror's own cache directory holds it
        ("gguf", with_mirror),  # a Nomad artifact
        ("vllm-2n", RenderSettings(model_cache_volume=None)),
    ):
        for group in groups(shipped_policy, model, settings):
            assert not group.get("Volumes"), (model, group.get("Volumes"))
            engine = next(t for t in group["Tasks"] if t["Name"] == "engine")
            assert "HF_HUB_CACHE" not in (engine.get("Env") or {})
