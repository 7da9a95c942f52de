"""The example's guard judge fits the smallest card its profile places on.

vLLM refuses to start when one sequence of ``--max-model-len`` tokens does not fit
in the KV cache left after the weights ("... KV cache is needed, which is larger
than the available KV cache memory", ``vllm/v1/core/kv_cache_utils.py``,
``check_enough_kv_cache_memory`` in 0.10.2 and 0.11.0). The arithmetic, from
Llama-Guard-3-8B's ``config.json`` (the Llama 3.1 8B architecture): 32 layers,
8 key-value heads of 128 dimensions, bf16, so K and V take 2 x 32 x 8 x 128 x 2
bytes = 128 KiB a token; 8.03 billion parameters take 16.06 GB. vLLM takes
``--gpu-memory-utilization`` (0.9 by default) of the card; 2 GiB of that is left
for activations, CUDA graphs and the allocator's slack.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.core.catalog import SecurityPolicy, load_catalog

REPO = Path(__file__).resolve().parents[3]

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
WEIGHT_BYTES = 8_030_000_000 * 2
RUNTIME_RESERVE_BYTES = 2 * 2**30
DEFAULT_CONTEXT = 131_072  # max_position_embeddings of Llama 3.1


def needed_bytes(context: int) -> int:
    return WEIGHT_BYTES + context * KV_BYTES_PER_TOKEN + RUNTIME_RESERVE_BYTES


def option(args: tuple[str, ...], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_the_example_guard_profile_sets_a_context_its_gpu_holds(shipped_policy: SecurityPolicy) -> None:
    text = (REPO / "examples" / "catalog.yaml").read_text(encoding="utf-8")
    catalog = load_catalog(text, filename="examples/catalog.yaml", policy=shipped_policy).catalog
    assert catalog is not None
    [profile] = catalog.models["llama-guard-3-8b"].profiles
    assert profile.gpu is not None and profile.gpu.memory_gb is not None, "name the card the judge needs"
    context = int(option(profile.args, "--max-model-len") or DEFAULT_CONTEXT)
    utilisation = float(option(profile.args, "--gpu-memory-utilization") or 0.9)
    budget = utilisation * profile.gpu.memory_gb * 10**9
    assert needed_bytes(context) <= budget, (context, needed_bytes(context), budget)
    # Without the limit the default context does not fit the same card: what the example fixes.
    assert needed_bytes(DEFAULT_CONTEXT) > budget
