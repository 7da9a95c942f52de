"""API keys' token budgets across several routers, on a real redis-server: held within
the stated bound whatever router a request reaches, refused as OpenAI refuses a spent
quota, reset at the period's boundary, and kept (with the keys' usage) across a
router's restart and Redis's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.adapters.redis.limits import RedisLimitStore
from llmgw.core.budgets import budget_window
from llmgw.core.records import ApiKeyRecord
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT
from llmgw.gateway.errors import ApiError
from llmgw.gateway.keys import new_api_key
from llmgw.gateway.shared_limits import SharedLimits, StoreDown
from tests.support.redis_server import MISSING, REDIS_SERVER, RedisServer
from tests.support.waiting import eventually

from .conftest import Cluster, StartRouter, admits

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)

MESSAGES: Any = [{"role": "user", "content": "hello there"}]
# 2023-11-14T22:13:20Z, the component tests' wall clock.
NOW = 1_700_000_000.0


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=True)
    await server.start()
    yield server
    await server.stop()


async def _routers(start_router: StartRouter, redis: RedisServer, n: int = 3) -> list[RouterServer]:
    return [
        # A Redis that answers, however loaded the machine: these tests hold the shared
        # path to the budget (the outage's own tests give it a short timeout).
        await start_router(
            with_keys=True, router_id=f"router-{i}", limits_redis_url=redis.url, limits_redis_timeout=5.0
        )
        for i in range(n)
    ]


async def _post(
    http: aiohttp.ClientSession, router: RouterServer, key: str, **body: Any
) -> aiohttp.ClientResponse:
    async with http.post(
        router.url + "/v1/chat/completions",
        json={"model": "sim-chat", "messages": MESSAGES, **body},
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        await response.read()
        return response


async def _budget_used(redis: RedisServer, record: ApiKeyRecord) -> int:
    """The key's budget period's counter at the tests' wall clock, as the admin API reads it."""
    window = budget_window(record.budget or pytest.fail("no budget"), record.created_at, NOW)
    store = RedisLimitStore(redis.url)
    try:
        return await store.budget_used(record.key_id, window.start)
    finally:
        await store.close()


def _shared(router: RouterServer) -> SharedLimits:
    shared = router.app[CONTEXT].shared_limits
    assert shared is not None
    return shared


async def _drained(routers: list[RouterServer]) -> None:
    for router in routers:
        await _shared(router).drain()


async def test_three_routers_at_once_hold_a_keys_budget_and_the_usage_is_the_engines(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    engine = await cluster.add_sim("sim-chat")
    key, record = cluster.issue_key(token_budget=3000)
    routers = await _routers(start_router, redis_server)
    # Sixty requests at once, twenty on each router: each holds its estimate (prompt
    # bytes / 4 + max_tokens) from the one balance, so the holds in flight never pass it.
    answers = await asyncio.gather(*(_post(http, routers[i % 3], key, max_tokens=60) for i in range(60)))
    statuses = [a.status for a in answers]
    assert set(statuses) == {200, 429}
    stats = await engine.stats(http)
    served = stats["prompt_tokens"] + stats["generation_tokens"]
    # The bound: the budget, plus what answers used beyond their holds (none here: every
    # answer is bounded by max_tokens and its prompt estimate errs high).
    assert 1500 < served <= 3000
    assert stats["requests_total"] == statuses.count(200)  # a refused request reached no engine
    await _drained(routers)
    (usage,) = await _shared(routers[2]).usage(record.key_id)
    assert (usage.requests, usage.input_tokens, usage.output_tokens) == (
        statuses.count(200),
        stats["prompt_tokens"],
        stats["generation_tokens"],
    )
    used = await _budget_used(redis_server, record)
    assert used == served  # the holds all settled to what the engine counted


async def test_a_spent_budget_is_openais_insufficient_quota_and_no_engine_generates(
    cluster: Cluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    engine = await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(token_budget=400, budget_period="monthly")
    (router,) = await _routers(start_router, redis_server, 1)
    for _ in range(40):
        if (await _post(http, router, key, max_tokens=50)).status == 429:
            break
    before = await engine.stats(http)
    refused = await _post(http, router, key, max_tokens=50)
    assert refused.status == 429
    body = await refused.json()
    assert body["error"]["type"] == body["error"]["code"] == "insufficient_quota"
    assert body["error"]["message"].startswith("You exceeded your current quota")
    assert "resets at 2023-12-01T00:00:00Z" in body["error"]["message"]
    assert refused.headers["x-should-retry"] == "false"  # the openai clients do not retry it
    month_end = datetime(2023, 12, 1, tzinfo=UTC).timestamp()
    assert int(refused.headers["Retry-After"]) == int(month_end - NOW)

    # The official client, retrying as it does by default, sends it once and raises.
    async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=key, max_retries=3) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=50)
    assert caught.value.code == "insufficient_quota"
    after = await engine.stats(http)
    assert after["requests_total"] == before["requests_total"]
    assert after["running"] == after["waiting"] == 0  # nothing generating for the refused


