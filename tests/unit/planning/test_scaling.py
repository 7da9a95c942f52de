"""core.scaling as tables: demand folding, on-demand wake and idle, load steps with hysteresis."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import Catalog
from llmgw.core.records import DemandReport, ModelUse
from llmgw.core.scaling import ModelDemand, ScaleState, ScalingPolicy, aggregate_demand, scale

NOW = 1_000_000.0


def policy(**scaling: object) -> ScalingPolicy:
    model = Catalog.model_validate(
        {"models": {"m": {"profiles": [{"engine": "sim"}], "scaling": scaling}}}
    ).models["m"]
    return ScalingPolicy.of(model, default_target_in_flight=8.0)


def test_demand_sums_fresh_reports_and_keeps_the_latest_use_of_stale_ones() -> None:
    reports = [
        DemandReport("a", NOW - 5, (ModelUse("m", NOW - 5, 3, 1, False),)),
        DemandReport("b", NOW - 1, (ModelUse("m", NOW - 2, 2, 0, True),)),
        DemandReport(
            "dead", NOW - 600, (ModelUse("m", NOW - 1, 40, 40, True), ModelUse("x", NOW - 700, 9, 0, False))
        ),
    ]
    demand = aggregate_demand(reports, NOW, stale_after=60)
    assert demand["m"] == ModelDemand(last_used=NOW - 1, in_flight=5, queued=1, wake=True)
    assert demand["x"] == ModelDemand(last_used=NOW - 700)  # known, but nothing counts now


@pytest.mark.parametrize(
    ("scaling", "replicas", "reason"),
    [
        ({"min": 0, "max": 0}, 0, "switched off"),
        ({"min": 2, "max": 2}, 2, "min 2"),
        ({"min": 0, "max": 1}, 0, "on demand: not requested"),
    ],
)
def test_counts_without_demand(scaling: dict[str, int], replicas: int, reason: str) -> None:
    d = scale(policy(**scaling), None, None, NOW, serving=0, down_ratio=0.7)
    assert (d.replicas, d.reason) == (replicas, reason)


def test_no_scaling_stanza_runs_nothing() -> None:
    model = Catalog.model_validate({"models": {"m": {"profiles": [{"engine": "sim"}]}}}).models["m"]
    d = scale(ScalingPolicy.of(model, 8.0), ModelDemand(wake=True), None, NOW, serving=0, down_ratio=0.7)
    assert d.replicas == 0


def test_on_demand_wakes_on_request_and_unloads_after_idle_timeout_from_last_use() -> None:
    p = policy(min=0, max=1, idle_timeout="10m")
    woke = scale(p, ModelDemand(last_used=NOW, queued=1, wake=True), None, NOW, serving=0, down_ratio=0.7)
    assert woke.replicas == 1 and woke.reason == "requested"
    used = ModelDemand(last_used=NOW + 300)
    later = scale(p, used, woke.state, NOW + 301, serving=1, down_ratio=0.7)
    assert later.replicas == 1 and later.wake_at == NOW + 300 + 600
    gone = scale(p, used, later.state, NOW + 901, serving=1, down_ratio=0.7)
    assert gone.replicas == 0 and "idle" in gone.reason


def test_a_request_in_flight_longer_than_the_idle_timeout_keeps_the_model() -> None:
    p = policy(min=0, max=1, idle_timeout="1m")
    state = None
    for t in range(0, 600, 30):
        d = scale(p, ModelDemand(last_used=NOW, in_flight=1), state, NOW + t, serving=1, down_ratio=0.7)
        state = d.state
        assert d.replicas == 1


def test_load_steps_up_only_after_a_full_window_and_once_the_last_step_serves() -> None:
    p = policy(min=1, max=4, target_in_flight=4, scale_window="60s")
    busy = ModelDemand(last_used=NOW, in_flight=20)
    d = scale(p, busy, None, NOW, serving=1, down_ratio=0.7)
    assert d.replicas == 1 and d.wake_at == NOW + 60
    d = scale(p, busy, d.state, NOW + 60, serving=1, down_ratio=0.7)
    assert d.replicas == 2
    # The second replica is still loading: no third one yet, however long the load stays high.
    d = scale(p, busy, d.state, NOW + 200, serving=1, down_ratio=0.7)
    d = scale(p, busy, d.state, NOW + 300, serving=1, down_ratio=0.7)
    assert d.replicas == 2 and "waits for the last replica" in d.reason
    d = scale(p, busy, d.state, NOW + 301, serving=2, down_ratio=0.7)
    assert d.replicas == 3


def test_load_steps_down_with_hysteresis() -> None:
    p = policy(min=1, max=4, target_in_flight=4, scale_window="60s")
    state = ScaleState(replicas=3)
    # 7 in flight: 2.3 per replica now, 3.5 with one fewer: not under 4 x 0.7, so no step down.
    for t in range(0, 300, 10):
        d = scale(p, ModelDemand(last_used=NOW, in_flight=7), state, NOW + t, serving=3, down_ratio=0.7)
        state = d.state
    assert d.replicas == 3
    d = scale(p, ModelDemand(last_used=NOW, in_flight=2), state, NOW + 300, serving=3, down_ratio=0.7)
    d = scale(p, ModelDemand(last_used=NOW, in_flight=2), d.state, NOW + 360, serving=3, down_ratio=0.7)
    assert d.replicas == 2
