"""How many replicas a model wants: catalog bounds, demand and hysteresis, as a pure function.

Owns: folding every router's demand report into one use per model, the on-demand rule
(a wake loads a model; use keeps it loaded; ``idle_timeout`` without use unloads it),
and load scaling between min and max (in-flight per replica above target for a whole
window steps up; low enough for a whole window steps down; one step at a time).

Must not: read a clock (``now`` is a parameter), know about Nomad or Consul, or decide
which replica to stop (``llmgw.core.planning`` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.core.catalog.model import DEFAULT_SCALE_WINDOW_SECONDS, Model, ScalingMode
from llmgw.core.records import DemandReport


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """One model's use across all routers."""

    last_used: float | None = None  # the latest use any router saw (unix seconds)
    in_flight: int = 0  # requests being served now, over fresh reports
    queued: int = 0  # requests waiting for a replica, over fresh reports
    wake: bool = False  # a router holds a request for a model with no replica

    @property
    def pressing(self) -> bool:
        """Someone wants the model right now."""
        return self.wake or self.in_flight > 0 or self.queued > 0


def aggregate_demand(
    reports: Iterable[DemandReport], now: float, stale_after: float
) -> dict[str, ModelDemand]:
    """Sum in-flight and queued over fresh reports; the latest ``last_used`` over all of them.

    A router that stopped reporting (crashed, partitioned) would otherwise hold its last
    counts forever and keep a model scaled up.
    """
    last: dict[str, float] = {}
    in_flight: dict[str, int] = {}
    queued: dict[str, int] = {}
    wake: set[str] = set()
    for report in reports:
        fresh = now - report.sent_at <= stale_after
        for use in report.models:
            if use.last_used > last.get(use.model, -1.0):
                last[use.model] = use.last_used
            if fresh:
                in_flight[use.model] = in_flight.get(use.model, 0) + use.in_flight
                queued[use.model] = queued.get(use.model, 0) + use.queued
                if use.wake:
                    wake.add(use.model)
    names = set(last) | set(in_flight) | wake
    return {
        name: ModelDemand(
            last_used=last.get(name),
            in_flight=in_flight.get(name, 0),
            queued=queued.get(name, 0),
            wake=name in wake,
        )
        for name in names
    }


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """The catalog's scaling stanza, read once per model, with defaults filled in."""

    mode: ScalingMode
    min: int
    max: int
    idle_timeout: float
    target_in_flight: float
    window: float

    @classmethod
    def of(cls, model: Model, default_target_in_flight: float) -> ScalingPolicy:
        scaling = model.scaling
        return cls(
            mode=model.scaling_mode,
            min=scaling.min if scaling else 0,
            max=scaling.max if scaling else 0,
            idle_timeout=float(model.idle_timeout_seconds),
            target_in_flight=(
                scaling.target_in_flight
                if scaling and scaling.target_in_flight is not None
                else default_target_in_flight
            ),
            window=float(
                scaling.scale_window
                if scaling and scaling.scale_window is not None
                else DEFAULT_SCALE_WINDOW_SECONDS
            ),
        )


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What scaling remembers between passes for one model."""

    replicas: int = 0  # the count decided last time (sticky between steps)
    active_at: float | None = None  # the last pass that saw the model pressed
    above_since: float | None = None  # load above target continuously since
    below_since: float | None = None  # load low enough to step down continuously since


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    state: ScaleState
    reason: str
    wake_at: float | None  # when this decision could change with no new input


def scale(
    policy: ScalingPolicy,
    demand: ModelDemand | None,
    previous: ScaleState | None,
    now: float,
    *,
    serving: int,
    down_ratio: float,
) -> ScaleDecision:
    """Replicas wanted now. ``serving``: replicas healthy now (no step up until the last step serves)."""
    demand = demand or ModelDemand()
    state = previous or ScaleState(replicas=policy.min)
    if policy.mode in (ScalingMode.UNSET, ScalingMode.OFF):
        why = "no scaling stanza in the catalog" if policy.mode is ScalingMode.UNSET else "switched off"
        return ScaleDecision(0, ScaleState(), why, None)

    active_at = now if demand.pressing else state.active_at
    floor = policy.min
    reason = f"min {policy.min}"
    wake_at: float | None = None
    if policy.mode is ScalingMode.ON_DEMAND:
        seen = max((t for t in (demand.last_used, active_at) if t is not None), default=None)
        if demand.pressing:
            floor, reason = 1, "requested" if demand.wake and state.replicas == 0 else "in use"
        elif seen is not None and now - seen < policy.idle_timeout:
            floor, reason = 1, "used recently"
            wake_at = seen + policy.idle_timeout
        else:
            # Idle: back to zero whatever the load steps said.
            return ScaleDecision(0, ScaleState(active_at=active_at), _idle_reason(seen, policy), None)

    current = min(max(state.replicas, floor), policy.max)
    if policy.max <= floor:
        return ScaleDecision(current, ScaleState(replicas=current, active_at=active_at), reason, wake_at)

    load = demand.in_flight + demand.queued
    per_replica = load / max(current, 1)
    above_since = state.above_since
    below_since = state.below_since
    target = policy.target_in_flight
    if per_replica > target and current < policy.max:
        above_since = above_since if above_since is not None else now
    else:
        above_since = None
    if current > floor and load / (current - 1) < target * down_ratio:
        below_since = below_since if below_since is not None else now
    else:
        below_since = None

    replicas = current
    if above_since is not None and now - above_since >= policy.window:
        if serving >= current:
            replicas, reason = current + 1, f"{per_replica:.1f} in flight per replica above {target:g}"
            above_since = None
        else:
            reason = "scale-up waits for the last replica to serve"
    elif below_since is not None and now - below_since >= policy.window:
        replicas, reason = current - 1, f"{per_replica:.1f} in flight per replica, low for {policy.window:g}s"
        below_since = None
    elif replicas > policy.min:
        reason = f"load {per_replica:.1f} per replica (target {target:g})"

    for since in (above_since, below_since):
        if since is not None:
            due = since + policy.window
            wake_at = due if wake_at is None else min(wake_at, due)
    return ScaleDecision(
        replicas,
        ScaleState(replicas=replicas, active_at=active_at, above_since=above_since, below_since=below_since),
        reason,
        wake_at,
    )


def _idle_reason(seen: float | None, policy: ScalingPolicy) -> str:
    if seen is None:
        return "on demand: not requested"
    return f"on demand: idle for more than {policy.idle_timeout:g}s"
