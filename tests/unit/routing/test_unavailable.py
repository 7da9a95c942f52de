"""A model the control plane cannot serve now (``llmgw/unavailable``): the router's state,
plan and answer for it, and when the router may trust the control plane's word at all.

The user-visible promise: no wait and no "loading, retry in 10 seconds" for a model that
cannot be placed or that an operator drained, but an immediate 503 ``model_unavailable``
that says why; fallbacks are still tried first; a missing, stale or foreign document
changes nothing (the router waits for loads as it always did)."""

from __future__ import annotations

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import Catalog, load_catalog
from llmgw.core.records import (
    RecordDecodeError,
    Unavailability,
    UnavailableModel,
    UnavailableModels,
    from_json,
    to_json,
    unavailable_now,
    unavailable_trusted,
)
from llmgw.core.routing import (
    ModelState,
    Unserved,
    model_state,
    plan_route,
    refusal_for,
    unserved_reason,
)

CATALOG_TEXT = """
models:
  on-demand: {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
  running:   {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  off:       {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 0}}
  unset:     {roles: [chat], profiles: [{engine: sim}]}
"""
SHA = "a" * 64
OTHER_SHA = "b" * 64
T0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z

UNPLACEABLE = UnavailableModel(
    "on-demand", Unavailability.UNPLACEABLE, "no profile fits: profile 0: missing drivers (docker)", T0
)
DRAINED = UnavailableModel("running", Unavailability.DRAINED, "drained by alice", T0 + 60)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    result = load_catalog(CATALOG_TEXT, filename="c.yaml", policy=read_security_policy())
    assert result.catalog is not None, result.diagnostics
    return result.catalog


@pytest.mark.parametrize(
    ("name", "usable", "unavailable", "expected"),
    [
        ("on-demand", 0, True, ModelState.UNAVAILABLE),
        ("on-demand", 0, False, ModelState.STARTABLE),
        ("running", 0, True, ModelState.UNAVAILABLE),
        ("running", 0, False, ModelState.NO_CAPACITY),
        # A replica that still serves wins: the control plane's word is about starting one.
        ("on-demand", 1, True, ModelState.SERVING),
        # The catalog's off is the more lasting answer.
        ("off", 0, True, ModelState.OFF),
        ("unset", 0, True, ModelState.UNSET),
    ],
)
def test_state(catalog: Catalog, name: str, usable: int, unavailable: bool, expected: ModelState) -> None:
    assert model_state(catalog.models[name], usable, unavailable) is expected


def test_an_unavailable_model_is_neither_woken_nor_waited_for_and_fallbacks_are_tried() -> None:
    plan = plan_route(("a", "b"), {"a": ModelState.UNAVAILABLE, "b": ModelState.SERVING})
    assert (plan.order, plan.wake, plan.wait_for) == (("b",), (), None)
    plan = plan_route(("a", "b"), {"a": ModelState.UNAVAILABLE, "b": ModelState.STARTABLE})
    assert (plan.order, plan.wake, plan.wait_for) == ((), ("b",), "b")
    plan = plan_route(("a",), {"a": ModelState.UNAVAILABLE})
    assert (plan.order, plan.wake, plan.wait_for) == ((), (), None)


@pytest.mark.parametrize(
    ("state", "waited_for", "failures", "expected"),
    [
        (ModelState.UNAVAILABLE, None, 0, Unserved.UNAVAILABLE),
        # Waiting for a fallback that still loads: that is the more useful answer.
        (ModelState.UNAVAILABLE, "fallback", 0, Unserved.LOADING),
        (ModelState.UNAVAILABLE, None, 2, Unserved.UPSTREAM_FAILED),
        (ModelState.STARTABLE, None, 0, Unserved.LOADING),
    ],
)
def test_unserved_reason(
    state: ModelState, waited_for: str | None, failures: int, expected: Unserved
) -> None:
    assert unserved_reason(state, waited_for=waited_for, failures=failures) is expected


