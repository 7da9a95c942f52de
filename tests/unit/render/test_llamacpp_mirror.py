"""llama.cpp with a `mirror:` source: the fetch names the GGUF file, and `--model` gets that file."""

from __future__ import annotations

import subprocess
from pathlib import Path

from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

CATALOG = """
models:
  qwen:
    profiles: [{engine: llamacpp, source: "mirror:qwen-gguf@q4", args: ["--ctx-size", "8192"]}]
"""


def rendered_tasks(policy: SecurityPolicy) -> dict[str, dict]:  # type: ignore[type-arg]
    catalog = load_catalog(CATALOG, filename="c", policy=policy).catalog
    assert catalog is not None
    renderer = Renderer(RenderSettings(mirror_url="http://mirror.internal:8900"), policy)
    spec = renderer.check(
        renderer.render(catalog, ReplicaRequest("qwen", 0, "0"), catalog_hash="h"), model="qwen"
    )
    [group] = spec["TaskGroups"]
    return {task["Name"]: task for task in group["Tasks"]}


def test_the_fetch_writes_the_gguf_path_where_the_engine_reads_it(shipped_policy: SecurityPolicy) -> None:
    tasks = rendered_tasks(shipped_policy)
    fetch_args = tasks["fetch-model"]["Config"]["args"]
    assert fetch_args[-4:] == [
        "--dest",
        "/var/lib/llmgw/models/qwen-gguf/q4",
        "--gguf-path-file",
        "${NOMAD_ALLOC_DIR}/llmgw-gguf-path",
    ]
    engine = tasks["engine"]["Config"]
    assert engine["entrypoint"] == ["/bin/sh"]
    assert engine["args"][2:4] == ["llama-server", "${NOMAD_ALLOC_DIR}/llmgw-gguf-path"]
    # The directory is never the model any more; the version's cache is mounted where the path points.
    assert "/var/lib/llmgw/models/qwen-gguf/q4" not in engine["args"]
    assert engine["volumes"] == ["/var/lib/llmgw/models:/var/lib/llmgw/models:ro"]


def test_the_engine_command_gives_llama_server_the_file_the_fetch_named(
    shipped_policy: SecurityPolicy, tmp_path: Path
) -> None:
    """The rendered command run by a real shell, with llama-server replaced by printf."""
    engine = rendered_tasks(shipped_policy)["engine"]["Config"]
    argv = [*engine["entrypoint"], *engine["args"]]
    path_file = tmp_path / "llmgw-gguf-path"
    path_file.write_text("/var/lib/llmgw/models/qwen-gguf/q4/qwen 2.5-00001-of-00002.gguf\n")
    at = argv.index("/app/llama-server")
    argv[at - 1 : at + 1] = [str(path_file), "printf", "%s\n"]
    printed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    assert printed[-2:] == ["--model", "/var/lib/llmgw/models/qwen-gguf/q4/qwen 2.5-00001-of-00002.gguf"]
    assert printed[printed.index("--ctx-size") + 1] == "8192"


# Every prestart task llmgw renders: a mirror fetch on each rank, a rank's wait for its head.
MULTI_NODE = """
models:
  big:
    profiles:
      - {engine: vllm, source: "mirror:big@v1", tp: 16, nodes: 2}
      - {engine: sglang, source: "mirror:big@v1", tp: 16, nodes: 2}
"""


def test_every_prestart_task_llmgw_renders_has_words_in_the_status(shipped_policy: SecurityPolicy) -> None:
    """`llmgw status` says what a replica's own prestart task does while it runs, and what
    its failure means, by the task's name: a renamed or new task would lose both silently."""
    from llmgw.core.planning.replicas import TASK_FAILURE_WORDS, TASK_PREPARING_WORDS

    catalog = load_catalog(MULTI_NODE, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    renderer = Renderer(RenderSettings(mirror_url="http://mirror.internal:8900"), shipped_policy)
    prestart: set[str] = set()
    for profile in (0, 1):
        spec = renderer.check(
            renderer.render(catalog, ReplicaRequest("big", profile, "0", fabric="ib-0"), catalog_hash="h"),
            model="big",
        )
        prestart |= {
            task["Name"]
            for group in spec["TaskGroups"]
            for task in group["Tasks"]
            if (task.get("Lifecycle") or {}).get("Hook") == "prestart"
        }
    assert {"fetch-model", "await-head"} <= prestart
    assert prestart <= set(TASK_PREPARING_WORDS) and prestart <= set(TASK_FAILURE_WORDS)
