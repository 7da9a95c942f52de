"""Health gating, metrics, admission and cancellation, observed from outside the sim."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from tests.support.sim import TEST_MODEL, fast_settings
from tests.support.waiting import eventually

from .conftest import ClientFor, StartServer


async def _status(http: aiohttp.ClientSession, url: object) -> int:
    async with http.get(url) as response:  # type: ignore[arg-type]
        return response.status


async def _stats(http: aiohttp.ClientSession, url: object) -> dict[str, object]:
    async with http.get(url) as response:  # type: ignore[arg-type]
        body: dict[str, object] = await response.json()
        return body


async def test_health_is_503_while_loading_then_200(
    start_server: StartServer, http: aiohttp.ClientSession, client_for: ClientFor
) -> None:
    server = await start_server(fast_settings(load_time=0.4))
    async with http.get(server.make_url("/health")) as response:
        assert response.status == 503
        assert "loading" in (await response.json())["error"]["message"]
    with pytest.raises(openai.APIStatusError) as caught:
        await client_for(server).chat.completions.create(
            model=TEST_MODEL, messages=[{"role": "user", "content": "too early"}]
        )
    assert caught.value.status_code == 503
    assert await eventually(lambda: _healthy(http, server.make_url("/health")), within=5)
    async with http.get(server.make_url("/health")) as response:
        assert await response.read() == b""  # like vLLM: 200 with an empty body


async def _healthy(http: aiohttp.ClientSession, url: object) -> bool:
    return await _status(http, url) == 200


async def test_metrics_expose_vllm_gauges_and_token_counters(
    start_server: StartServer, http: aiohttp.ClientSession, client_for: ClientFor
) -> None:
    server = await start_server()
    await client_for(server).chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "four words right here"}], max_tokens=3
    )
    async with http.get(server.make_url("/metrics")) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    label = f'{{model_name="{TEST_MODEL}"}}'
    assert f"vllm:num_requests_running{label} 0.0" in text
    assert f"vllm:num_requests_waiting{label} 0.0" in text
    assert f"vllm:prompt_tokens_total{label} 4.0" in text
    assert f"vllm:generation_tokens_total{label} 3.0" in text
    assert f"llmgw_sim_requests_cancelled_total{label} 0.0" in text
    assert "# TYPE vllm:num_requests_running gauge" in text


async def test_requests_beyond_max_num_seqs_wait(
    start_server: StartServer, http: aiohttp.ClientSession, client_for: ClientFor
) -> None:
    server = await start_server(fast_settings(max_num_seqs=2, token_rate=50.0))  # 0.5 s per request
    client = client_for(server)
    stats_url = server.make_url("/sim/stats")

    async def one() -> str | None:
        reply = await client.chat.completions.create(
            model=TEST_MODEL, messages=[{"role": "user", "content": "queue"}], max_tokens=25
        )
        content: str | None = reply.choices[0].message.content
        return content

    tasks = [asyncio.create_task(one()) for _ in range(5)]
    assert await eventually(lambda: _counts(http, stats_url, running=2, waiting=3))
    async with http.get(server.make_url("/metrics")) as response:
        text = await response.text()
    assert f'vllm:num_requests_running{{model_name="{TEST_MODEL}"}} 2.0' in text
    assert f'vllm:num_requests_waiting{{model_name="{TEST_MODEL}"}} 3.0' in text
    answers = await asyncio.gather(*tasks)
    assert all(answer and len(answer.split()) == 25 for answer in answers)
    stats = await _stats(http, stats_url)
    assert (stats["running"], stats["waiting"], stats["completed"]) == (0, 0, 5)


async def _counts(http: aiohttp.ClientSession, url: object, **expected: int) -> bool:
    stats = await _stats(http, url)
    return all(stats[key] == value for key, value in expected.items())


async def test_client_leaving_mid_stream_cancels_generation(
    start_server: StartServer, http: aiohttp.ClientSession, client_for: ClientFor
) -> None:
    server = await start_server(fast_settings(token_rate=100.0))
    stream = await client_for(server).chat.completions.create(
        model=TEST_MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=4000, stream=True
    )
    received = 0
    async for _ in stream:
        received += 1
        if received == 3:
            break
    await stream.close()
    stats_url = server.make_url("/sim/stats")
    assert await eventually(lambda: _counts(http, stats_url, cancelled=1, running=0))
    stats = await _stats(http, stats_url)
    assert stats["completed"] == 0
    generated = stats["generation_tokens"]
    assert isinstance(generated, int) and generated < 1000  # it stopped, far short of 4000
    async with http.get(server.make_url("/metrics")) as response:
        assert f'llmgw_sim_requests_cancelled_total{{model_name="{TEST_MODEL}"}} 1.0' in await response.text()


async def test_client_leaving_a_non_streamed_request_cancels_it(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server(fast_settings(token_rate=100.0))
    body = {"model": TEST_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4000}
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            server.make_url("/v1/chat/completions"), json=body, timeout=aiohttp.ClientTimeout(total=0.3)
        ) as response:
            await response.read()
    stats_url = server.make_url("/sim/stats")
    assert await eventually(lambda: _counts(http, stats_url, cancelled=1, running=0))


async def test_a_waiting_request_that_leaves_is_counted_as_cancelled(
    start_server: StartServer, http: aiohttp.ClientSession
) -> None:
    server = await start_server(fast_settings(max_num_seqs=1, token_rate=100.0))
    url = server.make_url("/v1/completions")
    stats_url = server.make_url("/sim/stats")
    long_body = {"model": TEST_MODEL, "prompt": "first", "max_tokens": 4000}
    holder = asyncio.create_task(http.post(url, json=long_body))
    assert await eventually(lambda: _counts(http, stats_url, running=1))
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            url, json={**long_body, "prompt": "second"}, timeout=aiohttp.ClientTimeout(total=0.3)
        ) as response:
            await response.read()
    assert await eventually(lambda: _counts(http, stats_url, cancelled=1, waiting=0, running=1))
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert await eventually(lambda: _counts(http, stats_url, cancelled=2, running=0))