async def test_the_budget_resets_at_the_periods_boundary(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(token_budget=300, budget_period="daily")
    routers = await _routers(start_router, redis_server, 2)
    statuses = [(await _post(http, routers[i % 2], key, max_tokens=40)).status for i in range(12)]
    assert statuses[0] == 200 and statuses[-1] == 429
    cluster.clock.now = datetime(2023, 11, 14, 23, 59, 59, tzinfo=UTC).timestamp()
    assert (await _post(http, routers[0], key, max_tokens=40)).status == 429  # still the same day
    cluster.clock.now = datetime(2023, 11, 15, tzinfo=UTC).timestamp()  # midnight UTC
    assert [(await _post(http, r, key, max_tokens=40)).status for r in routers] == [200, 200]


async def test_a_raised_budget_admits_the_key_again_this_period(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    await cluster.add_sim("sim-chat")
    key, record = cluster.issue_key(token_budget=200, budget_period="weekly")
    routers = await _routers(start_router, redis_server, 2)
    statuses = [(await _post(http, routers[i % 2], key, max_tokens=40)).status for i in range(10)]
    assert statuses[-1] == 429
    raised = replace(record, token_budget=100_000)  # as PUT /admin/v1/keys/ID/budget writes it
    cluster.keys.publish({**(cluster.keys.latest or {}), record.key_id: raised})
    for router in routers:
        await cluster.seen_by(router)
    assert [(await _post(http, r, key, max_tokens=40)).status for r in routers] == [200, 200]


async def test_usage_and_a_spent_budget_survive_a_router_restart_and_a_redis_restart(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    engine = await cluster.add_sim("sim-chat")
    key, record = cluster.issue_key(token_budget=500, budget_period="30d")
    (first,) = await _routers(start_router, redis_server, 1)
    statuses = [(await _post(http, first, key, max_tokens=40)).status for _ in range(20)]
    assert 429 in statuses
    await _shared(first).drain()
    counted = await _shared(first).usage(record.key_id)
    assert counted[0].requests == statuses.count(200)
    await first.stop()  # its usage was in Redis all along

    (second,) = await _routers(start_router, redis_server, 1)
    assert await _shared(second).usage(record.key_id) == counted
    assert (await _post(http, second, key, max_tokens=40)).status == 429  # still spent

    await redis_server.restart()  # the AOF (appendfsync always) is read back
    shared = _shared(second)

    async def answering() -> bool:
        try:
            return await shared.usage(record.key_id) == counted
        except Exception:
            return False

    await eventually(answering, what="Redis answering again with the usage it had")
    await eventually(lambda: _beat(shared), what="the router seeing Redis again")
    refused = await _post(http, second, key, max_tokens=40)
    assert refused.status == 429 and (await refused.json())["error"]["code"] == "insufficient_quota"
    stats = await engine.stats(http)
    assert stats["requests_total"] == statuses.count(200)


async def _beat(shared: SharedLimits) -> bool:
    await shared._beat_and_sweep()
    return shared.up


async def test_a_router_without_shared_limits_refuses_a_budgeted_key_rather_than_count_alone(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(token_budget=1_000_000)
    router = await start_router(with_keys=True)
    refused = await _post(http, router, key, max_tokens=5)
    assert refused.status == 503 and (await refused.json())["error"]["code"] == "limits_unavailable"
    # Its configuration, which no retry changes: the openai clients are told not to retry.
    assert refused.headers.get("x-should-retry") == "false", dict(refused.headers)
    assert "Retry-After" not in refused.headers
    assert (await engine.stats(http))["requests_total"] == 0


def _limits(redis: RedisServer, router_id: str, clock: list[float], **options: Any) -> SharedLimits:
    return SharedLimits(
        RedisLimitStore(redis.url, timeout=0.2), router_id, wall_clock=lambda: clock[0], **options
    )


async def test_while_redis_does_not_answer_each_router_spends_its_share_of_what_was_left(
    redis_server: RedisServer,
) -> None:
    clock = [NOW]
    routers = [
        _limits(redis_server, f"router-{i}", clock, store_down=StoreDown.LOCAL_SHARE) for i in range(3)
    ]
    for router in routers:
        await router.start()
    try:
        await routers[0]._beat_and_sweep()
        assert routers[0].routers_alive == 3
        record = new_api_key("team", now=NOW, token_budget=3100).record
        hold = await routers[0].admit(record, 100)  # Redis says 3000 are left
        hold.settle(100)
        await routers[0].drain()
        unseen = new_api_key("other", now=NOW, token_budget=3000).record
        redis_server.pause()
        admitted = 0
        for _ in range(20):
            try:
                await routers[0].admit(record, 100)
                admitted += 1
            except ApiError as exc:
                assert exc.refusal.code == "insufficient_quota"
        assert admitted == 10  # a third of the 3000 left
        # A key whose budget this router never saw: nothing says what it has left.
        with pytest.raises(ApiError) as caught:
            await routers[0].admit(unseen, 100)
        assert caught.value.refusal.code == "limits_unavailable"
        # A new period begun during the outage: a third of the whole budget.
        clock[0] = NOW + 31 * 86400
        fresh = 0
        for _ in range(20):
            try:
                await routers[0].admit(record, 100)
                fresh += 1
            except ApiError:
                pass
        assert fresh == 3100 // 3 // 100
    finally:
        redis_server.resume()
        for router in routers:
            await router.close()


async def test_a_killed_routers_budget_holds_return_within_seconds(redis_server: RedisServer) -> None:
    clock = [NOW]
    doomed = _limits(redis_server, "doomed", clock, heartbeat_ttl=1.0)
    survivor = _limits(redis_server, "survivor", clock, heartbeat_ttl=1.0)
    await doomed.start()
    await survivor.start()
    try:
        record = new_api_key("team", now=NOW, token_budget=1000).record
        await doomed.admit(record, 800)  # in flight when its router dies
        with pytest.raises(ApiError):
            await survivor.admit(record, 500)
        assert doomed._keep_alive_task is not None
        doomed._keep_alive_task.cancel()

        await eventually(
            lambda: admits(survivor, record, 500),
            within=15.0,
            what="the dead router's 800 budget tokens returned",
        )
    finally:
        await survivor.close()
        await doomed.close()


async def test_a_router_says_when_its_redis_keeps_nothing_on_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volatile = RedisServer(tmp_path / "volatile")
    await volatile.start()
    try:
        limits = _limits(volatile, "r", [NOW])
        with caplog.at_level("WARNING", logger="llmgw.gateway.shared_limits"):
            await limits.start()
        await limits.close()
        said = [r.getMessage() for r in caplog.records if "keeps nothing on disk" in r.getMessage()]
        assert len(said) == 1 and "appendonly yes" in said[0]
    finally:
        await volatile.stop()


async def test_usage_answered_while_redis_is_down_is_added_once_it_answers(redis_server: RedisServer) -> None:
    limits = _limits(redis_server, "router-0", [NOW], store_down=StoreDown.LOCAL_SHARE)
    await limits.start()
    try:
        record = new_api_key("team", now=NOW, token_budget=10_000).record
        hold = await limits.admit(record, 100)
        hold.settle(100)
        limits.count_usage(record, "sim-chat", {"prompt_tokens": 60, "completion_tokens": 40})
        await limits.drain()
        redis_server.pause()
        for _ in range(3):  # the first finds Redis down; the others do not wait for it
            local = await limits.admit(record, 100)
            local.settle(30)
            limits.count_usage(
                record,
                "sim-chat",
                {"prompt_tokens": 20, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 8}},
            )
        assert not limits.up
        redis_server.resume()
        await eventually(lambda: _beat(limits), what="Redis answering again")
        await limits.drain()
        (usage,) = await limits.usage(record.key_id)
        assert (usage.requests, usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (
            4,
            120,
            70,
            24,
        )
        used = await _budget_used(redis_server, record)
        assert used == 100 + 3 * 30  # the outage's answers charged to the period, once
    finally:
        redis_server.resume()
        await limits.close()


async def test_an_answer_whose_usage_never_came_pays_its_hold_from_the_budget(
    redis_server: RedisServer,
) -> None:
    limits = _limits(redis_server, "router-0", [NOW])
    await limits.start()
    try:
        record = new_api_key("team", now=NOW, token_budget=10_000).record  # a budget, no token limit
        left = await limits.admit(record, 300)
        left.keep()  # a client that hung up mid-stream: an engine generated, no usage came
        nothing = await limits.admit(record, 200)
        nothing.release()  # no engine answered
        answered = await limits.admit(record, 200)
        answered.settle(120)
        await limits.drain()
        assert await _budget_used(redis_server, record) == 300 + 120
    finally:
        await limits.close()
