"""The router's metrics: every name, label and bucket, in one module.

Owns: ``RouterMetrics``, a per-app ``CollectorRegistry`` (no global registry, so two
routers in one test process do not collide) with counters for events, histograms
for latencies, and gauges read at scrape time from their single owners (the
endpoint book, the gates, the watches) instead of being updated per request.

Names are ``llmgw_router_*``. Every label value comes from a bounded set that the
router, not the client, decides: catalog model names (``""`` for a request that
named no model the router knows, or failed before it was read), status codes and
fixed reasons (``REJECTION_REASONS``). Counters and histograms never carry a
replica id: each rebuild of a model has a new one, and a counter's series live
for the life of the process. Replica ids appear only on the scrape-time
``in_flight`` gauge, which lists the endpoints of the current snapshot, so a
replica's series is gone at the first scrape after it left. Never request ids,
key ids or a client's model string.

Must not: count anything by itself or hold routing state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.core.records import Endpoint

PREFIX = "llmgw_router_"
# Latency buckets from 5 ms (a cached short answer) to 10 min (a long generation).
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Time to first token: finer at the low end, where a router's own overhead shows.
_TTFT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Waiting for an on-demand model: seconds to minutes.
_LOAD_WAIT = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)

# The ``reason`` of ``rejections_total``: the OpenAI error codes of the router's own
# refusals (``llmgw/gateway/errors.py``, ``calls.py``, ``handlers.py``, and
# ``llmgw/core/routing.py``'s ``refusal_for``). A test holds this list to the codes
# written in those modules. Anything else (a codeless refusal, a code from elsewhere)
# is ``OTHER_REASON``: the label's values stay a fixed set whatever answers carry.
REJECTION_REASONS = frozenset(
    {
        # the request
        "missing_required_parameter", "empty_array", "unknown_url", "method_not_allowed",
        "request_too_large", "request_timeout", "unsupported_content_encoding",
        # keys and limits
        "invalid_api_key", "cross_site_request", "rate_limit_exceeded", "model_queue_full",
        "conflicting_api_keys", "tools_not_supported", "concurrency_limit_exceeded", "insufficient_quota",
        "limits_unavailable",
        # the model
        "model_not_found", "model_not_supported", "model_off", "model_unavailable", "model_loading",
        "no_healthy_replica",
        # the guard
        "content_policy_violation", "guard_unavailable", "context_length_exceeded",
        # the engines
        "upstream_unavailable", "upstream_timeout", "upstream_stream_broken", "upstream_unreadable",
        # the router
        "catalog_unavailable", "internal_error",
        # the Responses API (``gateway/responses.py``, ``conversations.py``; ``core/responses.py``'s 400s)
        "previous_response_not_found", "conversation_too_large", "response_store_unavailable",
        "stored_responses_disabled", "stored_responses_quota_exceeded",
        "unsupported_parameter", "invalid_type", "invalid_value",
    }
)  # fmt: skip
OTHER_REASON = "other"


@dataclass(frozen=True, slots=True)
class WatchHealth:
    name: str
    healthy: bool
    last_success_at: float | None  # event-loop clock
    generation: int


@dataclass(frozen=True)
class Gauges:
    """Where scrape-time gauges read from."""

    endpoints: Callable[[], tuple[Endpoint, ...]]
    in_flight: Callable[[], Mapping[str, int]]  # by service id
    draining: Callable[[Endpoint], bool]
    queued: Callable[[], Mapping[str, int]]  # by model
    watches: Callable[[], tuple[WatchHealth, ...]]
    now: Callable[[], float]  # event-loop clock
    # Nomad's word on an endpoint when it is not "route" ("gone", "stopping", ...), else None.
    held_back: Callable[[Endpoint], str | None] = lambda endpoint: None
    # The Nomad allocation watch's health; None when the router does not check Nomad.
    nomad: Callable[[], WatchHealth | None] = lambda: None


def rejection_reason(code: str | None) -> str:
    """The ``reason`` label for a refusal's OpenAI error code."""
    return code if code in REJECTION_REASONS else OTHER_REASON


