"""Benchmark: load and validate a generated catalog of 2,000 models.

Target (issue 2): under one second on the project's 2-core machine. Prints the
best of several runs of llmgw's full load (safe YAML read with positions, shape
validation, every rule, the security policy), next to a baseline measured in
the same run: PyYAML's plain ``safe_load`` (libyaml) of the same text, which
checks nothing.

    python bench/catalog_load.py [--models 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import load_catalog


def generate(models: int) -> str:
    lines = ["models:"]
    for i in range(models):
        engine = ("vllm", "sglang", "llamacpp", "sim")[i % 4]
        lines += [
            f"  model-{i:05d}:",
            f"    description: Generated model number {i}",
            "    roles: [chat, completion]",
            "    profiles:",
            f"      - engine: {engine}",
        ]
        if engine == "llamacpp":
            lines += [f"        source: https://example.org/models/m{i}.gguf", "        gpus_per_node: 2"]
        else:
            lines += [
                f"        source: org/model-{i}",
                "        tp: 8",
                "        nodes: 2" if i % 8 == 1 else "        nodes: 1",
                "        gpu: {model: H100, memory_gb: 80}",
            ]
        lines += [
            '        args: ["--max-model-len", "16384"]'
            if engine != "llamacpp"
            else '        args: ["--ctx-size", "8192"]',
            "        env: {NCCL_DEBUG: WARN, OMP_NUM_THREADS: 8}",
            f"    scaling: {{min: {i % 2}, max: 4, idle_timeout: 15m}}",
        ]
    lines.append("aliases:")
    lines += [f"  alias-{i:05d}: model-{i:05d}" for i in range(0, models, 10)]
    lines.append("fallbacks:")
    lines += [f"  model-{i:05d}: [model-{i - 1:05d}]" for i in range(1, models, 10)]
    return "\n".join(lines) + "\n"


def best_of(runs: int, action: object) -> float:
    assert callable(action)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--policy", type=Path, default=None, help="policy file (default: the bundled one)")
    args = parser.parse_args()
    text = generate(args.models)
    policy = read_security_policy(args.policy)
    result = load_catalog(text, filename="generated.yaml", policy=policy)
    assert result.catalog is not None, [d.format() for d in result.errors[:5]]
    assert len(result.catalog.models) == args.models

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    baseline = best_of(args.runs, lambda: yaml.load(text, Loader=loader))
    llmgw = best_of(args.runs, lambda: load_catalog(text, filename="generated.yaml", policy=policy))
    print(f"catalog: {args.models} models, {len(text) / 1e6:.2f} MB of YAML")
    print(f"baseline yaml safe_load (libyaml, no checks): {baseline * 1000:8.1f} ms")
    print(
        f"llmgw load_catalog (positions, shape, rules): {llmgw * 1000:8.1f} ms "
        f"({llmgw / baseline:.1f}x the baseline)"
    )
    print(f"target: under 1000 ms -> {'met' if llmgw < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
