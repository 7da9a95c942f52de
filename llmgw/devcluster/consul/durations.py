"""Go duration strings as Consul reads and writes them ("10s", "1m30s", "1.5ms").

Owns :func:`parse_go_duration` (Go's ``time.ParseDuration``) and
:func:`format_go_duration` (Go's ``time.Duration.String``), both in seconds.

Must not: know which field a duration belongs to.
"""

from __future__ import annotations

import re

_UNIT_NS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)([a-zA-Z\u00b5\u03bc]+)")


class DurationError(ValueError):
    """The text is not a Go duration; the message is Go's."""


def parse_go_duration(text: str) -> float:
    """Seconds in ``text`` ("10s", "1m30s", "-1.5h", "0"), as Go's time.ParseDuration reads it."""
    s = text
    sign = 1.0
    if s[:1] in ("-", "+"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise DurationError(f'time: invalid duration "{text}"')
    total_ns = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            if re.fullmatch(r"\d+\.?\d*|\.\d+", s[pos:]):
                raise DurationError(f'time: missing unit in duration "{text}"')
            raise DurationError(f'time: invalid duration "{text}"')
        number, unit = m.groups()
        if unit not in _UNIT_NS:
            raise DurationError(f'time: unknown unit "{unit}" in duration "{text}"')
        total_ns += float(number) * _UNIT_NS[unit]
        pos = m.end()
    return sign * total_ns / 1e9


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if frac == 0:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}.{str(frac).rjust(width, '0').rstrip('0')}"


def format_go_duration(seconds: float) -> str:
    """``seconds`` as Go's Duration.String writes it: "0s", "150ms", "10s", "1m30s", "1h0m0s"."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_decimal(u, 1_000)}\u00b5s"
    if u < 1_000_000_000:
        return f"{sign}{_decimal(u, 1_000_000)}ms"
    hours, rest = divmod(u, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    secs = _decimal(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return f"{sign}{secs}"
