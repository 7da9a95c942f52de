"""``llmgw status`` as a value: per model, desired and actual replicas, where each runs, its
health, draining, and in words why something is not placed or is backing off.

Owns: the report's shape and its one JSON spelling (the leader publishes it to Consul KV
at ``llmgw/status``; the CLI and admin API read it back from any node). Must not: compute
anything (``llmgw.core.planning.deciding`` builds it while it decides) or do I/O.
Decoding is lenient on unknown keys (a newer leader may add fields) and strict on types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    """Where a replica is in its life, as the reconciler judges it."""

    REGISTERED = "registered"  # registered with Nomad, not yet seen in an observation
    PLACING = "placing"  # not every group has a running allocation yet
    LOADING = "loading"  # every group runs; the engine has not passed its check yet
    HEALTHY = "healthy"  # passing in Consul
    UNHEALTHY = "unhealthy"  # was healthy, its check fails now
    UNREACHABLE = "unreachable"  # a node it runs on is down or disconnected, within the grace
    FAILED = "failed"  # a group failed or was lost, or a timeout passed: it is rebuilt whole
    STOPPED = "stopped"  # Nomad shows the job stopped; it is purged

    @property
    def starting(self) -> bool:
        return self in (Phase.REGISTERED, Phase.PLACING, Phase.LOADING)


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    job_id: str
    replica_id: str
    profile: int
    fabric: str | None
    phase: Phase
    health: str | None  # Consul's status of its endpoint, if it has one
    nodes: tuple[str, ...]  # node names (ids where the name is unknown)
    gpus: tuple[str, ...]
    draining: bool
    stopping: bool
    outdated: bool  # runs a spec the catalog no longer asks for
    reason: str  # in words: what it waits for, or why it is failed/draining/stopping
    # What Nomad warned about in its job when this leader registered it (Nomad's words).
    warnings: tuple[str, ...] = ()
    # The ids of its allocations that stand (Nomad wants them running, not ended), whole;
    # `llmgw status` shows them as Nomad's CLI does, 8 characters.
    allocations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BackoffStatus:
    failures: int
    retry_at: float
    last_failure: str


@dataclass(frozen=True, slots=True)
class ModelStatus:
    model: str
    mode: str  # the catalog's scaling mode
    desired: int
    healthy: int
    replicas: tuple[ReplicaStatus, ...]
    scaling: str  # why the desired count is what it is
    waiting: str | None  # why a wanted replica is not being placed now, in words
    backoff: BackoffStatus | None
    # Which replicas share a node (one node's loss takes them all) and why, in words; "" when
    # every replica has nodes of its own.
    spread: str = ""


@dataclass(frozen=True, slots=True)
class StatusReport:
    generated_at: float
    catalog_hash: str | None
    leader: str | None
    models: tuple[ModelStatus, ...]
    note: str = ""  # the whole plane's situation in words when it is not acting (no catalog...)


class StatusDecodeError(ValueError):
    pass


def to_dict(report: StatusReport) -> dict[str, Any]:
    return {
        "generated_at": report.generated_at,
        "catalog_hash": report.catalog_hash,
        "leader": report.leader,
        "note": report.note,
        "models": [
            {
                "model": m.model,
                "mode": m.mode,
                "desired": m.desired,
                "healthy": m.healthy,
                "scaling": m.scaling,
                "waiting": m.waiting,
                "spread": m.spread,
                "backoff": None
                if m.backoff is None
                else {
                    "failures": m.backoff.failures,
                    "retry_at": m.backoff.retry_at,
                    "last_failure": m.backoff.last_failure,
                },
                "replicas": [
                    {
                        "job_id": r.job_id,
                        "replica_id": r.replica_id,
                        "profile": r.profile,
                        "fabric": r.fabric,
                        "phase": str(r.phase),
                        "health": r.health,
                        "nodes": list(r.nodes),
                        "gpus": list(r.gpus),
                        "draining": r.draining,
                        "stopping": r.stopping,
                        "outdated": r.outdated,
                        "reason": r.reason,
                        "warnings": list(r.warnings),
                        "allocations": list(r.allocations),
                    }
                    for r in m.replicas
                ],
            }
            for m in report.models
        ],
    }


def to_json(report: StatusReport) -> str:
    return json.dumps(to_dict(report), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def from_json(text: str | bytes) -> StatusReport:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise StatusDecodeError(f"status: not valid JSON ({exc})") from None
    try:
        return _report(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise StatusDecodeError(f"status: unexpected shape ({exc!r})") from None


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _opt_str(v: object) -> str | None:
    return None if v is None else _str(v)


def _num(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    return float(v)


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected a whole number, got {type(v).__name__}")
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected true or false, got {type(v).__name__}")
    return v


def _list(v: object) -> list[Any]:
    if not isinstance(v, list):
        raise TypeError(f"expected an array, got {type(v).__name__}")
    return v


def _report(raw: Any) -> StatusReport:
    return StatusReport(
        generated_at=_num(raw["generated_at"]),
        catalog_hash=_opt_str(raw["catalog_hash"]),
        leader=_opt_str(raw["leader"]),
        note=_str(raw.get("note", "")),
        models=tuple(_model(m) for m in _list(raw["models"])),
    )


def _model(raw: Any) -> ModelStatus:
    backoff = raw["backoff"]
    return ModelStatus(
        model=_str(raw["model"]),
        mode=_str(raw["mode"]),
        desired=_int(raw["desired"]),
        healthy=_int(raw["healthy"]),
        scaling=_str(raw["scaling"]),
        waiting=_opt_str(raw["waiting"]),
        backoff=None
        if backoff is None
        else BackoffStatus(
            failures=_int(backoff["failures"]),
            retry_at=_num(backoff["retry_at"]),
            last_failure=_str(backoff["last_failure"]),
        ),
        replicas=tuple(_replica(r) for r in _list(raw["replicas"])),
        spread=_str(raw.get("spread", "")),
    )


def _replica(raw: Any) -> ReplicaStatus:
    return ReplicaStatus(
        job_id=_str(raw["job_id"]),
        replica_id=_str(raw["replica_id"]),
        profile=_int(raw["profile"]),
        fabric=_opt_str(raw["fabric"]),
        phase=Phase(_str(raw["phase"])),
        health=_opt_str(raw["health"]),
        nodes=tuple(_str(n) for n in _list(raw["nodes"])),
        gpus=tuple(_str(g) for g in _list(raw["gpus"])),
        draining=_bool(raw["draining"]),
        stopping=_bool(raw["stopping"]),
        outdated=_bool(raw["outdated"]),
        reason=_str(raw["reason"]),
        warnings=tuple(_str(w) for w in _list(raw.get("warnings", []))),
        allocations=tuple(_str(a) for a in _list(raw.get("allocations", []))),
    )
