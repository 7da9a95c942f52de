"""The simulated engine's Prometheus metrics, all defined here.

Owns: the metric names (vLLM's ``vllm:*`` names for what real engines expose,
``llmgw_sim_*`` for what only the simulator counts), and rendering them from
an `Engine` snapshot at scrape time into a per-app `CollectorRegistry`.

Must not: use prometheus-client's global registry (two apps in one test process
would collide) or keep counts of its own: the engine is the single owner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llmgw.sim.engine import EngineSnapshot

CONTENT_TYPE = CONTENT_TYPE_LATEST

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# Counter families are named without "_total"; the exposition appends it, as vLLM's do.
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
CANCELLED = "llmgw_sim_requests_cancelled"
FAILED = "llmgw_sim_requests_failed"
REQUESTS = "llmgw_sim_requests"


class _EngineCollector:
    def __init__(self, snapshot: Callable[[], EngineSnapshot], model_name: str, max_num_seqs: int) -> None:
        self._snapshot = snapshot
        self._model_name = model_name
        self._max_num_seqs = max_num_seqs

    def collect(self) -> Iterable[Metric]:
        now = self._snapshot()
        labels = ["model_name"]
        values = [self._model_name]

        def gauge(name: str, documentation: str, value: float) -> Metric:
            family = GaugeMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, documentation: str, value: float) -> Metric:
            family = CounterMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        yield gauge(RUNNING, "Number of requests in model execution batches.", now.running)
        yield gauge(WAITING, "Number of requests waiting to be processed.", now.waiting)
        yield gauge(
            KV_CACHE_USAGE,
            "KV-cache usage. 1 means 100 percent usage (simulated: running / max_num_seqs).",
            now.running / self._max_num_seqs,
        )
        yield counter(PROMPT_TOKENS, "Number of prefill tokens processed.", now.prompt_tokens)
        yield counter(GENERATION_TOKENS, "Number of generation tokens processed.", now.generation_tokens)
        success = CounterMetricFamily(
            REQUEST_SUCCESS,
            "Count of successfully processed requests.",
            labels=["model_name", "finished_reason"],
        )
        success.add_metric([self._model_name, "length"], now.completed)
        yield success
        yield counter(CANCELLED, "Requests whose client left (or shutdown cancelled) mid-way.", now.cancelled)
        yield counter(FAILED, "API requests answered with an error.", now.failed)
        yield counter(REQUESTS, "API requests received.", now.requests_total)


def build_registry(
    snapshot: Callable[[], EngineSnapshot], model_name: str, max_num_seqs: int
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(snapshot, model_name, max_num_seqs))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
