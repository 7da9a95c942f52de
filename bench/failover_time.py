"""Benchmark: from a node failing to its replica rebuilt elsewhere, on the dev stand-ins.

Runs what ``llmgw dev`` runs (the Nomad and Consul stand-ins with real ``llmgw sim``
processes, the control plane with ``llmgw dev``'s settings) and, for a one-node and a
two-node replica in turn, fails a node the replica runs on (as ``llmgw dev fail-node``
does) and times, from that moment:

- ``down``: Nomad reports the node down or disconnected (the stand-in's heartbeat grace);
- ``stopped``: llmgw has deregistered the failed replica (it judged it FAILED: the node
  was down for ``node_lost_grace``, or Nomad marked its allocations lost first, or a
  surviving rank failed without its peer);
- ``lost``: llmgw judged the replica lost with its node (its
  ``llmgw_control_replicas_lost_total`` moved): at ``stopped``, or for a rank that failed
  before Nomad called its peer's node down, when Nomad did;
- ``registered``: the rebuilt replica's job is registered;
- ``healthy``: its engine passes its Consul check (start, ``load_seconds``, check interval).

Beside them, the router's reaction (a router runs in the same process, following Nomad as
``llmgw serve`` wires it): ``router ms`` is the time from Nomad's first event that took the
failed replica's serving allocation out of ``running`` (unknown with its node, or its
task restarting when a multi-node replica lost a peer; its ``ModifyTime``, stamped at
the commit) to the
router's book no longer routing to it (Nomad's word, ``routing.vouch``), in milliseconds
of the router's own wall clock; ``consul out`` is when the router's Consul snapshot first
showed the endpoint not passing (the Consul stand-in fails the node's agent with the node,
at once, which a real cluster's gossip takes seconds to notice).

``lost -> registered`` is the control plane's own time for the rebuild (the pass that
judges it: render, plan, register; no backoff); the rest is bounded by the configured
graces, printed above the table. Each
run restores the node afterwards (it comes back empty). The passes' ``decide`` time is
read from the control plane's ``llmgw_control_decide_seconds`` histogram over each run.

    python bench/failover_time.py [--runs 3] [--node-lost-grace 15] [--heartbeat-grace 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw.adapters.consul import ConsulClient, parse_endpoint
from llmgw.adapters.nomad import NomadClient
from llmgw.bundled import read_security_policy
from llmgw.cli.dev_run import dev_control_settings, dev_render_settings
from llmgw.cli.serving import Role, Services, ServiceSettings, publish_catalog
from llmgw.control import ControlPlane, ControlSettings
from llmgw.core import conventions as c
from llmgw.core.records import Endpoint
from llmgw.core.routing import Vouch
from llmgw.devcluster.cluster import DevCluster, DevClusterConfig
from llmgw.devcluster.nomad import NodeSpec, StandInConfig
from llmgw.gateway.book import EndpointBook
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.settings import RouterSettings
from llmgw.render import RenderSettings
from llmgw.settings import ConsulConnection, NomadConnection

LOAD_SECONDS = 0.5
CATALOG = f"""
models:
  sim-one:
    profiles:
      - engine: sim
        sim: {{load_seconds: {LOAD_SECONDS}}}
    scaling: {{min: 1, max: 1}}
  sim-two:
    profiles:
      - engine: sim
        tp: 2
        nodes: 2
        sim: {{load_seconds: {LOAD_SECONDS}}}
    scaling: {{min: 1, max: 1}}
