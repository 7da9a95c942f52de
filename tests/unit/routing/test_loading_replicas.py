"""A running model whose replica is starting (registered, its check not passing yet) is
answered as loading, the way an on-demand model being loaded is; one whose replica passed
and went critical is not."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import Catalog, load_catalog
from llmgw.core.records import Endpoint, HealthStatus
from llmgw.core.routing import (
    ModelState,
    Unserved,
    loading_endpoints,
    model_state,
    plan_route,
    refusal_for,
    unserved_reason,
)

CATALOG_TEXT = """
models:
  running:   {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 2}}
  on-demand: {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
  off:       {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 0}}
  unset:     {roles: [chat], profiles: [{engine: sim}]}
"""

PASSING, CRITICAL, WARNING = HealthStatus.PASSING, HealthStatus.CRITICAL, HealthStatus.WARNING


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    result = load_catalog(CATALOG_TEXT, filename="c.yaml", policy=read_security_policy())
    assert result.catalog is not None, result.diagnostics
    return result.catalog


def endpoint(key: str, status: HealthStatus) -> Endpoint:
    return Endpoint(
        service_id=key,
        node="node-1",
        model="running",
        model_slug="running",
        replica="llmgw-running-r1",
        alloc_id="alloc-1",
        address="10.0.0.1",
        port=8000,
        engine="sim",
        profile=0,
        simulated=True,
        status=status,
    )


def replay(snapshots: Sequence[Sequence[tuple[str, HealthStatus]]]) -> frozenset[str]:
    """The loading set after a router applied ``snapshots`` in order, from its first."""
    previous: frozenset[str] | None = None
    loading: frozenset[str] = frozenset()
    for snapshot in snapshots:
        endpoints = [endpoint(key, status) for key, status in snapshot]
        loading = loading_endpoints(previous, endpoints, loading)
        previous = frozenset(e.service_id for e in endpoints)
    return loading


@pytest.mark.parametrize(
    ("snapshots", "loading"),
    [
        # Registered after the router started, its check failing: the engine loads its weights.
        ([[], [("a", CRITICAL)]], {"a"}),
        ([[], [("a", CRITICAL)], [("a", CRITICAL)]], {"a"}),  # still loading a snapshot later
        ([[], [("a", WARNING)]], {"a"}),  # any status but passing
        # It passed: no longer starting; and when it goes critical again that is a crash.
        ([[], [("a", CRITICAL)], [("a", PASSING)]], set()),
        ([[], [("a", PASSING)], [("a", CRITICAL)]], set()),
        ([[], [("a", CRITICAL)], [("a", PASSING)], [("a", CRITICAL)]], set()),
        # Already there and failing in the router's first snapshot: its history is unknown.
        ([[("a", CRITICAL)]], set()),
        ([[("a", CRITICAL)], [("a", CRITICAL)]], set()),
        # Deregistered and registered again (Nomad restarting the allocation): loading again.
        ([[], [("a", PASSING)], [], [("a", CRITICAL)]], {"a"}),
        # Gone: forgotten, and a later registration of another id counts on its own.
        ([[], [("a", CRITICAL)], []], set()),
        ([[], [("a", CRITICAL)], [("a", CRITICAL), ("b", CRITICAL)]], {"a", "b"}),
        ([[("a", CRITICAL)], [("a", CRITICAL), ("b", CRITICAL)]], {"b"}),
    ],
)
def test_which_endpoints_count_as_a_replica_starting(
    snapshots: Sequence[Sequence[tuple[str, HealthStatus]]], loading: set[str]
) -> None:
    assert replay(snapshots) == loading


@pytest.mark.parametrize(
    ("model", "usable", "unavailable", "loading", "state"),
    [
        ("running", 0, False, 1, ModelState.LOADING),
        ("running", 0, False, 0, ModelState.NO_CAPACITY),  # nothing starting: a crash, or no replica
        ("running", 1, False, 1, ModelState.SERVING),  # another replica serves
        # The control plane's word wins: its replicas keep failing, or Nomad cannot place more.
        ("running", 0, True, 1, ModelState.UNAVAILABLE),
        # On demand stays startable (woken and waited for) while its replica starts.
        ("on-demand", 0, False, 1, ModelState.STARTABLE),
        ("off", 0, False, 1, ModelState.OFF),
        ("unset", 0, False, 1, ModelState.UNSET),
    ],
)
def test_a_running_model_with_a_replica_starting_is_loading(
    catalog: Catalog, model: str, usable: int, unavailable: bool, loading: int, state: ModelState
) -> None:
    assert model_state(catalog.models[model], usable, unavailable, loading) is state


L, ST, NC, S = ModelState.LOADING, ModelState.STARTABLE, ModelState.NO_CAPACITY, ModelState.SERVING


@pytest.mark.parametrize(
    ("states", "order", "wake", "wait_for"),
    [
        ({"a": L}, (), (), "a"),  # waited for, never woken: its replica is already starting
        ({"a": L, "b": S}, ("b",), (), "a"),  # a fallback serves now
        ({"a": NC, "b": L, "c": ST}, (), (), "b"),  # the first model coming, in the chain's order
        ({"a": NC, "b": ST, "c": L}, (), ("b",), "b"),
        ({"a": NC}, (), (), None),
    ],
)
def test_a_loading_model_is_waited_for_like_a_startable_one(
    states: dict[str, ModelState], order: tuple[str, ...], wake: tuple[str, ...], wait_for: str | None
) -> None:
    plan = plan_route(tuple(states), states)
    assert (plan.order, plan.wake, plan.wait_for) == (order, wake, wait_for)


@pytest.mark.parametrize(
    ("state", "waited_for", "reason"),
    [
        (ModelState.LOADING, "a", Unserved.LOADING),
        (ModelState.LOADING, None, Unserved.LOADING),
        (ModelState.STARTABLE, None, Unserved.LOADING),
        (ModelState.NO_CAPACITY, None, Unserved.NO_CAPACITY),
    ],
)
def test_a_loading_model_not_served_in_time_is_answered_as_loading(
    state: ModelState, waited_for: str | None, reason: Unserved
) -> None:
    assert unserved_reason(state, waited_for=waited_for, failures=0) is reason


def test_the_answer_is_the_on_demand_models_own(catalog: Catalog) -> None:
    def answer(model: str, usable: int, loading: int) -> tuple[int, str | None, int | None, bool]:
        state = model_state(catalog.models[model], usable, False, loading)
        plan = plan_route((model,), {model: state})
        reason = unserved_reason(state, waited_for=plan.wait_for, failures=0)
        refusal = refusal_for(reason, model, retry_after=10, waited_for=plan.wait_for)
        return refusal.status, refusal.code, refusal.retry_after, refusal.retryable

    assert answer("running", 0, 1) == answer("on-demand", 0, 0) == (503, "model_loading", 10, True)
    assert answer("running", 0, 0) == (503, "no_healthy_replica", 10, True)
