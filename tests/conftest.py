"""Fixtures every test layer may use."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import SecurityPolicy

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.fixture(scope="session")
def test_policy() -> SecurityPolicy:
    """A small, stable policy for rule tests (the shipped one has tests of its own)."""
    return read_security_policy(TESTS / "fixtures" / "test-policy.yaml")


@pytest.fixture(scope="session")
def shipped_policy() -> SecurityPolicy:
    return read_security_policy()
