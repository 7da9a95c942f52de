"""What the official SDKs' default clients do with the router's 503s: they retry a 5xx
twice, sleeping Retry-After (up to 120 s), unless ``x-should-retry: false``
(``_should_retry`` in openai-python 3.60.0's and anthropic-python 2.17.0's
``_base_client.py``). Where retrying cannot help soon (a judge, or a model, the cluster
has no place for) the router says so and the client gives up at once; where it can (no
healthy replica now) the client retries, as Retry-After tells it.

The clients are the SDKs' own, with their default retries; their HTTP client is the
SDKs' default class with a hook that counts the requests that leave."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import openai
import pytest

from llmgw.gateway.app import RouterServer

from .conftest import Cluster, StartRouter
from .test_guard import guard_catalog
from .test_unavailable import applied, publish, unplaceable

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


class Sent:
    """Counts the requests a client's HTTP client sends (each retry is one more)."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, request: httpx2.Request) -> None:
        self.count += 1


def _openai(router: RouterServer, sent: Sent) -> openai.AsyncOpenAI:
    client = openai.DefaultAsyncHttpxClient(event_hooks={"request": [sent]})
    return openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="sk-none", http_client=client)


def _anthropic(router: RouterServer, sent: Sent) -> anthropic.AsyncAnthropic:
    client = anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [sent]})
    return anthropic.AsyncAnthropic(base_url=router.url, api_key="sk-none", http_client=client)


async def _both_refused(router: RouterServer, model: str) -> tuple[list[int], list[str]]:
    """Requests sent by each SDK for one call, and the error codes they raise."""
    sent_openai, sent_anthropic = Sent(), Sent()
    codes = []
    async with _openai(router, sent_openai) as client:
        assert client.max_retries == 2  # the default
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=model, messages=MESSAGES)
        codes.append(str(caught.value.code))
    async with _anthropic(router, sent_anthropic) as other:
        assert other.max_retries == 2
        with pytest.raises(anthropic.APIStatusError) as refused:
            await other.messages.create(model=model, max_tokens=4, messages=MESSAGES)
        codes.append(str(refused.value.status_code))
    return [sent_openai.count, sent_anthropic.count], codes


async def test_a_model_the_cluster_has_no_place_for_is_not_retried(
    cluster: Cluster, start_router: StartRouter
) -> None:
    publish(cluster, unplaceable("sleepy"))
    router = await start_router(unplaceable_retry_after=60)
    await applied(router, "sleepy")
    sent, codes = await _both_refused(router, "sleepy")
    assert codes == ["model_unavailable", "503"]
    assert sent == [1, 1]  # no 60 s sleeps, twice, for the same answer


async def test_a_guard_whose_judge_cannot_place_is_not_retried(
    cluster: Cluster, start_router: StartRouter
) -> None:
    cluster.set_catalog(guard_catalog())
    await cluster.add_sim("guarded")
    publish(cluster, unplaceable("judge"))
    router = await start_router()
    await applied(router, "judge")
    sent, codes = await _both_refused(router, "guarded")
    assert codes == ["guard_unavailable", "503"]
    assert sent == [1, 1]


async def test_a_model_without_a_healthy_replica_now_is_retried_after_retry_after(
    cluster: Cluster, start_router: StartRouter
) -> None:
    # No replica yet, and no word that it cannot place: one may come, so the SDKs retry.
    cluster.set_catalog(guard_catalog())
    await cluster.add_sim("guarded")
    router = await start_router(unavailable_retry_after=1)
    sent, codes = await _both_refused(router, "guarded")  # its judge has no replica
    assert codes == ["guard_unavailable", "503"]
    assert sent == [3, 3]  # the first try and the SDKs' two retries
