"""The router's decisions as tables: names, fallbacks, states, plans, endpoint choice, retries, answers."""

from __future__ import annotations

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core import routing
from llmgw.core.catalog import Catalog, load_catalog
from llmgw.core.routing import (
    Api,
    Candidate,
    Failure,
    ModelState,
    NextStep,
    RetryPolicy,
    Unserved,
    after_failure,
    choose_endpoint,
    fallback_chain,
    model_state,
    plan_route,
    refusal_for,
    resolve,
    unserved_reason,
)

CATALOG_TEXT = """
models:
  big:      {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 2}}
  medium:   {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  small:    {roles: [chat, completion], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
  tiny:     {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
  off:      {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 0}}
  unset:    {roles: [chat], profiles: [{engine: sim}]}
  embed:    {roles: [embedding], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  judge:    {roles: [guard], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
aliases:
  gpt-4o: big
  gpt-4o-mini: small
fallbacks:
  big: [medium, gpt-4o-mini]
  medium: [tiny]
  small: [tiny]
"""


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    result = load_catalog(CATALOG_TEXT, filename="c.yaml", policy=read_security_policy())
    assert result.catalog is not None, result.diagnostics
    return result.catalog


def test_resolve_models_and_aliases(catalog: Catalog) -> None:
    assert resolve(catalog, "big") == "big"
    assert resolve(catalog, "gpt-4o") == "big"
    assert resolve(catalog, "gpt-5") is None


@pytest.mark.parametrize(
    ("requested", "allowed", "expected"),
    [
        ("big", ["big"], "big"),
        ("gpt-4o", ["big"], "big"),  # the model is granted: its aliases are too
        ("gpt-4o", ["gpt-4o"], "big"),  # the alias alone is granted
        ("big", ["gpt-4o"], None),  # granting an alias does not grant its model's other names
        ("medium", ["big"], None),  # not allowed looks exactly like unknown
        ("nope", ["nope"], None),
    ],
)
def test_resolve_with_a_keys_model_list(
    catalog: Catalog, requested: str, allowed: list[str], expected: str | None
) -> None:
    assert resolve(catalog, requested, allowed) == expected


def test_fallback_chain_is_breadth_first_and_skips_models_that_cannot_answer(catalog: Catalog) -> None:
    # big's own list in order (medium, small via alias), then their fallbacks (tiny once).
    assert fallback_chain(catalog, "big", Api.CHAT) == ("big", "medium", "small", "tiny")
    # Only `small` has the completion role among them.
    assert fallback_chain(catalog, "big", Api.COMPLETIONS) == ("big", "small")
    assert fallback_chain(catalog, "tiny", Api.CHAT) == ("tiny",)


@pytest.mark.parametrize(
    ("allowed", "expected"),
    [
        (None, ("big", "medium", "small", "tiny")),
        (["big"], ("big",)),  # a key granted one model is answered by that model only
        (["big", "gpt-4o-mini"], ("big", "small")),  # a fallback granted by its alias
        (["big", "tiny"], ("big",)),  # tiny is reached only through models the key may not use
        (["gpt-4o", "medium", "tiny"], ("big", "medium", "tiny")),
    ],
)
def test_fallback_chain_keeps_to_the_keys_model_list(
    catalog: Catalog, allowed: list[str] | None, expected: tuple[str, ...]
) -> None:
    assert fallback_chain(catalog, "big", Api.CHAT, allowed) == expected


def test_fallback_chain_terminates_on_a_cycle() -> None:
    catalog = Catalog.model_validate(
        {
            "models": {n: {"profiles": [{"engine": "sim"}]} for n in ("a", "b")},
            "fallbacks": {"a": ["b"], "b": ["a"]},
        }
    )
    assert fallback_chain(catalog, "a", Api.CHAT) == ("a", "b")


def test_serves_api(catalog: Catalog) -> None:
    assert routing.serves_api(catalog.models["judge"], Api.CHAT)
    assert not routing.serves_api(catalog.models["embed"], Api.CHAT)
    assert routing.serves_api(catalog.models["embed"], Api.EMBEDDINGS)
    assert not routing.serves_api(catalog.models["big"], Api.COMPLETIONS)


