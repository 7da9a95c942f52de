"""Go's ``time.ParseDuration`` and ``time.Duration.String``, to the byte.

jobspec2 reads duration strings with the first; Consul reads and writes its check
and session durations with both, and Nomad's client writes its checks' with the
second, so the stand-ins use this module too (``llmgw.devcluster``).

Owns turning ``"1h30m"``, ``"1.5s"``, ``"-2m"`` into integer nanoseconds and
raising Go's own error text (``time: unknown unit "x" in duration "30x"``), and
nanoseconds back into Go's text (``"1m30s"``, ``"150ms"``, ``"1h0m0s"``).
Must not accept anything Go refuses (a bare ``"30"`` has no unit; ``"0"`` alone is fine).
"""

from __future__ import annotations

import json

_UNITS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}

_MAX = 1 << 63


class DurationError(ValueError):
    pass


def _quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def parse_go_duration(text: str) -> int:
    """Nanoseconds for a Go duration string; :class:`DurationError` carries Go's message."""
    orig = text
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    invalid = DurationError("time: invalid duration " + _quote(orig))
    if not s:
        raise invalid
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            raise invalid
        i = 0
        v = 0
        while i < len(s) and "0" <= s[i] <= "9":
            v = v * 10 + (ord(s[i]) - 48)
            if v >= _MAX:
                raise invalid
            i += 1
        pre = i > 0
        s = s[i:]
        f = 0
        scale = 1.0
        post = False
        if s and s[0] == ".":
            s = s[1:]
            j = 0
            overflow = False
            while j < len(s) and "0" <= s[j] <= "9":
                if not overflow:
                    if f > (_MAX - 1) // 10:
                        overflow = True
                    else:
                        f = f * 10 + (ord(s[j]) - 48)
                        scale *= 10
                j += 1
            post = j > 0
            s = s[j:]
        if not pre and not post:
            raise invalid
        k = 0
        while k < len(s) and not (s[k] == "." or "0" <= s[k] <= "9"):
            k += 1
        if k == 0:
            raise DurationError("time: missing unit in duration " + _quote(orig))
        unit_text = s[:k]
        s = s[k:]
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise DurationError("time: unknown unit " + _quote(unit_text) + " in duration " + _quote(orig))
        if v > _MAX // unit:
            raise invalid
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > _MAX:
                raise invalid
        total += v
        if total > _MAX:
            raise invalid
    if neg:
        return -total
    if total > _MAX - 1:
        raise invalid
    return total


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if frac == 0:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}.{str(frac).rjust(width, '0').rstrip('0')}"


def format_go_duration(ns: int) -> str:
    """``ns`` as Go's Duration.String writes it: "0s", "150ms", "10s", "1m30s", "1h0m0s"."""
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
