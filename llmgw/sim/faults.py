"""Injected faults: the misbehaviour tests ask of the simulated engine.

Owns: the current fault set (seeded from `FaultSettings`, changed at runtime
by `POST /sim/fault`), the decision whether an arriving request crashes the
process or fails, the hang gate, and parsing of the runtime update body.

Must not: exit the process itself. Crashing goes through the `ExitProcess`
effect it is given, so an in-process test can record it instead of dying.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.sim.openai_api import ApiError, injected_failure
from llmgw.sim.settings import ExitCode, FailStatus, FaultSettings

ExitProcess = Callable[[int, str], None]
"""Ends the process at once with (exit code, reason); never returns in production."""

_UPDATABLE = (
    "crash",
    "exit_code",
    "crash_after_requests",
    "hang",
    "fail_rate",
    "fail_status",
    "first_token_delay",
)


class FaultState:
    def __init__(self, settings: FaultSettings, exit_process: ExitProcess) -> None:
        self._exit_process = exit_process
        # Not for secrets: a seeded draw makes a fault run reproducible.
        self._random = random.Random(settings.fault_seed)  # noqa: S311
        self.crash_after_requests = settings.crash_after_requests
        self.fail_rate = settings.fail_rate
        self.fail_status = settings.fail_status
        self.first_token_delay = settings.first_token_delay
        self._unhung = asyncio.Event()
        if not settings.hang:
            self._unhung.set()

    @property
    def hang(self) -> bool:
        return not self._unhung.is_set()

    def _set_hang(self, hang: bool) -> None:
        if hang:
            self._unhung.clear()
        else:
            self._unhung.set()

    async def wait_while_hung(self) -> bool:
        """Return at once when not hung; else block until the hang is lifted. True if it blocked."""
        if self._unhung.is_set():
            return False
        await self._unhung.wait()
        return True

    def crash(self, code: int, reason: str) -> None:
        self._exit_process(code, reason)

    def on_arrival(self, ordinal: int) -> None:
        """Called with each API request's ordinal; crashes once more than N requests arrived."""
        limit = self.crash_after_requests
        if limit is not None and ordinal > limit:
            self.crash(ExitCode.CRASH_FAULT, f"crash fault: request {ordinal} arrived after {limit} served")

    def draw_failure(self) -> ApiError | None:
        """Whether this request is one of the `fail_rate` fraction, as its error."""
        if self.fail_rate > 0 and self._random.random() < self.fail_rate:
            return injected_failure(int(self.fail_status))
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "crash_after_requests": self.crash_after_requests,
            "hang": self.hang,
            "fail_rate": self.fail_rate,
            "fail_status": int(self.fail_status),
            "first_token_delay": self.first_token_delay,
        }

    def apply(self, update: FaultUpdate) -> None:
        """Apply a runtime update; a crash in it ends the process after the other fields."""
        if "crash_after_requests" in update.fields:
            self.crash_after_requests = update.crash_after_requests
        if "hang" in update.fields:
            self._set_hang(update.hang)
        if "fail_rate" in update.fields:
            self.fail_rate = update.fail_rate
        if "fail_status" in update.fields:
            self.fail_status = update.fail_status
        if "first_token_delay" in update.fields:
            self.first_token_delay = update.first_token_delay


class FaultUpdate:
    """A parsed `POST /sim/fault` body. Only the keys present change anything."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        unknown = sorted(set(body) - set(_UPDATABLE))
        if unknown:
            raise _bad(f"unknown fault keys {unknown}; known: {list(_UPDATABLE)}", unknown[0])
        self.fields = frozenset(body)
        self.crash = _bool(body, "crash", False)
        exit_code = body.get("exit_code", int(ExitCode.CRASH_FAULT))
        if isinstance(exit_code, bool) or not isinstance(exit_code, int) or not 1 <= exit_code <= 255:
            raise _bad("'exit_code' must be an integer in 1..255", "exit_code")
        self.exit_code = exit_code
        after = body.get("crash_after_requests")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            raise _bad("'crash_after_requests' must be null or an integer >= 0", "crash_after_requests")
        self.crash_after_requests: int | None = after
        self.hang = _bool(body, "hang", False)
        rate = body.get("fail_rate", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise _bad("'fail_rate' must be a number within 0..1", "fail_rate")
        self.fail_rate = float(rate)
        status = body.get("fail_status", 500)
        if status not in (500, 503):
            raise _bad("'fail_status' must be 500 or 503", "fail_status")
        self.fail_status = FailStatus(status)
        delay = body.get("first_token_delay", 0.0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise _bad("'first_token_delay' must be a number >= 0", "first_token_delay")
        self.first_token_delay = float(delay)


def _bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise _bad(f"'{key}' must be true or false", key)
    return value


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")
