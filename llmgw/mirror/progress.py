"""Showing download progress: bars on a terminal (rich), plain lines otherwise, or nothing.

Owns the ``ProgressSink`` port the downloader reports to and its three
implementations. Bars show bytes, rate and ETA per file and in total; plain
lines say the same at most every ``interval`` seconds per file, plus one line
when a file starts and ends, so a Nomad task log stays readable. Must not
decide anything about downloads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class ProgressMode(StrEnum):
    AUTO = "auto"
    BARS = "bars"
    PLAIN = "plain"
    NONE = "none"


class ProgressSink(Protocol):
    def begin(self, files: int, total_bytes: int | None) -> None: ...

    def start_file(self, label: str, size: int | None, already: int) -> None: ...

    def advance(self, label: str, nbytes: int) -> None: ...

    def restart_file(self, label: str, already: int) -> None: ...

    def end_file(self, label: str, ok: bool, note: str) -> None: ...

    def note(self, text: str) -> None: ...

    def close(self) -> None: ...


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class SilentProgress:
    def begin(self, files: int, total_bytes: int | None) -> None:
        pass

    def start_file(self, label: str, size: int | None, already: int) -> None:
        pass

    def advance(self, label: str, nbytes: int) -> None:
        pass

    def restart_file(self, label: str, already: int) -> None:
        pass

    def end_file(self, label: str, ok: bool, note: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class _FileLine:
    size: int | None
    done: int
    started_at: float
    start_bytes: int
    last_line_at: float


@dataclass
class PlainProgress:
    """One line per event, throttled per file; for logs and pipes."""

    stream: TextIO
    interval: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _files: dict[str, _FileLine] = field(default_factory=dict)
    _total: int | None = None
    _done: int = 0

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def begin(self, files: int, total_bytes: int | None) -> None:
        self._total = total_bytes
        size = human_bytes(total_bytes) if total_bytes is not None else "unknown size"
        self._print(f"downloading {files} file(s), {size}")

    def start_file(self, label: str, size: int | None, already: int) -> None:
        now = self.clock()
        self._files[label] = _FileLine(size, already, now, already, now)
        self._done += already
        resumed = f", resuming at {human_bytes(already)}" if already else ""
        size_text = human_bytes(size) if size is not None else "unknown size"
        self._print(f"{label}: start ({size_text}{resumed})")

    def advance(self, label: str, nbytes: int) -> None:
        line = self._files.get(label)
        if line is None:
            return
        line.done += nbytes
        self._done += nbytes
        now = self.clock()
        if now - line.last_line_at >= self.interval:
            line.last_line_at = now
            self._print(f"{label}: {self._describe(line, now)}{self._total_text()}")

    def restart_file(self, label: str, already: int) -> None:
        line = self._files.get(label)
        if line is not None:
            self._done += already - line.done
            line.done = already

    def end_file(self, label: str, ok: bool, note: str) -> None:
        self._files.pop(label, None)
        self._print(f"{label}: {'done' if ok else 'FAILED'}{': ' + note if note else ''}")

    def note(self, text: str) -> None:
        self._print(text)

    def close(self) -> None:
        pass

    def _describe(self, line: _FileLine, now: float) -> str:
        elapsed = max(now - line.started_at, 1e-6)
        rate = (line.done - line.start_bytes) / elapsed
        text = f"{human_bytes(line.done)}"
        if line.size:
            text += f" of {human_bytes(line.size)} ({100 * line.done / line.size:.0f}%)"
        text += f", {human_bytes(rate)}/s"
        if line.size and rate > 0:
            text += f", ETA {(line.size - line.done) / rate:.0f}s"
        return text

    def _total_text(self) -> str:
        if not self._total:
            return ""
        percent = 100 * self._done / self._total
        return f"; total {human_bytes(self._done)} of {human_bytes(self._total)} ({percent:.0f}%)"


class BarsProgress:
    """rich bars: one per file in flight and one for the total (bytes, rate, ETA)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}", justify="left"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._total: TaskID | None = None

    def begin(self, files: int, total_bytes: int | None) -> None:
        self._progress.start()
        self._total = self._progress.add_task(f"total ({files} files)", total=total_bytes)

    def start_file(self, label: str, size: int | None, already: int) -> None:
        self._tasks[label] = self._progress.add_task(label, total=size, completed=already)
        if self._total is not None:
            self._progress.advance(self._total, already)

    def advance(self, label: str, nbytes: int) -> None:
        task = self._tasks.get(label)
        if task is not None:
            self._progress.advance(task, nbytes)
        if self._total is not None:
            self._progress.advance(self._total, nbytes)

    def restart_file(self, label: str, already: int) -> None:
        task = self._tasks.get(label)
        if task is None:
            return
        before = self._progress.tasks[self._progress.task_ids.index(task)].completed
        self._progress.update(task, completed=already)
        if self._total is not None:
            self._progress.advance(self._total, already - before)

    def end_file(self, label: str, ok: bool, note: str) -> None:
        task = self._tasks.pop(label, None)
        if task is not None:
            self._progress.remove_task(task)
        status = "[green]done[/green]" if ok else "[red]FAILED[/red]"
        self._progress.console.print(
            f"{label}: {status}{': ' + note if note else ''}", markup=True, highlight=False
        )

    def note(self, text: str) -> None:
        self._progress.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        self._progress.stop()


def make_progress(mode: ProgressMode, stream: TextIO, interval: float) -> ProgressSink:
    if mode is ProgressMode.AUTO:
        mode = ProgressMode.BARS if stream.isatty() else ProgressMode.PLAIN
    if mode is ProgressMode.BARS:
        return BarsProgress(Console(file=stream))
    if mode is ProgressMode.PLAIN:
        return PlainProgress(stream, interval)
    return SilentProgress()
