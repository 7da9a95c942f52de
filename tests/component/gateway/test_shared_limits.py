"""API keys' limits across several routers, on a real redis-server (--limits-redis-url).

Without a shared store each router limits on its own: three routers admit three times
a key's limit (the first test shows it). With it, every router takes from one balance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.adapters.redis.limits import RedisLimitStore
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


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    await server.start()
    yield server
    await server.stop()


async def _routers(start_router: StartRouter, redis: RedisServer | None, n: int = 3) -> list[RouterServer]:
    # With Redis: one that answers however loaded the machine (its outage is tested on
    # SharedLimits itself, with a short timeout).
    shared: dict[str, Any] = {"limits_redis_url": redis.url, "limits_redis_timeout": 5.0} if redis else {}
    return [await start_router(with_keys=True, router_id=f"router-{i}", **shared) for i in range(n)]


async def _send_round_robin(
    http: aiohttp.ClientSession, routers: list[RouterServer], key: str, count: int, **body: Any
) -> list[int]:
    statuses = []
    for i in range(count):
        async with http.post(
            routers[i % len(routers)].url + "/v1/chat/completions",
            json={"model": "sim-chat", "messages": MESSAGES, **body},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            await response.read()
            statuses.append(response.status)
    return statuses


def _bound(limit: int, elapsed: float) -> float:
    """The issue's bound: the limit plus 10%, plus what the bucket refilled meanwhile."""
    return limit * 1.1 + elapsed * limit / 60.0


async def test_each_router_alone_admits_the_whole_limit_so_three_admit_three_times_it(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(requests_per_minute=10)
    statuses = await _send_round_robin(http, await _routers(start_router, None), key, 36, max_tokens=1)
    assert statuses.count(200) == 30  # why --limits-redis-url exists


async def test_three_routers_sharing_redis_admit_a_keys_requests_per_minute_once(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    await cluster.add_sim("sim-chat")
    key, _ = cluster.issue_key(requests_per_minute=10)
    routers = await _routers(start_router, redis_server)
    started = asyncio.get_running_loop().time()
    statuses = await _send_round_robin(http, routers, key, 36, max_tokens=1)
    elapsed = asyncio.get_running_loop().time() - started
    assert 10 <= statuses.count(200) <= _bound(10, elapsed)
    assert set(statuses) == {200, 429}
    # Every router refused some: the balance is one, whichever router a request reached.
    assert all(429 in statuses[i::3] for i in range(3))


async def test_three_routers_keep_a_keys_tokens_within_its_limit_and_usage_matches_the_engine(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    engine = await cluster.add_sim("sim-chat")
    key, record = cluster.issue_key(tokens_per_minute=2000)
    routers = await _routers(start_router, redis_server)
    started = asyncio.get_running_loop().time()
    statuses = await _send_round_robin(http, routers, key, 40, max_tokens=100)
    elapsed = asyncio.get_running_loop().time() - started
    assert 429 in statuses
    stats = await engine.stats(http)
    served = stats["prompt_tokens"] + stats["generation_tokens"]
    assert 0 < served <= _bound(2000, elapsed)

    # The usage every router counted, read from any of them: what the engine counted.
    shared = routers[1].app[CONTEXT].shared_limits
    assert shared is not None
    for router in routers:
        limits = router.app[CONTEXT].shared_limits
        assert limits is not None
        await limits.drain()
    (usage,) = await shared.usage(record.key_id)
    assert usage.model == "sim-chat"
    assert usage.requests == statuses.count(200)
    assert usage.input_tokens == stats["prompt_tokens"]
    assert usage.output_tokens == stats["generation_tokens"]


def _limits(redis: RedisServer, router_id: str, **options: Any) -> SharedLimits:
    return SharedLimits(RedisLimitStore(redis.url, timeout=0.2), router_id, **options)


def _key(**limits: Any) -> ApiKeyRecord:
    return new_api_key("team", now=0.0, **limits).record


async def test_a_killed_routers_held_tokens_return_within_seconds(redis_server: RedisServer) -> None:
    doomed = _limits(redis_server, "doomed", heartbeat_ttl=1.0)
    survivor = _limits(redis_server, "survivor", heartbeat_ttl=1.0)
    await doomed.start()
    await survivor.start()
    try:
        record = _key(tokens_per_minute=1000)
        await doomed.admit(record, 800)  # an answer in flight when its router dies
        with pytest.raises(ApiError) as caught:
            await survivor.admit(record, 500)
        assert caught.value.refusal.code == "rate_limit_exceeded"
        # Killed: no settle, no leave; only its heartbeat's expiry tells the others.
        assert doomed._keep_alive_task is not None
        doomed._keep_alive_task.cancel()
        started = asyncio.get_running_loop().time()

        await eventually(
            lambda: admits(survivor, record, 500), within=15.0, what="the dead router's 800 tokens returned"
        )
        waited = asyncio.get_running_loop().time() - started
        assert survivor.reaped_holds == 1
        assert waited < 1.0 + 2 * 0.2 + 2.0  # its TTL, a sweep's interval and slack: seconds, not a minute
    finally:
        await survivor.close()
        await doomed.close()


async def test_while_redis_does_not_answer_each_router_admits_its_share(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    routers = [_limits(redis_server, f"router-{i}", store_down=StoreDown.LOCAL_SHARE) for i in range(3)]
    errors: list[int] = []
    routers[0] = _limits(
        redis_server, "router-0", store_down=StoreDown.LOCAL_SHARE, on_store_error=lambda: errors.append(1)
    )
    for router in routers:
        await router.start()
    try:
        await routers[0]._beat_and_sweep()
        assert routers[0].routers_alive == 3
        record = _key(requests_per_minute=30)
        redis_server.pause()  # accepts, never answers: as a partitioned Redis looks
        with caplog.at_level(logging.ERROR, logger="llmgw.gateway.shared_limits"):
            admitted = 0
            for _ in range(15):
                try:
                    await routers[0].admit(record)
                    admitted += 1
                except ApiError as exc:
                    assert exc.refusal.code == "rate_limit_exceeded"
        assert admitted == 10  # a third of 30: this router's share
        # One timeout told it; the other requests did not wait for Redis again.
        assert not routers[0].up and len(errors) < 5
        said = [r.getMessage() for r in caplog.records if "router-0: Redis" in r.getMessage()]
        assert len(said) == 1 and "this router's share" in said[0]  # logged once, not per request
    finally:
        redis_server.resume()
        for router in routers:
            await router.close()


async def test_while_redis_does_not_answer_a_closed_router_refuses_limited_keys(
    redis_server: RedisServer,
) -> None:
    limits = _limits(redis_server, "router-0", store_down=StoreDown.CLOSED)
    await limits.start()
    try:
        record = _key(requests_per_minute=30)
        await limits.admit(record)
        redis_server.pause()
        with pytest.raises(ApiError) as caught:
            await limits.admit(record)
        assert caught.value.refusal.status == 503 and caught.value.refusal.code == "limits_unavailable"
        assert caught.value.refusal.retry_after is not None
        # A key without limits is not refused: there is nothing to check.
        await limits.admit(_key())
        redis_server.resume()
        await eventually(lambda: admits(limits, record), what="shared limits back once Redis answers")
        assert limits.up
    finally:
        redis_server.resume()
        await limits.close()
