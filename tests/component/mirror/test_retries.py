"""The mirror's HTTP retries (stamina's): what is retried, how often, and the message when they run out.

stamina's testing mode (conftest) skips the waits but keeps the count of tries the
settings allow, so these tests count requests the fake Hub saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Harness

REPO = "org/llama"


def _revision_requests(harness: Harness) -> int:
    return sum("/revision/" in s.path for s in harness.hub.seen)


def test_a_busy_hub_is_asked_again_until_it_answers(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo()
    harness.hub.busy_answers = 2
    result = harness.add("llama@v1", REPO)
    assert result.code == 0, result.err
    assert _revision_requests(harness) == 3


def test_a_hub_busy_for_every_try_gives_up_naming_the_tries_and_the_status(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo()
    harness.hub.busy_answers = 100
    result = harness.add("llama@v1", REPO)
    assert result.code != 0
    assert "gave up after 6 tries (HTTP 503)" in result.err  # retries=5 by default: 6 tries
    assert _revision_requests(harness) == 6


def test_a_refused_token_is_not_retried(harness: Harness) -> None:
    harness.hub.repos[REPO] = harness.safetensors_repo()
    harness.hub.token = "right"
    result = harness.add("llama@v1", REPO)
    assert result.code != 0
    assert "HTTP 401" in result.err
    assert _revision_requests(harness) == 1


def test_a_file_that_keeps_dropping_gives_up_after_its_tries(harness: Harness) -> None:
    repo = harness.hub.repos[REPO] = harness.safetensors_repo()
    shard = "model-00002-of-00003.safetensors"
    repo[shard].drop_after = 1_000
    repo[shard].drops = 100
    result = harness.add("llama@v1", REPO)
    assert result.code != 0
    assert f"{shard}: gave up after 6 request(s)" in result.err + result.out
    assert len(harness.hub.file_requests(shard)) == 6
