"""Write llmgw's Grafana dashboards (ops/grafana/*.json) from the definitions below.

One definition per dashboard, as rows of panels with their PromQL; this script turns them
into Grafana's dashboard JSON (schemaVersion 39, a Prometheus data source chosen by the
``datasource`` variable), so the JSON files are never edited by hand. The test suite
checks that the files are what this script writes and that every metric a panel queries
is one llmgw exposes (tests/component/ops/test_grafana.py).

    python scripts/grafana_dashboards.py            # rewrite ops/grafana/
    python scripts/grafana_dashboards.py --check    # exit 1 when a file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "ops" / "grafana"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[tuple[str, str], ...]  # (expr, legend)
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...]
    model_variable: bool = False


M = '{model=~"$model"}'
Q = "histogram_quantile"
TTFT = "llmgw_router_time_to_first_token_seconds_bucket"

OVERVIEW = Dashboard(
    "llmgw-overview",
    "llmgw / Overview",
    "Every model through every router: traffic, errors, latency, capacity.",
    (
        (
            "Traffic",
            (
                Panel(
                    "Requests per second by model",
                    (("sum by (model) (rate(llmgw_router_requests_total[5m]))", "{{model}}"),),
                    "reqps",
                ),
                Panel(
                    "5xx ratio by model",
                    (("model:llmgw_router_errors:ratio_rate5m", "{{model}}"),),
                    "percentunit",
                    description="Recorded by ops/prometheus/rules/llmgw.rules.yml; alert over 5 %.",
                ),
                Panel(
                    "Refusals by reason",
                    (("sum by (reason) (rate(llmgw_router_rejections_total[5m]))", "{{reason}}"),),
                    "reqps",
                ),
                Panel(
                    "Tokens per second",
                    (("sum by (kind) (rate(llmgw_router_tokens_total[5m]))", "{{kind}}"),),
                    "short",
                ),
            ),
        ),
        (
            "Latency",
            (
                Panel(
                    "Time to first token p50 / p99",
                    (
                        (
                            f"{Q}(0.5, sum by (le) (rate({TTFT}[5m])))",
                            "p50",
                        ),
                        (
                            f"{Q}(0.99, sum by (le) (rate({TTFT}[5m])))",
                            "p99",
                        ),
                    ),
                    "s",
                ),
                Panel(
                    "Request latency p50 / p99",
                    (
                        (f"{Q}(0.5, sum by (le) (rate(llmgw_router_request_seconds_bucket[5m])))", "p50"),
                        (f"{Q}(0.99, sum by (le) (rate(llmgw_router_request_seconds_bucket[5m])))", "p99"),
                    ),
                    "s",
                ),
            ),
        ),
        (
            "Capacity",
            (
                Panel("Endpoints by state", (("sum by (state) (llmgw_router_endpoints)", "{{state}}"),)),
                Panel("In flight by model", (("sum by (model) (llmgw_router_in_flight)", "{{model}}"),)),
                Panel("Queued for a slot", (("sum by (model) (llmgw_router_queued)", "{{model}}"),)),
                Panel(
                    "Replicas by phase",
                    (("max by (phase) (llmgw_control_replicas)", "{{phase}}"),),
                    description="As the leader judged them at its last pass.",
                ),
            ),
        ),
        (
            "Dependencies",
            (
                Panel("Control-plane leader", (("sum(llmgw_control_leader)", "leaders"),), kind="stat"),
                Panel("Routers following Nomad", (("sum(llmgw_router_nomad_up)", "up"),), kind="stat"),
                Panel("Consul watches up", (("min by (watch) (llmgw_router_consul_watch_up)", "{{watch}}"),)),
                Panel(
                    "Age of the routers' Consul view",
                    (("max by (watch) (llmgw_router_consul_watch_age_seconds)", "{{watch}}"),),
                    "s",
                ),
            ),
        ),
    ),
)

MODEL = Dashboard(
    "llmgw-model",
    "llmgw / Model",
    "One model: its requests through the routers and its engines' own view.",
    (
        (
            "Router",
            (
                Panel(
                    "Requests per second by status",
                    ((f"sum by (status) (rate(llmgw_router_requests_total{M}[5m]))", "{{status}}"),),
                    "reqps",
                ),
                Panel(
                    "Refusals by reason",
                    ((f"sum by (reason) (rate(llmgw_router_rejections_total{M}[5m]))", "{{reason}}"),),
                    "reqps",
                ),
                Panel(
                    "Time to first token p50 / p90 / p99",
                    tuple(
                        (
                            f"{Q}({q}, sum by (le) (rate({TTFT}{M}[5m])))",
                            f"p{int(q * 100)}",
                        )
                        for q in (0.5, 0.9, 0.99)
                    ),
                    "s",
                ),
                Panel(
                    "Request latency p50 / p99",
                    tuple(
                        (
                            f"{Q}({q}, sum by (le) (rate(llmgw_router_request_seconds_bucket{M}[5m])))",
                            f"p{int(q * 100)}",
                        )
                        for q in (0.5, 0.99)
                    ),
                    "s",
                ),
                Panel(
                    "Tokens per second",
                    ((f"sum by (kind) (rate(llmgw_router_tokens_total{M}[5m]))", "{{kind}}"),),
                ),
                Panel(
                    "Retries and stream errors",
                    (
                        (f"sum by (reason) (rate(llmgw_router_retries_total{M}[5m]))", "retry {{reason}}"),
                        (
                            f"sum by (reason) (rate(llmgw_router_stream_errors_total{M}[5m]))",
                            "stream {{reason}}",
                        ),
                    ),
                    "reqps",
                ),
                Panel(
                    "Fallbacks served",
                    (
                        (
                            'sum by (served) (rate(llmgw_router_fallbacks_total{requested=~"$model"}[5m]))',
                            "{{served}}",
                        ),
                    ),
                    "reqps",
                ),
                Panel(
                    "Waits for an on-demand load",
                    (
                        (
                            f"sum by (outcome) (rate(llmgw_router_load_wait_seconds_count{M}[5m]))",
                            "{{outcome}}",
                        ),
                    ),
                    "reqps",
                ),
                Panel(
                    "In flight per replica",
                    ((f"sum by (replica) (llmgw_router_in_flight{M})", "{{replica}}"),),
                ),
            ),
        ),
        (
            "Engines (vLLM and the sim)",
            (
                Panel(
                    "Requests running and waiting",
                    (
                        (f"sum by (replica) (vllm:num_requests_running{M})", "running {{replica}}"),
                        (f"sum by (replica) (vllm:num_requests_waiting{M})", "waiting {{replica}}"),
                    ),
                ),
                Panel(
                    "KV cache used",
                    ((f"max by (replica) (vllm:kv_cache_usage_perc{M})", "{{replica}}"),),
                    "percentunit",
                ),
                Panel(
                    "Prompt and generation tokens per second",
                    (
                        (f"sum(rate(vllm:prompt_tokens_total{M}[5m]))", "prompt"),
                        (f"sum(rate(vllm:generation_tokens_total{M}[5m]))", "generation"),
                    ),
                ),
            ),
        ),
    ),
    model_variable=True,
)

CONTROL = Dashboard(
    "llmgw-control-plane",
    "llmgw / Control plane",
    "The reconciler: its passes, what it did, and what it waits for.",
    (
        (
            "Leader",
            (
                Panel("Leader by instance", (("llmgw_control_leader", "{{instance}}"),)),
                Panel(
                    "Passes per second by result",
                    (("sum by (result) (rate(llmgw_control_passes_total[5m]))", "{{result}}"),),
                    "ops",
                ),
                Panel(
                    "Pass duration p50 / p99",
                    (
                        (f"{Q}(0.5, sum by (le) (rate(llmgw_control_pass_seconds_bucket[5m])))", "p50"),
                        (f"{Q}(0.99, sum by (le) (rate(llmgw_control_pass_seconds_bucket[5m])))", "p99"),
                    ),
                    "s",
                ),
                Panel(
                    "Decision duration p99",
                    ((f"{Q}(0.99, sum by (le) (rate(llmgw_control_decide_seconds_bucket[5m])))", "p99"),),
                    "s",
                ),
            ),
        ),
        (
            "Replicas",
            (
                Panel("Replicas by phase", (("max by (phase) (llmgw_control_replicas)", "{{phase}}"),)),
                Panel(
                    "Actions by kind and outcome",
                    (
                        (
                            "sum by (kind, outcome) (rate(llmgw_control_actions_total[5m]))",
                            "{{kind}} {{outcome}}",
                        ),
                    ),
                    "ops",
                ),
                Panel(
                    "Models waiting and backing off",
                    (
                        ("max(llmgw_control_models_waiting)", "waiting"),
                        ("max(llmgw_control_models_backing_off)", "backing off"),
                    ),
                ),
                Panel("Replicas draining", (("max(llmgw_control_replicas_draining)", "draining"),)),
                Panel(
                    "Replicas lost with a node",
                    (("sum(increase(llmgw_control_replicas_lost_total[1h]))", "per hour"),),
                ),
            ),
        ),
        (
            "Nomad",
            (
                Panel(
                    "Resyncs by reason",
                    (("sum by (reason) (increase(llmgw_control_resyncs_total[1h]))", "{{reason}}"),),
                ),
                Panel(
                    "Event stream reconnects",
                    (("sum(increase(llmgw_control_event_reconnects_total[1h]))", "per hour"),),
                ),
            ),
        ),
    ),
)

DASHBOARDS = (OVERVIEW, MODEL, CONTROL)


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, object]:
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def render(dashboard: Dashboard) -> dict[str, object]:
    panels: list[dict[str, object]] = []
    y = 0
    next_id = 1
    for title, row in dashboard.rows:
        panels.append({"id": next_id, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        next_id += 1
        y += 1
        for index, panel in enumerate(row):
            panels.append(_panel(panel, next_id, 12 * (index % 2), y + 8 * (index // 2)))
            next_id += 1
        y += 8 * ((len(row) + 1) // 2)
    variables: list[dict[str, object]] = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}
    ]
    if dashboard.model_variable:
        variables.append({
            "name": "model", "label": "Model", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(llmgw_router_requests_total, model)", "refId": "model"},
            "definition": "label_values(llmgw_router_requests_total, model)",
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
        })  # fmt: skip
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["llmgw"],
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": variables},
        "panels": panels,
    }


def files() -> dict[str, str]:
    return {f"{d.uid}.json": json.dumps(render(d), indent=2, sort_keys=True) + "\n" for d in DASHBOARDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is not what this writes")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    stale = []
    for name, text in files().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python scripts/grafana_dashboards.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
