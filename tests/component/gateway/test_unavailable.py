"""Models the control plane cannot serve now (``llmgw/unavailable``), through a real router.

What a user of ``llmgw dev`` saw before: a model no node can run, or one an operator
drained, answered "loading, retry in 10 seconds" after a 5 s wait (60 s of ``: loading
model`` comments for a stream), and a guarded model paid that wait on every request.
Now the router answers at once with 503 ``model_unavailable`` saying why, still tries
fallbacks first, shows the state in ``/v1/models``, and falls back to the old behaviour
whenever the control plane's word is missing, stale or about another catalog."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.records import Unavailability, UnavailableModel, UnavailableModels
from llmgw.gateway.app import RouterServer
from llmgw.gateway.context import CONTEXT

from .conftest import Cluster, OpenAIFor, StartRouter, eventually

MESSAGES: Any = [{"role": "user", "content": "hello there"}]
NO_DRIVER = "no profile fits: profile 0 (vllm): no node has the drivers it needs (missing drivers: docker)"


def publish(cluster: Cluster, *models: UnavailableModel, sha: str | None = None, age: float = 0.0) -> None:
    """What the leading control plane would write after a pass, ``age`` seconds ago."""
    current = cluster.catalog.latest
    assert current is not None
    cluster.unavailable.publish(
        UnavailableModels(
            catalog_sha256=current.sha256 if sha is None else sha,
            published_at=cluster.clock.now - age,
            models=models,
        )
    )


def unplaceable(model: str) -> UnavailableModel:
    return UnavailableModel(model, Unavailability.UNPLACEABLE, NO_DRIVER, 1_699_999_000.0)


def drained(model: str) -> UnavailableModel:
    return UnavailableModel(model, Unavailability.DRAINED, "drained by alice", 1_699_999_900.0)


async def refusal(client: AsyncOpenAI, model: str) -> openai.APIStatusError:
    """The error a chat completion for ``model`` gets."""
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model=model, messages=MESSAGES)
    return caught.value


async def applied(router: RouterServer, *models: str) -> None:
    book = router.app[CONTEXT].book
    assert await eventually(lambda: set(book.unavailable()) == set(models))


async def test_an_unplaceable_on_demand_model_is_refused_at_once_saying_why(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    publish(cluster, unplaceable("sleepy"))
    router = await start_router(load_wait=5.0)
    await applied(router, "sleepy")
    client = openai_for(router)
    loop = asyncio.get_running_loop()
    started = loop.time()
    error = await refusal(client, "sleepy")
    assert loop.time() - started < 1.0  # no load wait (5 s here)
    assert (error.status_code, error.code, error.type) == (503, "model_unavailable", "server_error")
    assert error.response.headers["Retry-After"] == "30"
    assert "cannot be served now" in error.message and "missing drivers: docker" in error.message
    assert "since 2023-11-14T21:56:40Z" in error.message
    assert cluster.sink.wakes("sleepy") == []  # no load is asked for that cannot come


async def test_a_stream_for_an_unplaceable_model_gets_the_error_at_once_not_loading_comments(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    publish(cluster, unplaceable("sleepy"))
    router = await start_router(load_wait_streaming=10.0, loading_comment_interval=0.05)
    await applied(router, "sleepy")
    body = {"model": "sleepy", "messages": MESSAGES, "stream": True}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 503
        error = (await response.json())["error"]
    assert error["code"] == "model_unavailable"


async def test_a_request_already_waiting_is_answered_when_the_control_plane_gives_up(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    """The first request wakes the model; the control plane's placement fails a moment
    later; the waiting requests (plain and streamed) end then, not at their deadline."""
    router = await start_router(load_wait=10.0, load_wait_streaming=10.0, loading_comment_interval=0.05)
    client = openai_for(router)
    plain = asyncio.create_task(client.chat.completions.create(model="sleepy", messages=MESSAGES))
    body = {"model": "sleepy", "messages": MESSAGES, "stream": True}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200  # the head went out with the first loading comment
        await response.content.readuntil(b": loading model\n\n")
        assert await eventually(lambda: len(cluster.sink.wakes("sleepy")) >= 1)
        started = asyncio.get_running_loop().time()
        publish(cluster, unplaceable("sleepy"))
        rest = (await response.read()).decode()
    assert asyncio.get_running_loop().time() - started < 2.0
    assert '"code":"model_unavailable"' in rest and "missing drivers" in rest
    with pytest.raises(openai.APIStatusError) as caught:
        await plain
    assert caught.value.code == "model_unavailable"


async def test_a_drained_model_is_refused_at_once_and_not_to_be_retried(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    engine = await cluster.add_sim("embed")
    cluster.drain(engine)
    publish(cluster, drained("embed"))
    router = await start_router(load_wait=5.0)
    await applied(router, "embed")
    with pytest.raises(openai.APIStatusError) as caught:
        await openai_for(router).embeddings.create(model="embed", input="hello")
    error = caught.value
    assert (error.status_code, error.code) == (503, "model_unavailable")
    assert error.response.headers["x-should-retry"] == "false"
    assert "Retry-After" not in error.response.headers
    assert "drained by alice" in error.message and "restarts it" in error.message


async def test_an_alias_of_an_unplaceable_running_model_says_so_instead_of_no_healthy_replica(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    # gpt-4o-mini -> chat-a (min 1), whose fallbacks chat-b and sim-chat have no replica either.
    publish(cluster, unplaceable("chat-a"))
    router = await start_router(load_wait=5.0)
    await applied(router, "chat-a")
    error = await refusal(openai_for(router), "gpt-4o-mini")
    assert error.code == "model_unavailable"
    assert "`gpt-4o-mini` (`chat-a`)" in error.message


async def test_fallbacks_are_still_tried_first(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await cluster.add_sim("sim-chat")
    publish(cluster, unplaceable("sleepy-fallback"))
    router = await start_router(load_wait=5.0)
    await applied(router, "sleepy-fallback")
    completion = await openai_for(router).chat.completions.create(
        model="sleepy-fallback", messages=MESSAGES, max_tokens=2
    )
    assert completion.model == "sim-chat"


async def test_the_model_list_shows_the_state_and_why(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    publish(cluster, unplaceable("sleepy"))
    router = await start_router()
    await applied(router, "sleepy")
    async with http.get(router.url + "/v1/models") as response:
        models = {m["id"]: m["llmgw"] for m in (await response.json())["data"]}
    assert models["sleepy"]["state"] == "unavailable"
    assert models["sleepy"]["unavailable"] == {
        "why": "unplaceable",
        "reason": NO_DRIVER,
        "since": 1_699_999_000.0,
        "until": None,  # only a failing model's backoff has an end
    }
    assert (models["sleepy-fallback"]["state"], models["sleepy-fallback"]["unavailable"]) == (
        "startable",
        None,
    )


@pytest.mark.parametrize(
    "untrusted",
    [
        pytest.param({"age": 91.0}, id="stale: the control plane stopped refreshing it"),
        pytest.param({"sha": "f" * 64}, id="judged against another catalog"),
    ],
)
async def test_an_untrusted_word_changes_nothing_the_model_is_loading_as_before(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, untrusted: dict[str, Any]
) -> None:
    publish(cluster, unplaceable("sleepy"), **untrusted)
    router = await start_router(load_wait=0.3)  # returns once the router has applied the word
    error = await refusal(openai_for(router), "sleepy")
    assert error.code == "model_loading"
    assert len(cluster.sink.wakes("sleepy")) == 1


async def test_a_consul_outage_keeps_the_last_word_until_it_goes_stale(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    publish(cluster, unplaceable("sleepy"))
    router = await start_router(load_wait=0.3)
    await applied(router, "sleepy")
    cluster.unavailable.fail("Consul unreachable")
    client = openai_for(router)
    error = await refusal(client, "sleepy")
    assert error.code == "model_unavailable"
    cluster.clock.now += 91.0  # no refresh came: the word is stale, the model loadable again
    error = await refusal(client, "sleepy")
    assert error.code == "model_loading"


GUARDED = """
models:
  guarded: {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  judge:
    roles: [guard]
    profiles: [{engine: vllm, source: meta-llama/Llama-Guard-3-8B}]
    scaling: {min: 0, max: 1}
guard_policies:
  default: {judge: judge, models: [guarded]}
"""


async def test_a_guarded_model_whose_judge_cannot_be_placed_is_refused_without_the_load_wait(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    cluster.set_catalog(GUARDED)
    await cluster.add_sim("guarded")
    publish(cluster, unplaceable("judge"))
    router = await start_router(load_wait=5.0)
    await applied(router, "judge")
    loop = asyncio.get_running_loop()
    started = loop.time()
    error = await refusal(openai_for(router), "guarded")
    assert loop.time() - started < 1.0
    assert (error.status_code, error.code) == (503, "guard_unavailable")


async def test_a_failing_model_is_refused_until_its_backoff_ends_with_retry_after_to_match(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    crashing = UnavailableModel(
        "sleepy",
        Unavailability.FAILING,
        "3 failure(s) in a row; the last: the engine exited with code 137",
        cluster.clock.now - 60,
        until=cluster.clock.now + 90,
    )
    publish(cluster, crashing)
    router = await start_router(load_wait=5.0)
    await applied(router, "sleepy")
    error = await refusal(openai_for(router), "sleepy")
    assert (error.status_code, error.code) == (503, "model_unavailable")
    assert "kept failing" in error.message and "exited with code 137" in error.message
    assert 89 <= int(error.response.headers["Retry-After"]) <= 90  # when the control plane tries again
    assert cluster.sink.wakes("sleepy") == []