@pytest.mark.parametrize(
    ("model", "usable", "state"),
    [
        ("big", 1, ModelState.SERVING),
        ("big", 0, ModelState.NO_CAPACITY),
        ("small", 0, ModelState.STARTABLE),
        ("off", 0, ModelState.OFF),
        ("off", 2, ModelState.SERVING),  # just switched off: its last replicas still answer
        ("unset", 0, ModelState.UNSET),
    ],
)
def test_model_state(catalog: Catalog, model: str, usable: int, state: ModelState) -> None:
    assert model_state(catalog.models[model], usable) is state


S, ST, NC, OFF = ModelState.SERVING, ModelState.STARTABLE, ModelState.NO_CAPACITY, ModelState.OFF


@pytest.mark.parametrize(
    ("states", "order", "wake", "wait_for"),
    [
        ({"a": S, "b": S}, ("a", "b"), (), None),
        # The requested model sleeps: wake it, and serve this request from the fallback now.
        ({"a": ST, "b": S}, ("b",), ("a",), "a"),
        # Nothing serves: wake and wait for the first startable one.
        ({"a": NC, "b": ST, "c": ST}, (), ("b",), "b"),
        ({"a": ST, "b": ST}, (), ("a",), "a"),
        # A sleeping fallback is not woken while something serves.
        ({"a": S, "b": ST}, ("a",), (), "b"),
        ({"a": OFF}, (), (), None),
    ],
)
def test_plan_route(
    states: dict[str, ModelState], order: tuple[str, ...], wake: tuple[str, ...], wait_for: str | None
) -> None:
    plan = plan_route(tuple(states), states)
    assert (plan.order, plan.wake, plan.wait_for) == (order, wake, wait_for)


@pytest.mark.parametrize(
    ("states", "answers"),
    [
        ({"a": S}, True),
        ({"a": NC, "b": S}, True),  # a fallback serves
        ({"a": ST}, True),  # woken and waited for
        ({"a": NC}, False),  # 503 at once: no healthy replica
        ({"a": OFF, "b": ModelState.UNAVAILABLE, "c": ModelState.UNSET}, False),
    ],
)
def test_a_plan_answers_when_something_serves_or_loads_for_it(
    states: dict[str, ModelState], answers: bool
) -> None:
    assert routing.answers(plan_route(tuple(states), states)) is answers


def C(key: str, in_flight: int, usable: bool = True) -> Candidate:
    return Candidate(key, in_flight, usable)


def test_choose_least_outstanding_skipping_unusable_and_avoided() -> None:
    candidates = [C("a", 3), C("b", 1), C("c", 0, usable=False), C("d", 2)]
    assert choose_endpoint(candidates, (), 0) == "b"
    assert choose_endpoint(candidates, {"b"}, 0) == "d"
    assert choose_endpoint(candidates, {"a", "b", "d"}, 0) is None
    assert choose_endpoint([], (), 0) is None


def test_ties_rotate_with_the_turn() -> None:
    candidates = [C("a", 0), C("b", 0), C("c", 1)]
    assert [choose_endpoint(candidates, (), turn) for turn in range(4)] == ["a", "b", "a", "b"]


def test_a_suspect_is_chosen_only_when_no_other_endpoint_is_left() -> None:
    # The suspect refused a connection and so has nothing outstanding: least
    # outstanding alone would pick it every time.
    candidates = [Candidate("dead", 0, True, suspect=True), C("busy", 5), C("busier", 7)]
    assert [choose_endpoint(candidates, (), turn) for turn in range(3)] == ["busy"] * 3
    assert choose_endpoint(candidates, {"busy", "busier"}, 0) == "dead"  # fail open
    assert choose_endpoint([Candidate("dead", 0, False, suspect=True)], (), 0) is None


