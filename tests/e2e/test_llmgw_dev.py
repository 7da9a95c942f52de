"""`llmgw dev` end to end: the official openai client through the router, a node failure, Ctrl-C."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml

from tests.support.waiting import eventually_sync

from .conftest import REPO, RunningDev, alive, start_dev

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-chat:
    roles: [chat, completion]
    profiles:
      - engine: sim
        sim: {tokens_per_second: 200, load_seconds: 0.5}
    scaling: {min: 1, max: 1}
  sim-two-node:
    roles: [chat]
    profiles:
      - engine: sim
        tp: 2
        nodes: 2
        sim: {tokens_per_second: 200, load_seconds: 0.5}
    scaling: {min: 2, max: 2}
"""

# Six one-GPU nodes on one fabric: two two-node replicas use four, two are spare.
CLUSTER = (
    "\n".join(
        ["nodes:"]
        + [f"  - {{name: gpu-{i}, gpus: 1, gpu_model: H100, fabric: fabric-a}}" for i in range(1, 7)]
    )
    + "\nheartbeat_grace_s: 1\n"
)


def wait_for(predicate, within: float, what: str):  # type: ignore[no-untyped-def]
    """``eventually_sync`` retrying whatever a probe raises while ``llmgw dev`` comes up."""
    return eventually_sync(predicate, within, what, every=0.5, retry_on=(Exception,))


def replicas(dev: RunningDev, model_slug_prefix: str) -> dict[str, set[str]]:
    """Running job id -> the node ids of its running allocations."""
    allocs = dev.nomad("/v1/allocations")
    out: dict[str, set[str]] = {}
    for alloc in allocs:
        # A stopped job's allocation on a down node may still read "running" (no client
        # is left to report it): only what Nomad wants running counts.
        if (
            alloc["JobID"].startswith(model_slug_prefix)
            and alloc["DesiredStatus"] == "run"
            and alloc["ClientStatus"] == "running"
        ):
            out.setdefault(alloc["JobID"], set()).add(alloc["NodeID"])
    return out


def dev_log_lines(dev: RunningDev, *needles: str, last: int = 40) -> str:
    """The last lines of llmgw dev's log holding any of ``needles`` (for failure messages)."""
    lines = [line for line in dev.log.read_text().splitlines() if any(n in line for n in needles)]
    return "\n".join(lines[-last:])


def node_names(dev: RunningDev) -> dict[str, str]:
    """Node id -> node name (gpu-1 ...)."""
    return {node["ID"]: node["Name"] for node in dev.nomad("/v1/nodes")}


