"""A running model whose only replica is starting (registered in Consul, its check failing
while the engine loads its weights) is answered as loading, as an on-demand load is: a
non-streamed request waits and gets 503 ``model_loading`` with Retry-After, a stream waits
with ``: loading model`` comments and is served once the check passes. A replica that
passed and went critical (a crash) is not loading: ``no_healthy_replica`` at once."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.core.records import HealthStatus

from .conftest import Cluster, Engine, OpenAIFor, StartRouter, eventually

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


async def consul_check_passes(http: aiohttp.ClientSession, engine: Engine) -> bool:
    """What Consul's HTTP check of the engine sees: its /health answers 200."""
    async with http.get(engine.url + "/health") as response:
        return response.status == 200


async def model_state(http: aiohttp.ClientSession, router_url: str, model: str) -> str:
    async with http.get(router_url + "/v1/models") as response:
        listed = (await response.json())["data"]
    state: str = next(m for m in listed if m["id"] == model)["llmgw"]["state"]
    return state


async def test_a_replica_loading_its_weights_is_answered_as_loading_then_serves(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    router = await start_router(load_wait=0.3, load_wait_streaming=10.0, loading_comment_interval=0.05)
    client = openai_for(router)
    # The replica's allocation runs and Nomad registered its service; the engine loads its
    # weights, so its check fails.
    engine = await cluster.add_sim("sim-chat", publish=False, load_time=1.0)
    cluster.set_status(engine, HealthStatus.CRITICAL)
    await cluster.seen_by(router)
    assert not await consul_check_passes(http, engine)
    assert await model_state(http, router.url, "sim-chat") == "loading"

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES)
    assert loop.time() - started >= 0.3  # it waited for the replica first
    error = caught.value
    assert (error.status_code, error.code) == (503, "model_loading")
    assert error.response.headers["Retry-After"] == "10"
    assert "`sim-chat` is loading" in error.message
    assert (await engine.stats(http))["requests_total"] == 0  # the router never sent it there

    body = {"model": "sim-chat", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200
        head = await response.content.readuntil(b"\n\n")
        assert head == b": loading model\n\n"
        await eventually(lambda: consul_check_passes(http, engine), what="the engine loaded its weights")
        cluster.set_status(engine, HealthStatus.PASSING)
        raw = (head + await response.read()).decode()
    assert ": llmgw model=sim-chat replica=sim-chat-r0\n\n" in raw
    assert raw.rstrip().endswith("data: [DONE]")

    completion = await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=2)
    assert completion.model == "sim-chat"
    assert await model_state(http, router.url, "sim-chat") == "serving"
    assert cluster.sink.wakes("sim-chat") == []  # kept running by its min: nothing to wake


async def test_a_replica_that_passed_and_went_critical_has_no_healthy_replica(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    engine = await cluster.add_sim("sim-chat")
    router = await start_router(load_wait=5.0)
    client = openai_for(router)
    await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    cluster.set_status(engine, HealthStatus.CRITICAL)  # its engine crashed or hangs
    await cluster.seen_by(router)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES)
    assert (caught.value.status_code, caught.value.code) == (503, "no_healthy_replica")
    assert caught.value.response.headers["Retry-After"] == "5"


async def test_a_replica_failing_before_the_router_started_is_not_taken_for_a_load(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    # The router cannot know whether it ever passed: the older, conservative answer.
    engine = await cluster.add_sim("sim-chat", publish=False)
    cluster.set_status(engine, HealthStatus.CRITICAL)
    client = openai_for(await start_router(load_wait=5.0))
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES)
    assert (caught.value.status_code, caught.value.code) == (503, "no_healthy_replica")


async def test_a_starting_replica_that_is_drained_is_not_waited_for(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    router = await start_router(load_wait=5.0)
    client = openai_for(router)
    engine = await cluster.add_sim("sim-chat", publish=False)
    cluster.set_status(engine, HealthStatus.CRITICAL)
    cluster.drain(engine)
    await cluster.seen_by(router)
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES)
    assert (caught.value.status_code, caught.value.code) == (503, "no_healthy_replica")
