"""The Responses API on `llmgw dev`: the official client's `responses.create` through the
router, whole and streamed, and a follow-up by `previous_response_id` that another replica
answers (the conversation kept in the dev Consul's KV by the router, not by an engine)."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from .conftest import RunningDev, start_dev

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim, simulate_gpus: false, sim: {tokens_per_second: 200, load_seconds: 0.5}}]
    scaling: {min: 2, max: 2}
"""


def _both_replicas_answer(client: openai.OpenAI) -> bool:
    replicas = set()
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model="sim-chat", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        replicas.add(raw.headers["x-llmgw-replica"])
    return len(replicas) == 2


def test_responses_whole_streamed_and_followed_up_on_another_replica(
    tmp_path: Path, dev_runner: list[RunningDev]
) -> None:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    dev = start_dev(tmp_path, "--catalog", str(tmp_path / "catalog.yaml"))
    dev_runner.append(dev)
    client = openai.OpenAI(base_url=dev.base_url, api_key="unused-in-dev", max_retries=0, timeout=30)
    deadline = time.monotonic() + 90
    while True:
        try:
            if _both_replicas_answer(client):
                break
        except openai.APIError:
            pass
        assert time.monotonic() < deadline, "both replicas of sim-chat never answered"
        time.sleep(0.5)

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