"""
POLL = 0.05  # how often the bench looks (the figures are this precise)


@dataclass(frozen=True)
class Run:
    model: str
    down: float | None
    stopped: float | None
    lost: float | None
    registered: float | None
    healthy: float | None
    passes: int
    decide_mean: float | None
    decide_max_below: float | None  # the histogram bucket the slowest decide fell in
    router_reaction: float | None = None  # seconds from Nomad's event to the router not routing there
    consul_out: float | None = None  # seconds after the failure the router's Consul view dropped it


class RouterReaction:
    """Times one replica leaving the router: Nomad's event (its allocation's ModifyTime in the
    stream) against the router's wall clock at the book change that took it away."""

    def __init__(self, nomad: NomadClient, book: EndpointBook, job: str) -> None:
        self._nomad = nomad
        self._book = book
        self._job = job
        self.event_at: float | None = None  # unix seconds, Nomad's stamp
        self.dropped_at: float | None = None  # unix seconds, the router's clock
        self.consul_out_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._events()), asyncio.create_task(self._book_changes())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def reaction(self) -> float | None:
        if self.event_at is None or self.dropped_at is None:
            return None
        return self.dropped_at - self.event_at

    def _mine(self) -> list[Endpoint]:
        return [e for e in self._book.endpoints() if e.replica == self._job]

    async def _events(self) -> None:
        # The allocations behind the replica's endpoints (rank 0's: the one that serves).
        serving = {e.alloc_id for e in self._mine()}
        index = (await self._nomad.allocations()).index + 1
        async for batch in self._nomad.events(["Allocation"], index=index):
            for event in batch.events:
                alloc = event["Payload"]["Allocation"]
                taken = alloc["ClientStatus"] != "running" or alloc["DesiredStatus"] != "run"
                if alloc["ID"] in serving and taken and self.event_at is None:
                    self.event_at = alloc["ModifyTime"] / 1e9

    async def _book_changes(self) -> None:
        while self.dropped_at is None or self.consul_out_at is None:
            await self._book.wait_changed()
            now = time.time()
            mine = self._mine()
            if self.dropped_at is None and any(
                self._book.vouch_of(e) not in (None, Vouch.ROUTE) for e in mine
            ):
                self.dropped_at = now
            if self.consul_out_at is None and not any(e.passing for e in mine):
                self.consul_out_at = now


async def jobs_of(nomad: NomadClient, model: str) -> dict[str, set[str]]:
    """The model's jobs that Nomad has (not stopped), with the nodes of their live allocations."""
    out: dict[str, set[str]] = {}
    for stub in (await nomad.jobs(prefix="llmgw-")).items:
        if (stub.get("Meta") or {}).get(c.JOB_META_MODEL) != model or stub.get("Stop"):
            continue
        allocs = (await nomad.job_allocations(str(stub["ID"]))).items
        out[str(stub["ID"])] = {
            str(a["NodeID"])
            for a in allocs
            if a.get("DesiredStatus") == "run" and a.get("ClientStatus") == "running"
        }
    return out


async def passing(consul: ConsulClient, model: str) -> set[str]:
    entries, _ = await consul.health_service(c.ENGINE_SERVICE)
    endpoints = [parse_endpoint(e) for e in entries]
    return {e.replica for e in endpoints if e.model == model and e.passing}


async def node_status(nomad: NomadClient, node_id: str) -> str:
    node = await nomad.node(node_id)
    return str((node or {}).get("Status", ""))


def lost_count(plane: ControlPlane) -> float:
    for metric in plane.metrics.registry.collect():
        for s in metric.samples:
            if s.name == "llmgw_control_replicas_lost_total":
                return s.value
    return 0.0


def decide_histogram(plane: ControlPlane) -> tuple[float, float, dict[float, float]]:
    total = count = 0.0
    buckets: dict[float, float] = {}
    for metric in plane.metrics.registry.collect():
        for s in metric.samples:
            if s.name == "llmgw_control_decide_seconds_sum":
                total = s.value
            elif s.name == "llmgw_control_decide_seconds_count":
                count = s.value
            elif s.name == "llmgw_control_decide_seconds_bucket":
                buckets[float(s.labels["le"])] = s.value
    return total, count, buckets


