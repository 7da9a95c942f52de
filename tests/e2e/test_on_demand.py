"""Load on demand, end to end: a request wakes a model nobody runs, use keeps it, idleness unloads it."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.support.waiting import eventually_sync

from .conftest import RunningDev, start_dev

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  lazy:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200, load_seconds: 0.5}}]
    scaling: {min: 0, max: 1, idle_timeout: 8s}
  off:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false}]
    scaling: {min: 0, max: 0}
"""


def lazy_jobs(dev: RunningDev) -> list[str]:
    return dev.live_jobs("lazy")


def test_a_request_loads_the_model_and_idleness_unloads_it(
    tmp_path: Path, dev_runner: list[RunningDev], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    # Routers report use every second here (10 s by default); wake-ups go at once anyway.
    monkeypatch.setenv("LLMGW_ROUTER_DEMAND_INTERVAL", "1")
    monkeypatch.setenv("LLMGW_ROUTER_LOAD_WAIT", "2")
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"))
    dev_runner.append(dev)
    client = openai.OpenAI(base_url=dev.base_url, api_key="unused", max_retries=0, timeout=60)
    time.sleep(3)  # a check that nothing happens: three seconds of llmgw dev running, no load
    assert lazy_jobs(dev) == [], "nothing runs an on-demand model before it is asked for"

    # A typo is unknown, never a load; a model switched off says so.
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="lazzy", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.APIStatusError) as off:
        client.chat.completions.create(model="off", messages=[{"role": "user", "content": "x"}])
    assert off.value.status_code == 503 and "off" in str(off.value.message)
    assert lazy_jobs(dev) == []

    # The first request wakes it: answered as "loading" (503, Retry-After) until a replica is healthy.
    with pytest.raises(openai.APIStatusError) as loading:
        client.chat.completions.create(model="lazy", messages=[{"role": "user", "content": "x"}])
    assert loading.value.status_code == 503
    assert loading.value.response.headers.get("retry-after")
    assert "loading" in str(loading.value.message)
    # A streaming request waits through the load (SSE comments keep it alive) and gets its answer.
    stream = client.chat.completions.create(
        model="lazy", messages=[{"role": "user", "content": "x"}], max_tokens=4, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text.split()) == 4
    assert len(lazy_jobs(dev)) == 1

    # Use keeps it alive past its idle timeout...
    started = time.monotonic()
    while time.monotonic() - started < 12:
        client.chat.completions.create(
            model="lazy", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        time.sleep(1)  # one request a second is the use under test
    assert len(lazy_jobs(dev)) == 1
    # ...and nobody using it unloads it.
    eventually_sync(lambda: lazy_jobs(dev) == [], 60, "the idle on-demand model unloaded", every=1.0)
