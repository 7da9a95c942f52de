"""The control plane's Prometheus metrics, all ``llmgw_control_*``, on a registry per app.

Owns: the metric names, types and (small) label sets. Must not: register on the global
registry (two control planes in one test process would collide) or compute anything
beyond counting what the loops report.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmgw.core.planning import ModelStatus, Phase


class ControlMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.passes = Counter(
            "llmgw_control_passes", "Reconcile passes, by result (ok, error)", ["result"], registry=r
        )
        self.pass_seconds = Histogram(
            "llmgw_control_pass_seconds",
            "Duration of a whole pass: observe, decide, act, publish",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.decide_seconds = Histogram(
            "llmgw_control_decide_seconds",
            "Duration of the pure decision of a pass",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        self.actions = Counter(
            "llmgw_control_actions",
            "Actions applied, by kind and outcome (placed, unplaceable, deferred, done, failed)",
            ["kind", "outcome"],
            registry=r,
        )
        self.replicas = Gauge(
            "llmgw_control_replicas", "Replicas by phase, as of the last pass", ["phase"], registry=r
        )
        self.draining = Gauge("llmgw_control_replicas_draining", "Replicas being drained", registry=r)
        self.backoffs = Gauge(
            "llmgw_control_models_backing_off", "Models waiting out a rebuild backoff", registry=r
        )
        self.waiting = Gauge(
            "llmgw_control_models_waiting",
            "Models that want a replica they are not being given now (backoff, no fit, turn)",
            registry=r,
        )
        self.replicas_lost = Counter(
            "llmgw_control_replicas_lost",
            "Replicas judged lost with a node (rebuilt at once, without the model's backoff)",
            registry=r,
        )
        self.leader = Gauge("llmgw_control_leader", "1 while this instance leads, else 0", registry=r)
        self.resyncs = Counter(
            "llmgw_control_resyncs", "Full resyncs of the Nomad view, by reason", ["reason"], registry=r
        )
        self.event_reconnects = Counter(
            "llmgw_control_event_reconnects", "Reconnects of Nomad's event stream", registry=r
        )

    def observe_status(self, models: Iterable[ModelStatus]) -> None:
        counts = dict.fromkeys(Phase, 0)
        draining = backing_off = waiting = 0
        for m in models:
            backing_off += m.backoff is not None and m.waiting is not None and "backing off" in m.waiting
            waiting += m.waiting is not None
            for rep in m.replicas:
                counts[rep.phase] += 1
                draining += rep.draining
        for phase, count in counts.items():
            self.replicas.labels(phase=str(phase)).set(count)
        self.draining.set(draining)
        self.backoffs.set(backing_off)
        self.waiting.set(waiting)