class _ScrapeTime(Collector):
    def __init__(self, gauges: Gauges) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        g = self._gauges
        in_flight = g.in_flight()
        flight = GaugeMetricFamily(
            PREFIX + "in_flight",
            "Requests this router has outstanding per replica in the current endpoint set",
            labels=["model", "replica"],
        )
        endpoints = GaugeMetricFamily(
            PREFIX + "endpoints", "Engine endpoints known from Consul, by state", labels=["model", "state"]
        )
        # Built from the current snapshot at each scrape: a replica that left has no
        # series. Per replica, not per endpoint: while Nomad replaces an allocation,
        # two endpoints of one replica (job) are registered, and one series adds them.
        outstanding: dict[tuple[str, str], int] = {}
        counts: dict[tuple[str, str], int] = {}
        for endpoint in g.endpoints():
            replica = (endpoint.model, endpoint.replica)
            outstanding[replica] = outstanding.get(replica, 0) + in_flight.get(endpoint.service_id, 0)
            held = g.held_back(endpoint)
            state = held if held is not None else "draining" if g.draining(endpoint) else str(endpoint.status)
            counts[(endpoint.model, state)] = counts.get((endpoint.model, state), 0) + 1
        for (model, replica_id), count in sorted(outstanding.items()):
            flight.add_metric([model, replica_id], count)
        for (model, state), count in sorted(counts.items()):
            endpoints.add_metric([model, state], count)
        yield flight
        yield endpoints
        queued = GaugeMetricFamily(PREFIX + "queued", "Requests waiting for a model's slot", labels=["model"])
        for model, count in sorted(g.queued().items()):
            queued.add_metric([model], count)
        yield queued
        up = GaugeMetricFamily(
            PREFIX + "consul_watch_up", "1 when the watch's last Consul request succeeded", labels=["watch"]
        )
        age = GaugeMetricFamily(
            PREFIX + "consul_watch_age_seconds",
            "Seconds since the watch last heard from Consul (the age of what the router routes on)",
            labels=["watch"],
        )
        now = g.now()
        for watch in g.watches():
            up.add_metric([watch.name], 1.0 if watch.healthy else 0.0)
            if watch.last_success_at is not None:
                age.add_metric([watch.name], max(0.0, now - watch.last_success_at))
        yield up
        yield age
        nomad = g.nomad()
        if nomad is not None:
            yield GaugeMetricFamily(
                PREFIX + "nomad_up",
                "1 while the router follows Nomad's allocations (0: it routes on its last view, and "
                "endpoints it had not verified wait)",
                value=1.0 if nomad.healthy else 0.0,
            )
            if nomad.last_success_at is not None:
                yield GaugeMetricFamily(
                    PREFIX + "nomad_age_seconds",
                    "Seconds since the router last heard from Nomad (an open, quiet stream counts as now)",
                    value=0.0 if nomad.healthy else max(0.0, now - nomad.last_success_at),
                )


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._counters: dict[tuple[Counter, tuple[str, ...]], Counter] = {}
        self._histograms: dict[tuple[Histogram, tuple[str, ...]], Histogram] = {}
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "Requests answered, by HTTP status and model: the one that answered, else the one the "
            'request resolved to ("" when it named none the router knows)',
            ["model", "status"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            PREFIX + "request_seconds", "Time from request to the last byte of the answer",
            ["model"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Streams: time from request to the first byte sent",
            ["model"], buckets=_TTFT, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            PREFIX + "tokens",
            "Tokens from the engines' usage reports, by kind: prompt, completion, and cached (the prompt "
            "tokens the engine read from its prefix cache, part of prompt)",
            ["model", "kind"], registry=r,
        )  # fmt: skip
        self.routing_decisions = Counter(
            PREFIX + "routing_decisions",
            "Replicas chosen for a try, by how: affinity (the replica that owns the conversation's prefix), "
            "overflow (its owner was past its share of conversations or the load bound: the next in its "
            "order), no-history (least outstanding: a conversation's first turn, nothing cached to follow), "
            "no-key (least outstanding: no conversation to follow, or the model's prefix affinity is off)",
            ["model", "outcome"], registry=r,
        )  # fmt: skip
        self.retries = Counter(
            PREFIX + "retries",
            "Tries repeated after a failure before the first byte",
            ["model", "reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            PREFIX + "fallbacks", "Requests answered by a fallback model", ["requested", "served"], registry=r
        )
        self.wakeups = Counter(
            PREFIX + "wakeups",
            "Wake-ups of on-demand models sent to the control plane",
            ["model"],
            registry=r,
        )
        self.load_wait = Histogram(
            PREFIX + "load_wait_seconds", "Time requests waited for a model to load, by outcome",
            ["model", "outcome"], buckets=_LOAD_WAIT, registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            PREFIX + "rejections",
            "Requests the router refused itself (not an engine's answer), by model as in requests_total "
            "and OpenAI error code",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.stream_errors = Counter(
            PREFIX + "stream_errors", "Streams ended with an error event after their first byte",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.client_disconnects = Counter(
            PREFIX + "client_disconnects",
            "Requests whose client left before the answer ended",
            ["model"],
            registry=r,
        )
        self.guard_latency = Histogram(
            PREFIX + "guard_seconds", "Latency the guard judge added, by verdict",
            ["policy", "verdict"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.endpoints_ignored = Counter(
            PREFIX + "endpoints_ignored",
            "Consul registrations of the engine service that no allocation in Nomad matches "
            "(forged, or left behind), each counted once",
            registry=r,
        )
        self.demand_reports = Counter(
            PREFIX + "demand_reports", "Demand reports sent to Consul, by result", ["result"], registry=r
        )
        self.limits_store_errors = Counter(
            PREFIX + "limits_store_errors",
            "Calls to the Redis of the limits every router shares that failed (--limits-redis-url)",
            registry=r,
        )

    # prometheus_client's labels() validates, converts and locks on every call; the
    # per-request metrics look their children up here instead (label sets are few).
    def counter(self, metric: Counter, *values: str) -> Counter:
        child = self._counters.get((metric, values))
        if child is None:
            child = self._counters[(metric, values)] = metric.labels(*values)
        return child

    def histogram(self, metric: Histogram, *values: str) -> Histogram:
        child = self._histograms.get((metric, values))
        if child is None:
            child = self._histograms[(metric, values)] = metric.labels(*values)
        return child

    def add_gauges(self, gauges: Gauges) -> None:
        self.registry.register(_ScrapeTime(gauges))

    def render(self) -> bytes:
        return generate_latest(self.registry)