def scrape_as_prometheus_finds_them(dev: RunningDev) -> None:
    """Every target ops/prometheus/prometheus.yml names, found as Prometheus's Consul
    discovery finds it (discovery/consul/consul.go: /v1/health/service/NAME?dc=, a target at
    Service.Address, else Node.Address, and Service.Port; a Bearer token), answers /metrics
    with llmgw's metrics. Debian builds Prometheus without Consul discovery, so this walks
    its requests by hand (tests/component/ops/test_prometheus.py says so where it skips)."""
    config = yaml.safe_load((REPO / "ops" / "prometheus" / "prometheus.yml").read_text())
    token = (dev.state_dir / "consul.token").read_text()
    prefixes = {"llmgw-router": "llmgw_router_", "llmgw-control": "llmgw_control_", "llmgw-engine": "vllm:"}
    for job in config["scrape_configs"]:
        (sd,) = job["consul_sd_configs"]
        (service,) = sd["services"]

        def targets(service: str = service, dc: str = sd["datacenter"]) -> list[str] | None:
            request = urllib.request.Request(
                f"{dev.state['consul_addr']}/v1/health/service/{service}?dc={dc}",
                headers={"Authorization": f"Bearer {token}"},
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                entries = json.load(response)
            found = [
                f"{e['Service']['Address'] or e['Node']['Address']}:{e['Service']['Port']}"
                for e in entries
                if all(check["Status"] == "passing" for check in e["Checks"])
            ]
            return found or None

        for target in wait_for(targets, 30, f"{service} passing in Consul"):
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
                text = response.read().decode()
            assert f"\n{prefixes[job['job_name']]}" in text, f"{job['job_name']} at {target}"


def test_llmgw_dev_serves_streams_survives_a_node_and_stops_clean(
    tmp_path: Path, dev_runner: list[RunningDev]
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    dev = start_dev(
        tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--cluster", str(tmp_path / "cluster.yaml")
    )
    dev_runner.append(dev)
    client = openai.OpenAI(base_url=dev.base_url, api_key="unused-in-dev", max_retries=0, timeout=30)

    # The official client streams from a simulated model through the router.
    def streamed() -> str:
        stream = client.chat.completions.create(
            model="sim-chat", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
        )
        chunks = list(stream)
        assert {c.model for c in chunks} == {"sim-chat"}
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    text = wait_for(streamed, 60, "a streamed answer from sim-chat")
    assert len(text.split()) == 8 and all(word.isalpha() for word in text.split())
    assert "event loop: uvloop" in dev.log.read_text()  # as llmgw serve runs, by default
    models = {m.id: m.owned_by for m in client.models.list()}
    assert models["sim-chat"] == "llmgw-sim"
    scrape_as_prometheus_finds_them(dev)

    # Two replicas of the two-node model, each on two nodes.
    prefix = "llmgw-sim-two-node-"

    def two_full_replicas() -> dict[str, set[str]] | None:
        running = replicas(dev, prefix)
        return running if len(running) == 2 and all(len(n) == 2 for n in running.values()) else None

    before = wait_for(two_full_replicas, 90, "two two-node replicas running")
    wait_for(
        lambda: client.chat.completions.create(
            model="sim-two-node", max_tokens=2, messages=[{"role": "user", "content": "x"}]
        ),
        60,
        "the two-node model answering",
    )

    # Keep a load of requests running through the router the whole time.
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(
                    model="sim-two-node", max_tokens=4, messages=[{"role": "user", "content": "x"}]
                )
                answered[0] += 1
            except Exception as exc:
                failures.append(repr(exc))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        doomed_job, doomed_nodes = sorted(before.items())[0]
        survivor_job = next(job for job in before if job != doomed_job)
        node_id = sorted(doomed_nodes)[0]
        result = dev.cli("fail-node", node_id)
        assert result.returncode == 0, result.stderr

        def rebuilt() -> dict[str, set[str]] | None:
            now = replicas(dev, prefix)
            fresh = [job for job in now if job not in before]
            if survivor_job in now and len(fresh) == 1 and len(now[fresh[0]]) == 2:
                return now
            return None

        after = wait_for(rebuilt, 120, "the lost replica rebuilt on two other nodes")
        new_job = next(job for job in after if job not in before)
        assert node_id not in after[new_job]
        assert after[survivor_job] == before[survivor_job], "the other replica was not touched"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert answered[0] > 0
    assert failures == [], (failures[:5], dev_log_lines(dev, "attempt failed", "stop ", "lost"))

    # Ctrl-C stops everything and leaves no process behind.
    pids = dev.task_pids()
    assert pids
    assert dev.interrupt() == 0
    assert not (dev.state_dir / "dev.json").exists()
    leftovers = [pid for pid in pids if alive(pid)]
    assert leftovers == [], leftovers


def test_the_readme_fail_node_demo_rebuilds_the_405b_replica_on_the_spare_node(
    tmp_path: Path, dev_runner: list[RunningDev]
) -> None:
    """README: `llmgw dev` (the example catalog on the default cluster), then
    `llmgw dev fail-node gpu-1`: the two-node replica on it comes back on two live
    nodes, and sim-chat answers throughout."""
    dev = start_dev(tmp_path)
    dev_runner.append(dev)
    client = openai.OpenAI(base_url=dev.base_url, api_key="unused-in-dev", max_retries=0, timeout=30)
    prefix = "llmgw-llama-3-1-405b-"

    def on_two_nodes() -> dict[str, set[str]] | None:
        names = node_names(dev)
        running = {job: {names[n] for n in nodes} for job, nodes in replicas(dev, prefix).items()}
        return running if len(running) == 1 and all(len(n) == 2 for n in running.values()) else None

    ((job, nodes),) = wait_for(on_two_nodes, 90, "the 405b replica on two nodes").items()
    assert "gpu-1" in nodes, nodes  # the README fails gpu-1: the demo must hit the replica
    result = dev.cli("fail-node", "gpu-1")
    assert result.returncode == 0, result.stderr

    def rebuilt() -> dict[str, set[str]] | None:
        running = on_two_nodes()
        return running if running and all("gpu-1" not in n for n in running.values()) else None

    ((new_job, new_nodes),) = wait_for(rebuilt, 90, "the 405b replica rebuilt off gpu-1").items()
    assert new_job != job and len(new_nodes) == 2
    answer = client.chat.completions.create(
        model="sim-chat", max_tokens=2, messages=[{"role": "user", "content": "x"}]
    )
    assert answer.model == "sim-chat"
