"""Records round-trip through JSON, and hostile JSON is refused with a message naming the field."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from llmgw.core.records import (
    MAX_DOCUMENT_BYTES,
    MAX_ITEMS,
    ApiKeyRecord,
    CatalogVersion,
    DemandReport,
    DrainMark,
    Endpoint,
    EndpointSnapshot,
    HealthStatus,
    ModelUse,
    RecordDecodeError,
    aggregate_status,
    from_dict,
    from_json,
    secret_sha256,
    to_dict,
    to_json,
)

ENDPOINT = Endpoint(
    service_id="_nomad-task-abc-engine-http",
    node="gpu-1",
    model="meta-llama/Llama-3.1-8B-Instruct",
    model_slug="meta-llama-llama-3-1-8b-instruct-1a2b3c4d",
    replica="llmgw-llama-r1",
    alloc_id="5c1b6a5e-0000-4000-8000-000000000001",
    address="10.0.0.7",
    port=23456,
    engine="vllm",
    profile=0,
    simulated=False,
    status=HealthStatus.WARNING,
)
DEMAND = DemandReport(
    router_id="router-a",
    sent_at=1_700_000_000.25,
    models=(
        ModelUse(model="m1", last_used=1_699_999_999.5, in_flight=3, queued=1, wake=False),
        ModelUse(model="m2", last_used=0.0, in_flight=0, queued=2, wake=True),
    ),
)
KEY = ApiKeyRecord(
    key_id="k-1",
    name="team ünïcode",
    secret_sha256=secret_sha256("sk-secret"),
    models=("m1", "m2"),
    requests_per_minute=60,
    tokens_per_minute=None,
    created_at=1_700_000_000.0,
    revoked_at=None,
)
RECORDS = [
    ENDPOINT,
    EndpointSnapshot(endpoints=(ENDPOINT,), index=42),
    DEMAND,
    DemandReport(router_id="r", sent_at=1.0, models=()),
    DrainMark(job_id="llmgw-llama-r1", model="m1", since=1_700_000_000.0, reason="scale down"),
    KEY,
    ApiKeyRecord("k-2", "", secret_sha256("x"), None, None, 1000, 1.0, 2.0),
    CatalogVersion.of(7, "models:\n  - name: m1\n", "alice@host", 1_700_000_000.0),
    CatalogVersion.of(0, "", "bootstrap", 0.0),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_round_trip(record: Any) -> None:
    text = to_json(record)
    assert from_json(type(record), text) == record
    assert from_json(type(record), text.encode("utf-8")) == record
    # The same record always has the same bytes (so "changed?" is a compare).
    assert to_json(from_json(type(record), text)) == text


def test_json_is_plain_and_sorted() -> None:
    parsed = json.loads(to_json(DEMAND))
    assert list(parsed) == sorted(parsed)
    assert parsed["models"][1] == {"model": "m2", "last_used": 0.0, "in_flight": 0, "queued": 2, "wake": True}


def test_api_key_never_holds_the_secret() -> None:
    assert "sk-secret" not in to_json(KEY)
    assert KEY.allows("m1") and not KEY.allows("m3")


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    raw = to_dict(DEMAND) | {"added_in_a_later_version": {"x": 1}}
    assert from_dict(DemandReport, raw) == DEMAND


def test_whole_numbers_written_as_floats_are_accepted() -> None:
    raw = to_dict(ENDPOINT) | {"port": 23456.0}
    assert from_dict(Endpoint, raw).port == 23456


def _mutated(record: Any, **changes: Any) -> str:
    raw = to_dict(record)
    for key, value in changes.items():
        if value is _DELETE:
            del raw[key]
        else:
            raw[key] = value
    return json.dumps(raw)


_DELETE = object()


@pytest.mark.parametrize(
    ("kind", "document", "expected"),
    [
        (DemandReport, "", "not valid JSON"),
        (DemandReport, "{", "not valid JSON"),
        (DemandReport, "[]", "expected a JSON object, got an array"),
        (DemandReport, "null", "expected a JSON object, got null"),
        (DemandReport, _mutated(DEMAND, router_id=_DELETE), "missing key 'router_id'"),
        (
            DemandReport,
            _mutated(DEMAND, router_id=7),
            "DemandReport.router_id: expected a string, got a number",
        ),
        (DemandReport, _mutated(DEMAND, router_id=""), "router_id: must not be empty"),
        (DemandReport, _mutated(DEMAND, router_id="x" * 5000), "5000 characters"),
        (DemandReport, _mutated(DEMAND, sent_at="now"), "sent_at: expected unix seconds"),
        (DemandReport, _mutated(DEMAND, sent_at=True), "sent_at: expected unix seconds"),
        (DemandReport, _mutated(DEMAND, sent_at=-1), "not a plausible unix time"),
        (DemandReport, _mutated(DEMAND, sent_at=1e300), "not a plausible unix time"),
        (DemandReport, '{"router_id":"r","sent_at":1e999,"models":[]}', "not a plausible unix time"),
        (DemandReport, '{"router_id":"r","sent_at":NaN,"models":[]}', "not valid JSON"),
        (DemandReport, '{"router_id":"r","sent_at":Infinity,"models":[]}', "not valid JSON"),
        (DemandReport, _mutated(DEMAND, models={"m1": 1}), "models: expected a JSON array, got an object"),
        (DemandReport, _mutated(DEMAND, models=[1]), "DemandReport.models[0]: expected a JSON object"),
        (
            DemandReport,
            _mutated(
                DEMAND, models=[{"model": "m", "last_used": 1, "in_flight": -1, "queued": 0, "wake": False}]
            ),
            "DemandReport.models[0].in_flight: -1 is outside",
        ),
        (
            DemandReport,
            _mutated(
                DEMAND, models=[{"model": "m", "last_used": 1, "in_flight": 1.5, "queued": 0, "wake": False}]
            ),
            "in_flight: expected a whole number",
        ),
        (
            DemandReport,
            _mutated(
                DEMAND, models=[{"model": "m", "last_used": 1, "in_flight": 2**60, "queued": 0, "wake": 0}]
            ),
            "is outside",
        ),
        (
            DemandReport,
            _mutated(DEMAND, models=[{"model": "m", "last_used": 1, "in_flight": 0, "queued": 0, "wake": 0}]),
            "wake: expected true or false, got a number",
        ),
        (DemandReport, '{"router_id":"r","sent_at":1,"models":[],"n":' + "9" * 5000 + "}", "not valid JSON"),
        (DemandReport, "[" * 100_000 + "]" * 100_000, "JSON"),
        (DemandReport, " " * (MAX_DOCUMENT_BYTES + 1), "more than the"),
        (DemandReport, _mutated(DEMAND, models=[{}] * (MAX_ITEMS + 1)), "items, more than the"),
        (Endpoint, _mutated(ENDPOINT, port=0), "port: 0 is outside 1..65535"),
        (Endpoint, _mutated(ENDPOINT, port=70000), "port: 70000 is outside"),
        (Endpoint, _mutated(ENDPOINT, status="maintenance"), "not passing, warning or critical"),
        (EndpointSnapshot, '{"endpoints":[{}],"index":1}', "EndpointSnapshot.endpoints[0]: missing key"),
        (
            DrainMark,
            _mutated(DrainMark("j", "m", 1.0, "r"), job_id=None),
            "job_id: expected a string, got null",
        ),
        (ApiKeyRecord, _mutated(KEY, secret_sha256="ABC"), "expected 64 lowercase hex digits"),
        (ApiKeyRecord, _mutated(KEY, secret_sha256="sk-secret"), "expected 64 lowercase hex digits"),
        (ApiKeyRecord, _mutated(KEY, models="m1"), "models: expected a JSON array, got a string"),
        (ApiKeyRecord, _mutated(KEY, models=["m1", 2]), "ApiKeyRecord.models[1]: expected a string"),
        (ApiKeyRecord, _mutated(KEY, requests_per_minute=0), "requests_per_minute: 0 is outside"),
        (ApiKeyRecord, _mutated(KEY, revoked_at="yesterday"), "revoked_at: expected unix seconds"),
        (ApiKeyRecord, _mutated(KEY, revoked_at=_DELETE), "missing key 'revoked_at'"),
        (
            CatalogVersion,
            _mutated(CatalogVersion.of(1, "a", "me", 1.0), text="b"),
            "sha256: does not match the text",
        ),
        (
            CatalogVersion,
            _mutated(CatalogVersion.of(1, "a", "me", 1.0), version=-3),
            "version: -3 is outside",
        ),
    ],
)
def test_hostile_documents_are_refused_with_a_message(kind: Any, document: str, expected: str) -> None:
    with pytest.raises(RecordDecodeError, match=_escape(expected)):
        from_json(kind, document)


def _escape(text: str) -> str:
    return re.escape(text)


def test_decode_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        from_json(DrainMark, b"\xff\xfe\x00garbage")


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ((), HealthStatus.PASSING),
        (("passing", "passing"), HealthStatus.PASSING),
        (("passing", "warning"), HealthStatus.WARNING),
        (("warning", "critical", "passing"), HealthStatus.CRITICAL),
        (("passing", "maintenance"), HealthStatus.CRITICAL),
    ],
)
def test_aggregate_status_is_the_worst_check(statuses: tuple[str, ...], expected: HealthStatus) -> None:
    assert aggregate_status(statuses) is expected


def test_endpoint_url_brackets_ipv6() -> None:
    assert ENDPOINT.url == "http://10.0.0.7:23456"
    v6 = from_dict(Endpoint, to_dict(ENDPOINT) | {"address": "::1"})
    assert v6.url == "http://[::1]:23456"
