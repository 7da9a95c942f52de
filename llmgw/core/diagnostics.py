"""Diagnostics: what a check found, where, and how bad, in the compiler's shape.

Owns the ``Diagnostic`` value and its two renderings (``FILE:LINE:COL: error:
PATH: message`` for people and editors, a dict for ``--format json``). It does
not decide what is wrong; the catalog rules do.

The text form goes to terminals and CI logs, and its file, path and message carry
catalog text (keys, values, a file name a pipeline chose): a character that is not
printable (C0 and C1 controls such as ESC and BEL, DEL, bidi overrides such as
U+202E, line separators, lone surrogates) is written as its escape (``\\x1b``,
``\\u202e``), so a hostile catalog cannot retitle a terminal, rewrite a log line or
reorder what is shown. The dict keeps the exact strings: JSON escapes them itself.
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
    NOTE = "note"  # what llmgw chose for the operator (a default), said so it can be checked


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
        """One line for a terminal: every character not printable is escaped (``printable``)."""
        line, column = (self.position.line, self.position.column) if self.position else (1, 1)
        where = printable(format_path(self.path))
        prefix = f"{where}: " if where else ""
        return f"{printable(self.file)}:{line}:{column}: {self.severity}: {prefix}{printable(self.message)}"

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
        elif _PLAIN_KEY.fullmatch(element):
            parts.append(f".{element}" if parts else element)
        else:
            escaped = element.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'["{escaped}"]')
    return "".join(parts)


def printable(text: str) -> str:
    """``text`` with every character Python does not call printable written as its escape
    (``\\x07``, ``\\x9b``, ``\\u202e``, ``\\ud800``); the ASCII space stays a space."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diagnostics)


def sort_diagnostics(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Source order, so a reader goes down the file once."""

    def key(d: Diagnostic) -> tuple[str, int, int, str]:
        pos = d.position or Position(0, 0)
        return (d.file, pos.line, pos.column, d.message)

    return sorted(diagnostics, key=key)
