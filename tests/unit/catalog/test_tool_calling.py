"""The tool-calling rules of a profile, as tables: family defaults (each name checked in the
release's own registry), the flags per engine and release, the check of a declared parser
against the release the image pins, and which requests need tool calling."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.apispec.engine_parsers import parser_registry
from llmgw.core.catalog import ClusterAllowlists, SecurityPolicy, load_catalog
from llmgw.core.catalog.allowlists import ClusterEngines
from llmgw.core.catalog.images import Release, tag_release
from llmgw.core.catalog.model import Engine, Profile, Role
from llmgw.core.catalog.tool_calling import (
    FAMILIES,
    family_of,
    model_calls_tools,
    needs_tool_calling,
    parser_refusals,
    registry_for,
    tool_call_args,
    tool_calling,
)
from llmgw.core.diagnostics import Severity

CHAT = (Role.CHAT,)
DEFAULT_IMAGES = {
    Engine.VLLM: "vllm/vllm-openai:v0.34.0",
    Engine.SGLANG: "lmsysorg/sglang:v0.5.23-cu129",
    Engine.LLAMACPP: "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434",
}


def _profile(**fields: Any) -> Profile:
    return Profile.model_validate(fields)


def test_the_vendored_registries_are_the_four_releases_read_from_their_wheels() -> None:
    assert sorted(parser_registry()) == [
        (Engine.SGLANG, "0.5.23"),
        (Engine.SGLANG, "0.5.3"),
        (Engine.VLLM, "0.11.0"),
        (Engine.VLLM, "0.34.0"),
    ]


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_every_family_default_is_registered_by_every_vendored_release_of_its_engine(family: Any) -> None:
    for (engine, release), parsers in parser_registry().items():
        if engine in family.tool_call:
            assert family.tool_call[engine] in parsers.tool_call, (family.name, engine, release)
        if engine in family.reasoning:
            assert family.reasoning[engine] in parsers.reasoning, (family.name, engine, release)


@pytest.mark.parametrize(
    ("source", "family"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama 3.x"),
        ("meta-llama/Llama-3.3-70B-Instruct", "Llama 3.x"),
        ("meta-llama/Llama-Guard-3-8B", "Llama Guard"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5"),
        ("https://huggingface.co/Qwen/Qwen2.5-7B-Instruct-GGUF/resolve/main/q.gguf", "Qwen2.5"),
        ("Qwen/Qwen3-30B-A3B", "Qwen3"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mistral"),
        ("deepseek-ai/DeepSeek-V3", "DeepSeek V3"),
        ("deepseek-ai/DeepSeek-R1", "DeepSeek R1"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "DeepSeek R1 distill"),
        ("openai/gpt-oss-20b", "gpt-oss"),
        ("BAAI/bge-m3", None),
        ("mirror:m@v1", None),
    ],
)
def test_the_family_of_a_source(source: str, family: str | None) -> None:
    found = family_of(source)
    assert (found.name if found else None) == family


def test_flags_per_engine() -> None:
    vllm = _profile(engine="vllm", source="meta-llama/Llama-3.1-8B-Instruct")
    assert tool_call_args(vllm, CHAT, Release((0, 34, 0, 0))) == (
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "llama3_json",
    )
    sglang = _profile(engine="sglang", source="Qwen/Qwen3-8B")
    assert tool_call_args(sglang, CHAT, Release((0, 5, 23, 0))) == (
        "--tool-call-parser",
        "qwen25",
        "--reasoning-parser",
        "qwen3",
    )
    gguf = _profile(engine="llamacpp", source="https://h.example/m.gguf")
    assert tool_call_args(gguf, CHAT, tag_release(Engine.LLAMACPP, "server-cuda-b6795")) == ("--jinja",)
    assert tool_call_args(gguf, CHAT, tag_release(Engine.LLAMACPP, "server-cuda-b11434")) == ()
    assert tool_call_args(gguf, CHAT, None) == ("--jinja",)  # a trusted digest: harmless either way
    reasoning = _profile(engine="llamacpp", source="https://h.example/m.gguf", reasoning_parser="deepseek")
    assert tool_call_args(reasoning, CHAT, tag_release(Engine.LLAMACPP, "server-b11434")) == (
        "--reasoning-format",
        "deepseek",
    )
    assert tool_call_args(vllm, (Role.EMBEDDING,), Release((0, 34, 0, 0))) == ()
    assert tool_call_args(_profile(engine="sim"), CHAT, None) == ()


def test_whether_a_model_can_call_tools() -> None:
    assert tool_calling(_profile(engine="vllm", source="Qwen/Qwen2.5-7B-Instruct"), CHAT).can_call_tools
    assert not tool_calling(_profile(engine="vllm", source="org/m"), CHAT).can_call_tools
    assert tool_calling(
        _profile(engine="vllm", source="org/m", args=["--tool-call-parser", "hermes"]), CHAT
    ).can_call_tools
    assert tool_calling(_profile(engine="llamacpp", source="https://h.example/m.gguf"), CHAT).can_call_tools
    assert not tool_calling(_profile(engine="sim", tool_call_parser="none"), CHAT).can_call_tools
    # Every profile must: the router may send the request to any of them.
    capable, incapable = _profile(engine="sim"), _profile(engine="sglang", source="org/m")
    assert model_calls_tools((capable,), CHAT)
    assert not model_calls_tools((capable, incapable), CHAT)


def test_registry_between_two_vendored_releases_is_what_both_register() -> None:
    registry = parser_registry()
    between = registry_for(Engine.SGLANG, Release((0, 5, 10, 0)), registry)
    assert between is not None
    assert "qwen25" in between.tool_call and "hermes" not in between.tool_call  # 0.5.23 only
    newer = registry_for(Engine.VLLM, Release((0, 40, 0, 0)), registry)
    assert newer == registry[(Engine.VLLM, "0.34.0")]
    assert registry_for(Engine.VLLM, Release((0, 10, 0, 0)), registry) is None


@pytest.mark.parametrize(
    ("fields", "release", "refused"),
    [
        ({"engine": "vllm", "tool_call_parser": "qwen3_json"}, (0, 11, 0, 0), "tool_call_parser"),
        ({"engine": "vllm", "tool_call_parser": "qwen3_json"}, (0, 34, 0, 0), None),
        ({"engine": "sglang", "tool_call_parser": "hermes"}, (0, 5, 3, 0), "tool_call_parser"),
        ({"engine": "sglang", "tool_call_parser": "hermes"}, (0, 5, 23, 0), None),
        (
            {"engine": "sglang", "reasoning_parser": "deepseek_r1"},
            (0, 5, 23, 0),
            "reasoning_parser",
        ),  # vLLM's spelling
        ({"engine": "vllm", "tool_call_parser": "none"}, (0, 11, 0, 0), None),
    ],
)
def test_a_declared_parser_is_checked_against_the_release(
    fields: dict[str, Any], release: tuple[int, ...], refused: str | None
) -> None:
    profile = _profile(source="org/m", **fields)
    found = [key for key, _ in parser_refusals(profile, CHAT, Release(release), parser_registry())]
    assert found == ([refused] if refused else [])


def test_llama_cpp_and_the_sim_take_no_parser_name() -> None:
    gguf = _profile(engine="llamacpp", source="https://h.example/m.gguf", tool_call_parser="hermes")
    assert [key for key, _ in parser_refusals(gguf, CHAT, None, {})] == ["tool_call_parser"]
    bad_format = _profile(engine="llamacpp", source="https://h.example/m.gguf", reasoning_parser="qwen3")
    assert [key for key, _ in parser_refusals(bad_format, CHAT, None, {})] == ["reasoning_parser"]
    assert [
        key for key, _ in parser_refusals(_profile(engine="sim", tool_call_parser="x"), CHAT, None, {})
    ] == ["tool_call_parser"]


def test_catalog_check_reports_the_default_as_a_note_and_a_parser_the_release_lacks_as_an_error(
    shipped_policy: SecurityPolicy,
) -> None:
    text = """
