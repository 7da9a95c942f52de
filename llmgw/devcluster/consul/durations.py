"""Go duration strings as Consul reads and writes them ("10s", "1m30s", "1.5ms"), in seconds.

Owns only the unit: the stand-in's store counts seconds, Go counts nanoseconds.
The parsing and writing are Go's, in one place: ``llmgw.apispec.jobspec.goduration``.

Must not: know which field a duration belongs to.
"""

from __future__ import annotations

from llmgw.apispec.jobspec import goduration
from llmgw.apispec.jobspec.goduration import DurationError

__all__ = ["DurationError", "format_go_duration", "parse_go_duration"]


def parse_go_duration(text: str) -> float:
    """Seconds in ``text`` ("10s", "1m30s", "-1.5h", "0"), as Go's time.ParseDuration reads it."""
    return goduration.parse_go_duration(text) / 1e9


def format_go_duration(seconds: float) -> str:
    """``seconds`` as Go's Duration.String writes it: "0s", "150ms", "10s", "1m30s", "1h0m0s"."""
    return goduration.format_go_duration(round(seconds * 1e9))
