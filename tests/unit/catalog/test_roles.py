"""A model's roles reach its engine's flags, and `catalog check` warns where args say otherwise."""

from __future__ import annotations

import textwrap

import pytest

from llmgw.core.catalog import LoadResult, SecurityPolicy, load_catalog
from llmgw.core.diagnostics import format_path


def check(policy: SecurityPolicy, text: str) -> LoadResult:
    return load_catalog(textwrap.dedent(text).lstrip("\n"), filename="catalog.yaml", policy=policy)


def warnings(result: LoadResult) -> list[tuple[int, str, str]]:
    return [
        (d.position.line if d.position else 0, format_path(d.path), d.message)
        for d in result.diagnostics
        if d.severity == "warning"
    ]


@pytest.mark.parametrize(
    ("engine", "source", "arg"),
    [
        ("llamacpp", "https://example.com/m.gguf", '"--embeddings"'),
        ("llamacpp", "https://example.com/m.gguf", '"--embedding"'),
        ("sglang", "org/chat", '"--is-embedding"'),
        ("sglang", "org/chat", '"--is_embedding"'),
        ("vllm", "org/chat", '"--runner", "pooling"'),
        ("vllm", "org/chat", '"--runner=pooling"'),
        ("vllm", "org/chat", '"--task", "embed"'),
        ("vllm", "org/chat", '"--convert", "embed"'),
    ],
)
def test_an_embedding_flag_on_a_chat_model_is_a_warning_at_the_arg(
    shipped_policy: SecurityPolicy, engine: str, source: str, arg: str
) -> None:
    result = check(
        shipped_policy,
        f"""
        models:
          m:
            roles: [chat]
            profiles:
              - engine: {engine}
                source: {source}
                args: ["--seed", "1", {arg}]
        """,
    )
    assert result.ok
    [(line, path, message)] = warnings(result)
    assert (line, path) == (7, "models.m.profiles[0].args[2]")
    assert "embeddings only" in message and "chat" in message and "roles: [embedding]" in message


def test_a_generation_runner_on_an_embedding_model_is_a_warning(shipped_policy: SecurityPolicy) -> None:
    result = check(
        shipped_policy,
        """
        models:
          e:
            roles: [embedding]
            profiles: [{engine: vllm, source: org/embed, args: ["--runner", "generate"]}]
        """,
    )
    [(_, path, message)] = warnings(result)
    assert path == "models.e.profiles[0].args[0]"
    assert "--runner generate starts vllm for generation" in message and "--runner pooling" in message


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_embedding_mixed_with_chat_on_one_engine_is_a_warning(
    shipped_policy: SecurityPolicy, engine: str
) -> None:
    result = check(
        shipped_policy,
        f"""
        models:
          m:
            roles: [chat, embedding]
            profiles: [{{engine: {engine}, source: org/m}}, {{engine: sim}}]
        """,
    )
    # The sim serves every endpoint: only the real engine's profile is warned about.
    [(_, path, message)] = warnings(result)
    assert path == "models.m.profiles[0].engine"
    assert "not both" in message and "a model of its own" in message


def test_roles_and_args_that_agree_are_silent(shipped_policy: SecurityPolicy) -> None:
    result = check(
        shipped_policy,
        """
        models:
          e:
            roles: [embedding]
            profiles: [{engine: llamacpp, source: "https://example.com/e.gguf", args: ["--embeddings"]}]
          c:
            roles: [chat, guard]
            profiles: [{engine: vllm, source: org/c, args: ["--max-model-len", "8192"]}]
        """,
    )
    assert result.ok and warnings(result) == []