models:
  llama:
    profiles: [{engine: vllm, source: meta-llama/Llama-3.1-8B-Instruct}]
  odd:
    profiles: [{engine: sglang, source: org/m}]
  old:
    profiles: [{engine: vllm, source: org/m, image: "vllm/vllm-openai:v0.11.0", tool_call_parser: qwen3_json}]
"""
    engines = ClusterEngines(DEFAULT_IMAGES, parser_registry())
    allowlists = ClusterAllowlists(
        ("docker.io/vllm/vllm-openai", "docker.io/lmsysorg/sglang"), engines=engines
    )
    loaded = load_catalog(text, filename="c.yaml", policy=shipped_policy, allowlists=allowlists)
    by_path = {(d.path, d.severity): d.message for d in loaded.diagnostics}
    llama = by_path[(("models", "llama", "profiles", 0, "engine"), Severity.NOTE)]
    assert "llama3_json (the default for Llama 3.x)" in llama
    odd = by_path[(("models", "odd", "profiles", 0, "engine"), Severity.NOTE)]
    assert "requests with tools are answered 400" in odd
    old = by_path[(("models", "old", "profiles", 0, "tool_call_parser"), Severity.ERROR)]
    assert "vllm 0.11.0 registers no tool-call-parser 'qwen3_json'" in old
    assert loaded.catalog is None  # the error refuses the catalog


@pytest.mark.parametrize(
    ("body", "needs"),
    [
        ({}, False),
        ({"tools": []}, False),
        ({"tools": [], "tool_choice": "auto"}, False),
        ({"tool_choice": "none"}, False),
        ({"tool_choice": {"type": "auto"}}, False),  # Anthropic's
        ({"tools": [{"type": "function"}]}, True),
        ({"tools": [{"type": "function"}], "tool_choice": "none"}, True),
        ({"tool_choice": "required"}, True),
        ({"tool_choice": {"type": "any"}}, True),  # Anthropic's
        ({"tool_choice": {"type": "function", "name": "f"}}, True),  # Responses'
        ({"tools": "not a list"}, False),  # the engine's own 400
    ],
)
def test_which_requests_need_tool_calling(body: dict[str, Any], needs: bool) -> None:
    assert needs_tool_calling(body) is needs
