"""An embedding model's replica is started with the flags its engine needs to serve embeddings."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

CATALOG = """
models:
  embed-vllm:
    roles: [embedding]
    profiles: [{engine: vllm, source: BAAI/bge-m3}]
  embed-sglang:
    roles: [embedding]
    profiles: [{engine: sglang, source: Alibaba-NLP/gte-Qwen2-7B-instruct, tp: 16, nodes: 2}]
  embed-llamacpp:
    roles: [embedding]
    profiles: [{engine: llamacpp, source: "https://example.com/nomic-embed-text-v1.5.Q8_0.gguf"}]
  chat-vllm:
    roles: [chat, guard]
    profiles: [{engine: vllm, source: org/chat}]
  mixed-llamacpp:
    roles: [chat, embedding]
    profiles: [{engine: llamacpp, source: "https://example.com/chat.gguf"}]
"""


def engine_argvs(policy: SecurityPolicy, model: str) -> list[list[str]]:
    catalog = load_catalog(CATALOG, filename="c", policy=policy).catalog
    assert catalog is not None
    renderer = Renderer(RenderSettings(), policy)
    rendered = renderer.render(catalog, ReplicaRequest(model, 0, "0", fabric="f"), catalog_hash="h")
    spec = renderer.check(rendered, model=model)
    return [
        [*task["Config"]["entrypoint"], *task["Config"]["args"]]
        for group in spec["TaskGroups"]
        for task in group["Tasks"]
        if task["Name"] == "engine"
    ]


@pytest.mark.parametrize(
    ("model", "flags"),
    [
        ("embed-vllm", ["--runner", "pooling"]),
        ("embed-sglang", ["--is-embedding"]),
        ("embed-llamacpp", ["--embeddings"]),
    ],
)
def test_every_rank_of_an_embedding_model_gets_its_engines_embedding_flags(
    shipped_policy: SecurityPolicy, model: str, flags: list[str]
) -> None:
    argvs = engine_argvs(shipped_policy, model)
    assert argvs
    for argv in argvs:
        at = argv.index(flags[0])
        assert argv[at : at + len(flags)] == flags, argv


@pytest.mark.parametrize("model", ["chat-vllm", "mixed-llamacpp"])
def test_a_generating_model_gets_no_embedding_flag(shipped_policy: SecurityPolicy, model: str) -> None:
    [argv] = engine_argvs(shipped_policy, model)
    assert not {"--runner", "--embeddings", "--is-embedding"} & set(argv), argv
