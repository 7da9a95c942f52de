"""``llmgw status`` against the Consul stand-in, with a status document the leader would publish.

The document is built from the planning status types and published through the same
adapter the leader uses; the command reads it back the way an operator runs it:
``CONSUL_HTTP_ADDR`` in the environment, its exit code and output.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from llmgw.adapters.consul import ConsulClient, StatusPublisher
from llmgw.cli import main
from llmgw.core.planning.status import (
    BackoffStatus,
    ModelStatus,
    Phase,
    ReplicaStatus,
    StatusReport,
    to_json,
)
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.settings import ConsulConnection

REPO = Path(__file__).resolve().parents[3]
ALLOC_R1_RANK0 = "5d1b7c3e-0f4a-4e9b-9a7d-2c8e6f1a3b40"
ALLOC_R1_RANK1 = "a93e0d42-7b16-4c85-b3f9-e1d2c4a6b870"


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def replica(
    job: str, phase: Phase, nodes: tuple[str, ...], gpus: int, reason: str, **kw: object
) -> ReplicaStatus:
    fields: dict[str, object] = {
        "job_id": job,
        "replica_id": job.rsplit("-", 1)[-1],
        "profile": 0,
        "fabric": None,
        "phase": phase,
        "health": "passing" if phase is Phase.HEALTHY else None,
        "nodes": nodes,
        "gpus": tuple(f"GPU-{job}-{i}" for i in range(gpus)),
        "draining": False,
        "stopping": False,
        "outdated": False,
        "reason": reason,
    }
    fields.update(kw)
    return ReplicaStatus(**fields)  # type: ignore[arg-type]


def report(generated_at: float) -> StatusReport:
    return StatusReport(
        generated_at=generated_at,
        catalog_hash="ab" * 32,
        leader="cp-1",
        models=(
            ModelStatus(
                model="llama-70b",
                mode="keep-running",
                desired=2,
                healthy=1,
                replicas=(
                    replica(
                        "llmgw-llama-70b-r1",
                        Phase.HEALTHY,
                        ("gpu-1", "gpu-2"),
                        8,
                        "passing",
                        allocations=(ALLOC_R1_RANK0, ALLOC_R1_RANK1),
                    ),
                    replica(
                        "llmgw-llama-70b-r2",
                        Phase.HEALTHY,
                        ("gpu-3",),
                        4,
                        "draining: 3 request(s) in flight",
                        draining=True,
                    ),
                ),
                scaling="min 2",
                waiting="no node has 4 free GPUs of model H100 (2 nodes ready; 2 have too few free GPUs)",
                backoff=None,
            ),
            ModelStatus(
                model="qwen-7b",
                mode="on-demand",
                desired=1,
                healthy=0,
                replicas=(),
                scaling="demand 2.0 in flight",
                waiting=None,
                backoff=BackoffStatus(
                    failures=3,
                    retry_at=generated_at + 600,
                    last_failure="group rank-0 failed on gpu-4: task fetch-model failed: Exit Code: 1",
                ),
            ),
        ),
    )


@pytest.fixture
async def consul() -> AsyncIterator[ConsulStandIn]:
    async with ConsulStandIn(ConsulSettings.for_tests()) as standin:
        yield standin


@pytest.fixture
async def publisher(consul: ConsulStandIn) -> AsyncIterator[StatusPublisher]:
    async with ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": consul.url})) as client:
        yield StatusPublisher(client)


StatusRunner = Callable[..., Awaitable[Ran]]


@pytest.fixture
def status(
    consul: ConsulStandIn, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> StatusRunner:
    """``await status(*args)``: ``llmgw status ARGS`` in a worker thread (it runs its own event loop)."""
    for name in list(os.environ):
        if name.startswith("CONSUL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CONSUL_HTTP_ADDR", consul.url)
    monkeypatch.delenv("COLUMNS", raising=False)  # output to a pipe: no width, unless a test sets one

    async def run(*args: str) -> Ran:
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["status", *args])
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


async def test_before_any_leader_published_it_says_so_and_exits_3(status: StatusRunner) -> None:
    ran = await status()
    assert ran.code == 3
    assert ran.out == ""
    assert "no status has been published yet" in ran.err
    assert "llmgw serve" in ran.err


async def test_shows_each_model_and_replica_with_nodes_gpus_health_draining_and_why(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    await publisher.publish(to_json(report(time.time() - 5)))
    ran = await status()
    assert ran.code == 0, ran.err
    header = ran.lines[0]
    assert header.startswith("leader cp-1, catalog abababababab, published ")
    assert "ago)" in header and "STALE" not in header

    models = {line.split()[0]: line for line in ran.lines if line.startswith(("llama-70b ", "qwen-7b "))}
    assert models["llama-70b"].split()[:5] == ["llama-70b", "keep-running", "2", "1", "2"]
    assert "no node has 4 free GPUs of model H100" in models["llama-70b"]
    assert models["qwen-7b"].split()[:5] == ["qwen-7b", "on-demand", "1", "0", "0"]
    assert "rebuilding after 3 failure(s) in a row" in models["qwen-7b"]
    assert "task fetch-model failed: Exit Code: 1" in models["qwen-7b"]
    assert "next try in 9m" in models["qwen-7b"]

    rows = {line.split()[0]: line.split() for line in ran.lines if line.startswith("llmgw-")}
    assert rows["llmgw-llama-70b-r1"][:8] == [
        "llmgw-llama-70b-r1",
        "llama-70b",
        "healthy",
        "passing",
        "gpu-1,gpu-2",
        "8",
        "-",
        "5d1b7c3e,a93e0d42",
    ]
    assert rows["llmgw-llama-70b-r2"][4:8] == ["gpu-3", "4", "draining", "-"]
    assert " ".join(rows["llmgw-llama-70b-r2"][8:]) == "draining: 3 request(s) in flight"


async def test_at_80_columns_no_line_is_wider_and_nothing_is_lost(
    status: StatusRunner, publisher: StatusPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide_document = to_json(report(time.time() - 5))
    await publisher.publish(wide_document)
    wide = await status()
    monkeypatch.setenv("COLUMNS", "80")
    narrow = await status()
    assert narrow.code == 0, narrow.err
    assert max(len(line) for line in wide.lines) > 80, "the test needs a status wider than 80"
    assert all(len(line) <= 80 for line in narrow.lines), narrow.out

    # Every word of the wide table is still there (the why wrapped, replicas stacked).
    def words(text: str) -> set[str]:
        return set(text.lower().split())

    # Stacked, a block is a replica and its last lines its reason.
    assert words(wide.out) - {"replica", "reason"} <= words(narrow.out)
    assert "5d1b7c3e,a93e0d42" in narrow.out
    # --json is the published document whatever the width.
    monkeypatch.setenv("COLUMNS", "40")
    as_json = await status("--json")
    assert json.loads(as_json.out) == json.loads(wide_document)


async def test_nomads_warnings_about_a_replicas_job_are_shown_and_round_trip(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    warning = (
        'Memory oversubscription is not enabled; Task "rank-0.engine" memory_max value will be ignored. '
        "Update the Scheduler Configuration to allow oversubscription."
    )
    base = report(time.time())
    model = base.models[0]
    warned = replace(model.replicas[0], warnings=(warning,))
    published = replace(base, models=(replace(model, replicas=(warned, model.replicas[1])), *base.models[1:]))
    await publisher.publish(to_json(published))
    ran = await status()
    assert ran.code == 0, ran.err
    at = ran.lines.index("Nomad warned when these jobs were registered (a setting it ignores or doubts):")
    assert ran.lines[at + 1 :] == [f"  llmgw-llama-70b-r1: {warning}"]
    doc = json.loads((await status("--json")).out)
    assert doc["models"][0]["replicas"][0]["warnings"] == [warning]
    assert doc["models"][0]["replicas"][1]["warnings"] == []


async def test_replicas_sharing_a_node_are_named_with_why_and_round_trip(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    why = (
        "r1, r2 share node gpu-1: no node away from the others fitted when r2 was placed "
        "(profile 0 away from 1 node(s) of the model's other replicas: no node has 4 free GPUs)"
    )
    base = report(time.time())
    published = replace(base, models=(replace(base.models[0], spread=why), *base.models[1:]))
    await publisher.publish(to_json(published))
    ran = await status()
    assert ran.code == 0, ran.err
    at = ran.lines.index("Replicas of one model sharing a node (that node's loss takes them all):")
    assert ran.lines[at + 1] == f"  llama-70b: {why}"
    doc = json.loads((await status("--json")).out)
    assert doc["models"][0]["spread"] == why and doc["models"][1]["spread"] == ""
    await publisher.publish(to_json(base))
    assert "sharing a node" not in (await status()).out


async def test_json_is_the_published_document_and_model_filters_it(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    published = report(time.time())
    await publisher.publish(to_json(published))
    whole = await status("--json")
    assert whole.code == 0
    assert json.loads(whole.out) == json.loads(to_json(published))

    one = await status("--json", "--model", "qwen-7b")
    assert one.code == 0
    doc = json.loads(one.out)
    assert [m["model"] for m in doc["models"]] == ["qwen-7b"]
    assert doc["leader"] == "cp-1" and doc["generated_at"] == published.generated_at

    text = await status("--model", "llama-70b")
    assert text.code == 0
    assert "llama-70b" in text.out and "qwen-7b" not in text.out

    unknown = await status("--model", "nope")
    assert unknown.code == 1
    assert "no model 'nope' in the status (models: llama-70b, qwen-7b)" in unknown.err


async def test_an_old_status_is_called_stale_with_its_age(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    await publisher.publish(to_json(report(time.time() - 3 * 3600)))
    ran = await status()
    assert ran.code == 0
    assert "(3h00m ago); STALE" in ran.lines[0] or "(2h59m ago); STALE" in ran.lines[0]
    assert "none is publishing now" in ran.lines[0]


async def test_a_status_from_a_newer_leader_is_shown_as_published(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    doc = json.loads(to_json(report(time.time())))
    doc["models"][0]["replicas"][0]["phase"] = "hibernating"  # a phase this llmgw does not know
    await publisher.publish(json.dumps(doc))
    ran = await status()
    assert ran.code == 0
    assert "a shape this llmgw does not know" in ran.err
    assert json.loads(ran.out) == doc


async def test_consul_unreachable_exits_3_naming_the_address(
    status: StatusRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("CONSUL_HTTP_ADDR", f"127.0.0.1:{port}")
    ran = await status()
    assert ran.code == 3
    assert f"cannot reach Consul at http://127.0.0.1:{port}" in ran.err
    bad = await status("--interval", "0")
    assert bad.code == 2
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "unix:///var/run/consul.sock")
    unusable = await status()
    assert unusable.code == 2 and "CONSUL_HTTP_ADDR" in unusable.err


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_a_token_consul_refuses_exits_1_and_says_which_variable(
    token: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with ConsulStandIn(ConsulSettings.for_tests(acl_token="s3cret")) as standin:
        async with ConsulClient(
            ConsulConnection.from_env({"CONSUL_HTTP_ADDR": standin.url, "CONSUL_HTTP_TOKEN": "s3cret"})
        ) as client:
            await StatusPublisher(client).publish(to_json(report(time.time())))
        monkeypatch.setenv("CONSUL_HTTP_ADDR", standin.url)
        if token is None:
            monkeypatch.delenv("CONSUL_HTTP_TOKEN", raising=False)
        else:
            monkeypatch.setenv("CONSUL_HTTP_TOKEN", token)
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["status"])
        err = capsys.readouterr().err
        assert code == 1
        assert "refused" in err and "CONSUL_HTTP_TOKEN" in err
        monkeypatch.setenv("CONSUL_HTTP_TOKEN", "s3cret")
        assert await asyncio.to_thread(main, ["status"]) == 0


async def test_watch_as_a_process_shows_the_next_status_and_stops_on_ctrl_c(
    consul: ConsulStandIn, publisher: StatusPublisher
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    env["CONSUL_HTTP_ADDR"] = consul.url
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        "status",
        "--watch",
        "--interval",
        "0.2",
        "--model",
        "llama-70b",
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_ctrl_c_as_on_a_terminal,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        # Nothing is published yet: the watch says so and keeps trying.
        first_err = await asyncio.wait_for(process.stderr.readline(), 30)
        assert b"no status has been published yet" in first_err
        assert b"retrying every 0.2s" in first_err
        await publisher.publish(to_json(report(time.time())))
        seen = b""
        while b"llmgw-llama-70b-r2" not in seen:
            seen += await asyncio.wait_for(process.stdout.readline(), 30)
        later = replace(report(time.time()), leader="cp-2")
        await publisher.publish(to_json(later))
        while b"leader cp-2" not in seen:
            seen += await asyncio.wait_for(process.stdout.readline(), 30)
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _ctrl_c_as_on_a_terminal() -> None:
    # A suite started as a shell's background job runs with SIGINT ignored, and an
    # ignored signal stays ignored across exec: Python then installs no Ctrl-C handler
    # in the child, and the watch would rightly ignore the interrupt this test sends.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_status_is_listed_in_llmgw_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0
    assert "status" in result.stdout


async def test_a_model_healthy_again_after_a_rebuild_shows_why_it_runs_not_the_old_failure(
    status: StatusRunner, publisher: StatusPublisher
) -> None:
    # The planner on a synthetic clock: a replica crashes, is rebuilt after the backoff and
    # serves again. The failure stays in the document (the backoff resets only after
    # backoff_reset_after of health), but WHY says what is true now.
    from llmgw.core.catalog import Catalog
    from tests.support.control import FakeCluster, Simulation

    def crash_and_rebuild() -> tuple[StatusReport, StatusReport, float]:
        cluster = FakeCluster(start_delay=2.0, load_delay=10.0)
        cluster.add_node("n0")
        model = {
            "profiles": [{"engine": "sim", "tp": 1, "gpu": {"model": "H100"}}],
            "scaling": {"min": 1, "max": 1},
        }
        sim = Simulation(Catalog.model_validate({"models": {"m": model}}), cluster)
        sim.run(30)
        (job,) = cluster.healthy_jobs("m")
        cluster.crash(job, "rank0")
        sim.run(5)
        rebuilding = sim.decisions[-1].status
        sim.run(300)
        return rebuilding, sim.decisions[-1].status, sim.now

    # The simulation runs the executor on a loop of its own: not on this test's loop.
    rebuilding, healthy, now = await asyncio.to_thread(crash_and_rebuild)
    (m,) = healthy.models
    assert (m.desired, m.healthy, m.waiting) == (1, 1, None)
    assert m.backoff is not None and m.backoff.failures == 1 and m.backoff.retry_at < now

    await publisher.publish(to_json(replace(rebuilding, generated_at=time.time())))
    ran = await status()
    (row,) = [line for line in ran.lines if line.startswith("m ")]
    assert "backing off after 1 failure(s) in a row" in row, row

    await publisher.publish(to_json(replace(healthy, generated_at=time.time())))
    ran = await status()
    assert ran.code == 0, ran.err
    (row,) = [line for line in ran.lines if line.startswith("m ")]
    assert row.split()[:5] == ["m", "keep-running", "1", "1", "1"]
    assert row.split(None, 5)[5] == m.scaling, row
    assert "rebuilding" not in row and "failure" not in row
    history = await status("--json")
    assert json.loads(history.out)["models"][0]["backoff"]["failures"] == 1


def big_report(models: int, generated_at: float, leader: str = "cp-1") -> StatusReport:
    """A catalog of ``models`` two-node models, each with one replica on two nodes of 8 GPUs."""
    return StatusReport(
        generated_at=generated_at,
        catalog_hash="cd" * 32,
        leader=leader,
        models=tuple(
            ModelStatus(
                model=f"model-{i:04d}",
                mode="keep-running",
                desired=1,
                healthy=1,
                replicas=(
                    replica(
                        f"llmgw-model-{i:04d}-r1",
                        Phase.HEALTHY,
                        (f"gpu-{2 * i}", f"gpu-{2 * i + 1}"),
                        16,
                        "passing",
                    ),
                ),
                scaling="min 1",
                waiting=None,
                backoff=None,
            )
            for i in range(models)
        ),
    )


async def test_a_2000_model_status_publishes_through_consuls_value_limit_and_shows_whole(
    consul: ConsulStandIn, status: StatusRunner, publisher: StatusPublisher
) -> None:
    """One KV value holds 512 KiB (the stand-in refuses more as Consul does, 413); a
    2,000-model status is several times that, so it is stored in pieces and read whole."""
    published = big_report(2000, time.time())
    text = to_json(published)
    assert len(text.encode()) > 3 * consul.settings.kv_max_value_size
    await publisher.publish(text)

    whole = await status("--json")
    assert whole.code == 0, whole.err
    assert json.loads(whole.out) == json.loads(text)
    shown = await status()
    assert shown.code == 0, shown.err
    assert sum(1 for line in shown.lines if line.startswith("model-")) == 2000
    assert sum(1 for line in shown.lines if line.startswith("llmgw-model-")) == 2000
    one = await status("--json", "--model", "model-1999")
    assert [m["model"] for m in json.loads(one.out)["models"]] == ["model-1999"]

    # A smaller status replaces it whole, and the old pieces are gone.
    await publisher.publish(to_json(report(time.time())))
    again = await status("--json")
    assert [m["model"] for m in json.loads(again.out)["models"]] == ["llama-70b", "qwen-7b"]
    async with ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": consul.url})) as client:
        keys = await client.kv_keys("llmgw/status/parts/")
    assert len({key.split("/")[3] for key in keys}) == 1