def test_unplaceable_answer_says_why_and_since_when_and_when_to_retry() -> None:
    refusal = refusal_for(Unserved.UNAVAILABLE, "on-demand", retry_after=30, unavailable=UNPLACEABLE)
    assert (refusal.status, refusal.code, refusal.type) == (503, "model_unavailable", "server_error")
    # No place says nothing of when there will be one: the SDKs are told not to retry
    # (x-should-retry: false), and Retry-After says when a person might.
    assert refusal.retry_after == 30 and not refusal.retryable
    # Without the control plane's word a retry may find a replica.
    assert refusal_for(Unserved.UNAVAILABLE, "on-demand", retry_after=30).retryable
    assert refusal.message == (
        "The model `on-demand` cannot be served now: the cluster has no place for it "
        "(no profile fits: profile 0: missing drivers (docker)) since 2026-11-30T00:53:20Z. "
        "The control plane tries again when the cluster's capacity changes; retry in 30 seconds "
        "or ask the operator."
    )
    assert refusal.body()["error"]["code"] == "model_unavailable"


FAILING = UnavailableModel(
    "crashy", Unavailability.FAILING, "3 failure(s) in a row; the last: exited 137", T0, until=T0 + 120
)


def test_failing_answer_says_why_and_when_the_control_plane_tries_again() -> None:
    refusal = refusal_for(Unserved.UNAVAILABLE, "crashy", retry_after=95, unavailable=FAILING)
    assert (refusal.status, refusal.code, refusal.retry_after, refusal.retryable) == (
        503,
        "model_unavailable",
        95,
        True,
    )
    assert refusal.message == (
        "The model `crashy` cannot be served now: its replicas kept failing (3 failure(s) in a row; "
        "the last: exited 137) since 2026-11-30T00:53:20Z. The control plane tries again at "
        "2026-11-30T00:55:20Z; retry in 95 seconds or ask the operator."
    )


def test_drained_answer_is_not_to_be_retried_and_names_the_alias_and_the_model() -> None:
    refusal = refusal_for(Unserved.UNAVAILABLE, "gpt-x", retry_after=30, unavailable=DRAINED)
    assert (refusal.status, refusal.code, refusal.retry_after, refusal.retryable) == (
        503,
        "model_unavailable",
        None,
        False,
    )
    assert refusal.message == (
        "The model `gpt-x` (`running`) cannot be served now: drained by alice since 2026-11-30T00:54:20Z. "
        "It serves again after an operator restarts it or changes it in the catalog."
    )


def _document(*models: UnavailableModel, sha: str = SHA, at: float = T0) -> UnavailableModels:
    return UnavailableModels(catalog_sha256=sha, published_at=at, models=models)


def test_the_router_trusts_only_a_fresh_document_about_its_own_catalog() -> None:
    doc = _document(UNPLACEABLE, DRAINED)
    assert set(unavailable_now(doc, SHA, T0 + 90, stale_after=90)) == {"on-demand", "running"}
    # Fail safe, to today's behaviour (wait for loads): no document, a stale one (the
    # control plane stopped refreshing it), one about another catalog, no catalog yet.
    assert unavailable_now(None, SHA, T0, stale_after=90) == {}
    assert unavailable_now(doc, SHA, T0 + 91, stale_after=90) == {}
    assert unavailable_now(doc, OTHER_SHA, T0, stale_after=90) == {}
    assert unavailable_now(doc, None, T0, stale_after=90) == {}
    assert not unavailable_trusted(_document(sha=""), "", T0, stale_after=90)


def test_the_document_round_trips_and_bad_ones_are_refused() -> None:
    doc = _document(UNPLACEABLE, DRAINED, FAILING)
    assert from_json(UnavailableModels, to_json(doc)) == doc
    # A document from a leader older than the failing kind has no "until".
    assert '"until"' not in to_json(_document(UNPLACEABLE))
    assert from_json(UnavailableModels, to_json(_document(UNPLACEABLE))).models == (UNPLACEABLE,)
    with pytest.raises(RecordDecodeError, match="until"):
        from_json(
            UnavailableModels, to_json(_document(FAILING)).replace(f'"until":{T0 + 120}', '"until":"soon"')
        )
    # A kind only a newer leader knows is skipped (that model is waited for as before).
    newer = from_json(UnavailableModels, to_json(doc).replace('"drained"', '"quarantined"'))
    assert newer.models == (UNPLACEABLE, FAILING)
    with pytest.raises(RecordDecodeError, match="why"):
        from_json(UnavailableModels, to_json(doc).replace('"why":"drained"', '"why":7'))
    with pytest.raises(RecordDecodeError, match="catalog_sha256"):
        from_json(UnavailableModels, to_json(_document(sha="not-a-digest")))
    with pytest.raises(RecordDecodeError, match="published_at"):
        from_json(UnavailableModels, to_json(doc).replace(f'"published_at":{T0}', '"published_at":-1'))
