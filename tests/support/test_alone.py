"""A test marked alone has the only turn: it waits for the shared turns taken before it, and
no shared turn starts while it waits or runs (each thread opens the lock files itself, so
their flock locks conflict as those of two workers' processes do)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from .alone import Turns


def _holder(turn: Callable[[], AbstractContextManager[None]]) -> tuple[threading.Event, threading.Event]:
    """A thread that takes ``turn``, says so, and keeps it until told to end."""
    inside, leave = threading.Event(), threading.Event()

    def run() -> None:
        with turn():
            inside.set()
            leave.wait(30)

    threading.Thread(target=run, daemon=True).start()
    return inside, leave


def test_shared_turns_run_together(tmp_path: Path) -> None:
    turns = Turns(tmp_path)
    first_in, first_leave = _holder(turns.shared)
    second_in, second_leave = _holder(turns.shared)
    assert first_in.wait(10) and second_in.wait(10), "two shared turns at once"
    first_leave.set()
    second_leave.set()


def test_alone_waits_for_the_running_test_and_holds_back_the_next(tmp_path: Path) -> None:
    turns = Turns(tmp_path)
    running_in, running_leave = _holder(turns.shared)
    assert running_in.wait(10)
    alone_in, alone_leave = _holder(turns.alone)
    # Checks that nothing happens for a while: the alone test does not start beside the
    # running one, and a test that asks after it waits too.
    assert not alone_in.wait(0.3), "the alone test started beside a running one"
    next_in, next_leave = _holder(turns.shared)
    assert not next_in.wait(0.3), "a test started while one waited to be alone"
    running_leave.set()
    assert alone_in.wait(10), "the alone test never started once the running one ended"
    assert not next_in.wait(0.3), "a test started beside the alone one"
    alone_leave.set()
    assert next_in.wait(10), "the next test never started once the alone one ended"
    next_leave.set()
