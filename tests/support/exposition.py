"""Every metric name llmgw's processes expose, read from their own registries.

The dashboards' and alert rules' tests hold each query to these names, so a panel or an
alert that queries a metric no process has fails the suite instead of showing "No data".
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from llmgw.control.metrics import ControlMetrics
from llmgw.gateway.metrics import Gauges, RouterMetrics, WatchHealth
from llmgw.sim.engine import EngineSnapshot
from llmgw.sim.metrics import build_registry, render

# A histogram's or counter's family name becomes these series in the text exposition.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def _names(text: str) -> frozenset[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        suffixes = _SUFFIXES.get(family.type)
        # The parser names a counter's family without "_total": only the suffixed series exist.
        names.update((family.name + suffix for suffix in suffixes) if suffixes else (family.name,))
    return frozenset(names)


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                       "group_left", "group_right", "inf", "nan", "le"})  # fmt: skip


def queried_metrics(expr: str) -> frozenset[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and
    numbers taken out). Enough for the expressions llmgw ships; not a PromQL parser."""
    text = _RANGES.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", expr)))
    text = _LABEL_LISTS.sub(" ", text)
    found = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        found.add(name)
    return frozenset(found)


def router_names() -> frozenset[str]:
    metrics = RouterMetrics()
    metrics.add_gauges(
        Gauges(
            endpoints=lambda: (),
            in_flight=dict,
            draining=lambda endpoint: False,
            queued=dict,
            watches=lambda: (WatchHealth("endpoints", True, 0.0, 1),),
            now=lambda: 0.0,
            nomad=lambda: WatchHealth("nomad", True, 0.0, 1),
        )
    )
    return _names(metrics.render().decode())


def control_names() -> frozenset[str]:
    from prometheus_client import generate_latest

    return _names(generate_latest(ControlMetrics().registry).decode())


def engine_names() -> frozenset[str]:
    """The sim's, which are vLLM's own names for what both expose (``llmgw/sim/metrics.py``)."""
    snapshot = EngineSnapshot(0, 0, 0, 0, 0, 0, 0, 0)
    return _names(render(build_registry(lambda: snapshot, "m", 4)).decode())


def all_names() -> frozenset[str]:
    return router_names() | control_names() | engine_names() | {"up"}
