"""Tests that run with no other test running, across pytest-xdist's workers: :class:`Turns`.

Every test holds a turn while it runs (its fixtures' setup and teardown included): a shared
one, as many at once as there are workers, or, for a test marked ``alone`` (it measures CPU
time or its event loop's stalls, which another worker's load would make), the only one. A
test waiting to be alone waits for the tests already running to end, and no test starts
meanwhile.

The turns are ``flock`` locks on two files in a folder every worker of one run sees: the
turn itself (shared or exclusive) and a gate taken briefly before it, which a test waiting
to be alone holds until it has its turn, so the others' shared turns, taken one after another,
cannot keep it waiting forever. Locks of a process that dies are released by the kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class Turns:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._gate = folder / "alone.gate"
        self._turn = folder / "alone.turn"

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """A turn beside the other tests' shared ones."""
        with self._locked(self._gate, fcntl.LOCK_EX):
            turn = self._take(self._turn, fcntl.LOCK_SH)
        try:
            yield
        finally:
            turn.close()  # closing the file releases its lock

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """The only turn: once every shared one taken before it has ended."""
        with self._locked(self._gate, fcntl.LOCK_EX):
            turn = self._take(self._turn, fcntl.LOCK_EX)
        try:
            yield
        finally:
            turn.close()

    @contextlib.contextmanager
    def _locked(self, path: Path, how: int) -> Iterator[None]:
        handle = self._take(path, how)
        try:
            yield
        finally:
            handle.close()

    @staticmethod
    def _take(path: Path, how: int) -> IO[str]:
        handle = path.open("a")
        try:
            fcntl.flock(handle, how)
        except BaseException:
            handle.close()
            raise
        return handle
