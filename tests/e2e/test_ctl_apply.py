"""A CI pipeline's `llmgw ctl apply` against a running `llmgw dev`: the diff it prints is what happens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import eventually_sync

from .conftest import REPO, RunningDev, start_dev

pytestmark = pytest.mark.e2e

SIM = "roles: [chat]\n    profiles: [{{engine: sim, simulate_gpus: false, sim: {{tokens_per_second: {rate}, load_seconds: 0.2}}}}]\n    scaling: {{min: 1, max: 1}}"  # noqa: E501

BEFORE = f"""models:
  keep:
    {SIM.format(rate=100)}
  change:
    {SIM.format(rate=100)}
  remove:
    {SIM.format(rate=100)}
"""
AFTER = f"""models:
  keep:
    {SIM.format(rate=100)}
  change:
    {SIM.format(rate=300)}
  add:
    {SIM.format(rate=100)}
"""
BROKEN = (
    AFTER
    + """  sneaky:
    profiles: [{engine: sim, env: {LD_PRELOAD: /tmp/evil.so}}]
    scaling: {min: 1, max: 1}
"""
)


def running_jobs(dev: RunningDev) -> dict[str, str]:
    """model -> running job id, from Nomad (the reconciler's doing)."""
    jobs = dev.nomad("/v1/jobs?meta=true")
    return {j["Meta"]["llmgw_model"]: j["ID"] for j in jobs if j["Status"] == "running" and j.get("Meta")}


def ctl(dev: RunningDev, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "--admin-url", dev.state["admin_url"], *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def wait_for(predicate, within: float, what: str):  # type: ignore[no-untyped-def]
    """``eventually_sync`` retrying whatever a probe raises while ``llmgw dev`` comes up."""
    return eventually_sync(predicate, within, what, every=0.5, retry_on=(Exception,))


def test_ci_apply_does_what_its_diff_said(tmp_path: Path, dev_runner: list[RunningDev]) -> None:
    (tmp_path / "before.yaml").write_text(BEFORE)
    (tmp_path / "after.yaml").write_text(AFTER)
    (tmp_path / "broken.yaml").write_text(BROKEN)
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "before.yaml"))
    dev_runner.append(dev)

    def first_catalog_running() -> dict[str, str] | None:
        jobs = running_jobs(dev)
        return jobs if set(jobs) == {"keep", "change", "remove"} else None

    before = wait_for(first_catalog_running, 60, "the first catalog running")

    # A catalog the policy refuses: exit 1, the compiler-style lines, nothing changes.
    refused = ctl(dev, "apply", str(tmp_path / "broken.yaml"), "--yes")
    assert refused.returncode == 1
    assert (
        ": error: models.sneaky.profiles[0].env.LD_PRELOAD: environment variable LD_PRELOAD is refused"
        in (refused.stdout)
    )
    assert ctl(dev, "catalog", "get").stdout.count("remove:") == 1

    # The diff CI prints, then the apply.
    shown = ctl(dev, "--json", "diff", str(tmp_path / "after.yaml"))
    assert shown.returncode == 0, shown.stderr
    effects = {m["model"]: m["effect"] for m in json.loads(shown.stdout)["diff"]["models"]}
    assert effects == {"change": "roll", "remove": "stop", "add": "start"}  # "keep": nothing to do
    applied = ctl(dev, "apply", str(tmp_path / "after.yaml"), "--yes")
    assert applied.returncode == 0, applied.stderr
    assert "applied: catalog version 2" in applied.stdout

    # What the reconciler then does, model by model.
    def settled() -> dict[str, str] | None:
        jobs = running_jobs(dev)
        return jobs if set(jobs) == {"keep", "change", "add"} and jobs["change"] != before["change"] else None

    after = wait_for(settled, 90, "the applied catalog running")
    assert after["keep"] == before["keep"]  # untouched
    assert after["change"] != before["change"]  # rolled: a new replica replaced the old one
    assert "remove" not in after  # stopped
    assert "add" in after  # started
