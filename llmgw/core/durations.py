"""Durations as operators write them in the catalog (``30s``, ``15m``, ``2h`` or
integer seconds), and instants as llmgw shows them (RFC 3339, UTC)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_DURATION = re.compile(r"^(\d+)(s|m|h)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}

DURATION_HINT = "a duration like 30s, 15m, 2h or a whole number of seconds"


def parse_duration(value: object) -> int:
    """Seconds, or ValueError with a message that says what to write."""
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HINT}, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected {DURATION_HINT}, got a negative number {value}")
        return value
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match:
            return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    raise ValueError(f"expected {DURATION_HINT}, got {value!r}")


def format_duration(seconds: int) -> str:
    """The shortest exact spelling: 7200 -> ``2h``, 90 -> ``90s``."""
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def format_utc(unix_seconds: float) -> str:
    """Unix seconds as an RFC 3339 UTC time to the second: ``2026-11-30T00:53:20Z``."""
    return datetime.fromtimestamp(unix_seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
