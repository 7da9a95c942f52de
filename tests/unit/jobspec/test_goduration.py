"""Go's duration text, read and written as Go does: the one implementation the parser and
both stand-ins use (Go's ``time`` package, ``ParseDuration`` and ``Duration.String``)."""

from __future__ import annotations

import pytest

from llmgw.apispec.jobspec.goduration import DurationError, format_go_duration, parse_go_duration

NS = 1_000_000_000


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1.5\u00b5s"),
        (150_000_000, "150ms"),
        (10 * NS, "10s"),
        (90 * NS, "1m30s"),
        (90 * NS + NS // 2, "1m30.5s"),
        (3600 * NS, "1h0m0s"),
        (-2 * 60 * NS, "-2m0s"),
    ],
)
def test_durations_are_written_as_go_writes_them_and_read_back(ns: int, text: str) -> None:
    assert format_go_duration(ns) == text
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("30", 'time: missing unit in duration "30"'),
        ("30x", 'time: unknown unit "x" in duration "30x"'),
        ("", 'time: invalid duration ""'),
        ("1.s.", 'time: invalid duration "1.s."'),
    ],
)
def test_what_go_refuses_is_refused_with_its_words(text: str, message: str) -> None:
    with pytest.raises(DurationError) as err:
        parse_go_duration(text)
    assert str(err.value) == message
