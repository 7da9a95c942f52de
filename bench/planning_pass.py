"""Benchmark: one pass of the reconciler's decision core over 1,000 models on 500 nodes.

Target (the control-plane issue): under 100 ms for one pass. Prints the best of several
runs of ``decide`` in three situations — steady (everything healthy, nothing to do), churn
(5% of replicas failed, 10% of models with a changed spec, demand moving) and cold start
(nothing runs: every model wants a placement) — next to a baseline measured in the same
run: one plain loop that reads every job, allocation, node and model of the same input
once and builds a dict of them, the floor any pass over this input pays.

    python bench/planning_pass.py [--models 1000] [--nodes 500] [--runs 7]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from llmgw.core.catalog import Catalog
from llmgw.core.planning import (
    EMPTY_STATE,
    AllocStatus,
    Decision,
    JobId,
    NodeId,
    NodeStatus,
    Observed,
    ObservedAlloc,
    ObservedJob,
    ObservedNode,
    PlannerState,
    PlanningSettings,
    ReplicaId,
    decide,
    desired_from_catalog,
    replica_job_id,
)
from llmgw.core.records import HealthStatus
from llmgw.core.scaling import ModelDemand

NOW = 1_700_000_000.0


def build_catalog(models: int) -> Catalog:
    spec: dict[str, object] = {}
    for i in range(models):
        nodes = 2 if i % 25 == 0 else 1
        profile = {"engine": "sim", "tp": 8 * nodes if nodes > 1 else 1 + i % 4, "gpu": {"model": "H100"}}
        if nodes > 1:
            profile["nodes"] = nodes
        scaling = {"min": 1, "max": 3} if i % 3 else {"min": 0, "max": 1, "idle_timeout": "10m"}
        spec[f"model-{i:05d}"] = {"profiles": [profile], "scaling": scaling}
    return Catalog.model_validate({"models": spec})


def build_world(catalog: Catalog, nodes: int, *, failed_every: int = 0) -> Observed:
    node_map = {
        NodeId(f"node-{n:04d}"): ObservedNode(
            NodeId(f"node-{n:04d}"), f"gpu-{n:04d}", NodeStatus.READY, NOW - 86400, True, f"fab-{n // 50}"
        )
        for n in range(nodes)
    }
    node_ids = list(node_map)
    jobs: dict[JobId, ObservedJob] = {}
    health: dict[JobId, HealthStatus] = {}
    demand: dict[str, ModelDemand] = {}
    k = 0
    for i, (name, model) in enumerate(catalog.models.items()):
        profile = model.profiles[0]
        count = 1 if model.scaling and model.scaling.min <= 1 else 2
        demand[name] = ModelDemand(last_used=NOW - 30, in_flight=i % 7)
        for r in range(count):
            rid = ReplicaId(f"r{i:05d}{r}")
            jid = replica_job_id(name, rid)
            groups = tuple(f"rank{g}" for g in range(profile.node_count))
            allocs = []
            for g in groups:
                k += 1
                status = AllocStatus.FAILED if failed_every and k % failed_every == 0 else AllocStatus.RUNNING
                allocs.append(
                    ObservedAlloc(
                        f"alloc-{k:06d}",
                        g,
                        node_ids[k % nodes],
                        status,
                        True,
                        NOW - 3600,
                        NOW - 3500,
                        0,
                        tuple(f"gpu-{k}-{d}" for d in range(profile.gpus_per_replica_node)),
                    )
                )
            jobs[jid] = ObservedJob(
                jid,
                name,
                rid,
                0,
                spec_hash(name, 0, rid, None),
                "c",
                "0.1.0",
                "fab-0" if profile.node_count > 1 else None,
                groups,
                NOW - 3600,
                False,
                tuple(allocs),
            )
            health[jid] = HealthStatus.PASSING
    return Observed(jobs=jobs, nodes=node_map, health=health, demand=demand, capacity_version=1)


def spec_hash(model: str, profile: int, replica: str, fabric: str | None) -> str:
    return f"{model}:{profile}"


def changed_spec(model: str, profile: int, replica: str, fabric: str | None) -> str:
    # Every tenth model has a new spec.
    return f"{model}:{profile}" + ("*" if model.endswith("0") else "")


def baseline(observed: Observed, catalog: Catalog) -> object:
    seen: dict[str, tuple[int, int]] = {}
    for job in observed.jobs.values():
        running = sum(1 for a in job.allocs if a.client_status is AllocStatus.RUNNING)
        seen[job.job_id] = (running, len(job.groups))
    ready = sum(1 for n in observed.nodes.values() if n.status is NodeStatus.READY)
    models = {name: len(m.profiles) for name, m in catalog.models.items()}
    return seen, ready, models


def best_of(runs: int, action: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    settings = PlanningSettings()
    catalog = build_catalog(args.models)
    steady_world = build_world(catalog, args.nodes)
    churn_world = build_world(catalog, args.nodes, failed_every=20)
    cold_world = Observed(nodes=steady_world.nodes, capacity_version=1)
    steady = desired_from_catalog(catalog, "c1", spec_hash, settings)
    changed = desired_from_catalog(catalog, "c2", changed_spec, settings)
    warm: PlannerState = decide(steady, steady_world, EMPTY_STATE, NOW, settings).state

    base = best_of(args.runs, lambda: baseline(steady_world, catalog))
    rows: list[tuple[str, Callable[[], Decision]]] = [
        ("steady", lambda: decide(steady, steady_world, warm, NOW + 1, settings)),
        ("churn", lambda: decide(changed, churn_world, warm, NOW + 1, settings)),
        ("cold start", lambda: decide(steady, cold_world, EMPTY_STATE, NOW, settings)),
    ]
    jobs = len(steady_world.jobs)
    allocs = sum(len(j.allocs) for j in steady_world.jobs.values())
    print(
        f"{args.models} models, {args.nodes} nodes, {jobs} replica jobs, {allocs} allocations; "
        f"best of {args.runs}"
    )
    print(f"  baseline (read every input once):  {base * 1000:8.2f} ms")
    for name, action in rows:
        seconds = best_of(args.runs, action)
        count = len(action().actions)
        verdict = "ok" if seconds < 0.1 else "OVER the 100 ms target"
        print(
            f"  decide, {name:<10} {seconds * 1000:8.2f} ms  ({seconds / base:5.1f}x baseline, "
            f"{count} actions)  {verdict}"
        )


if __name__ == "__main__":
    main()
