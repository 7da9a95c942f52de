"""More routers on `llmgw dev`, as its banner says to attach them: with the same
LLMGW_ENGINE_KEY_SECRET a second `llmgw serve --role router` reaches dev's engines,
and with the same LLMGW_ROUTER_LIMITS_REDIS_URL (a real redis-server) a key's limit
holds across both routers and its usage is one report."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.redis_server import MISSING, REDIS_SERVER, RedisServer
from tests.support.waiting import eventually_sync

from .conftest import REPO, RunningDev, start_dev

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)]

CATALOG = """
models:
  sim-chat:
    roles: [chat]
    profiles:
      - engine: sim
        simulate_gpus: false
        sim: {tokens_per_second: 2000, load_seconds: 0.2}
    scaling: {min: 1, max: 1}
"""
SECRET = "dev-routers-test-secret-of-more-than-32-characters"


def _status(url: str, headers: dict[str, str], body: object = None, timeout: float = 90) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={**headers, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
async def redis_url(tmp_path: Path) -> AsyncIterator[str]:
    server = RedisServer(tmp_path / "redis")
    await server.start()
    yield server.url
    await server.stop()


def _second_router(dev: RunningDev, redis_url: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    """The banner's ``llmgw serve --role router --port N`` with its exports, the same
    secret and Redis, and its default router id."""
    command = re.search(r"llmgw serve --role router --port (\d+)", dev.banner)
    assert command, dev.banner  # the banner says how
    port = command.group(1)
    assert int(port) not in {dev.port, int(dev.state["admin_url"].rsplit(":", 1)[1])}  # none of dev's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "NOMAD_", "CONSUL_"))}
    env |= {
        "NOMAD_ADDR": dev.state["nomad_addr"],
        "NOMAD_TOKEN": (dev.state_dir / "nomad.token").read_text(),
        "CONSUL_HTTP_ADDR": dev.state["consul_addr"].split("://", 1)[-1],
        "CONSUL_HTTP_TOKEN": (dev.state_dir / "consul.token").read_text(),
        "LLMGW_ENGINE_KEY_SECRET": SECRET,
        "LLMGW_ROUTER_LIMITS_REDIS_URL": redis_url,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "serve", "--role", "router", "--port", port],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    found = eventually_sync(
        lambda: re.search(r"llmgw router listening on (http://\S+)", log.read_text()),
        60,
        "the second router listening",
    )
    return process, found.group(1)


def test_a_second_router_reaches_devs_engines_and_shares_a_keys_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    monkeypatch.setenv("LLMGW_ENGINE_KEY_SECRET", SECRET)
    monkeypatch.setenv("LLMGW_ROUTER_LIMITS_REDIS_URL", redis_url)
    monkeypatch.setenv("LLMGW_ROUTER_ROUTER_ID", "dev")
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--api-keys")
    second: subprocess.Popen[str] | None = None
    try:
        second, second_url = _second_router(dev, redis_url, tmp_path / "second.log")
        key = dev.create_key("team", "--requests-per-minute", "6")
        routers = [f"http://127.0.0.1:{dev.port}", second_url]
        body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {key}"}

        def knows_the_key(url: str) -> bool:
            return _status(f"{url}/v1/models", headers, timeout=10) == 200

        eventually_sync(lambda: all(map(knows_the_key, routers)), 60, "both routers know the key")
        started = time.monotonic()
        statuses: list[tuple[int, int]] = []
        for i in range(14):
            statuses.append((i % 2, _status(f"{routers[i % 2]}/v1/chat/completions", headers, body)))
        elapsed = time.monotonic() - started
        admitted = [router for router, status in statuses if status == 200]
        assert set(admitted) == {0, 1}  # the second router's requests reached dev's engine
        assert len(admitted) <= 6 * 1.1 + elapsed * 6 / 60
        assert {status for _, status in statuses} <= {200, 429}

        key_id = key.removeprefix("sk-llmgw-").split(".", 1)[0]

        def usage_report() -> list[tuple[str, int]]:
            shown = subprocess.run(
                [sys.executable, "-m", "llmgw", "ctl", "keys", "usage", key_id, "--json",
                 "--admin-url", dev.state["admin_url"]],
                capture_output=True, text=True, timeout=60, cwd=REPO,
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            return [(u["model"], u["requests"]) for u in json.loads(shown.stdout)["usage"]]

        # Each router counts from a task after its answer: the report catches up at once.
        eventually_sync(lambda: usage_report() == [("sim-chat", len(admitted))], 20, "the usage report")

        # A token budget, set as the README says, holds across both routers.
        budgeted = dev.create_key("ci", "--token-budget", "100", "--budget-period", "daily")
        budget_headers = {"Authorization": f"Bearer {budgeted}"}
        eventually_sync(
            lambda: all(_status(f"{url}/v1/models", budget_headers, timeout=10) == 200 for url in routers),
            60,
            "both routers know the budgeted key",
        )
        spent = [_status(f"{routers[i % 2]}/v1/chat/completions", budget_headers, body) for i in range(30)]
        assert 200 in spent and spent[-1] == 429
        budget_id = budgeted.removeprefix("sk-llmgw-").split(".", 1)[0]

        def budget_report() -> dict[str, object]:
            shown = subprocess.run(
                [sys.executable, "-m", "llmgw", "ctl", "keys", "usage", budget_id, "--json",
                 "--admin-url", dev.state["admin_url"]],
                capture_output=True, text=True, timeout=60, cwd=REPO,
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            report: dict[str, object] = json.loads(shown.stdout)["budget"]
            return report

        def settled() -> dict[str, object] | None:
            report = budget_report()
            return report if 0 < int(str(report["used"])) <= 100 else None

        report = eventually_sync(settled, 20, "the budget's period used within it")
        assert report["period"] == "daily" and report["tokens"] == 100
    finally:
        if second is not None and second.poll() is None:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(timeout=30)
        dev.process.send_signal(signal.SIGINT)
        dev.process.wait(timeout=60)
