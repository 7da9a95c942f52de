"""The reconciler's timing rules as one value: every timeout, grace and backoff has a name here.

Owns: the defaults and their reasons. Must not: read the environment or a clock
(``llmgw.control.settings`` reads overrides and passes a ``PlanningSettings`` in).
All durations are seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from llmgw.core.catalog.model import Engine


def _default_load_timeouts() -> Mapping[Engine, float]:
    return MappingProxyType(
        {
            # vLLM and SGLang compile CUDA graphs and load tens of GB of weights from disk
            # or the mirror; a 70B model on a cold node takes 10-20 minutes.
            Engine.VLLM: 30 * 60.0,
            Engine.SGLANG: 30 * 60.0,
            # llama.cpp mmaps one GGUF file and starts in seconds to minutes.
            Engine.LLAMACPP: 15 * 60.0,
            # The simulated engine sleeps ``sim.load_seconds``; two minutes covers any test.
            Engine.SIM: 2 * 60.0,
        }
    )


@dataclass(frozen=True, slots=True)
class PlanningSettings:
    # --- placing -----------------------------------------------------------------------------
    # Every group of a replica must have a running allocation this long after the job was
    # registered, or the replica is stopped whole and retried with backoff (Nomad has no gang
    # scheduling: a half-placed multi-node replica holds GPUs and serves nothing). Covers
    # image pulls of several GB.
    placement_timeout: float = 15 * 60.0
    # After a register, wait this long at most for Nomad to create the job's allocations
    # before planning another replica that competes for the same GPUs (a plan from the
    # snapshot before those allocations exist would offer the same cards twice).
    placement_settle: float = 15.0
    # A registered job that no observation has shown after this long is forgotten (the
    # register was lost); until then it counts as a replica, so a lagging view never
    # causes a second register.
    register_observe_timeout: float = 60.0
    # At most this many placements are tried through Nomad's plan in one pass; the rest
    # wait their turn (the status says so). Bounds one pass's time when many models are
    # unplaceable.
    placement_attempts_per_pass: int = 16
    # Nomad's plan said no profile of the model fits: ask again after this long, doubling
    # up to the maximum, or at once when the cluster's capacity changed.
    unplaceable_retry: float = 30.0
    unplaceable_retry_max: float = 5 * 60.0
    # A register that failed (an HTTP error, not a "does not fit") is retried after this.
    register_retry: float = 10.0

    # --- health ------------------------------------------------------------------------------
    # A replica whose allocations all run must pass its Consul health check within the
    # profile's ``load_timeout``, or this per-engine default.
    load_timeouts: Mapping[Engine, float] = field(default_factory=_default_load_timeouts)
    # A replica that was healthy and has not passed its check for this long is rebuilt
    # (an engine wedged on a GPU error keeps its process alive).
    health_lost_timeout: float = 5 * 60.0

    # --- nodes ---------------------------------------------------------------------------------
    # A node that Nomad reports down or disconnected is first only "unreachable": its replicas
    # are kept (a network blip or a rebooting switch heals on its own). Down for longer than
    # this, it is "lost" and its replicas are rebuilt elsewhere. Operators tune it to their
    # hardware; it should exceed Nomad's own heartbeat grace.
    node_lost_grace: float = 10 * 60.0
    # A replica that failed while its nodes still looked ready (a rank whose peer's node just
    # died notices before Nomad does: Nomad marks a node down only after its heartbeat TTL
    # and ``heartbeat_grace``, 10 s + 10 s by default) was lost with its node, after all, if
    # Nomad reports one of its nodes down or disconnected within this long: the model's
    # backoff is taken back and the replica rebuilt at once. Must exceed Nomad's failure
    # detection; a failure of the model's own still backs off in the meantime.
    lost_node_window: float = 60.0

    # --- draining ------------------------------------------------------------------------------
    # Routers need a moment to see a drain mark (their Consul watch fires within about a
    # second); no replica is stopped sooner than this after being marked.
    drain_min: float = 5.0
    # In-flight requests may finish for at most this long (long streamed completions).
    drain_timeout: float = 5 * 60.0
    # While a draining replica still has requests in flight, look again this often (the
    # engine's count is polled, not watched).
    drain_check_interval: float = 5.0
    # A stop (Nomad deregister) that has not taken effect after this long is sent again.
    stop_retry: float = 30.0

    # --- rebuild backoff (carried on the model, not on the replica it destroyed) ----------------
    backoff_base: float = 30.0
    backoff_max: float = 30 * 60.0
    # Each delay is shortened by up to this fraction, the same for a model and attempt in
    # every run (a hash, not a random draw), so rebuilds of many models spread out.
    backoff_jitter: float = 0.2
    # After the model has had a healthy replica and no failure for this long, its failure
    # count goes back to zero.
    backoff_reset_after: float = 10 * 60.0

    # --- demand --------------------------------------------------------------------------------
    # A router's report older than this no longer counts for in-flight, queued and wake-ups
    # (the router may be gone); its ``last_used`` still does.
    demand_stale_after: float = 60.0
    # Models with max > min and no ``target_in_flight``: scale on this many in-flight
    # requests per replica.
    default_target_in_flight: float = 8.0
    # Scale down only when, with one replica fewer, the load per replica would still be
    # under target x this ratio (hysteresis between the two thresholds).
    scale_down_ratio: float = 0.7

    def load_timeout(self, engine: Engine, profile_timeout: int | None) -> float:
        if profile_timeout is not None:
            return float(profile_timeout)
        return self.load_timeouts[engine]


DEFAULT_PLANNING = PlanningSettings()
