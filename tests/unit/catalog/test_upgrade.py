"""`llmgw catalog upgrade` writes the loader's repairs back, keeping comments and order."""

from __future__ import annotations

import textwrap

from llmgw.core.catalog import SecurityPolicy, load_catalog, upgrade_catalog
from llmgw.core.diagnostics import Severity

LEGACY = textwrap.dedent("""\
    # Our catalog. Reviewed by the platform team.
    models:
      qwen:  # the small one
        profiles:
          - engine: llamacpp
            source: "https://example.org/q.gguf"
            tp: 2  # two GPUs
            args: ["--ctx-size", "8192"]
        scaling: {min: 0, max: 1}
      llama:
        profiles:
          - engine: vllm
            source: https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/tree/main
    aliases:
      mini: qwen   # cheap
    """)


def test_upgrade_rewrites_legacy_spellings_and_keeps_everything_else(test_policy: SecurityPolicy) -> None:
    result = upgrade_catalog(LEGACY, filename="c.yaml", policy=test_policy)
    assert [c.description for c in result.changes] == [
        "tp: 2 -> gpus_per_node: 2",
        "source https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/tree/main"
        " -> meta-llama/Llama-3.1-8B-Instruct",
    ]
    assert result.text == LEGACY.replace("tp: 2  # two GPUs", "gpus_per_node: 2 # two GPUs").replace(
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/tree/main",
        "meta-llama/Llama-3.1-8B-Instruct",
    )
    again = load_catalog(result.text, filename="c.yaml", policy=test_policy)
    # Only the notes of what llmgw chose (the tool-call parser of its family) remain.
    assert again.ok and not again.repairs
    assert [d.severity for d in again.diagnostics] == [Severity.NOTE] * len(again.diagnostics)
    assert again.catalog == result.load.catalog


def test_upgrade_of_a_current_catalog_changes_nothing(test_policy: SecurityPolicy) -> None:
    text = "models:\n  m: {profiles: [{engine: sim}]}  # keep me\n"
    result = upgrade_catalog(text, filename="c.yaml", policy=test_policy)
    assert result.changes == ()
    assert result.text == text
