"""Property: every catalog that loads renders back to YAML that loads to the same catalog."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.core.catalog import SecurityPolicy, dump_catalog, load_catalog
from llmgw.core.names import NAME_PATTERN

names = st.from_regex(NAME_PATTERN, fullmatch=True).filter(lambda n: len(n) <= 40)
text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
durations = st.one_of(st.integers(0, 10**6), st.sampled_from(["30s", "15m", "2h", "0s"]))
safe_args = st.lists(
    st.sampled_from(
        [
            "--max-model-len",
            "16384",
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            "-1",
            "0.9",
            "yes",
            "--gpu-memory-utilization",
            "=",
            "multi word value",
            "ünïcode",
            'quote"d',
            "new\nline",
        ]
    ),
    max_size=6,
)
safe_env = st.dictionaries(
    st.sampled_from(["NCCL_DEBUG", "OMP_NUM_THREADS", "VLLM_ATTENTION_BACKEND", "TOKENIZERS_PARALLELISM"]),
    # Without what the catalog refuses in engine text (NUL, Nomad's ${, the renderer's @@):
    # tests/unit/catalog/test_rules.py has a catalog for each of those.
    st.one_of(
        text.filter(lambda s: "\x00" not in s and "${" not in s and "@@" not in s),
        st.integers(0, 64).map(str),
    ),
    max_size=3,
)


@st.composite
def profiles(draw: st.DrawFn) -> dict[str, Any]:
    engine = draw(st.sampled_from(["vllm", "sglang", "llamacpp", "sim"]))
    profile: dict[str, Any] = {"engine": engine}
    if engine == "llamacpp":
        profile["source"] = draw(st.sampled_from(["https://example.org/m.gguf", "mirror:qwen@v1"]))
        if draw(st.booleans()):
            profile["gpus_per_node"] = draw(st.integers(0, 8))
    else:
        if engine != "sim" or draw(st.booleans()):
            profile["source"] = draw(st.sampled_from(["org/model", "meta-llama/Llama-3.1-8B", "mirror:m@1"]))
        nodes = draw(st.integers(1, 4))
        per_node = draw(st.integers(1, 8))
        tp = draw(st.sampled_from([d for d in range(1, nodes * per_node + 1) if (nodes * per_node) % d == 0]))
        profile.update(tp=tp, pp=nodes * per_node // tp, nodes=nodes)
        if engine == "sim":
            if draw(st.booleans()):
                profile["simulate_gpus"] = draw(st.booleans())
            if draw(st.booleans()):
                profile["sim"] = {
                    "tokens_per_second": draw(st.floats(0.5, 500)),
                    "load_seconds": draw(st.floats(0, 10)),
                }
    if draw(st.booleans()):
        profile["gpu"] = {
            "model": draw(st.sampled_from(["H100", "A100", "L4"])),
            "memory_gb": draw(st.integers(1, 192)),
        }
    profile["args"] = draw(safe_args)
    profile["env"] = draw(safe_env)
    if draw(st.booleans()):
        profile["load_timeout"] = draw(durations)
    return profile


@st.composite
def catalogs(draw: st.DrawFn) -> dict[str, Any]:
    model_names = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    models: dict[str, Any] = {}
    for name in model_names:
        model: dict[str, Any] = {
            "description": draw(text),
            "roles": draw(
                st.lists(
                    st.sampled_from(["chat", "completion", "embedding", "guard"]),
                    min_size=1,
                    max_size=3,
                    unique=True,
                )
            ),
            "profiles": draw(st.lists(profiles(), min_size=1, max_size=3)),
        }
        if draw(st.booleans()):
            low = draw(st.integers(0, 3))
            scaling: dict[str, Any] = {"min": low, "max": draw(st.integers(low, 6))}
            if draw(st.booleans()):
                scaling["idle_timeout"] = draw(durations)
            if draw(st.booleans()):
                scaling["target_in_flight"] = draw(st.floats(0.5, 100))
            model["scaling"] = scaling
        models[name] = model
    alias_names = draw(st.lists(names.filter(lambda n: n not in models), max_size=3, unique=True))
    aliases = {alias: draw(st.sampled_from(model_names)) for alias in alias_names}
    # Fallbacks only point to earlier models with a shared role: acyclic by construction.
    fallbacks: dict[str, list[str]] = {}
    for index, name in enumerate(model_names):
        candidates = [m for m in model_names[:index] if set(models[m]["roles"]) & set(models[name]["roles"])]
        if candidates and draw(st.booleans()):
            fallbacks[name] = draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True))
    guards = [m for m in model_names if "guard" in models[m]["roles"]]
    guard_policies: dict[str, Any] = {}
    if guards:
        judge = guards[0]
        screened = [m for m in model_names if m != judge]
        if screened:
            guard_policies["default"] = {
                "judge": judge,
                "models": draw(st.lists(st.sampled_from(screened), min_size=1, unique=True)),
                "on_error": draw(st.sampled_from(["block", "allow"])),
                "on_too_long": draw(st.sampled_from(["block", "split"])),
            }
    return {"models": models, "aliases": aliases, "fallbacks": fallbacks, "guard_policies": guard_policies}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catalogs())
def test_loaded_catalog_dumps_to_yaml_that_loads_to_the_same_catalog(
    test_policy: SecurityPolicy, data: dict[str, Any]
) -> None:
    first = load_catalog(yaml.safe_dump(data, allow_unicode=True), filename="gen.yaml", policy=test_policy)
    assert first.catalog is not None, [d.format() for d in first.errors]
    dumped = dump_catalog(first.catalog)
    second = load_catalog(dumped, filename="dumped.yaml", policy=test_policy)
    assert second.catalog is not None, [d.format() for d in second.errors]
    assert second.catalog == first.catalog
    assert dump_catalog(second.catalog) == dumped  # and the dump is stable
