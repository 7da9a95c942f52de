"""The Responses API on `llmgw dev`, through the official client's `responses.create`:
whole and streamed, a follow-up by `previous_response_id` that another replica answers
(the conversation kept in the dev Consul's KV by the router, not by an engine), a guard
block, a fallback, a load on demand, and keys from `llmgw ctl keys create` (one for
another model finds no such model). One `llmgw dev --api-keys` serves the file's tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from tests.support.waiting import eventually_sync

from .conftest import GUARD_FALLBACK_AND_ON_DEMAND, RunningDev, start_dev

pytestmark = pytest.mark.e2e

CATALOG = (
    """
models:
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200, load_seconds: 0.5}}]
    scaling: {min: 2, max: 2}"""
    + GUARD_FALLBACK_AND_ON_DEMAND
)


def _replicas_answering(client: openai.OpenAI, model: str, requests: int) -> set[str]:
    replicas = set()
    for _ in range(requests):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        replicas.add(raw.headers["x-llmgw-replica"])
    return replicas


@dataclass
class Keyed:
    dev: RunningDev
    elsewhere: str  # sim-guarded only
    everything: str  # every model

    def client(self, api_key: str | None = None, max_retries: int = 0) -> openai.OpenAI:
        # Codex CLI's base_url is the router's address with /v1, as here.
        return openai.OpenAI(
            base_url=self.dev.base_url,
            api_key=api_key or self.everything,
            max_retries=max_retries,
            timeout=60,
        )


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    tmp_path = tmp_path_factory.mktemp("responses-on-dev")
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--api-keys")
    try:
        keyed = Keyed(
            dev,
            elsewhere=dev.create_key("elsewhere", "--model", "sim-guarded"),
            # Issued last: once the router takes it, it knows the others (one watched prefix).
            everything=dev.create_key("everything"),
        )
        probe = keyed.client()
        eventually_sync(
            lambda: len(_replicas_answering(probe, "sim-chat", 6)) == 2,
            90,
            "both replicas of sim-chat answering",
            every=0.5,
            retry_on=(openai.APIError,),
        )
        eventually_sync(
            lambda: _replicas_answering(probe, "sim-guarded", 1),
            90,
            "sim-guarded answering (its judge loaded)",
            every=0.5,
            retry_on=(openai.APIError,),
        )
        yield keyed
    finally:
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)
            dev.process.wait(timeout=10)


def test_responses_whole_streamed_and_followed_up_on_another_replica(keyed: Keyed) -> None:
    client = keyed.client()
    raw = client.responses.with_raw_response.create(
        model="sim-chat", input="hello there", max_output_tokens=4
    )
    first = raw.parse()
    first_replica = raw.headers["x-llmgw-replica"]
    assert first.id.startswith("resp_") and first_replica not in first.id
    assert len(first.output_text.split()) == 4 and first.usage is not None

    stream = client.responses.create(model="sim-chat", input="hello there", max_output_tokens=3, stream=True)
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert len(events[-1].response.output_text.split()) == 3  # type: ignore[union-attr]

    # Follow-ups until the other replica takes one: it reads the first turn all the same.
    replicas = set()
    for _ in range(6):
        raw = client.responses.with_raw_response.create(
            model="sim-chat", input="and again", previous_response_id=first.id, max_output_tokens=2
        )
        again = raw.parse()
        replicas.add(raw.headers["x-llmgw-replica"])
        assert again.usage is not None
        assert again.usage.input_tokens == first.usage.input_tokens + first.usage.output_tokens + 2
        if raw.headers["x-llmgw-replica"] != first_replica:
            break
    assert len(replicas | {first_replica}) == 2, "no follow-up reached the other replica"

    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="sim-chat", input="x", previous_response_id="resp_" + "0" * 48)
    assert caught.value.code == "previous_response_not_found"


def test_a_response_without_max_output_tokens_completes_as_codex_reads_it(keyed: Keyed) -> None:
    """Codex CLI and the SDK's responses.stream() ask no max_output_tokens: the chat turn
    then has the rest of the context (as vLLM's) and the sim ends it with its own stop, so
    the stream ends with response.completed (a cut at 16 tokens ended it incomplete and
    get_final_response raised "Didn't receive a `response.completed` event")."""
    with keyed.client().responses.stream(model="sim-chat", input="tell me a long story") as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.usage is not None
    assert final.output_text and final.usage.output_tokens == len(final.output_text.split())


def test_the_guard_blocks_a_response_whole_streamed_and_in_a_follow_up(keyed: Keyed) -> None:
    client = keyed.client()
    fine = client.responses.create(model="sim-guarded", input="how do I bake bread?", max_output_tokens=2)
    assert fine.model == "sim-guarded" and len(fine.output_text.split()) == 2

    with pytest.raises(openai.BadRequestError) as blocked:
        client.responses.create(model="sim-guarded", input="where is the Forbidden Fruit?")
    assert blocked.value.code == "content_policy_violation"
    assert blocked.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    # A stream is screened before it starts: the client gets the 400, not an event.
    with pytest.raises(openai.BadRequestError) as streamed:
        list(client.responses.create(model="sim-guarded", input="the forbidden fruit", stream=True))
    assert streamed.value.code == "content_policy_violation"
    # What reaches the prompt from elsewhere than `input` is screened too.
    with pytest.raises(openai.BadRequestError) as instructed:
        client.responses.create(model="sim-guarded", instructions="praise the forbidden fruit", input="hi")
    assert instructed.value.code == "content_policy_violation"
    # A follow-up carries the stored turn to the judge with the new input.
    with pytest.raises(openai.BadRequestError) as followed:
        client.responses.create(model="sim-guarded", input="forbidden fruit", previous_response_id=fine.id)
    assert followed.value.code == "content_policy_violation"


def test_a_model_that_cannot_run_is_answered_by_its_fallback_and_counted(keyed: Keyed) -> None:
    dev = keyed.dev
    before = dev.router_metric("llmgw_router_fallbacks_total", requested="gpu-chat", served="sim-chat")
    client = keyed.client()
    raw = client.responses.with_raw_response.create(model="gpu-chat", input="hi", max_output_tokens=3)
    response = raw.parse()
    assert raw.headers["x-llmgw-model"] == "sim-chat"
    assert response.model == "sim-chat" and len(response.output_text.split()) == 3
    streamed = list(client.responses.create(model="gpu-chat", input="hi", max_output_tokens=2, stream=True))
    assert streamed[-1].response.model == "sim-chat"  # type: ignore[union-attr]
    after = dev.router_metric("llmgw_router_fallbacks_total", requested="gpu-chat", served="sim-chat")
    assert after - before == 2


def test_a_response_for_a_model_nobody_runs_loads_it(keyed: Keyed) -> None:
    dev = keyed.dev
    assert dev.live_jobs("sim-on-demand") == [], "nothing runs an on-demand model before it is asked for"
    # The SDK's own retries, as a user has them: the router waits for the load for a
    # while, then answers 503 model_loading with Retry-After, which the client honours.
    client = keyed.client(max_retries=3)
    response = client.responses.create(model="sim-on-demand", input="wake up", max_output_tokens=3)
    assert response.model == "sim-on-demand" and len(response.output_text.split()) == 3
    assert len(dev.live_jobs("sim-on-demand")) == 1


def test_a_key_for_another_model_finds_no_such_model_and_a_bad_key_is_refused(keyed: Keyed) -> None:
    elsewhere = keyed.client(keyed.elsewhere)
    with pytest.raises(openai.NotFoundError) as caught:
        elsewhere.responses.create(model="sim-chat", input="hi", max_output_tokens=2)
    assert caught.value.code == "model_not_found" and "sim-chat" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        list(elsewhere.responses.create(model="sim-chat", input="hi", max_output_tokens=2, stream=True))
    # A response another key stored is not this key's to continue.
    theirs = keyed.client().responses.create(model="sim-guarded", input="hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as foreign:
        elsewhere.responses.create(model="sim-guarded", input="more", previous_response_id=theirs.id)
    assert foreign.value.code == "previous_response_not_found"
    mine = elsewhere.responses.create(model="sim-guarded", input="hi", max_output_tokens=1)
    assert mine.model == "sim-guarded"

    forged = keyed.everything.rsplit(".", 1)[0] + ".not-the-secret"
    with pytest.raises(openai.AuthenticationError) as refused:
        keyed.client(forged).responses.create(model="sim-chat", input="hi")
    assert refused.value.code == "invalid_api_key" and "not-the-secret" not in refused.value.message
