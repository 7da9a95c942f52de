"""Fixtures every test layer may use."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import SecurityPolicy
from tests.support.alone import Turns
from tests.support.waiting import eventually_sync

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


WORKERS_PER_CORE = 1.5


@pytest.fixture(autouse=True)
def _no_inherited_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist's workers start with ``COLUMNS=80`` and ``LINES=24`` in their environment
    (their stdio are pipes; pytest-xdist #1208, documented in #1355), which a serial run does
    not have: ``llmgw status`` then lays its table out for 80 columns in one run and for a pipe
    in the other. Every test starts as a pipe does; a test of a width sets ``COLUMNS`` itself."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (pyproject's addopts): WORKERS_PER_CORE workers a core this process may run
    on. Most of the suite's time is spent waiting (on `llmgw dev`, engines, timeouts under test),
    not on the CPU, so a worker a core would leave the cores idle. pytest-xdist's own
    PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return max(1, round(WORKERS_PER_CORE * len(os.sched_getaffinity(0))))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Under pytest-xdist, a test marked ``alone`` runs with no other worker's test running
    (``support/alone.py``); every other test shares its turn. The lock folder is the run's
    base temporary folder, which holds every worker's own (pytest-xdist puts them there)."""
    if not hasattr(item.config, "workerinput"):  # one process: every test is alone already
        return (yield)
    turns = Turns(item.config._tmp_path_factory.getbasetemp().parent)  # type: ignore[attr-defined]
    with turns.alone() if item.get_closest_marker("alone") else turns.shared():
        return (yield)


@pytest.fixture(scope="session")
def test_policy() -> SecurityPolicy:
    """A small, stable policy for rule tests (the shipped one has tests of its own)."""
    return read_security_policy(TESTS / "fixtures" / "test-policy.yaml")


@pytest.fixture(scope="session")
def shipped_policy() -> SecurityPolicy:
    return read_security_policy()


def _ancestry() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def _processes_touching(base: Path) -> list[tuple[int, str]]:
    """Live processes (not this one) running in or naming a path under ``base``."""
    found = []
    marker = str(base)
    ours = _ancestry()  # pytest itself and what started it (their command line may name base)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            status = (entry / "status").read_text()
            if "\nState:\tZ" in status:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(marker) or marker in cmdline:
            found.append((int(entry.name), cmdline.strip()[:200]))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_orphaned_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the whole session, nothing a test started may still run (engines, stand-ins, llmgw dev)."""
    base = tmp_path_factory.getbasetemp()
    yield
    with contextlib.suppress(AssertionError):  # processes told to stop may take a moment to exit
        eventually_sync(lambda: not _processes_touching(base), 10, "every process the tests started gone")
    leftovers = _processes_touching(base)
    for pid, _ in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not leftovers, "processes outlived the tests that started them:\n" + "\n".join(
        f"  {pid}: {cmd}" for pid, cmd in leftovers
    )
