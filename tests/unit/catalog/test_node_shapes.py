"""A profile's GPUs per node against the largest nodes of the cluster (``LLMGW_NODE_GPUS``).

Each engine puts tp × pp / nodes ranks, one GPU each, on every node of a replica (vLLM
0.34.0's local world size, SGLang 0.5.23's ranks per node; llama.cpp its gpus_per_node
on its one node): more than the largest matching node has is never placed.
"""

from __future__ import annotations

import textwrap

import pytest

from llmgw.core.catalog import ClusterAllowlists, SecurityPolicy, load_catalog
from llmgw.core.catalog.node_shapes import NodeGpus, parse_node_gpus
from llmgw.core.diagnostics import format_path

H100_8 = (NodeGpus("H100", 8), NodeGpus("L4", 4))


def check(
    policy: SecurityPolicy, text: str, shapes: tuple[NodeGpus, ...] = H100_8
) -> list[tuple[str, str, str]]:
    result = load_catalog(
        textwrap.dedent(text).lstrip("\n"),
        filename="c.yaml",
        policy=policy,
        allowlists=ClusterAllowlists(images=("vllm/", "ghcr.io/"), node_gpus=shapes),
    )
    return [
        (str(d.severity), format_path(d.path), d.message)
        for d in result.diagnostics
        if str(d.severity) != "note"
    ]


def profile(body: str) -> str:
    return "models:\n  m:\n    profiles:\n" + textwrap.indent(textwrap.dedent(body), "      ")


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        ("- {engine: vllm, source: org/m, tp: 12, gpu: {model: H100}}", "models.m.profiles[0].tp",
         "write nodes: 2 (6 GPUs on each)"),
        ("- {engine: sglang, source: org/m, tp: 4, pp: 4, nodes: 1, gpu: {model: H100}}",
         "models.m.profiles[0].nodes", "16 GPUs puts 16 on one node"),
        ("- {engine: vllm, source: org/m, tp: 8, gpu: {model: L4}}", "models.m.profiles[0].tp",
         "the largest node with L4 has 4 GPUs"),
        ("- {engine: vllm, source: org/m, tp: 32, nodes: 2}", "models.m.profiles[0].nodes",
         "puts 16 on each of 2 nodes"),
        ("- {engine: vllm, source: org/m, tp: 2, gpu: {model: A100}}", "models.m.profiles[0].gpu",
         "no node has A100 GPUs"),
        ("- {engine: llamacpp, source: 'https://example.com/m.gguf', gpus_per_node: 9}",
         "models.m.profiles[0].gpus_per_node", "write gpus_per_node: 8 or fewer"),
        ("- {engine: sim, tp: 16}", "models.m.profiles[0].tp", "write nodes: 2 (8 GPUs on each)"),
    ],
)  # fmt: skip
def test_a_shape_no_node_holds_is_refused_with_what_to_write(
    test_policy: SecurityPolicy, body: str, path: str, words: str
) -> None:
    found = check(test_policy, profile(body))
    assert [(severity, where) for severity, where, _ in found] == [("error", path)], found
    assert words in found[0][2]


@pytest.mark.parametrize(
    "body",
    [
        "- {engine: vllm, source: org/m, tp: 8, gpu: {model: h100}}",  # any case, as the device constraint
        "- {engine: vllm, source: org/m, tp: 16, nodes: 2, gpu: {model: H100}}",
        "- {engine: vllm, source: org/m, tp: 8}",  # no GPU model: the largest node of any
        "- {engine: llamacpp, source: 'https://example.com/m.gguf', gpus_per_node: 0}",  # CPU only
        "- {engine: sim, tp: 64, simulate_gpus: false}",  # asks Nomad for no GPU
    ],
)
def test_a_shape_some_node_holds_passes(test_policy: SecurityPolicy, body: str) -> None:
    assert check(test_policy, profile(body)) == []


def test_without_node_shapes_nothing_is_checked(test_policy: SecurityPolicy) -> None:
    assert check(test_policy, profile("- {engine: vllm, source: org/m, tp: 64}"), shapes=()) == []


def test_a_profile_no_node_holds_is_a_warning_while_another_fits(test_policy: SecurityPolicy) -> None:
    found = check(
        test_policy,
        profile(
            """
            - {engine: vllm, source: org/m, tp: 8, gpu: {model: A100}}
            - {engine: vllm, source: org/m, tp: 8, gpu: {model: H100}}
            """
        ),
    )
    assert [(s, p) for s, p, _ in found] == [("warning", "models.m.profiles[0].gpu")]
    assert found[0][2].startswith("never placed on this cluster: no node has A100 GPUs")


@pytest.mark.parametrize("text", ["H100", "H100=x", "=8", "H100=65", "8;L4=4", "a${x}=8"])
def test_a_setting_of_another_form_is_refused_naming_the_entry(text: str) -> None:
    with pytest.raises(ValueError, match="is not MODEL=COUNT or COUNT"):
        parse_node_gpus(text)


def test_the_setting_reads_models_and_a_bare_count() -> None:
    assert parse_node_gpus(" H100=8, L4=4 ,,16") == (NodeGpus("H100", 8), NodeGpus("L4", 4), NodeGpus("", 16))
