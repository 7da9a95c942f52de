"""A model that cannot be served now, end to end on ``llmgw dev``: answered at once.

Before: a model whose profiles no dev node can run (vllm needs drivers the stand-in's
nodes lack), or one an operator drained, was "loading, retry in 10 seconds" after the
whole load wait. Now the control plane publishes ``llmgw/unavailable`` and the router
answers 503 ``model_unavailable`` with the reason, without waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.waiting import eventually_sync

from .conftest import REPO, RunningDev, start_dev

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  nowhere:
    roles: [chat]
    profiles: [{engine: vllm, source: org/nowhere-7b}]
    scaling: {min: 0, max: 1}
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200, load_seconds: 0.2}}]
    scaling: {min: 1, max: 1}
  too-wide:
    roles: [chat]
    profiles: [{engine: sim, tp: 48, nodes: 6}]
    scaling: {min: 0, max: 1}
"""
MESSAGES: Any = [{"role": "user", "content": "x"}]


def states(dev: RunningDev) -> dict[str, Any]:
    with urllib.request.urlopen(f"{dev.base_url}/models", timeout=5) as response:
        return {m["id"]: m["llmgw"] for m in json.load(response)["data"]}


def refused(client: openai.OpenAI, model: str) -> tuple[openai.APIStatusError, float]:
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1)
    return caught.value, time.monotonic() - started


def test_unplaceable_and_drained_models_are_refused_at_once_saying_why(
    tmp_path: Path, dev_runner: list[RunningDev], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    monkeypatch.setenv("LLMGW_ROUTER_LOAD_WAIT", "30")
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"))
    dev_runner.append(dev)
    client = openai.OpenAI(base_url=dev.base_url, api_key="unused", max_retries=0, timeout=60)

    # The first request wakes it; the control plane's plan fails within a pass and the
    # waiting request is answered then, long before its 30 s wait.
    first, waited = refused(client, "nowhere")
    assert (first.status_code, first.code) == (503, "model_unavailable"), first.message
    assert waited < 15, waited
    assert "no place for it" in first.message and "no profile fits" in first.message
    # From now on at once, streamed or not.
    again, waited = refused(client, "nowhere")
    assert again.code == "model_unavailable" and waited < 1.0, waited
    assert again.response.headers["Retry-After"] == "30"
    with pytest.raises(openai.APIStatusError) as streamed:
        client.chat.completions.create(model="nowhere", messages=MESSAGES, stream=True)
    assert streamed.value.code == "model_unavailable"
    assert states(dev)["nowhere"]["state"] == "unavailable"

    # Six nodes on one fabric, on four dev nodes: the control plane knows without asking
    # Nomad, and says so the same way.
    wide, waited = refused(client, "too-wide")
    assert (wide.code, waited < 15) == ("model_unavailable", True), (wide.message, waited)
    assert "needs 6 ready nodes on one fabric" in wide.message

    # An operator drains a serving model: refused at once, not to be retried.
    eventually_sync(
        lambda: client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1),
        60,
        "sim-chat serving",
        retry_on=(openai.APIStatusError,),
    )
    drain = subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "--admin-url", dev.state["admin_url"], "drain", "sim-chat"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert drain.returncode == 0, drain.stderr

    def refused_as_drained() -> openai.APIStatusError | None:
        try:
            client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
        except openai.APIStatusError as exc:
            return exc if exc.code == "model_unavailable" else None
        return None

    drained = eventually_sync(refused_as_drained, 30, "the drain reaching the router")
    assert drained.response.headers["x-should-retry"] == "false"
    assert "drained by" in drained.message
    again, waited = refused(client, "sim-chat")
    assert again.code == "model_unavailable" and waited < 1.0, waited
    assert states(dev)["sim-chat"]["unavailable"]["why"] == "drained"
