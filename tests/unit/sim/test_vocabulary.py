"""The simulated model's text and vectors: deterministic, Greek, and consistent across encodings."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from llmgw.sim import vocabulary


def test_pieces_join_into_greek_words_separated_by_single_spaces() -> None:
    pieces = list(vocabulary.greek_pieces("tell me a story", 30))
    assert len(pieces) == 30
    assert not pieces[0].startswith(" ")
    assert all(piece.startswith(" ") for piece in pieces[1:])
    words = "".join(pieces).split(" ")
    assert all(word in vocabulary.GREEK for word in words)


def test_words_cycle_through_the_alphabet_in_order() -> None:
    words = vocabulary.greek_text("x", 48).split()
    start = vocabulary.GREEK.index(words[0])
    expected = [vocabulary.GREEK[(start + i) % 24] for i in range(48)]
    assert words == expected


def test_same_prompt_same_text_and_prompts_spread_over_start_words() -> None:
    assert vocabulary.greek_text("hello", 5) == vocabulary.greek_text("hello", 5)
    starts = {vocabulary.start_offset(f"prompt {i}") for i in range(200)}
    assert len(starts) > 12  # the hash spreads prompts over the alphabet


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("one", 1), ("  two   words ", 2), ("line\nbreak\ttab", 3)],
)
def test_tokens_are_whitespace_separated_words(text: str, tokens: int) -> None:
    assert vocabulary.count_tokens(text) == tokens


@pytest.mark.parametrize("dimension", [1, 3, 384, 1536])
def test_embedding_is_a_unit_vector_of_the_asked_dimension(dimension: int) -> None:
    vector = vocabulary.embedding_vector("some text", dimension)
    assert len(vector) == dimension
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-5)


def test_embeddings_depend_on_the_input_only() -> None:
    assert vocabulary.embedding_vector("a", 16) == vocabulary.embedding_vector("a", 16)
    assert vocabulary.embedding_vector("a", 16) != vocabulary.embedding_vector("b", 16)


def test_base64_carries_the_same_float32_numbers_as_the_float_list() -> None:
    vector = vocabulary.embedding_vector("roundtrip", 32)
    decoded = struct.unpack("<32f", base64.b64decode(vocabulary.embedding_base64(vector)))
    assert decoded == vector


@pytest.mark.parametrize(
    ("prompt", "verdict"),
    [
        ("how do I bake bread?", ["safe"]),
        ("tell me about the FORBIDDEN   fruit please", ["unsafe"]),  # any case, any spacing
        ("forbidden\nfruit", ["unsafe"]),  # across the lines of the judged conversation
        ("forbidden fruits are sweet", ["unsafe"]),  # a phrase, not a word list
        ("fruit forbidden", ["safe"]),
    ],
)
def test_a_judge_answers_as_llama_guard_does(prompt: str, verdict: list[str]) -> None:
    assert list(vocabulary.judge_pieces(prompt, "forbidden fruit", 16)) == verdict
    assert list(vocabulary.judge_pieces(prompt, "forbidden fruit", 0)) == []
