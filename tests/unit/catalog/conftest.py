from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from llmgw.core.catalog import LoadResult, SecurityPolicy, load_catalog
from llmgw.core.diagnostics import Diagnostic, format_path

Load = Callable[[str], LoadResult]


@pytest.fixture
def load(test_policy: SecurityPolicy) -> Load:
    def _load(text: str) -> LoadResult:
        return load_catalog(textwrap.dedent(text).lstrip("\n"), filename="catalog.yaml", policy=test_policy)

    return _load


def only(result: LoadResult, severity: str = "error") -> Diagnostic:
    """The single diagnostic of that severity; fails listing all of them otherwise."""
    found = [d for d in result.diagnostics if d.severity == severity]
    assert len(found) == 1, "\n".join(d.format() for d in result.diagnostics)
    return found[0]


def where(diagnostic: Diagnostic) -> tuple[int, str]:
    assert diagnostic.position is not None
    return diagnostic.position.line, format_path(diagnostic.path)
