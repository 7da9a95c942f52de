"""The `curl` line `llmgw dev` prints names a model of the catalog it serves that answers,
and run as printed, it gets an answer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import eventually_sync

from .conftest import REPO, RunningDev, start_dev

pytestmark = pytest.mark.e2e

# No sim-chat. `screened` serves on dev (its sim profile), but its judge cannot run
# there: it would answer 503 guard_unavailable, so the hint names `mine`.
CATALOG = """
models:
  screened:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false}]
    scaling: {min: 1, max: 1}
  mine:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200, load_seconds: 0.5}}]
    scaling: {min: 1, max: 1}
  judge:
    roles: [guard]
    profiles: [{engine: vllm, source: meta-llama/Llama-Guard-3-8B}]
    scaling: {min: 0, max: 1}
guard_policies:
  default:
    judge: judge
    models: [screened]
"""


def test_the_printed_curl_names_a_model_of_the_catalog_that_answers(
    tmp_path: Path, dev_runner: list[RunningDev]
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--nodes", "1", "--gpus", "1")
    dev_runner.append(dev)
    lines = dev.banner.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("try "))
    command = "\n".join([lines[start].strip().removeprefix("try").strip(), lines[start + 1]])
    assert '"model": "mine"' in command, command

    # As a user pastes it into a shell; the first answers can be 503 while the router reads
    # the applied catalog and while `mine` loads.
    def pasted() -> dict[str, Any] | None:
        run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, cwd=REPO)
        answer: dict[str, Any] = json.loads(run.stdout) if run.stdout.startswith("{") else {}
        if "choices" in answer:
            return answer
        assert answer.get("error", {}).get("code") in (
            "catalog_unavailable",
            "no_healthy_replica",
            "model_loading",
        ), run.stdout + run.stderr
        return None

    answer = eventually_sync(pasted, 60, "an answer to the printed curl", every=0.5)
    assert answer["model"] == "mine" and answer["choices"][0]["message"]["content"], answer
    assert dev.interrupt() == 0
