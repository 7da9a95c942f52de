"""Choosing what an engine needs from a repository listing."""

from __future__ import annotations

import json

import pytest

from llmgw.core.mirror import RepoFile, SelectionError, index_path, select_files, shards_of_index

SHA = "a" * 64


def listing(*paths: str) -> list[RepoFile]:
    return [RepoFile(p, 10, SHA if p.endswith((".safetensors", ".gguf")) else None) for p in paths]


LLAMA = listing(
    ".gitattributes",
    "LICENSE",
    "README.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
INDEX = json.dumps(
    {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
)


def test_sharded_safetensors_takes_index_shards_and_support_files_only() -> None:
    assert index_path(LLAMA) == "model.safetensors.index.json"
    sel = select_files(LLAMA, index_shards=shards_of_index(INDEX))
    assert [f.path for f in sel.files] == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sel.index_shards == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert sel.kind == "safetensors"
    shard = next(f for f in sel.files if f.path.endswith(".safetensors"))
    assert shard.sha256 == SHA and shard.size == 10


def test_an_index_naming_a_missing_shard_is_refused() -> None:
    index = json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00003.safetensors"}}
    )
    with pytest.raises(SelectionError, match=r"model-00003\.safetensors"):
        select_files(LLAMA, index_shards=shards_of_index(index))


def test_the_index_must_be_read_first() -> None:
    with pytest.raises(SelectionError, match=r"read model\.safetensors\.index\.json first"):
        select_files(LLAMA)


@pytest.mark.parametrize("text", ["not json", "{}", '{"weight_map": {}}', '{"weight_map": {"a": 1}}'])
def test_bad_indexes(text: str) -> None:
    with pytest.raises(SelectionError):
        shards_of_index(text)


def test_single_safetensors() -> None:
    sel = select_files(listing("config.json", "model.safetensors", "tokenizer.json", "README.md"))
    assert [f.path for f in sel.files] == ["config.json", "model.safetensors", "tokenizer.json"]


GGUF_REPO = listing(
    "README.md",
    "m-Q4_K_M.gguf",
    "m-Q8_0.gguf",
    "big-Q8_0-00001-of-00002.gguf",
    "big-Q8_0-00002-of-00002.gguf",
)


def test_gguf_repo_needs_a_choice() -> None:
    with pytest.raises(SelectionError, match=r"pick one with --file NAME\.gguf: big-Q8_0-00001"):
        select_files(GGUF_REPO)


def test_gguf_by_name_and_glob() -> None:
    assert [f.path for f in select_files(GGUF_REPO, patterns=["m-Q4_K_M.gguf"]).files] == ["m-Q4_K_M.gguf"]
    assert [f.path for f in select_files(GGUF_REPO, patterns=["*Q4_K_M*"]).files] == ["m-Q4_K_M.gguf"]
    assert index_path(GGUF_REPO, ["*.gguf"]) is None


def test_a_split_gguf_brings_all_its_parts() -> None:
    sel = select_files(GGUF_REPO, patterns=["big-Q8_0-00001-of-00002.gguf"])
    assert [f.path for f in sel.files] == ["big-Q8_0-00001-of-00002.gguf", "big-Q8_0-00002-of-00002.gguf"]
    with pytest.raises(SelectionError, match="parts are missing"):
        select_files(listing("x-00001-of-00003.gguf"), patterns=["x-00001-of-00003.gguf"])


def test_a_pattern_matching_nothing_lists_candidates() -> None:
    with pytest.raises(SelectionError, match=r"matches no file.*m-Q4_K_M\.gguf"):
        select_files(GGUF_REPO, patterns=["*Q2*"])


def test_pickled_weights_are_refused() -> None:
    with pytest.raises(SelectionError, match="only safetensors and GGUF"):
        select_files(listing("config.json", "pytorch_model.bin"))


def test_safetensors_without_config_is_refused() -> None:
    with pytest.raises(SelectionError, match=r"no config\.json"):
        select_files(listing("model.safetensors"))
