"""Mirror references and the classification of `mirror add` sources."""

from __future__ import annotations

import pytest

from llmgw.core.mirror import (
    FileUrl,
    HubRepo,
    MirrorRefError,
    SourceError,
    is_mirror_source,
    parse_ref,
    parse_source,
    parse_sources,
)


@pytest.mark.parametrize(
    ("text", "name", "version"),
    [
        ("llama-8b@2024-07", "llama-8b", "2024-07"),
        ("mirror:llama-8b@v1", "llama-8b", "v1"),
        ("Qwen2.5_7B@abc123", "Qwen2.5_7B", "abc123"),
    ],
)
def test_parse_ref_accepts(text: str, name: str, version: str) -> None:
    ref = parse_ref(text)
    assert (ref.name, ref.version) == (name, version)
    assert ref.source == f"mirror:{name}@{version}"
    assert str(ref) == f"{name}@{version}"


@pytest.mark.parametrize(
    "text", ["llama", "llama@", "@v1", "../x@v1", "x@..", "a/b@v1", "x@v/1", ".hidden@v1"]
)
def test_parse_ref_refuses_what_cannot_be_a_directory(text: str) -> None:
    with pytest.raises(MirrorRefError):
        parse_ref(text)


def test_is_mirror_source() -> None:
    assert is_mirror_source("mirror:x@1")
    assert not is_mirror_source("meta-llama/Llama-3.1-8B-Instruct")


@pytest.mark.parametrize(
    ("url", "expected_in_message"),
    [
        (
            "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct",
            "write the repository id meta-llama/Llama-3.1-8B-Instruct",
        ),
        (
            "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/tree/main",
            "write the repository id meta-llama/Llama-3.1-8B-Instruct",
        ),
        ("https://huggingface.co/org/m/tree/v2.0", "write the repository id org/m with --revision v2.0"),
        (
            "https://huggingface.co/org/m/blob/main/m-Q4.gguf",
            "write the repository id org/m with --revision main --file m-Q4.gguf",
        ),
        ("https://hf.co/org/m", "write the repository id org/m"),
        ("https://huggingface.co/gpt2", "write the repository id gpt2"),
        ("https://huggingface.co/datasets/org/d", "not a model repository"),
    ],
)
def test_repository_pages_are_refused_with_the_id_to_write(url: str, expected_in_message: str) -> None:
    with pytest.raises(SourceError) as err:
        parse_source(url)
    assert expected_in_message in str(err.value)
    assert "repository page" in str(err.value) or "not a model" in str(err.value)


def test_the_configured_hub_host_is_treated_as_the_hub() -> None:
    with pytest.raises(SourceError, match="write the repository id org/m"):
        parse_source("http://127.0.0.1:8080/org/m", frozenset({"127.0.0.1:8080"}))
    assert parse_source("http://127.0.0.1:9999/org/m", frozenset({"127.0.0.1:8080"})) == FileUrl(
        "http://127.0.0.1:9999/org/m", "m"
    )


def test_hub_resolve_urls_and_other_urls_are_files() -> None:
    src = parse_source("https://huggingface.co/org/m/resolve/main/m-Q4_K_M.gguf")
    assert src == FileUrl("https://huggingface.co/org/m/resolve/main/m-Q4_K_M.gguf", "m-Q4_K_M.gguf")
    pinned = parse_source("https://example.com/f/x.gguf?sig=SECRET#sha256=" + "ab" * 32)
    assert isinstance(pinned, FileUrl)
    assert pinned.sha256 == "ab" * 32
    assert pinned.url == "https://example.com/f/x.gguf?sig=SECRET"
    assert pinned.describe() == "https://example.com/f/x.gguf"


@pytest.mark.parametrize("text", ["meta-llama/Llama-3.1-8B-Instruct", "gpt2", "Qwen/Qwen2.5-0.5B"])
def test_repo_ids(text: str) -> None:
    assert parse_source(text) == HubRepo(text)


@pytest.mark.parametrize("text", ["a/b/c", "ftp://x/y", "not a repo", "org/--x", "https://example.com/"])
def test_nonsense_is_refused(text: str) -> None:
    with pytest.raises(SourceError):
        parse_source(text)


def test_parse_sources_rules() -> None:
    assert len(parse_sources(["https://a/x.gguf", "https://b/y.gguf"])) == 2
    with pytest.raises(SourceError, match="not both"):
        parse_sources(["org/m", "https://a/x.gguf"])
    with pytest.raises(SourceError, match="same file name"):
        parse_sources(["https://a/x.gguf", "https://b/x.gguf"])
    with pytest.raises(SourceError):
        parse_sources([])


def test_versions_are_at_most_64_characters_like_the_catalog_says() -> None:
    assert parse_ref("m@" + "v" * 64).version == "v" * 64
    with pytest.raises(MirrorRefError, match="at most 64"):
        parse_ref("m@" + "v" * 65)
