"""Diagnostics of the jobspec parser: where (file, line, column) and what, as HCL says it.

Owns the :class:`Diagnostic` value, the :class:`JobspecError` that carries a list of
them, and turning character offsets into 1-based lines and columns.
Must not parse or decode anything.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One error, positioned like HCL's ``hcl.Diagnostic`` subject start.

    ``summary`` and ``detail`` are HCL's own wording where jobspec2 has one
    (e.g. ``Unsupported argument`` / ``An argument named "foo" is not expected here.``).
    """

    filename: str
    line: int
    column: int
    summary: str
    detail: str = ""

    @property
    def message(self) -> str:
        return f"{self.summary}; {self.detail}" if self.detail else self.summary

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.column}: {self.message}"

    def nomad_text(self) -> str:
        """The line as Nomad's ``/v1/jobs/parse`` prints it (``input.hcl:3,5-8: ...``), start only."""
        return f"{self.filename}:{self.line},{self.column}: {self.message}"


class JobspecError(ValueError):
    """The jobspec did not parse or decode; ``diagnostics`` lists every problem found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        super().__init__("\n".join(str(d) for d in diagnostics))

    def nomad_text(self) -> str:
        """The error body a real Nomad answers with (one diagnostic a line)."""
        return "\n".join(d.nomad_text() for d in self.diagnostics)


class SourceMap:
    """Offsets to 1-based (line, column); columns count characters, as HCL counts graphemes."""

    __slots__ = ("_starts", "filename")

    def __init__(self, src: str, filename: str) -> None:
        self.filename = filename
        starts = [0]
        find = src.find
        i = find("\n")
        while i >= 0:
            starts.append(i + 1)
            i = find("\n", i + 1)
        self._starts = starts

    def position(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._starts, offset)
        return line, offset - self._starts[line - 1] + 1

    def diag(self, offset: int, summary: str, detail: str = "") -> Diagnostic:
        line, col = self.position(offset)
        return Diagnostic(self.filename, line, col, summary, detail)


class SyntaxProblem(Exception):
    """Raised inside the parser and evaluator; turned into a :class:`Diagnostic` at the edge."""

    def __init__(self, offset: int, summary: str, detail: str = "") -> None:
        self.offset = offset
        self.summary = summary
        self.detail = detail
        super().__init__(f"{summary}; {detail}")
