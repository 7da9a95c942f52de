"""The admin API over HTTP on the Consul stand-in: catalog diff/apply/history with
preconditions, failover, API keys, status, model commands, and the token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.adapters.redis.limits import RedisLimitStore
from llmgw.admin import AdminListener
from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.core.catalog_diff import Effect, diff_from_dict
from llmgw.core.planning.status import StatusReport, to_json
from llmgw.core.records import KeyUsage, catalog_sha256
from llmgw.devcluster.consul import ConsulStandIn, OutageMode
from llmgw.gateway.keys import KeyRing, authenticate
from tests.support.redis_server import MISSING, REDIS_SERVER, RedisServer

if TYPE_CHECKING:
    from conftest import Client, RecordedModelCommands, StartAdmin, Stores, Texts


async def apply(client: Client, text: str, **headers: str) -> dict[str, object]:
    reply = await client.call(
        "PUT", "/admin/v1/catalog", {"catalog": text, "filename": "c.yaml"}, headers=headers
    )
    assert reply.status == 200, reply.body
    return reply.body


# --- catalog --------------------------------------------------------------------------------------


async def test_apply_then_read_back_with_etag_and_history(
    client: Client, stores: Stores, texts: Texts
) -> None:
    reply = await client.call("GET", "/admin/v1/catalog")
    assert reply.status == 404 and reply.body["error"]["code"] == "no_catalog"

    first = await apply(client, texts.good, **{"X-Llmgw-Actor": "ci"})
    assert first["applied"] is True and first["version"] == 1
    assert diff_from_dict(first["diff"]).names(Effect.START) == ("chat",)

    got = await client.call("GET", "/admin/v1/catalog")
    assert got.status == 200
    assert got.body["text"] == texts.good
    assert got.headers["ETag"] == f'"{catalog_sha256(texts.good)}"'
    assert got.body["applied_by"] == "ci via admin-token"

    # Durable in Consul KV, as the store reads it.
    stored = await stores.catalogs.current()
    assert stored is not None and stored.text == texts.good and stored.version == 1

    second = await apply(client, texts.next, **{"If-Match": got.headers["ETag"]})
    assert second["version"] == 2
    history = await client.call("GET", "/admin/v1/catalog/history")
    assert [(v["version"], v["applied_by"], v["sha256"]) for v in history.body["versions"]] == [
        (2, "unnamed via admin-token", catalog_sha256(texts.next)),
        (1, "ci via admin-token", catalog_sha256(texts.good)),
    ]
    assert all("text" not in v for v in history.body["versions"])
    one = await client.call("GET", "/admin/v1/catalog/history?limit=1")
    assert [v["version"] for v in one.body["versions"]] == [2]
    for bad in ("0", "x", "%C2%B2", "1001"):
        assert (await client.call("GET", f"/admin/v1/catalog/history?limit={bad}")).status == 400


async def test_the_same_text_twice_stores_nothing_new(client: Client, stores: Stores, texts: Texts) -> None:
    await apply(client, texts.good)
    again = await apply(client, texts.good)
    assert again["applied"] is False and again["version"] == 1
    assert diff_from_dict(again["diff"]).unchanged
    assert [v.version for v in await stores.catalogs.history()] == [1]


async def test_diff_says_what_apply_would_do_and_changes_nothing(
    client: Client, stores: Stores, texts: Texts
) -> None:
    await apply(client, texts.good)
    reply = await client.call("POST", "/admin/v1/catalog/diff", {"catalog": texts.next})
    assert reply.status == 200
    diff = diff_from_dict(reply.body["diff"])
    assert diff.names(Effect.ROLL) == ("chat",)
    assert diff.names(Effect.SCALE) == ("lazy",)
    assert diff.names(Effect.START) == ("fresh",)
    assert reply.body["base"]["version"] == 1
    assert reply.body["sha256"] == catalog_sha256(texts.next)
    current = await stores.catalogs.current()
    assert current is not None and current.version == 1


async def test_an_invalid_catalog_is_422_with_the_checks_diagnostics_and_nothing_changes(
    client: Client, stores: Stores, texts: Texts, shipped_policy: SecurityPolicy
) -> None:
    await apply(client, texts.good)
    expected = [
        d.as_dict() for d in load_catalog(texts.bad, filename="bad.yaml", policy=shipped_policy).diagnostics
    ]
    for method, path in (("POST", "/admin/v1/catalog/diff"), ("PUT", "/admin/v1/catalog")):
        reply = await client.call(method, path, {"catalog": texts.bad, "filename": "bad.yaml"})
        assert reply.status == 422
        assert reply.body["error"]["code"] == "invalid_catalog"
        assert reply.body["diagnostics"] == expected
    messages = " ".join(d["message"] for d in expected)
    assert "--trust-remote-code" in messages  # the security policy, at the admin API's door
    assert 'missing required key "max"' in messages
    current = await stores.catalogs.current()
    assert current is not None and current.text == texts.good


async def test_an_image_or_source_the_cluster_does_not_allow_is_422_at_diff_and_apply(
    client: Client, stores: Stores, texts: Texts
) -> None:
    # What the renderer would refuse for this cluster (its default allowlists here) is
    # refused where the catalog comes in, so CI's apply fails instead of reporting "start"
    # for a model that never places.
    await apply(client, texts.good)
    for profile, key, words in (
        ("{engine: vllm, source: org/m, image: 'attacker.example/miner:1'}", "image", "LLMGW_ALLOWED_IMAGES"),
        ("{engine: llamacpp, source: 'https://[fd00:ec2::254]/latest/meta-data/'}", "source", "metadata"),
        ("{engine: llamacpp, source: 'https://100.100.100.200/latest/meta-data/'}", "source", "metadata"),
        ("{engine: llamacpp, source: 'https://10.0.0.5/m.gguf'}", "source", "LLMGW_SOURCE_ALLOWED_NETWORKS"),
    ):
        text = f"models:\n  m:\n    profiles: [{profile}]\n    scaling: {{min: 1, max: 1}}\n"
        for method, path in (("POST", "/admin/v1/catalog/diff"), ("PUT", "/admin/v1/catalog")):
            reply = await client.call(method, path, {"catalog": text, "filename": "ci.yaml"})
            assert reply.status == 422, (profile, reply.body)
            assert reply.body["error"]["code"] == "invalid_catalog"
            # Notes (a profile's tool-call parser) come beside the one error.
            [diagnostic] = [d for d in reply.body["diagnostics"] if d["severity"] == "error"]
            assert (diagnostic["file"], diagnostic["line"], diagnostic["path"]) == (
                "ci.yaml",
                3,
                f"models.m.profiles[0].{key}",
            ), diagnostic
            assert words in diagnostic["message"]
    current = await stores.catalogs.current()
    assert current is not None and current.text == texts.good


async def test_a_stale_if_match_is_412_and_changes_nothing(
    client: Client, stores: Stores, texts: Texts
) -> None:
    await apply(client, texts.good)
    old_etag = f'"{catalog_sha256(texts.good)}"'
    await apply(client, texts.next, **{"If-Match": old_etag})
    reply = await client.call(
        "PUT", "/admin/v1/catalog", {"catalog": texts.good + "# again\n"}, headers={"If-Match": old_etag}
    )
    assert reply.status == 412
    assert reply.body["error"]["code"] == "stale_catalog"
    assert reply.headers["ETag"] == f'"{catalog_sha256(texts.next)}"'
    assert "version 2" in reply.body["error"]["message"]
    current = await stores.catalogs.current()
    assert current is not None and current.text == texts.next
    # If-None-Match: * means "only the first catalog".
    first_only = await client.call(
        "PUT", "/admin/v1/catalog", {"catalog": texts.good}, headers={"If-None-Match": "*"}
    )
    assert first_only.status == 412


async def test_concurrent_applies_on_the_same_etag_exactly_one_wins(
    client: Client, stores: Stores, texts: Texts
) -> None:
    await apply(client, texts.good)
    etag = f'"{catalog_sha256(texts.good)}"'
    variants = [texts.good.replace("the chat model", f"variant {i}") for i in range(6)]
    replies = await asyncio.gather(
        *(
            client.call("PUT", "/admin/v1/catalog", {"catalog": v}, headers={"If-Match": etag})
            for v in variants
        )
    )
    statuses = sorted(r.status for r in replies)
    assert statuses == [200, 412, 412, 412, 412, 412]
    winner = next(v for v, r in zip(variants, replies, strict=True) if r.status == 200)
    current = await stores.catalogs.current()
    assert current is not None and current.version == 2 and current.text == winner
    assert [v.version for v in await stores.catalogs.history()] == [2, 1]


async def test_concurrent_applies_without_if_match_all_land_one_after_another(
    client: Client, stores: Stores, texts: Texts
) -> None:
    await apply(client, texts.good)
    variants = [texts.good.replace("the chat model", f"variant {i}") for i in range(3)]
    replies = await asyncio.gather(
        *(client.call("PUT", "/admin/v1/catalog", {"catalog": v}) for v in variants)
    )
    assert [r.status for r in replies] == [200, 200, 200]
    assert sorted(r.body["version"] for r in replies) == [2, 3, 4]
    history = await stores.catalogs.history()
    assert [v.version for v in history] == [4, 3, 2, 1]


async def test_a_second_admin_instance_continues_from_the_stored_catalog(
    client: Client,
    admin: AdminListener,
    start: StartAdmin,
    other_stores: Stores,
    client_for: Callable[[AdminListener], Client],
    texts: Texts,
) -> None:
    """Failover: another control plane (its own Consul client, its own listener) reads
    back what the first applied, and its applies build on it."""
    await apply(client, texts.good, **{"X-Llmgw-Actor": "ci"})
    await admin.stop()  # the first control plane is gone
    second = client_for(await start(other_stores))
    got = await second.call("GET", "/admin/v1/catalog")
    assert got.status == 200 and got.body["text"] == texts.good and got.body["version"] == 1
    diff = await second.call("POST", "/admin/v1/catalog/diff", {"catalog": texts.next})
    assert diff.body["base"]["version"] == 1
    assert diff_from_dict(diff.body["diff"]).names(Effect.ROLL) == ("chat",)
    applied = await apply(second, texts.next, **{"If-Match": got.headers["ETag"]})
    assert applied["version"] == 2


async def test_consul_unreachable_is_503_and_nothing_is_half_done(
    client: Client, stores: Stores, standin: ConsulStandIn, texts: Texts
) -> None:
    await apply(client, texts.good)
    await standin.start_outage(OutageMode.REFUSE)
    try:
        for method, path, body in (
            ("PUT", "/admin/v1/catalog", {"catalog": texts.next}),
            ("GET", "/admin/v1/catalog", None),
            ("POST", "/admin/v1/keys", {"name": "x"}),
        ):
            reply = await client.call(method, path, body)
            assert reply.status == 503, (path, reply.body)
            assert reply.body["error"]["code"] == "consul_unavailable"
            assert "Retry-After" in reply.headers
    finally:
        await standin.end_outage()
    current = await stores.catalogs.current()
    assert current is not None and current.version == 1


# --- keys -----------------------------------------------------------------------------------------


async def test_keys_create_list_revoke_and_the_secret_works_at_the_router(
    client: Client, stores: Stores
) -> None:
    created = await client.call(
        "POST", "/admin/v1/keys", {"name": "team-a", "models": ["chat"], "requests_per_minute": 60}
    )
    assert created.status == 201
    secret = created.body["secret"]
    key = created.body["key"]
    assert key["name"] == "team-a" and key["models"] == ["chat"] and key["revoked"] is False
    assert created.headers["Cache-Control"] == "no-store"

    # The router's own check accepts the secret (shown once: it is nowhere else).
    records = await stores.keys.list()
    assert authenticate(f"Bearer {secret}", KeyRing(records)).key_id == key["id"]

    listed = await client.call("GET", "/admin/v1/keys")
    assert [k["id"] for k in listed.body["keys"]] == [key["id"]]
    shown = json.dumps(listed.body)
    assert secret not in shown and records[key["id"]].secret_sha256 not in shown

    revoked = await client.call("DELETE", f"/admin/v1/keys/{key['id']}")
    assert revoked.status == 200 and revoked.body["key"]["revoked"] is True
    assert (await stores.keys.list())[key["id"]].revoked
    missing = await client.call("DELETE", "/admin/v1/keys/k-0000000000000000")
    assert missing.status == 404 and missing.body["error"]["code"] == "no_key"


async def test_key_requests_are_checked(client: Client, stores: Stores) -> None:
    for body in (
        {},
        {"name": ""},
        {"name": "x", "models": []},
        {"name": "x", "requests_per_minute": 0},
        {"name": "x", "tokens_per_minute": True},
        {"name": "x", "colour": "blue"},
    ):
        reply = await client.call("POST", "/admin/v1/keys", body)
        assert reply.status == 400, body
    assert await stores.keys.list() == {}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"name": "\\ud800"}',  # a lone surrogate: valid JSON syntax, no text (was a 500)
        b'{"name": "x", "models": ["\\udfff"]}',
        b'{"name": "x", "models": ' + b"[" * 100 + b"]" * 100 + b"}",  # past the door's depth
        b'{"name": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # past the parser's own limit
    ],
)
async def test_a_key_request_that_is_no_text_or_too_deep_is_a_400(
    client: Client, stores: Stores, raw: bytes
) -> None:
    reply = await client.call("POST", "/admin/v1/keys", raw=raw)
    assert reply.status == 400 and reply.body["error"]["code"] == "invalid_json", reply.body
    assert await stores.keys.list() == {}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"\\ud800": "x", "name": "x"}',  # a lone surrogate as a key (third pass)
        b'{"name": "x\\udc00y"}',  # a lone low surrogate inside a name
        b'{"name": "x", "models": [{"\\ud83d": 1}]}',
    ],
)
async def test_a_lone_surrogate_anywhere_in_a_key_request_is_a_4xx(
    client: Client, stores: Stores, raw: bytes
) -> None:
    reply = await client.call("POST", "/admin/v1/keys", raw=raw)
    assert 400 <= reply.status < 500, reply.body
    assert await stores.keys.list() == {}


async def test_a_compressed_admin_body_is_refused_before_it_is_inflated(
    client: Client, stores: Stores
) -> None:
    import gzip

    reply = await client.call(
        "POST", "/admin/v1/keys", raw=gzip.compress(b'{"name": "x"}'), headers={"Content-Encoding": "gzip"}
    )
    assert reply.status == 415 and reply.body["error"]["code"] == "unsupported_content_encoding"
    assert await stores.keys.list() == {}


# --- status and models ---------------------------------------------------------------------------


async def test_status_is_the_leaders_published_document(client: Client, stores: Stores) -> None:
    reply = await client.call("GET", "/admin/v1/status")
    assert reply.status == 503 and reply.body["error"]["code"] == "no_status"
    report = StatusReport(generated_at=1_700_000_000.0, catalog_hash="ab" * 32, leader="cp-1", models=())
    await stores.status.publish(to_json(report))
    reply = await client.call("GET", "/admin/v1/status")
    assert reply.status == 200
    assert reply.body == json.loads(to_json(report))


async def test_drain_and_restart_reach_the_control_plane_with_the_actor(
    client: Client, models: RecordedModelCommands
) -> None:
    drained = await client.call("POST", "/admin/v1/models/chat/drain", headers={"X-Llmgw-Actor": "alice"})
    assert drained.status == 202
    assert drained.body["replicas"] == ["llmgw-chat-r1"]
    restarted = await client.call("POST", "/admin/v1/models/org%2Fmodel/restart", raw=b"")
    assert restarted.status == 202 and restarted.body["model"] == "org/model"
    unknown = await client.call("POST", "/admin/v1/models/nope/drain")
    assert unknown.status == 404 and unknown.body["error"]["code"] == "no_model"
    assert models.calls == [
        ("drain", "chat", "alice via admin-token"),
        ("restart", "org/model", "unnamed via admin-token"),
    ]


async def test_without_a_control_plane_model_commands_are_501(
    start: StartAdmin, stores: Stores, client_for: Callable[[AdminListener], Client]
) -> None:
    listener = await start(stores, None)
    reply = await client_for(listener).call("POST", "/admin/v1/models/chat/drain")
    assert reply.status == 501 and reply.body["error"]["code"] == "no_control_plane"


# --- the token ------------------------------------------------------------------------------------


async def test_no_token_or_a_wrong_one_is_401_and_changes_nothing(
    client: Client, stores: Stores, texts: Texts
) -> None:
    for token in (None, "wrong-token-wrong-token-wrong-token-00"):
        client.token = token
        reply = await client.call("PUT", "/admin/v1/catalog", {"catalog": texts.good})
        assert reply.status == 401
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await client.call("GET", "/admin/v1/keys")).status == 401
    assert await stores.catalogs.current() is None


async def test_errors_are_json_everywhere(client: Client) -> None:
    for method, path, expected in (
        ("GET", "/admin/v1/nothing", 404),
        ("POST", "/admin/v1/status", 405),
        ("GET", "/", 404),
    ):
        reply = await client.call(method, path)
        assert reply.status == expected
        assert set(reply.body["error"]) == {"message", "type", "code"}
    bad_json = await client.call("PUT", "/admin/v1/catalog", raw=b"{not json")
    assert bad_json.status == 400 and bad_json.body["error"]["code"] == "invalid_json"
    big = await client.call(
        "PUT", "/admin/v1/catalog", raw=b'{"catalog": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    )
    assert big.status == 413


# --- a key's usage --------------------------------------------------------------------------------


async def test_a_keys_usage_is_what_the_routers_counted_in_redis(
    start: StartAdmin, stores: Stores, client_for: Callable[[AdminListener], Client], tmp_path: Path
) -> None:
    if REDIS_SERVER is None:
        pytest.skip(MISSING)
    redis = RedisServer(tmp_path / "redis")
    await redis.start()
    store = RedisLimitStore(redis.url)
    try:
        issued = await stores.keys.create("team-a")
        key_id = issued.record.key_id
        await store.count_usage(key_id, "chat", {"requests": 2, "input_tokens": 30, "output_tokens": 7})
        await store.count_usage(key_id, "chat", {"requests": 1, "input_tokens": 10, "cached_tokens": 8})
        client = client_for(await start(stores, usage=store))
        reply = await client.call("GET", f"/admin/v1/keys/{key_id}/usage")
        assert reply.status == 200 and reply.body["key"]["id"] == key_id
        assert reply.body["usage"] == [
            {"model": "chat", "requests": 3, "input_tokens": 40, "output_tokens": 7, "cached_tokens": 8}
        ]
        missing = await client.call("GET", "/admin/v1/keys/k-0000000000000000/usage")
        assert missing.status == 404 and missing.body["error"]["code"] == "no_key"
        await redis.stop()
        down = await client.call("GET", f"/admin/v1/keys/{key_id}/usage")
        assert down.status == 503 and down.body["error"]["code"] == "usage_unavailable"
    finally:
        await store.close()
        await redis.stop()


async def test_without_shared_limits_a_keys_usage_is_501_saying_what_to_set(
    client: Client, stores: Stores
) -> None:
    issued = await stores.keys.create("team-a")
    reply = await client.call("GET", f"/admin/v1/keys/{issued.record.key_id}/usage")
    assert reply.status == 501 and reply.body["error"]["code"] == "usage_not_counted"
    assert "LLMGW_ROUTER_LIMITS_REDIS_URL" in reply.body["error"]["message"]


# --- a key's token budget -------------------------------------------------------------------------


class _RecordedUsage:
    """A usage source that says what a router would have counted (no Redis needed)."""

    def __init__(self, used: int = 0) -> None:
        self.used = used
        self.asked: list[tuple[str, int]] = []

    async def usage(self, key_id: str) -> list[KeyUsage]:
        return [KeyUsage("chat", 4, 300, 120, 0)]

    async def budget_used(self, key_id: str, window_start: int) -> int:
        self.asked.append((key_id, window_start))
        return self.used


async def test_a_key_is_issued_with_a_token_budget_and_its_usage_says_what_is_left(
    start: StartAdmin, stores: Stores, client_for: Callable[[AdminListener], Client]
) -> None:
    usage = _RecordedUsage(used=1_250_000)
    client = client_for(await start(stores, usage=usage))
    made = await client.call("POST", "/admin/v1/keys", {"name": "team-a", "token_budget": 5_000_000})
    assert made.status == 201, made.body
    key = made.body["key"]
    assert (key["token_budget"], key["budget_period"]) == (5_000_000, "monthly")  # monthly unless said
    stored = (await stores.keys.list())[key["id"]]
    assert (stored.token_budget, stored.budget_period) == (5_000_000, "monthly")
    thirty = await client.call(
        "POST", "/admin/v1/keys", {"name": "team-b", "token_budget": 1000, "budget_period": "720h"}
    )
    assert thirty.body["key"]["budget_period"] == "30d"  # one spelling

    reply = await client.call("GET", f"/admin/v1/keys/{key['id']}/usage")
    assert reply.status == 200
    budget = reply.body["budget"]
    created = datetime.fromtimestamp(stored.created_at, UTC)
    month = datetime(created.year, created.month, 1, tzinfo=UTC)
    assert budget["period_start"] == int(month.timestamp())
    assert budget["resets_at"] > stored.created_at
    assert {k: budget[k] for k in ("tokens", "period", "used", "left")} == {
        "tokens": 5_000_000,
        "period": "monthly",
        "used": 1_250_000,
        "left": 3_750_000,
    }
    assert usage.asked == [(key["id"], budget["period_start"])]
    plain = await client.call("POST", "/admin/v1/keys", {"name": "team-c"})
    no_budget = await client.call("GET", f"/admin/v1/keys/{plain.body['key']['id']}/usage")
    assert no_budget.body["budget"] is None and plain.body["key"]["token_budget"] is None


@pytest.mark.parametrize(
    "fields",
    [
        {"token_budget": 0},
        {"token_budget": -5_000_000},
        {"token_budget": 2**53},
        {"token_budget": 10**30},
        {"token_budget": 1e6},
        {"token_budget": "5000000"},
        {"token_budget": True},
        {"token_budget": [1000]},
        {"budget_period": "monthly"},  # a period without a budget
        {"token_budget": 1000, "budget_period": "30x"},
        {"token_budget": 1000, "budget_period": "0d"},
        {"token_budget": 1000, "budget_period": "-30d"},
        {"token_budget": 1000, "budget_period": "30m"},  # a rate limit, not a budget
        {"token_budget": 1000, "budget_period": "9999d"},
        {"token_budget": 1000, "budget_period": "monthly\n"},
        {"token_budget": 1000, "budget_period": ""},
        {"token_budget": 1000, "budget_period": 30},
        {"token_budget": 1000, "budget_period": {"days": 30}},
        {"token_budget": 1000, "budget_period": "x" * 100_000},
        {"budget": {"tokens": 1000, "period": "30d"}},  # not a field of a key
    ],
)
async def test_a_budget_past_what_is_valid_is_refused_and_no_key_is_issued(
    start: StartAdmin,
    stores: Stores,
    client_for: Callable[[AdminListener], Client],
    fields: dict[str, object],
) -> None:
    client = client_for(await start(stores, usage=_RecordedUsage()))
    reply = await client.call("POST", "/admin/v1/keys", {"name": "team-a", **fields})
    assert reply.status == 400, reply.body
    assert reply.body["error"]["code"] in {"invalid_field", "unknown_field"}
    assert await stores.keys.list() == {}


async def test_without_shared_limits_a_budget_is_refused_saying_what_to_set(
    client: Client, stores: Stores
) -> None:
    reply = await client.call("POST", "/admin/v1/keys", {"name": "team-a", "token_budget": 1000})
    assert reply.status == 400 and reply.body["error"]["code"] == "budget_not_enforced"
    assert "LLMGW_ROUTER_LIMITS_REDIS_URL" in reply.body["error"]["message"]
    assert await stores.keys.list() == {}


async def test_a_keys_budget_is_raised_removed_and_refused_past_what_is_valid(
    start: StartAdmin, stores: Stores, client_for: Callable[[AdminListener], Client]
) -> None:
    client = client_for(await start(stores, usage=_RecordedUsage()))
    key_id = (await stores.keys.create("team-a", token_budget=1000)).record.key_id
    raised = await client.call("PUT", f"/admin/v1/keys/{key_id}/budget", {"token_budget": 5000})
    assert raised.status == 200, raised.body
    assert (raised.body["key"]["token_budget"], raised.body["key"]["budget_period"]) == (5000, "monthly")
    weekly = await client.call(
        "PUT", f"/admin/v1/keys/{key_id}/budget", {"token_budget": 5000, "budget_period": "weekly"}
    )
    assert weekly.body["key"]["budget_period"] == "weekly"
    assert (await stores.keys.list())[key_id].budget_period == "weekly"
    again = await client.call("PUT", f"/admin/v1/keys/{key_id}/budget", {"token_budget": 6000})
    assert (again.body["key"]["token_budget"], again.body["key"]["budget_period"]) == (6000, "weekly")
    for bad in (
        {"token_budget": -1},
        {"token_budget": 2**53},
        {"token_budget": 10, "budget_period": "fortnightly"},
        {"budget_period": "daily"},
        {},
        {"token_budget": 10, "name": "renamed"},
    ):
        refused = await client.call("PUT", f"/admin/v1/keys/{key_id}/budget", bad)
        assert refused.status == 400, (bad, refused.body)
    assert (await stores.keys.list())[key_id].token_budget == 6000  # unchanged by any of them
    removed = await client.call("PUT", f"/admin/v1/keys/{key_id}/budget", {"token_budget": None})
    assert removed.body["key"]["token_budget"] is None and removed.body["key"]["budget_period"] is None
    assert (await stores.keys.list())[key_id].budget is None
    missing = await client.call("PUT", "/admin/v1/keys/k-0000000000000000/budget", {"token_budget": 1})
    assert missing.status == 404 and missing.body["error"]["code"] == "no_key"
