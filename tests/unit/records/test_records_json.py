"""Records as JSON: the exact text of every record, pinned, and hostile JSON refused
with a message naming the field. Routers and control planes of different llmgw
versions read each other's documents in Consul during an upgrade, so a record must
keep its bytes, and a document must keep reading as the same value.

Each row is a full value and the text it is stored as, written out by hand: the
encoder must produce that text, and the decoder must read it back as that value
(tuples as tuples, enums as their members, seconds as floats). The refusals pin the
whole message, since it reaches operators through ``CorruptRecord`` and the
endpoint reader's warning (``llmgw.adapters.consul.kv`` and ``.endpoints``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from typing import Any

import pytest

from llmgw.core.records import (
    MAX_CATALOG_CHARS,
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
    Unavailability,
    UnavailableModel,
    UnavailableModels,
    aggregate_status,
    catalog_sha256,
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
    address="fd00::7",
    port=23456,
    engine="vllm",
    profile=2,
    simulated=True,
    status=HealthStatus.WARNING,
)
ENDPOINT_JSON = (
    '{"address":"fd00::7","alloc_id":"5c1b6a5e-0000-4000-8000-000000000001","engine":"vllm",'
    '"model":"meta-llama/Llama-3.1-8B-Instruct","model_slug":"meta-llama-llama-3-1-8b-instruct-1a2b3c4d",'
    '"node":"gpu-1","port":23456,"profile":2,"replica":"llmgw-llama-r1",'
    '"service_id":"_nomad-task-abc-engine-http","simulated":true,"status":"warning"}'
)
SHA_OF_X = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"

WIRE: list[tuple[Any, str]] = [
    (ENDPOINT, ENDPOINT_JSON),
    (
        EndpointSnapshot(endpoints=(ENDPOINT, ENDPOINT), index=42),
        f'{{"endpoints":[{ENDPOINT_JSON},{ENDPOINT_JSON}],"index":42}}',
    ),
    (EndpointSnapshot(endpoints=(), index=0), '{"endpoints":[],"index":0}'),
    (
        ModelUse(model="m1", last_used=1.5, in_flight=3, queued=1, wake=False),
        '{"in_flight":3,"last_used":1.5,"model":"m1","queued":1,"wake":false}',
    ),
    (
        DemandReport(
            router_id="router-a",
            sent_at=1_700_000_000.25,
            models=(
                ModelUse(model="m1", last_used=1_699_999_999.5, in_flight=3, queued=1, wake=False),
                ModelUse(model="m2", last_used=0.0, in_flight=0, queued=2, wake=True),
            ),
        ),
        '{"models":[{"in_flight":3,"last_used":1699999999.5,"model":"m1","queued":1,"wake":false},'
        '{"in_flight":0,"last_used":0.0,"model":"m2","queued":2,"wake":true}],'
        '"router_id":"router-a","sent_at":1700000000.25}',
    ),
    (
        DrainMark(job_id="llmgw-llama-r1", model="m1", since=1_700_000_000.5, reason="scale down"),
        '{"job_id":"llmgw-llama-r1","model":"m1","reason":"scale down","since":1700000000.5}',
    ),
    (
        ApiKeyRecord(
            key_id="k-1",
            name="team ünïcode",
            secret_sha256=secret_sha256("sk-secret"),
            models=("m1", "m2"),
            requests_per_minute=60,
            tokens_per_minute=None,
            created_at=1_700_000_000.0,
            revoked_at=None,
        ),
        '{"budget_period":"","created_at":1700000000.0,"key_id":"k-1","models":["m1","m2"],'
        '"name":"team ünïcode","requests_per_minute":60,"revoked_at":null,'
        '"secret_sha256":"746b4ad1ca9129e1caf080bf9406d43531b8bbf97f42cc1597ee4f3d4663938e",'
        '"token_budget":null,"tokens_per_minute":null}',
    ),
    (
        ApiKeyRecord("k-2", "", secret_sha256("x"), None, None, 1000, 1.0, 2.0, 5_000_000, "30d"),
        '{"budget_period":"30d","created_at":1.0,"key_id":"k-2","models":null,"name":"",'
        f'"requests_per_minute":null,"revoked_at":2.0,"secret_sha256":"{SHA_OF_X}",'
        '"token_budget":5000000,"tokens_per_minute":1000}',
    ),
    (
        CatalogVersion.of(7, 'models:\n  - name: "m1"\n', "alice@host", 1_700_000_000.0),
        '{"applied_at":1700000000.0,"applied_by":"alice@host",'
        '"sha256":"34da9ecfc3c09b7e17bb5fe7518ec29c8b512cff4aa927b41a2d17ddcf823a42",'
        '"text":"models:\\n  - name: \\"m1\\"\\n","version":7}',
    ),
    (
        UnavailableModel("m1", Unavailability.UNPLACEABLE, "no profile fits", 5.0),
        '{"model":"m1","reason":"no profile fits","since":5.0,"why":"unplaceable"}',
    ),
    (
        UnavailableModel("m2", Unavailability.FAILING, "kept failing", 5.0, until=65.0),
        '{"model":"m2","reason":"kept failing","since":5.0,"until":65.0,"why":"failing"}',
    ),
    (
        UnavailableModels(
            catalog_sha256=SHA_OF_X,
            published_at=7.0,
            models=(
                UnavailableModel("m1", Unavailability.DRAINED, "alice", 5.0),
                UnavailableModel("m2", Unavailability.FAILING, "", 5.0, 65.5),
            ),
        ),
        f'{{"catalog_sha256":"{SHA_OF_X}","models":[{{"model":"m1","reason":"alice","since":5.0,"why":"drained"}},'
        '{"model":"m2","reason":"","since":5.0,"until":65.5,"why":"failing"}],"published_at":7.0}',
    ),
    (UnavailableModels("", 7.0, ()), '{"catalog_sha256":"","models":[],"published_at":7.0}'),
    (DemandReport(router_id="r", sent_at=1.0, models=()), '{"models":[],"router_id":"r","sent_at":1.0}'),
    (
        CatalogVersion.of(0, "", "bootstrap", 0.0),
        '{"applied_at":0.0,"applied_by":"bootstrap",'
        '"sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","text":"","version":0}',
    ),
]


@pytest.mark.parametrize(("record", "text"), WIRE, ids=[type(r).__name__ for r, _ in WIRE])
def test_record_encodes_to_the_pinned_json(record: Any, text: str) -> None:
    assert to_json(record) == text
    assert to_dict(record) == json.loads(text)


@pytest.mark.parametrize(("record", "text"), WIRE, ids=[type(r).__name__ for r, _ in WIRE])
def test_pinned_json_decodes_to_the_record(record: Any, text: str) -> None:
    decoded = from_json(type(record), text)
    assert decoded == record
    assert from_json(type(record), text.encode("utf-8")) == record
    assert from_dict(type(record), json.loads(text)) == record
    _assert_same_types(decoded, record)


def _assert_same_types(decoded: Any, expected: Any) -> None:
    """Equal is not enough: ``(1,) != [1]`` is caught by ==, but ``3 == 3.0`` and
    ``"warning" == HealthStatus.WARNING`` are not."""
    assert type(decoded) is type(expected)
    if isinstance(expected, tuple):
        for got, want in zip(decoded, expected, strict=True):
            _assert_same_types(got, want)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            _assert_same_types(getattr(decoded, field.name), getattr(expected, field.name))


@pytest.mark.parametrize(("record", "text"), WIRE, ids=[type(r).__name__ for r, _ in WIRE])
def test_records_are_frozen_and_hashable(record: Any, text: str) -> None:
    # Routers keep endpoints in sets and compare snapshots to skip unchanged ones.
    assert hash(record) == hash(from_json(type(record), text))
    field = dataclasses.fields(record)[0].name
    with pytest.raises(AttributeError):
        setattr(record, field, getattr(record, field))


def test_seconds_given_as_an_int_are_written_as_given_and_read_as_a_float() -> None:
    mark = DrainMark("j", "m", 1_700_000_000, "")
    assert to_json(mark) == '{"job_id":"j","model":"m","reason":"","since":1700000000}'
    decoded = from_json(DrainMark, to_json(mark))
    assert decoded == mark and isinstance(decoded.since, float)


def test_a_record_built_with_plain_types_encodes_as_with_the_declared_ones() -> None:
    loose = dataclasses.replace(ENDPOINT, status="warning")  # type: ignore[arg-type]
    key = WIRE[6][0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert to_json(loose) == ENDPOINT_JSON
        assert to_json(dataclasses.replace(key, models=["m1"])) == to_json(
            dataclasses.replace(key, models=("m1",))
        )


def test_whole_number_floats_read_as_ints() -> None:
    decoded = from_json(EndpointSnapshot, '{"endpoints":[],"index":42.0}')
    assert decoded.index == 42 and type(decoded.index) is int


def test_until_absent_or_null_reads_as_none() -> None:
    # Leaders older than the ``failing`` kind never wrote ``until``.
    absent = '{"model":"m","why":"drained","reason":"","since":1}'
    null = '{"model":"m","why":"drained","reason":"","since":1,"until":null}'
    assert from_json(UnavailableModel, absent) == from_json(UnavailableModel, null)
    assert from_json(UnavailableModel, absent).until is None


def test_an_entry_of_a_kind_only_a_newer_leader_knows_is_skipped() -> None:
    document = json.dumps(
        {
            "catalog_sha256": "",
            "published_at": 1.0,
            "models": [
                {"model": "a", "why": "quarantined", "reason": "", "since": 1.0, "extra": [1]},
                {"model": "b", "why": "drained", "reason": "", "since": 1.0},
            ],
        }
    )
    assert from_json(UnavailableModels, document).models == (
        UnavailableModel("b", Unavailability.DRAINED, "", 1.0),
    )


def test_unknown_keys_are_ignored_at_every_level() -> None:
    raw = json.loads(WIRE[1][1])
    raw["later"] = 1
    raw["endpoints"][0]["later"] = {"x": None}
    assert from_dict(EndpointSnapshot, raw) == WIRE[1][0]


def _doc(record: Any, **changes: Any) -> str:
    raw = to_dict(record)
    for key, value in changes.items():
        if value is None and key.startswith("no_"):
            del raw[key[3:]]
        else:
            raw[key] = value
    return json.dumps(raw)


_USE = {"model": "m", "last_used": 1, "in_flight": 0, "queued": 0, "wake": False}
_DEMAND = DemandReport("r", 1.0, ())
_KEY = WIRE[6][0]
_CATALOG = CatalogVersion.of(1, "a", "me", 1.0)
_ENDPOINT_NO_STATUS = {k: v for k, v in to_dict(ENDPOINT).items() if k != "status"}


def test_api_key_never_holds_the_secret() -> None:
    assert "sk-secret" not in to_json(_KEY)
    assert _KEY.allows("m1") and not _KEY.allows("m3")


@pytest.mark.parametrize(
    ("kind", "document", "message"),
    [
        (DemandReport, "", "DemandReport: not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        (
            DemandReport,
            "{",
            "DemandReport: not valid JSON"
            " (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
        (DemandReport, "[]", "DemandReport: expected a JSON object, got an array"),
        (DemandReport, "null", "DemandReport: expected a JSON object, got null"),
        (
            DemandReport,
            '{"router_id":"r","sent_at":1,"models":[]',
            "DemandReport: not valid JSON (Expecting ',' delimiter: line 1 column 41 (char 40))",
        ),
        (DrainMark, b"\xff\xfe", "DrainMark: not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        (DemandReport, _doc(_DEMAND, no_router_id=None), "DemandReport: missing key 'router_id'"),
        (DemandReport, _doc(_DEMAND, router_id=7), "DemandReport.router_id: expected a string, got a number"),
        (DemandReport, _doc(_DEMAND, router_id=""), "DemandReport.router_id: must not be empty"),
        (
            DemandReport,
            _doc(_DEMAND, router_id="x" * 1025),
            "DemandReport.router_id: 1025 characters, more than the 1024 allowed",
        ),
        (
            DemandReport,
            _doc(_DEMAND, sent_at="now"),
            "DemandReport.sent_at: expected unix seconds (a number), got a string",
        ),
        (
            DemandReport,
            _doc(_DEMAND, sent_at=False),
            "DemandReport.sent_at: expected unix seconds (a number), got a boolean",
        ),
        (
            DemandReport,
            _doc(_DEMAND, sent_at=-1),
            "DemandReport.sent_at: -1 is not a plausible unix time in seconds",
        ),
        (
            DemandReport,
            _doc(_DEMAND, sent_at=1e300),
            "DemandReport.sent_at: 1e+300 is not a plausible unix time in seconds",
        ),
        (
            DrainMark,
            '{"job_id":"j","model":"m","since":1e999,"reason":""}',
            "DrainMark.since: inf is not a plausible unix time in seconds",
        ),
        (
            DemandReport,
            '{"router_id":"r","sent_at":NaN,"models":[]}',
            "DemandReport: not valid JSON (NaN is not a JSON number)",
        ),
        (
            DemandReport,
            '{"router_id":"r","sent_at":Infinity,"models":[]}',
            "DemandReport: not valid JSON (Infinity is not a JSON number)",
        ),
        (DemandReport, _doc(_DEMAND, models={}), "DemandReport.models: expected a JSON array, got an object"),
        (
            DemandReport,
            _doc(_DEMAND, models=[7]),
            "DemandReport.models[0]: expected a JSON object, got a number",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE | {"in_flight": -1}]),
            "DemandReport.models[0].in_flight: -1 is outside 0..9007199254740991",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE | {"in_flight": 2**60}]),
            "DemandReport.models[0].in_flight: 1152921504606846976 is outside 0..9007199254740991",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE, _USE | {"in_flight": 1.5}]),
            "DemandReport.models[1].in_flight: expected a whole number, got a number",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE | {"in_flight": "1"}]),
            "DemandReport.models[0].in_flight: expected a whole number, got a string",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE | {"in_flight": True}]),
            "DemandReport.models[0].in_flight: expected a whole number, got a boolean",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE | {"wake": "yes"}]),
            "DemandReport.models[0].wake: expected true or false, got a string",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[_USE | {"wake": 0}]),
            "DemandReport.models[0].wake: expected true or false, got a number",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[{k: v for k, v in _USE.items() if k != "wake"}]),
            "DemandReport.models[0]: missing key 'wake'",
        ),
        (DemandReport, "[" * 100_000 + "]" * 100_000, "DemandReport: JSON nested too deeply"),
        (
            DemandReport,
            " " * (MAX_DOCUMENT_BYTES + 1),
            "DemandReport: document is 1048577 bytes, more than the 1048576 allowed",
        ),
        (
            DemandReport,
            _doc(_DEMAND, models=[{}] * (MAX_ITEMS + 1)),
            "DemandReport.models: 100001 items, more than the 100000 allowed",
        ),
        (
            DrainMark,
            _doc(DrainMark("j", "m", 1.0, "r"), job_id=None),
            "DrainMark.job_id: expected a string, got null",
        ),
        (Endpoint, _doc(ENDPOINT, port=0), "Endpoint.port: 0 is outside 1..65535"),
        (Endpoint, _doc(ENDPOINT, port=65536), "Endpoint.port: 65536 is outside 1..65535"),
        (
            Endpoint,
            _doc(ENDPOINT, status="maintenance"),
            "Endpoint.status: 'maintenance' is not passing, warning or critical",
        ),
        (Endpoint, _doc(ENDPOINT, status=3), "Endpoint.status: expected a string, got a number"),
        (Endpoint, _doc(ENDPOINT, simulated=None), "Endpoint.simulated: expected true or false, got null"),
        (
            EndpointSnapshot,
            json.dumps({"endpoints": [_ENDPOINT_NO_STATUS], "index": 1}),
            "EndpointSnapshot.endpoints[0]: missing key 'status'",
        ),
        (
            EndpointSnapshot,
            '{"endpoints":[],"index":null}',
            "EndpointSnapshot.index: expected a whole number, got null",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, secret_sha256="ABC"),
            "ApiKeyRecord.secret_sha256: expected 64 lowercase hex digits",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, models=["m1", 2]),
            "ApiKeyRecord.models[1]: expected a string, got a number",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, secret_sha256="sk-secret"),
            "ApiKeyRecord.secret_sha256: expected 64 lowercase hex digits",
        ),
        (ApiKeyRecord, _doc(_KEY, models="m1"), "ApiKeyRecord.models: expected a JSON array, got a string"),
        (
            ApiKeyRecord,
            _doc(_KEY, requests_per_minute=0),
            "ApiKeyRecord.requests_per_minute: 0 is outside 1..9007199254740991",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, revoked_at="x"),
            "ApiKeyRecord.revoked_at: expected unix seconds (a number), got a string",
        ),
        (ApiKeyRecord, _doc(_KEY, no_revoked_at=None), "ApiKeyRecord: missing key 'revoked_at'"),
        (
            ApiKeyRecord,
            _doc(_KEY, token_budget=-1),
            "ApiKeyRecord.token_budget: -1 is outside 1..9007199254740991",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, token_budget=2**53),
            "ApiKeyRecord.token_budget: 9007199254740992 is outside 1..9007199254740991",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, token_budget="5000"),
            "ApiKeyRecord.token_budget: expected a whole number, got a string",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, token_budget=5000, budget_period="30x"),
            "ApiKeyRecord.budget_period: a budget period is daily, weekly, monthly, lifetime, or a whole "
            "number of days or hours such as 30d or 12h, not '30x'",
        ),
        (
            ApiKeyRecord,
            _doc(_KEY, token_budget=5000, budget_period=30),
            "ApiKeyRecord.budget_period: expected a string, got a number",
        ),
        (
            CatalogVersion,
            _doc(_CATALOG, text="b"),
            "CatalogVersion.sha256: does not match the text (the record is corrupt)",
        ),
        (
            CatalogVersion,
            _doc(_CATALOG, sha256="x"),
            "CatalogVersion.sha256: expected 64 lowercase hex digits",
        ),
        (
            CatalogVersion,
            _doc(
                _CATALOG,
                text="x" * (MAX_CATALOG_CHARS + 1),
                sha256=catalog_sha256("x" * (MAX_CATALOG_CHARS + 1)),
            ),
            "CatalogVersion.text: 921601 characters, more than the 921600 allowed",
        ),
        (
            CatalogVersion,
            _doc(_CATALOG, version=-3),
            "CatalogVersion.version: -3 is outside 0..9007199254740991",
        ),
        (
            UnavailableModel,
            '{"model":"m","why":"bored","reason":"","since":1}',
            "UnavailableModel.why: 'bored' is not unplaceable, drained or failing",
        ),
        (
            UnavailableModel,
            '{"model":"m","why":"failing","reason":"","since":1,"until":"later"}',
            "UnavailableModel.until: expected unix seconds (a number), got a string",
        ),
        (
            UnavailableModels,
            '{"catalog_sha256":"abc","published_at":1,"models":[]}',
            "UnavailableModels.catalog_sha256: expected 64 lowercase hex digits or nothing",
        ),
        (
            UnavailableModels,
            '{"catalog_sha256":"","published_at":1,"models":[{"model":"m","why":"drained","reason":"","since":1,"until":-5}]}',
            "UnavailableModels.models[0].until: -5 is not a plausible unix time in seconds",
        ),
        (
            UnavailableModels,
            '{"catalog_sha256":"","published_at":1,"models":[7]}',
            "UnavailableModels.models[0]: expected a JSON object, got a number",
        ),
    ],
)
def test_malformed_documents_are_refused_with_the_whole_message(
    kind: Any, document: str | bytes, message: str
) -> None:
    with pytest.raises(RecordDecodeError) as refused:
        from_json(kind, document)
    assert str(refused.value) == message


def test_a_number_too_long_to_read_is_refused_as_not_valid_json() -> None:
    # Python refuses to convert it (sys.int_max_str_digits, 4300 by default): the
    # message after "not valid JSON" is Python's own, so only its start is pinned.
    document = '{"router_id":"r","sent_at":1,"models":[],"n":' + "9" * 5000 + "}"
    with pytest.raises(RecordDecodeError, match=re.escape("DemandReport: not valid JSON (")):
        from_json(DemandReport, document)


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
    assert ENDPOINT.url == "http://[fd00::7]:23456"
    v4 = from_dict(Endpoint, to_dict(ENDPOINT) | {"address": "10.0.0.7"})
    assert v4.url == "http://10.0.0.7:23456"


def test_a_key_stored_before_budgets_existed_reads_as_one_without_a_budget() -> None:
    old = _doc(_KEY, no_token_budget=None, no_budget_period=None)
    record = from_json(ApiKeyRecord, old)
    assert record.token_budget is None and record.budget is None
    assert record == _KEY