def test_only_an_unreachable_engine_makes_its_endpoint_a_suspect() -> None:
    assert routing.marks_suspect(Failure.CONNECT)
    for failure in (Failure.STALE_CONNECTION, Failure.UNAVAILABLE, Failure.FIRST_BYTE_TIMEOUT):
        assert not routing.marks_suspect(failure)


POLICY = RetryPolicy(attempts_per_model=3, attempts_total=5)


@pytest.mark.parametrize(
    ("failure", "has_bytes", "on_model", "total", "step"),
    [
        (Failure.CONNECT, False, 1, 1, NextStep.OTHER_ENDPOINT),
        (Failure.UNAVAILABLE, False, 2, 2, NextStep.OTHER_ENDPOINT),
        (Failure.STALE_CONNECTION, False, 1, 1, NextStep.SAME_ENDPOINT),
        # A stale pooled connection is the pool's leftover, not the model's failure:
        # retried even when the model's tries are spent (not past the request's).
        (Failure.STALE_CONNECTION, False, 3, 3, NextStep.SAME_ENDPOINT),
        (Failure.STALE_CONNECTION, False, 3, 5, NextStep.GIVE_UP),
        (Failure.CONNECT, False, 3, 3, NextStep.NEXT_MODEL),
        (Failure.CONNECT, False, 1, 5, NextStep.GIVE_UP),
        (Failure.CONNECT, True, 1, 1, NextStep.GIVE_UP),  # a byte reached the client
        (Failure.FIRST_BYTE_TIMEOUT, False, 1, 1, NextStep.GIVE_UP),  # the engine may still work
    ],
)
def test_after_failure(failure: Failure, has_bytes: bool, on_model: int, total: int, step: NextStep) -> None:
    got = after_failure(
        failure, client_has_bytes=has_bytes, attempts_on_model=on_model, attempts_total=total, policy=POLICY
    )
    assert got is step


@pytest.mark.parametrize(
    ("state", "waited_for", "failures", "reason"),
    [
        (ModelState.NO_CAPACITY, None, 0, Unserved.NO_CAPACITY),
        (ModelState.STARTABLE, "a", 0, Unserved.LOADING),
        (ModelState.STARTABLE, None, 0, Unserved.LOADING),
        (ModelState.OFF, None, 0, Unserved.OFF),
        (ModelState.UNSET, None, 0, Unserved.UNSET),
        (ModelState.OFF, "b", 0, Unserved.LOADING),  # off, but its fallback is loading
        (ModelState.SERVING, None, 2, Unserved.UPSTREAM_FAILED),
    ],
)
def test_unserved_reason(state: ModelState, waited_for: str | None, failures: int, reason: Unserved) -> None:
    assert unserved_reason(state, waited_for=waited_for, failures=failures) is reason


def test_unknown_model_is_openais_exact_404() -> None:
    refusal = refusal_for(Unserved.UNKNOWN, "gpt-5", retry_after=3)
    assert refusal.status == 404
    assert refusal.body() == {
        "error": {
            "message": "The model `gpt-5` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert refusal.retry_after is None


def test_loading_off_and_no_capacity_are_different_answers() -> None:
    loading = refusal_for(Unserved.LOADING, "m", retry_after=10)
    off = refusal_for(Unserved.OFF, "m", retry_after=10)
    unset = refusal_for(Unserved.UNSET, "m", retry_after=10)
    none = refusal_for(Unserved.NO_CAPACITY, "m", retry_after=5)
    assert (loading.status, loading.code, loading.retry_after) == (503, "model_loading", 10)
    assert loading.retryable
    assert (off.status, off.code, off.retry_after, off.retryable) == (503, "model_off", None, False)
    assert "configured off" in off.message and "no scaling stanza" in unset.message
    assert (none.status, none.code, none.retry_after) == (503, "no_healthy_replica", 5)
    assert "loading" in loading.message and "loading" not in none.message


def test_wrong_api_names_the_api() -> None:
    refusal = refusal_for(Unserved.WRONG_API, "embed", retry_after=0, api=Api.CHAT)
    assert (refusal.status, refusal.code, refusal.param) == (400, "model_not_supported", "model")
    assert "chat.completions" in refusal.message
