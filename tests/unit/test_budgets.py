"""Token budgets' periods and decisions, on plain values (no clock: each case gives ``now``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmgw.core.budgets import (
    BudgetPeriod,
    BudgetWindow,
    PeriodKind,
    budget_decision,
    budget_fields,
    budget_window,
    parse_budget_period,
)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def window(start: str, end: str | None) -> BudgetWindow:
    return BudgetWindow(int(at(start)), None if end is None else int(at(end)))


CREATED = at("2026-03-10T15:30:00")


@pytest.mark.parametrize(
    ("period", "now", "expected"),
    [
        ("daily", "2026-12-04T20:05:00", window("2026-12-04T00:00:00", "2026-12-05T00:00:00")),
        ("daily", "2026-12-04T00:00:00", window("2026-12-04T00:00:00", "2026-12-05T00:00:00")),
        ("daily", "2026-12-04T23:59:59.999", window("2026-12-04T00:00:00", "2026-12-05T00:00:00")),
        # 2026-12-04 is a Friday: the week began on Monday the 30th of November.
        ("weekly", "2026-12-04T20:05:00", window("2026-11-30T00:00:00", "2026-12-07T00:00:00")),
        ("weekly", "2026-12-07T00:00:00", window("2026-12-07T00:00:00", "2026-12-14T00:00:00")),
        ("monthly", "2026-12-04T20:05:00", window("2026-12-01T00:00:00", "2027-01-01T00:00:00")),
        ("monthly", "2027-01-01T00:00:00", window("2027-01-01T00:00:00", "2027-02-01T00:00:00")),
        ("monthly", "2028-02-29T12:00:00", window("2028-02-01T00:00:00", "2028-03-01T00:00:00")),
        ("monthly", "2026-12-31T23:59:59", window("2026-12-01T00:00:00", "2027-01-01T00:00:00")),
        # Fixed lengths count from the key's creation, whatever the calendar.
        ("30d", "2026-03-10T15:30:00", window("2026-03-10T15:30:00", "2026-04-09T15:30:00")),
        ("30d", "2026-04-09T15:29:59", window("2026-03-10T15:30:00", "2026-04-09T15:30:00")),
        ("30d", "2026-04-09T15:30:00", window("2026-04-09T15:30:00", "2026-05-09T15:30:00")),
        ("12h", "2026-03-11T04:00:00", window("2026-03-11T03:30:00", "2026-03-11T15:30:00")),
        # A router whose clock is behind the key's creation: the first period.
        ("30d", "2026-03-10T15:00:00", window("2026-03-10T15:30:00", "2026-04-09T15:30:00")),
        ("lifetime", "2030-01-01T00:00:00", window("2026-03-10T15:30:00", None)),
    ],
)
def test_the_period_that_holds_an_instant(period: str, now: str, expected: BudgetWindow) -> None:
    assert budget_window(parse_budget_period(period), CREATED, at(now)) == expected


def test_a_window_says_when_it_resets_in_whole_seconds_rounded_up() -> None:
    w = window("2026-12-04T00:00:00", "2026-12-05T00:00:00")
    assert w.seconds_left(at("2026-12-04T23:59:58.5")) == 2
    assert w.seconds_left(at("2026-12-05T00:00:00")) == 1  # never 0: Retry-After 0 means now
    assert window("2026-01-01T00:00:00", None).seconds_left(at("2030-01-01T00:00:00")) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("daily", BudgetPeriod(PeriodKind.DAILY)),
        ("monthly", BudgetPeriod(PeriodKind.MONTHLY)),
        ("lifetime", BudgetPeriod(PeriodKind.LIFETIME)),
        ("30d", BudgetPeriod(PeriodKind.FIXED, 30 * 86400)),
        ("1h", BudgetPeriod(PeriodKind.FIXED, 3600)),
        ("366d", BudgetPeriod(PeriodKind.FIXED, 366 * 86400)),
        ("8784h", BudgetPeriod(PeriodKind.FIXED, 366 * 86400)),
    ],
)
def test_periods_operators_write(text: str, expected: BudgetPeriod) -> None:
    assert parse_budget_period(text) == expected
    assert parse_budget_period(str(expected)) == expected  # what is shown reads back


@pytest.mark.parametrize(
    "text",
    [
        "", " monthly", "fixed", "Monthly", "month", "0d", "0h", "-1d", "30m", "30s", "1.5d", "367d", "8785h",
        "999999999d", "1e3d", "30 d", "30D", "３０d", "30d\n", "\x00daily", 30, None, 2.5, True, ["daily"],
        "d", "0030d",
    ],
)  # fmt: skip
def test_periods_refused_say_what_to_write(text: object) -> None:
    with pytest.raises(ValueError, match=r"daily, weekly, monthly, lifetime|at least 1h"):
        parse_budget_period(text)


@pytest.mark.parametrize(
    ("budget", "used", "tokens", "admitted", "left"),
    [
        (1000, 0, 100, True, 1000),
        (1000, 900, 100, True, 100),  # exactly what is left
        (1000, 901, 100, False, 99),
        (1000, 1000, 0, False, 0),  # nothing left: not even a request that holds nothing
        (1000, 1500, 1, False, 0),  # overshot by answers beyond their holds: left is 0, not negative
        (1000, 0, 5000, False, 1000),  # larger than the whole budget: never fits
        (1000, -5, 10, True, 1000),  # a count gone negative (a refund racing a reset) reads as 0
        (1000, 10, -3, True, 990),
    ],
)
def test_a_request_is_admitted_when_what_it_holds_fits_in_what_is_left(
    budget: int, used: int, tokens: int, admitted: bool, left: int
) -> None:
    decision = budget_decision(budget, used, tokens)
    assert (decision.admitted, decision.left) == (admitted, left)


@pytest.mark.parametrize(
    ("tokens", "period", "stored"),
    [
        (None, None, (None, "")),
        (5_000_000, None, (5_000_000, "monthly")),
        (5_000_000, "30d", (5_000_000, "30d")),
        (1, "720h", (1, "30d")),  # stored in one spelling
        (2**53 - 1, "lifetime", (2**53 - 1, "lifetime")),
    ],
)
def test_a_budget_as_given_and_as_stored(tokens: object, period: object, stored: object) -> None:
    assert budget_fields(tokens, period) == stored


@pytest.mark.parametrize(
    ("tokens", "period"),
    [
        (None, "monthly"), (0, None), (-1, "daily"), (2**53, None), (10**400, None), (1.0, None),
        (True, None), ("1000", None), (1000, "30x"), (1000, ""), (1000, 30),
    ],
)  # fmt: skip
def test_a_budget_refused(tokens: object, period: object) -> None:
    with pytest.raises(ValueError):
        budget_fields(tokens, period)
