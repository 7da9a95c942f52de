"""Running `llmgw dev` as a user does: a subprocess, its banner, its fault commands, Ctrl-C.

And, for every test here that runs on an event loop (the in-process stack of ``harness.py``),
a watchdog of that loop whose report of its longest stalls is printed under the test if it
fails: a test that timed out on a loaded machine then shows what held the loop up.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.loop_stalls import LoopStalls
from tests.support.waiting import eventually_sync

REPO = Path(__file__).resolve().parents[2]

# The models and rules behind a guard block, a fallback and a load on demand on dev, after
# a catalog's own models (YAML under `models:`, two spaces in): the example catalog's guard
# demo (sim-guard judging sim-guarded), an on-demand model, and a GPU model that cannot
# place on dev (its nodes run no Docker driver) whose fallback is sim-chat.
GUARD_FALLBACK_AND_ON_DEMAND = """
  gpu-chat:
    roles: [chat]
    profiles: [{engine: vllm, source: org/gpu-chat}]
    scaling: {min: 1, max: 1}
  sim-on-demand:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200, load_seconds: 1}}]
    scaling: {min: 0, max: 1, idle_timeout: 10m}
  sim-guard:
    roles: [guard]
    profiles: [{engine: sim, simulate_gpus: false, args: ["--judge-unsafe-phrase", "forbidden fruit"]}]
    scaling: {min: 0, max: 1}
  sim-guarded:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200}}]
    scaling: {min: 1, max: 1}
fallbacks:
  gpu-chat: [sim-chat]
guard_policies:
  demo: {judge: sim-guard, models: [sim-guarded]}
"""
HERE = Path(__file__).resolve().parent
_STALLS = pytest.StashKey[LoopStalls]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents and inspect.iscoroutinefunction(getattr(item, "obj", None)):
            item.fixturenames.append("loop_stalls")  # type: ignore[attr-defined]


@pytest.fixture
async def loop_stalls(request: pytest.FixtureRequest) -> AsyncIterator[LoopStalls]:
    stalls = LoopStalls()
    stalls.start()
    request.node.stash[_STALLS] = stalls
    yield stalls
    stalls.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    stalls = item.stash.get(_STALLS, None)
    if stalls is not None and report.failed and report.when in ("call", "teardown"):
        report.sections.append(("event loop stalls", stalls.report()))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class RunningDev:
    process: subprocess.Popen[str]
    state_dir: Path
    port: int
    log: Path
    banner: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.state_dir / "dev.json").read_text()))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "llmgw", "dev", *args, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )

    def nomad(self, path: str) -> Any:
        """GET ``path`` from the Nomad stand-in with its token, as a user's script would."""
        token = (self.state_dir / "nomad.token").read_text()
        request = urllib.request.Request(
            f"{self.state['nomad_addr']}{path}", headers={"X-Nomad-Token": token}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def create_key(self, name: str, *options: str) -> str:
        """A new API key's secret, from ``llmgw ctl keys create NAME --json [options]``."""
        done = subprocess.run(
            [sys.executable, "-m", "llmgw", "ctl", "keys", "create", name, "--json", *options,
             "--admin-url", self.state["admin_url"]],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["secret"])

    def live_jobs(self, model: str) -> list[str]:
        """The Nomad jobs of ``model``'s replicas that are not dead, as ``nomad job status`` lists them."""
        jobs = self.nomad("/v1/jobs?meta=true")
        return [
            j["ID"]
            for j in jobs
            if (j.get("Meta") or {}).get("llmgw_model") == model and j["Status"] != "dead"
        ]

    def router_metric(self, name: str, **labels: str) -> float:
        """One sample of the router's /metrics as Prometheus parses it (0 when there is none yet)."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0

    def wait_answering(self, key: str, models: Iterable[str], within: float, *, every: float = 0.25) -> None:
        """Until each of ``models`` answers a one-token chat completion with ``key``."""
        for model in models:
            request = urllib.request.Request(
                self.base_url + "/chat/completions",
                data=json.dumps(
                    {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
                ).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            eventually_sync(
                functools.partial(urllib.request.urlopen, request, timeout=30),
                within,
                f"{model} answering the key",
                every=every,
                retry_on=(urllib.error.URLError, ConnectionError),
            )

    def kill(self) -> None:
        """SIGKILL to its whole process group, if it still runs (a module fixture's teardown)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def task_pids(self) -> list[int]:
        return sorted({int(p) for p in _all_ints(self.nomad("/_dev/pids"))})

    def interrupt(self, within: float = 30) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=within)


def _all_ints(value: Any) -> Iterator[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _all_ints(item)
    elif isinstance(value, list):
        for item in value:
            yield from _all_ints(item)


def start_dev(tmp_path: Path, *args: str, ready_within: float = 60) -> RunningDev:
    """``llmgw dev`` on ports the kernel picks as it binds them (0): a port probed free and
    handed over would be free only until another test's process (under pytest-xdist, another
    worker's) took it in the seconds ``llmgw dev`` takes to start. The router's is read back
    from ``dev.json``."""
    state_dir = tmp_path / "dev"
    log = tmp_path / "dev.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "dev",
            "--port",
            "0",
            "--admin-port",
            "0",
            "--metrics-port",
            "0",
            "--state-dir",
            str(state_dir),
            # The routers' retries and the control plane's stops, in dev.log, for the
            # failure that only shows once in a while under a full suite's load.
            "--log-level",
            "INFO",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    banner: list[str] = []
    deadline = time.monotonic() + ready_within
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        banner.append(line)
        if line.startswith("Ctrl-C stops everything"):
            router_url = json.loads((state_dir / "dev.json").read_text())["router_url"]
            port = int(router_url.rstrip("/").rsplit(":", 1)[1])
            return RunningDev(process, state_dir, port, log, "".join(banner))
    process.kill()
    raise AssertionError(f"llmgw dev did not start: {''.join(banner)}\n{log.read_text()[-3000:]}")


@pytest.fixture
def dev_runner(tmp_path: Path) -> Iterator[list[RunningDev]]:
    started: list[RunningDev] = []
    yield started
    for dev in started:  # a failed test still leaves nothing running
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)
            dev.process.wait(timeout=10)
