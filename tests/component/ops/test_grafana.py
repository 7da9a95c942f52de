"""ops/grafana: the dashboards are what scripts/grafana_dashboards.py writes, and every panel
queries metrics llmgw exposes (or the recording rules ops/prometheus defines)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import yaml

from tests.support.exposition import all_names, queried_metrics

REPO = Path(__file__).resolve().parents[3]
GRAFANA = REPO / "ops" / "grafana"
RULES = REPO / "ops" / "prometheus" / "rules" / "llmgw.rules.yml"


def _script() -> ModuleType:
    path = REPO / "scripts" / "grafana_dashboards.py"
    spec = importlib.util.spec_from_file_location("grafana_dashboards", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("grafana_dashboards", module)
    spec.loader.exec_module(module)
    return module


def _targets(dashboard: dict[str, object]) -> list[tuple[str, str]]:
    found = []
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        for target in panel.get("targets", ()):
            found.append((panel["title"], target["expr"]))
    return found


def test_the_dashboards_are_what_the_script_writes() -> None:
    written = _script().files()
    assert sorted(written) == sorted(p.name for p in GRAFANA.glob("*.json"))
    for name, text in written.items():
        assert (GRAFANA / name).read_text() == text, (
            f"{name} is stale: run python scripts/grafana_dashboards.py"
        )


def test_every_panel_queries_metrics_llmgw_exposes() -> None:
    recorded = {
        rule["record"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
        if "record" in rule
    }  # fmt: skip
    known = all_names() | recorded
    checked = 0
    for path in sorted(GRAFANA.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for title, expr in _targets(dashboard):
            queried = queried_metrics(expr)
            assert queried, f"{path.name}: {title!r} queries no metric: {expr}"
            missing = queried - known
            assert not missing, (
                f"{path.name}: panel {title!r} queries {sorted(missing)}, which nothing exposes"
            )
            checked += 1
        variables = dashboard["templating"]["list"]
        for variable in variables:
            if variable["type"] == "query":
                assert (
                    queried_metrics(variable["definition"].removeprefix("label_values(").split(",")[0])
                    <= known
                )
    assert checked > 30


def test_every_dashboard_has_a_unique_uid_and_no_panel_overlaps() -> None:
    uids = []
    for path in sorted(GRAFANA.glob("*.json")):
        dashboard = json.loads(path.read_text())
        uids.append(dashboard["uid"])
        cells: set[tuple[int, int]] = set()
        for panel in dashboard["panels"]:
            pos = panel["gridPos"]
            mine = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not cells & mine, f"{path.name}: {panel['title']!r} overlaps another panel"
            cells |= mine
    assert len(uids) == len(set(uids)) == 3
