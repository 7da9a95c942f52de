"""The cold-start contract: on-demand models are woken (once for many requests), waited
for, and answered as loading; unknown, off and unconfigured models get their own answers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT

from .conftest import Cluster, OpenAIFor, StartRouter, eventually, metric_value

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


async def queued_for(router: RouterServer, model: str) -> None:
    """Returns once a request waits at ``router`` for ``model`` to load."""
    demand = router.app[CONTEXT].demand
    await eventually(
        lambda: any(u.model == model and u.queued for u in demand.report().models),
        what=f"a request waiting for {model} to load",
    )


async def test_a_sleeping_model_is_woken_and_the_request_told_it_is_loading(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router(load_wait=0.3))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sleepy", messages=MESSAGES)
    assert loop.time() - started >= 0.3  # it waited for a replica first
    error = caught.value
    assert error.status_code == 503 and error.code == "model_loading"
    assert error.response.headers["Retry-After"] == "10"
    assert "loading" in error.message
    wakes = cluster.sink.wakes("sleepy")
    assert len(wakes) == 1  # published at once, not at the next report interval


async def test_simultaneous_requests_share_one_wake_up(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    router = await start_router(load_wait=0.3)
    client = openai_for(router)

    async def one() -> int:
        try:
            await client.chat.completions.create(model="sleepy", messages=MESSAGES)
        except openai.APIStatusError as exc:
            return exc.status_code
        return 200

    assert await asyncio.gather(*(one() for _ in range(10))) == [503] * 10
    assert len(cluster.sink.wakes("sleepy")) == 1
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "llmgw_router_wakeups_total", model="sleepy") == 1
    assert metric_value(text, "llmgw_router_load_wait_seconds_count", model="sleepy", outcome="timeout") == 10


async def test_a_request_waiting_for_a_load_is_served_when_a_replica_comes_up(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    router = await start_router(load_wait=5.0)
    client = openai_for(router)
    waiting = asyncio.create_task(
        client.chat.completions.create(model="sleepy", messages=MESSAGES, max_tokens=3)
    )
    await queued_for(router, "sleepy")
    await cluster.add_sim("sleepy")
    completion = await waiting
    assert completion.model == "sleepy"
    report = cluster.sink.wakes("sleepy")[0]
    use = next(u for u in report.models if u.model == "sleepy")
    assert use.wake and use.last_used == cluster.clock.now


async def test_a_stream_waiting_for_a_load_is_kept_alive_with_comments(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router(load_wait_streaming=5.0, loading_comment_interval=0.05)
    body = {"model": "sleepy", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200
        head = b""
        while head.count(b": loading model") < 2:  # two comments while nothing can serve it
            head += await response.content.readuntil(b"\n\n")
        await cluster.add_sim("sleepy")
        raw = (head + await response.read()).decode()
    assert raw.startswith(": loading model\n\n")
    assert raw.count(": loading model") >= 2
    assert ": llmgw model=sleepy replica=sleepy-r0\n\n" in raw
    assert raw.rstrip().endswith("data: [DONE]")


async def test_the_official_client_ignores_the_loading_comments(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router(load_wait_streaming=5.0, loading_comment_interval=0.05))
    # The stream's head goes with its first loading comment: the client has one to ignore.
    stream = await client.chat.completions.create(
        model="sleepy", messages=MESSAGES, max_tokens=4, stream=True
    )
    await cluster.add_sim("sleepy")
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert len(text.split()) == 4


async def test_a_stream_that_waits_in_vain_ends_with_a_loading_error_event(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router(load_wait_streaming=0.3, loading_comment_interval=0.05))
    with pytest.raises(openai.APIError) as caught:
        stream = await client.chat.completions.create(model="sleepy", messages=MESSAGES, stream=True)
        async for _ in stream:
            pass
    assert "is loading" in caught.value.message


async def test_a_sleeping_model_with_a_serving_fallback_answers_now_and_still_wakes(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    client = openai_for(await start_router(load_wait=5.0))
    completion = await client.chat.completions.create(
        model="sleepy-fallback", messages=MESSAGES, max_tokens=2
    )
    assert completion.model == "sim-chat"
    assert len(cluster.sink.wakes("sleepy-fallback")) == 1


async def test_unknown_models_never_wake_anything(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    client = openai_for(await start_router())
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="sleepyy", messages=MESSAGES)
    assert caught.value.code == "model_not_found"
    assert cluster.sink.reports == []


@pytest.mark.parametrize(
    ("model", "why"), [("switched-off", "min 0, max 0"), ("no-scaling", "no scaling stanza")]
)
async def test_a_model_configured_off_says_so_and_is_not_retried(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, model: str, why: str
) -> None:
    client = openai_for(await start_router())
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=model, messages=MESSAGES)
    assert caught.value.status_code == 503 and caught.value.code == "model_off"
    assert why in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "Retry-After" not in caught.value.response.headers
    assert cluster.sink.reports == []


async def test_use_is_reported_in_batches(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    router = await start_router(demand_interval=30.0)
    client = openai_for(router)
    for _ in range(3):
        await client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=1)
    # A check that nothing happens: 50 ms gives an early report the time to go out, and none may.
    await asyncio.sleep(0.05)
    assert cluster.sink.reports == []  # ordinary use waits for the next report
    assert await router.app[CONTEXT].demand.publish_once()  # what the reporting loop does each interval
    use = cluster.sink.reports[0].models
    assert [(u.model, u.wake, u.in_flight, u.last_used) for u in use] == [
        ("sim-chat", False, 0, cluster.clock.now)
    ]


async def test_a_failing_demand_sink_does_not_fail_requests(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    cluster.sink.fail_with = ConnectionError("consul is down")
    client = openai_for(await start_router(load_wait=0.2))
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="sleepy", messages=MESSAGES)
    assert caught.value.code == "model_loading"
