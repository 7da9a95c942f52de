"""API keys' token budgets: how an operator writes a budget's period, where the period
that holds a given instant begins and ends, and whether a request fits what is left.

Owns: ``BudgetPeriod`` (parsed from ``daily``, ``weekly``, ``monthly``, ``lifetime``,
or a whole number of days or hours such as ``30d`` or ``12h``), ``budget_window``
(the period holding ``now``: UTC calendar days, weeks from Monday and months from the
1st; fixed lengths counted from the key's creation; ``lifetime`` never ends) and
``budget_decision`` (a request is admitted when what it holds fits in what is left).

Must not: read a clock (``now`` is a parameter) or know where the counts are kept
(``llmgw.adapters.redis.limits`` keeps them; its ``admit.lua`` takes the same
decision atomically on the server, this is its specification).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

# A budget's tokens: at least 1, at most what an IEEE double holds exactly (as every count).
MAX_BUDGET_TOKENS = 2**53 - 1
# A fixed period: an hour at least (a shorter one is a rate limit: use tokens_per_minute),
# at most a leap year's days.
MIN_PERIOD_SECONDS = 3600
MAX_PERIOD_SECONDS = 366 * 86400
PERIOD_HINT = "daily, weekly, monthly, lifetime, or a whole number of days or hours such as 30d or 12h"
_FIXED = re.compile(r"([1-9][0-9]{0,5})(d|h)")


class PeriodKind(StrEnum):
    DAILY = "daily"  # UTC midnight to midnight
    WEEKLY = "weekly"  # Monday 00:00 UTC to the next (ISO weeks, as OpenRouter's key budgets count)
    MONTHLY = "monthly"  # the 1st 00:00 UTC to the next 1st
    LIFETIME = "lifetime"  # never resets: a one-off grant
    FIXED = "fixed"  # a whole number of hours, counted from the key's creation


@dataclass(frozen=True, slots=True)
class BudgetPeriod:
    kind: PeriodKind
    seconds: int = 0  # FIXED only

    def __str__(self) -> str:
        if self.kind is not PeriodKind.FIXED:
            return str(self.kind)
        if self.seconds % 86400 == 0:
            return f"{self.seconds // 86400}d"
        return f"{self.seconds // 3600}h"


def parse_budget_period(value: object) -> BudgetPeriod:
    """The period an operator wrote, or ValueError saying what to write."""
    if not isinstance(value, str):
        raise ValueError(f"a budget period is {PERIOD_HINT}, not {type(value).__name__}")
    text = value  # no stripping: what is stored is what was checked
    if text in {k.value for k in PeriodKind if k is not PeriodKind.FIXED}:
        return BudgetPeriod(PeriodKind(text))
    match = _FIXED.fullmatch(text)
    if match is None:
        raise ValueError(f"a budget period is {PERIOD_HINT}, not {value[:40]!r}")
    seconds = int(match.group(1)) * (86400 if match.group(2) == "d" else 3600)
    if not MIN_PERIOD_SECONDS <= seconds <= MAX_PERIOD_SECONDS:
        raise ValueError(f"a budget period is at least 1h and at most 366d, not {text!r}")
    return BudgetPeriod(PeriodKind.FIXED, seconds)


@dataclass(frozen=True, slots=True)
class BudgetWindow:
    """One period of a budget: its counts are kept under ``start`` (whole unix seconds)."""

    start: int
    end: int | None  # None: ``lifetime``, which never resets

    def seconds_left(self, now: float) -> int | None:
        return None if self.end is None else max(1, -int(-(self.end - now) // 1))


def budget_window(period: BudgetPeriod, created_at: float, now: float) -> BudgetWindow:
    """The period of a key created at ``created_at`` that holds ``now`` (unix seconds)."""
    if period.kind is PeriodKind.LIFETIME:
        return BudgetWindow(int(created_at), None)
    if period.kind is PeriodKind.FIXED:
        anchor = int(created_at)
        n = max(0, int((now - anchor) // period.seconds))
        start = anchor + n * period.seconds
        return BudgetWindow(start, start + period.seconds)
    day = datetime.fromtimestamp(int(now // 86400) * 86400, UTC)
    if period.kind is PeriodKind.DAILY:
        begin, after = day, day + timedelta(days=1)
    elif period.kind is PeriodKind.WEEKLY:
        begin = day - timedelta(days=day.weekday())
        after = begin + timedelta(days=7)
    else:
        begin = day.replace(day=1)
        after = (
            begin.replace(year=begin.year + 1, month=1)
            if begin.month == 12
            else begin.replace(month=begin.month + 1)
        )
    return BudgetWindow(int(begin.timestamp()), int(after.timestamp()))


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    admitted: bool
    left: int  # what the period has left before this request (held tokens counted as used)


def budget_decision(budget: int, used: int, tokens: int) -> BudgetDecision:
    """``used``: the period's settled usage plus the tokens open requests hold; ``tokens``:
    what this request would hold. It is admitted when that fits in what is left, so the
    budget is overshot only by what answers use beyond what they held."""
    left = max(0, budget - max(0, used))
    return BudgetDecision(max(0, tokens) <= left and left > 0, left)


def budget_fields(token_budget: object, budget_period: object) -> tuple[int | None, str]:
    """A key's budget as an operator gave it (``None`` for either when not given), as
    it is stored: a period without tokens is refused, tokens without a period are
    ``monthly``. ValueError says what is wrong."""
    if token_budget is None:
        if budget_period is not None:
            raise ValueError("a budget period needs a token budget (token_budget)")
        return None, ""
    if type(token_budget) is not int or not 1 <= token_budget <= MAX_BUDGET_TOKENS:
        raise ValueError(f"a token budget is a whole number of tokens from 1 to {MAX_BUDGET_TOKENS}")
    period = parse_budget_period("monthly" if budget_period is None else budget_period)
    return token_budget, str(period)
