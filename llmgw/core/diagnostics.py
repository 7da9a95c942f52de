"""Diagnostics: what a check found, where, and how bad, in the compiler's shape.

Owns the ``Diagnostic`` value and its two renderings (``FILE:LINE:COL: error:
PATH: message`` for people and editors, a dict for ``--format json``). It does
not decide what is wrong; the catalog rules do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

# A YAML path: mapping keys are strings, sequence indexes are ints.
YamlPath = tuple[str | int, ...]

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Position:
    """1-based line and column, as editors count them."""

    line: int
    column: int


@dataclass(frozen=True, slots=True)
class Diagnostic:
    severity: Severity
    path: YamlPath
    message: str
    file: str = "<catalog>"
    position: Position | None = None

    def format(self) -> str:
        line, column = (self.position.line, self.position.column) if self.position else (1, 1)
        where = format_path(self.path)
        prefix = f"{where}: " if where else ""
        return f"{self.file}:{line}:{column}: {self.severity}: {prefix}{self.message}"

    def as_dict(self) -> dict[str, str | int]:
        line, column = (self.position.line, self.position.column) if self.position else (1, 1)
        return {
            "file": self.file,
            "line": line,
            "column": column,
            "path": format_path(self.path),
            "severity": str(self.severity),
            "message": self.message,
        }


def format_path(path: YamlPath) -> str:
    """Render a path the way jq and yq write it: ``models["llama-3.1-8b"].profiles[0].tp``.

    Keys that are not plain identifiers are quoted, since model names carry dots
    and slashes that would make a dotted path ambiguous.
    """
    parts: list[str] = []
    for element in path:
        if isinstance(element, int):
            parts.append(f"[{element}]")
        elif _PLAIN_KEY.match(element):
            parts.append(f".{element}" if parts else element)
        else:
            escaped = element.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'["{escaped}"]')
    return "".join(parts)


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diagnostics)


def sort_diagnostics(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Source order, so a reader goes down the file once."""

    def key(d: Diagnostic) -> tuple[str, int, int, str]:
        pos = d.position or Position(0, 0)
        return (d.file, pos.line, pos.column, d.message)

    return sorted(diagnostics, key=key)
