"""A hostile catalog that passes the check still cannot add a task, a driver, a volume or an env var."""

from __future__ import annotations

import json
from typing import Any

import hcl2
import pytest

from llmgw.core.catalog import SecurityPolicy, catalog_digest, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

ESCAPE = (
    '"} } task "evil" { driver = "docker" config { image = "evil" volumes = ["/:/host"] } '
    'env { LD_PRELOAD = "x" } } #'
)
HOSTILE_VALUES = [
    ESCAPE,
    '\n}\n  task "evil" {\n    driver = "raw_exec"\n  }\n',
    "%{ for x in [1] }x%{ endfor }",
    "$NOMAD_TOKEN $(id) `id` $$",
    '\\"; volumes = ["/:/host"]',
    "ünïcode ✓ \u2028 模型",
]


def catalog_text(value: str, engine: str = "vllm") -> str:
    quoted = json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    source = "org/model" if engine != "llamacpp" else "https://example.org/m.gguf"
    return f"""
models:
  m:
    profiles:
      - engine: {engine}
        source: {source}
        tp: {2 if engine != "llamacpp" else 1}
        {"nodes: 2" if engine in ("vllm", "sglang", "sim") else ""}
        gpu: {{model: {quoted}}}
        args: ["--max-model-len", {quoted}]
        env: {{NCCL_DEBUG: {quoted}, VLLM_ATTENTION_BACKEND: {quoted}}}
    scaling: {{min: 1, max: 1}}
"""


def structure(job: dict[str, Any]) -> Any:
    """Everything about a job except the values a catalog can set."""
    return [
        (
            group["Name"],
            [
                (
                    task["Name"],
                    task["Driver"],
                    sorted((task.get("Env") or {}).keys()),
                    sorted((task.get("Config") or {}).keys()),
                    len(task.get("Config", {}).get("args") or []),
                    task["Config"].get("volumes"),
                    [a["GetterSource"] for a in task.get("Artifacts") or []],
                    [
                        len(d.get("Constraints") or [])
                        for d in (task.get("Resources") or {}).get("Devices") or []
                    ],
                )
                for task in group["Tasks"]
            ],
            [s["Name"] for s in group.get("Services") or []],
        )
        for group in job["TaskGroups"]
    ]


def render(text: str, policy: SecurityPolicy) -> tuple[Any, str]:
    loaded = load_catalog(text, filename="c.yaml", policy=policy)
    assert loaded.catalog is not None, [d.format() for d in loaded.errors]
    renderer = Renderer(RenderSettings(), policy)
    profile = loaded.catalog.models["m"].profiles[0]
    fabric = "fabric-a" if profile.node_count > 1 else None
    rendered = renderer.render(
        loaded.catalog, ReplicaRequest("m", 0, "0", fabric), catalog_hash=catalog_digest(loaded.catalog)
    )
    return renderer.check(rendered, model="m"), rendered.hcl


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "sim"])
@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=range(len(HOSTILE_VALUES)))
def test_hostile_values_change_values_only(shipped_policy: SecurityPolicy, engine: str, value: str) -> None:
    benign_job, _ = render(catalog_text("benign", engine), shipped_policy)
    hostile_job, hcl = render(catalog_text(value, engine), shipped_policy)
    assert structure(hostile_job) == structure(benign_job)
    engine_task = hostile_job["TaskGroups"][0]["Tasks"][-1]
    assert engine_task["Env"]["NCCL_DEBUG"] == value
    assert value in engine_task["Config"]["args"]
    # python-hcl2, an independent HCL2 parser, sees the same blocks: no task "evil" anywhere.
    parsed = hcl2.loads(hcl)
    tasks = [
        next(iter(task))
        for group in next(iter(parsed["job"][0].values()))["group"]
        for task in next(iter(group.values()))["task"]
    ]
    assert all("evil" not in name for name in tasks), tasks
