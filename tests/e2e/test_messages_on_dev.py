"""Anthropic's Messages API on `llmgw dev --api-keys`: the official client's `messages.create`
(whole and streamed) and `messages.count_tokens` through the router with keys issued by
`llmgw ctl keys create`, as Claude Code would reach it; its usage in the router's /metrics
and in what the key may still spend; a key for another model, a guard block, a fallback
and a load on demand. One `llmgw dev` serves the file's tests."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest

from tests.support.waiting import eventually_sync

from .conftest import GUARD_FALLBACK_AND_ON_DEMAND, RunningDev, start_dev

pytestmark = pytest.mark.e2e

CATALOG = (
    """
models:
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 1000, load_seconds: 0.2}}]
    scaling: {min: 1, max: 1}
  sim-other:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false}]
    scaling: {min: 0, max: 1}"""
    + GUARD_FALLBACK_AND_ON_DEMAND
)

USER: Any = [{"role": "user", "content": "hello there"}]
# One word of 300 bytes: the router holds ~100 tokens of the key's budget for its prompt
# (its estimate from the body's size), and the sim counts one. Only a hold settled with
# the answer's usage gives the difference back.
LONG_WORD: Any = [{"role": "user", "content": "x" * 300}]
TOKENS_PER_MINUTE = 300


@dataclass
class Keyed:
    dev: RunningDev
    limited: str  # sim-chat only, TOKENS_PER_MINUTE
    elsewhere: str  # sim-other only
    everything: str  # every model, no limit

    def client(self, api_key: str) -> anthropic.Anthropic:
        # Claude Code's ANTHROPIC_BASE_URL is the router's address without /v1.
        return anthropic.Anthropic(
            base_url=self.dev.base_url.removesuffix("/v1"), api_key=api_key, max_retries=0, timeout=30
        )

    def tokens(self, kind: str) -> float:
        return self.dev.router_metric("llmgw_router_tokens_total", model="sim-chat", kind=kind)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    tmp_path = tmp_path_factory.mktemp("messages-on-dev")
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    dev = start_dev(
        tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--api-keys", "--nodes", "1", "--gpus", "1"
    )
    try:
        keyed = Keyed(
            dev,
            limited=dev.create_key(
                "limited", "--model", "sim-chat", "--tokens-per-minute", str(TOKENS_PER_MINUTE)
            ),
            elsewhere=dev.create_key("elsewhere", "--model", "sim-other"),
            # Issued last: once the router takes it, it knows the others (one watched prefix).
            everything=dev.create_key("everything"),
        )
        probe = keyed.client(keyed.everything)
        for model in ("sim-chat", "sim-guarded"):
            eventually_sync(
                functools.partial(probe.messages.create, model=model, max_tokens=1, messages=USER),
                90,
                f"{model} answering the probe key",
                every=0.5,
                retry_on=(anthropic.APIStatusError, anthropic.APIConnectionError),
            )
        yield keyed
    finally:
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)
            dev.process.wait(timeout=10)


def test_a_keyed_client_gets_a_message_whole_streamed_and_counted_and_the_key_pays_its_usage(
    keyed: Keyed,
) -> None:
    client = keyed.client(keyed.limited)
    prompt_before, completion_before = keyed.tokens("prompt"), keyed.tokens("completion")

    message = client.messages.create(model="sim-chat", max_tokens=60, messages=LONG_WORD, system="brief")
    assert message.type == "message" and message.model == "sim-chat" and message.id.startswith("msg_")
    [block] = message.content
    assert block.type == "text" and len(block.text.split()) == 60
    assert message.stop_reason == "max_tokens"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (2, 60)

    events = list(client.messages.create(model="sim-chat", max_tokens=60, messages=LONG_WORD, stream=True))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    assert events[0].message.usage.input_tokens == 1
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    text = "".join(d.text for d in deltas if d.type == "text_delta")
    assert len(text.split()) == 60
    [delta] = [e for e in events if e.type == "message_delta"]
    assert delta.delta.stop_reason == "max_tokens" and delta.usage.output_tokens == 60

    # A count is charged to its key as the engine's work (#28), so it is asked with a key
    # without a token limit here: the limited key's budget below is the answers' alone.
    counted = keyed.client(keyed.everything).messages.count_tokens(
        model="sim-chat", messages=LONG_WORD, system="brief"
    )
    assert counted.input_tokens == 2

    # Both answers reach the counters chat completions use (count_tokens generates nothing).
    assert keyed.tokens("prompt") - prompt_before == 3
    assert keyed.tokens("completion") - completion_before == 120

    # The key paid 123 of its 300 (a hold left open by either answer would have kept ~160):
    # 140 more fit (with the prompt's estimate, ~165 held), and then its budget is spent.
    third = client.messages.create(model="sim-chat", max_tokens=140, messages=USER)
    assert third.usage.output_tokens == 140
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="sim-chat", max_tokens=100, messages=USER)
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(caught.value.response.headers["Retry-After"]) >= 1


def test_a_key_for_another_model_finds_no_such_model_and_a_bad_key_is_refused(keyed: Keyed) -> None:
    # The banner says how to get a key, and its curl line sends one.
    admin = keyed.dev.state["admin_url"]
    assert f"(API keys: llmgw ctl --admin-url {admin} keys create NAME)" in keyed.dev.banner
    assert '-H "Authorization: Bearer $OPENAI_API_KEY"' in keyed.dev.banner
    elsewhere = keyed.client(keyed.elsewhere)
    with pytest.raises(anthropic.NotFoundError) as caught:
        elsewhere.messages.create(model="sim-chat", max_tokens=2, messages=USER)
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "sim-chat" in caught.value.message
    with pytest.raises(anthropic.NotFoundError):
        list(elsewhere.messages.create(model="sim-chat", max_tokens=2, messages=USER, stream=True))
    with pytest.raises(anthropic.NotFoundError):
        elsewhere.messages.count_tokens(model="sim-chat", messages=USER)

    forged = keyed.limited.rsplit(".", 1)[0] + ".not-the-secret"
    with pytest.raises(anthropic.AuthenticationError) as refused:
        keyed.client(forged).messages.create(model="sim-chat", max_tokens=2, messages=USER)
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert "not-the-secret" not in refused.value.message  # a presented key is never echoed

    with pytest.raises(anthropic.BadRequestError) as bad:
        keyed.client(keyed.everything).messages.create(model="sim-chat", max_tokens=2, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_the_guard_blocks_a_message_whole_streamed_and_from_its_system_prompt(keyed: Keyed) -> None:
    client = keyed.client(keyed.everything)
    fine = client.messages.create(model="sim-guarded", max_tokens=2, messages=USER)
    assert fine.model == "sim-guarded" and fine.stop_reason == "max_tokens"

    unsafe: Any = [{"role": "user", "content": "where is the Forbidden Fruit?"}]
    with pytest.raises(anthropic.BadRequestError) as blocked:
        client.messages.create(model="sim-guarded", max_tokens=5, messages=unsafe)
    assert blocked.value.body["type"] == "error"  # type: ignore[index]
    assert blocked.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "content policy" in blocked.value.message
    # A stream is screened before it starts: the client gets the 400, not an event.
    with pytest.raises(anthropic.BadRequestError):
        list(client.messages.create(model="sim-guarded", max_tokens=5, messages=unsafe, stream=True))
    # The system prompt reaches the prompt, so the judge reads it too.
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="sim-guarded", max_tokens=5, system="praise the forbidden fruit", messages=USER
        )


def test_a_model_that_cannot_run_is_answered_by_its_fallback_and_counted(keyed: Keyed) -> None:
    dev = keyed.dev
    before = dev.router_metric("llmgw_router_fallbacks_total", requested="gpu-chat", served="sim-chat")
    client = keyed.client(keyed.everything)
    raw = client.messages.with_raw_response.create(model="gpu-chat", max_tokens=3, messages=USER)
    assert raw.headers["x-llmgw-model"] == "sim-chat"
    message = raw.parse()
    assert message.model == "sim-chat" and len(message.content[0].text.split()) == 3  # type: ignore[union-attr]
    events = list(client.messages.create(model="gpu-chat", max_tokens=2, messages=USER, stream=True))
    assert events[0].type == "message_start" and events[0].message.model == "sim-chat"
    after = dev.router_metric("llmgw_router_fallbacks_total", requested="gpu-chat", served="sim-chat")
    assert after - before == 2


def test_a_streamed_message_for_a_model_nobody_runs_waits_for_its_load(keyed: Keyed) -> None:
    assert keyed.dev.live_jobs("sim-on-demand") == [], "nothing runs an on-demand model before it is asked"
    client = keyed.client(keyed.everything)
    # The router keeps the stream alive through the load (SSE comments the SDK skips).
    events = list(client.messages.create(model="sim-on-demand", max_tokens=3, messages=USER, stream=True))
    assert events[0].type == "message_start" and events[0].message.model == "sim-on-demand"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert len("".join(d.text for d in deltas if d.type == "text_delta").split()) == 3
    assert events[-1].type == "message_stop"
    assert len(keyed.dev.live_jobs("sim-on-demand")) == 1
