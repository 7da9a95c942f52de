"""Which file of a mirrored version `llama-server --model` is given."""

from __future__ import annotations

import pytest

from llmgw.core.mirror import SelectionError, gguf_to_load


@pytest.mark.parametrize(
    ("paths", "chosen"),
    [
        (["README.md", "model-q4_k_m.gguf"], "model-q4_k_m.gguf"),
        (["sub/model.gguf", "mmproj-model-f16.gguf"], "sub/model.gguf"),
        (
            ["m-00003-of-00003.gguf", "m-00001-of-00003.gguf", "m-00002-of-00003.gguf"],
            "m-00001-of-00003.gguf",
        ),
    ],
)
def test_the_single_model_or_the_first_part_of_a_split_one(paths: list[str], chosen: str) -> None:
    assert gguf_to_load(paths) == chosen


@pytest.mark.parametrize(
    ("paths", "words"),
    [
        (["config.json", "model.safetensors"], "holds no GGUF file"),
        (["mmproj-f16.gguf"], "holds no GGUF file"),
        (["a-q4.gguf", "a-q8.gguf"], "holds 2 GGUF models (a-q4.gguf, a-q8.gguf)"),
        (["m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "n.gguf"], "holds 2 GGUF models"),
        (["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"], "parts are missing: m-00002-of-00003.gguf"),
    ],
)
def test_no_ambiguous_or_incomplete_gguf_is_refused_naming_the_files(paths: list[str], words: str) -> None:
    with pytest.raises(SelectionError) as refused:
        gguf_to_load(paths)
    assert words in str(refused.value)