async def wait_steady(nomad: NomadClient, consul: ConsulClient, model: str, within: float) -> str:
    """The model's one job once it runs and passes; its id."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        jobs = await jobs_of(nomad, model)
        healthy = await passing(consul, model)
        if len(jobs) == 1 and set(jobs) <= healthy:
            return next(iter(jobs))
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{model} did not become healthy within {within}s")


async def one_failover(
    cluster: DevCluster,
    nomad: NomadClient,
    consul: ConsulClient,
    plane: ControlPlane,
    model: str,
    book: EndpointBook,
) -> Run:
    assert cluster.nomad is not None
    job = await wait_steady(nomad, consul, model, 120)
    node_id = sorted((await jobs_of(nomad, model))[job])[0]
    sum0, count0, buckets0 = decide_histogram(plane)
    lost0 = lost_count(plane)
    router = RouterReaction(nomad, book, job)
    router.start()
    await asyncio.sleep(0.2)  # the bench's event stream is open before the fault
    failed_at = time.time()
    t0 = time.monotonic()
    await cluster.nomad.fail_node(node_id)
    down = stopped = lost = registered = healthy = None
    fresh: str | None = None
    while time.monotonic() - t0 < 300 and healthy is None:
        now = time.monotonic() - t0
        if down is None and await node_status(nomad, node_id) in ("down", "disconnected"):
            down = now
        jobs = await jobs_of(nomad, model)
        if stopped is None and job not in jobs:
            stopped = now
        if lost is None and lost_count(plane) > lost0:
            lost = now
        if fresh is None:
            fresh = next((j for j in jobs if j != job), None)
            if fresh is not None:
                registered = now
        if fresh is not None and fresh in await passing(consul, model):
            healthy = now
        await asyncio.sleep(POLL)
    sum1, count1, buckets1 = decide_histogram(plane)
    await router.stop()
    await cluster.nomad.restore_node(node_id)
    passes = int(count1 - count0)
    # Cumulative buckets: the slowest decide fell in the smallest bucket that holds every pass.
    holds_all = [le for le, n in buckets1.items() if passes and n - buckets0.get(le, 0.0) >= passes]
    return Run(
        model,
        down,
        stopped,
        lost,
        registered,
        healthy,
        passes,
        (sum1 - sum0) / passes if passes else None,
        min(holds_all) if holds_all else None,
        router.reaction,
        None if router.consul_out_at is None else router.consul_out_at - failed_at,
    )


def show(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def print_bounds(nomad: StandInConfig, control: ControlSettings, render: RenderSettings) -> None:
    p = control.planning
    rows = [
        ("Nomad stand-in: a failed node is down after (heartbeat grace)", f"{nomad.heartbeat_grace_s:g} s"),
        ("job: a disconnected node's allocations are lost after (lost_after)", f"{render.lost_after_s} s"),
        ("llmgw: a down node's replicas are rebuilt after (node_lost_grace)", f"{p.node_lost_grace:g} s"),
        ("llmgw: after an event, a pass starts within (debounce)", f"{control.debounce:g} s"),
        ("llmgw: between two passes at least (min_pass_interval)", f"{control.min_pass_interval:g} s"),
        (
            "llmgw: first rebuild backoff (backoff_base, jitter)",
            f"{p.backoff_base:g} s, -{p.backoff_jitter:.0%}",
        ),
        ("engine: sim load_seconds", f"{LOAD_SECONDS:g} s"),
        ("Consul: health check interval", f"{render.check_interval_s} s"),
    ]
    print("configured bounds:")
    for name, value in rows:
        print(f"  {name:<72} {value}")
    first = min(render.lost_after_s, p.node_lost_grace)
    print(
        f"  => a one-node replica is judged lost about {nomad.heartbeat_grace_s + first:g} s after its node "
        f"fails (down + min(lost_after, node_lost_grace)); a multi-node one as soon as its surviving rank "
        "stops serving, if sooner"
    )


async def bench(args: argparse.Namespace) -> None:
    policy = read_security_policy()
    base = dev_control_settings()
    control = replace(base, planning=replace(base.planning, node_lost_grace=args.node_lost_grace))
    render = dev_render_settings()
    nodes = tuple(NodeSpec(name=f"gpu-{i}", gpus=1, gpu_model="H100", fabric="fabric-a") for i in range(1, 7))
    nomad_config = StandInConfig(nodes=nodes, heartbeat_grace_s=args.heartbeat_grace)
    print(
        f"failover on the dev stand-ins: {len(nodes)} nodes x 1 simulated H100, {args.runs} run(s) per model"
    )
    print_bounds(nomad_config, control, render)
    with tempfile.TemporaryDirectory(prefix="llmgw-failover-") as tmp:
        config = DevClusterConfig(nomad=nomad_config, state_dir=Path(tmp) / "nomad")
        async with DevCluster(config) as cluster:
            settings = ServiceSettings(
                role=Role.ALL,  # the control plane and a router that follows Nomad
                router=RouterSettings(host="127.0.0.1", port=0, no_auth=True, router_id="bench"),
                nomad=NomadConnection(address=cluster.nomad_addr, token=cluster.nomad_token),
                consul=ConsulConnection.from_env(
                    {"CONSUL_HTTP_ADDR": cluster.consul_addr, "CONSUL_HTTP_TOKEN": cluster.consul_token}
                ),
                policy=policy,
                render=render,
                control=control,
                admin=None,
                instance_id="bench",
            )
            async with (
                Services(settings) as services,
                NomadClient(settings.nomad) as nomad,
            ):
                assert services.consul is not None and services.control is not None
                assert services.router is not None
                book = services.router.app[CONTEXT].book
                await publish_catalog(services.consul, CATALOG, applied_by="bench")
                runs: list[Run] = []
                for i in range(args.runs):
                    for model in ("sim-one", "sim-two"):
                        run = await one_failover(
                            cluster, nomad, services.consul, services.control, model, book
                        )
                        runs.append(run)
                        print(
                            f"  run {i + 1} {model}: rebuilt replica healthy after {show(run.healthy)} s",
                            flush=True,
                        )
    print()
    header = (
        f"{'model':<8} {'down':>6} {'stopped':>8} {'lost':>6} {'registered':>11} {'healthy':>8} "
        f"{'llmgw lost->reg':>16} {'passes':>7} {'decide mean':>12} {'decide max':>11}"
        f" {'router ms':>10} {'consul out':>11}"
    )
    print("seconds after the node failed:")
    print(header)
    for r in runs:
        own = r.registered - r.lost if r.registered is not None and r.lost is not None else None
        times = (
            f"{show(r.down):>6} {show(r.stopped):>8} {show(r.lost):>6} "
            f"{show(r.registered):>11} {show(r.healthy):>8}"
        )
        mean, slowest = (
            show(r.decide_mean, 1000, 2) + " ms",
            "<= " + show(r.decide_max_below, 1000, 1) + " ms",
        )
        decide = f"{mean:>12} {slowest:>11}"
        router = f"{show(r.router_reaction, 1000, 1):>10} {show(r.consul_out):>11}"
        print(f"{r.model:<8} {times} {show(own, digits=2):>16} {r.passes:>7} {decide} {router}")
    for model in ("sim-one", "sim-two"):
        mine = [r for r in runs if r.model == model and r.registered is not None and r.healthy is not None]
        if mine:
            reg = statistics.median(r.registered for r in mine if r.registered is not None)
            ok = statistics.median(r.healthy for r in mine if r.healthy is not None)
            own = [r.registered - r.lost for r in mine if r.registered is not None and r.lost is not None]
            lost_to_reg = f", llmgw lost->registered {statistics.median(own):.2f} s" if own else ""
            print(
                f"{model}: median {reg:.1f} s to registered, {ok:.1f} s to healthy{lost_to_reg} "
                f"over {len(mine)} run(s)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--node-lost-grace",
        type=float,
        default=dev_control_settings().planning.node_lost_grace,
        help="seconds a node is down before its replicas are rebuilt (default: llmgw dev's)",
    )
    parser.add_argument(
        "--heartbeat-grace",
        type=float,
        default=StandInConfig().heartbeat_grace_s,
        help="seconds before the Nomad stand-in marks a failed node down (default: the stand-in's)",
    )
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
