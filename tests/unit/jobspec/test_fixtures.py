"""Whole jobspecs parse to the api.Job JSON jobspec2 returns, and every output is key-exact."""

from __future__ import annotations

import pytest

from llmgw.apispec import check_document
from llmgw.apispec.jobspec import parse_jobspec

from .fixtures import FIXTURES


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_parses_to_the_expected_job(name: str) -> None:
    text, expected = FIXTURES[name]
    assert parse_jobspec(text) == expected


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_output_is_key_exact_against_nomads_api(name: str) -> None:
    text, _ = FIXTURES[name]
    assert check_document(parse_jobspec(text), "Job") == []


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_canonicalized_output_is_key_exact_too(name: str) -> None:
    text, _ = FIXTURES[name]
    assert check_document(parse_jobspec(text, canonicalize=True), "Job") == []
