"""Child processes of the stand-in: started in their own process group, never orphaned.

Owns: spawning a task's argv (never through a shell) in a new session with
``PR_SET_PDEATHSIG`` = SIGKILL, so a task dies when the stand-in's process dies;
signalling and killing the whole process group (which also reaches grandchildren);
and the registry of every live process group, so ``kill_all`` can leave nothing behind.

Must not: know about allocations or restart policies (the task runner decides).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Mapping
from pathlib import Path

_PR_SET_PDEATHSIG = 1

SIGNALS: dict[str, int] = {
    name: int(getattr(signal, name))
    for name in ("SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")
}


def die_with_parent() -> None:
    """``preexec_fn`` of a child that must not outlive this process (it runs in the child,
    between fork and exec): the kernel sends it SIGKILL when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def signal_number(name: str, default: str = "SIGINT") -> int:
    key = (name or default).upper()
    if not key.startswith("SIG"):
        key = "SIG" + key
    if key not in SIGNALS:
        raise ValueError(f"unknown signal {name!r}; use one of {sorted(SIGNALS)}")
    return SIGNALS[key]


class ProcessTable:
    """Every process group the stand-in started and has not yet reaped."""

    def __init__(self) -> None:
        self._live: dict[int, asyncio.subprocess.Process] = {}

    @property
    def pids(self) -> list[int]:
        return sorted(self._live)

    async def spawn(
        self, argv: list[str], env: Mapping[str, str], cwd: Path, stdout: Path, stderr: Path
    ) -> asyncio.subprocess.Process:
        out = stdout.open("ab")
        err = stderr.open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=dict(env),
                cwd=str(cwd),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            out.close()
            err.close()
        self._live[proc.pid] = proc
        return proc

    def forget(self, proc: asyncio.subprocess.Process) -> None:
        self._live.pop(proc.pid, None)

    @staticmethod
    def signal_group(proc: asyncio.subprocess.Process, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)

    async def stop(self, proc: asyncio.subprocess.Process, signum: int, grace_s: float) -> int | None:
        """Send ``signum`` to the group, wait ``grace_s``, then SIGKILL the group. Returns the exit code."""
        if proc.returncode is None:
            self.signal_group(proc, signum)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                self.signal_group(proc, signal.SIGKILL)
                await proc.wait()
        # Grandchildren may outlive the leader: the group is killed either way.
        self.signal_group(proc, signal.SIGKILL)
        self.forget(proc)
        return proc.returncode

    async def kill_all(self) -> None:
        procs = list(self._live.values())
        for proc in procs:
            self.signal_group(proc, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5.0)
            self.forget(proc)
