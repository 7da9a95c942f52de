"""Stored Responses API conversations under attack: sealed at rest with the operator's
keys, bound to their owner and id, within each key's quota, and nothing served when
the keys are gone. Real routers over a shared store, the ``openai`` SDK as the client."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.core.responses import parse_stored_name
from llmgw.core.sealing import SealingKey, SealingKeys
from llmgw.gateway.app import RouterServer
from llmgw.gateway.ports import MemoryResponseStore

from .conftest import Cluster, OpenAIFor, router_settings


def _keys(*ids: str) -> SealingKeys:
    return SealingKeys(tuple(SealingKey(key_id, os.urandom(32)) for key_id in ids))


class Routers:
    """Routers started over one store, each with the sealing keys it is given."""

    def __init__(self, cluster: Cluster, store: MemoryResponseStore) -> None:
        self.cluster = cluster
        self.store = store
        self._started: list[RouterServer] = []

    async def start(self, keys: SealingKeys | None, **settings: Any) -> RouterServer:
        router = RouterServer(
            router_settings(no_auth=False, **settings),
            replace(self.cluster.deps(with_keys=True), responses=self.store, response_keys=keys),
        )
        await router.start()
        self._started.append(router)
        await self.cluster.seen_by(router)
        return router

    async def stop(self, router: RouterServer) -> None:
        self._started.remove(router)
        await router.stop()

    async def close(self) -> None:
        for router in self._started:
            await router.stop()


@pytest.fixture
async def routers(cluster: Cluster) -> AsyncIterator[Routers]:
    await cluster.add_sim("sim-chat")
    made = Routers(cluster, MemoryResponseStore())
    try:
        yield made
    finally:
        await made.close()


def _names(store: MemoryResponseStore, response_id: str) -> list[str]:
    return [
        n for n in store.values if (p := parse_stored_name(n)) is not None and p.response_id == response_id
    ]


async def _follow_up_code(client: openai.AsyncOpenAI, previous: str) -> str | None:
    with pytest.raises(openai.APIStatusError) as caught:
        await client.responses.create(model="sim-chat", input="again", previous_response_id=previous)
    return caught.value.code


async def test_a_stored_conversation_is_sealed_and_named_by_its_owner(
    routers: Routers, openai_for: OpenAIFor
) -> None:
    router = await routers.start(_keys("k1"))
    api_key, record = routers.cluster.issue_key("team")
    key_id = record.key_id
    client = openai_for(router, api_key)
    stored = await client.responses.create(model="sim-chat", input="the secret plan is ZEBRA-42")
    (name,) = _names(routers.store, stored.id)
    value = routers.store.values[name]
    assert name.startswith(key_id + "/") and name.endswith(f".{len(value)}")
    assert (
        b"ZEBRA-42" not in value and b"secret plan" not in value and value.startswith(b"llmgw-sealed-1.k1.")
    )
    again = await client.responses.create(model="sim-chat", input="again", previous_response_id=stored.id)
    assert again.previous_response_id == stored.id


async def test_another_keys_conversation_is_not_found_even_copied_under_its_own_name(
    routers: Routers, openai_for: OpenAIFor
) -> None:
    router = await routers.start(_keys("k1"))
    alice, _ = routers.cluster.issue_key("alice")
    mallory, mallory_record = routers.cluster.issue_key("mallory")
    mallory_id = mallory_record.key_id
    theirs = await openai_for(router, alice).responses.create(model="sim-chat", input="alice's notes")
    thief = openai_for(router, mallory)
    assert await _follow_up_code(thief, theirs.id) == "previous_response_not_found"
    # Someone who can write the store moves alice's record into mallory's part of it:
    # it is bound to alice and its id, so it does not open for mallory.
    (name,) = _names(routers.store, theirs.id)
    value = routers.store.values[name]
    routers.store.values[f"{mallory_id}/{theirs.id}.{len(value)}"] = value
    assert await _follow_up_code(thief, theirs.id) == "previous_response_not_found"
    # Nor under another id of mallory's own.
    own = await thief.responses.create(model="sim-chat", input="mine")
    (own_name,) = _names(routers.store, own.id)
    routers.store.values[own_name] = value
    assert await _follow_up_code(thief, own.id) == "previous_response_not_found"


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda v: v[:-1] + bytes([v[-1] ^ 1]), id="a flipped bit of the tag"),
        pytest.param(lambda v: v[:40] + bytes([v[40] ^ 0x80]) + v[41:], id="a flipped bit of the text"),
        pytest.param(lambda v: v[:-200], id="cut short"),
        pytest.param(lambda v: b"llmgw-sealed-1.k1.", id="the header alone"),
        pytest.param(
            lambda v: b'{"owner":"","expires_at":9e99,"messages":[]}', id="plaintext written by hand"
        ),
        pytest.param(lambda v: v.replace(b".k1.", b".k9.", 1), id="another key id"),
    ],
)
async def test_a_tampered_record_is_not_found_and_the_router_serves_on(
    routers: Routers, openai_for: OpenAIFor, tamper: Any
) -> None:
    router = await routers.start(_keys("k1"))
    api_key, _ = routers.cluster.issue_key("team")
    client = openai_for(router, api_key)
    stored = await client.responses.create(model="sim-chat", input="hello")
    (name,) = _names(routers.store, stored.id)
    routers.store.values[name] = tamper(routers.store.values[name])
    assert await _follow_up_code(client, stored.id) == "previous_response_not_found"
    fresh = await client.responses.create(model="sim-chat", input="hello")
    assert (await client.responses.create(model="sim-chat", input="on", previous_response_id=fresh.id)).id


async def test_a_rotated_key_opens_old_records_seals_new_ones_and_once_retired_opens_none(
    routers: Routers, openai_for: OpenAIFor
) -> None:
    old, new = _keys("2026-06"), _keys("2026-12")
    first = await routers.start(old)
    api_key, _ = routers.cluster.issue_key("team")
    before = await openai_for(first, api_key).responses.create(model="sim-chat", input="under the old key")
    await routers.stop(first)
    # The operator rotates: the new key first (it seals), the old one after it (it opens).
    rotated = await routers.start(SealingKeys((*new.keys, *old.keys)))
    client = openai_for(rotated, api_key)
    follow = await client.responses.create(model="sim-chat", input="again", previous_response_id=before.id)
    (follow_name,) = _names(routers.store, follow.id)
    assert routers.store.values[follow_name].startswith(b"llmgw-sealed-1.2026-12.")
    await routers.stop(rotated)
    # The old key retired: what it sealed is not found, what the new one sealed still is.
    retired = openai_for(await routers.start(new), api_key)
    assert await _follow_up_code(retired, before.id) == "previous_response_not_found"
    assert (await retired.responses.create(model="sim-chat", input="on", previous_response_id=follow.id)).id


async def test_a_router_restarted_without_keys_stores_and_reads_nothing_and_says_so(
    routers: Routers, openai_for: OpenAIFor
) -> None:
    first = await routers.start(_keys("k1"))
    api_key, _ = routers.cluster.issue_key("team")
    stored = await openai_for(first, api_key).responses.create(model="sim-chat", input="hello")
    await routers.stop(first)
    before = dict(routers.store.values)
    client = openai_for(await routers.start(None), api_key)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="sim-chat", input="again", previous_response_id=stored.id)
    assert caught.value.code == "stored_responses_disabled" and "store set to false" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="sim-chat", input="x", store=True)
    assert caught.value.code == "stored_responses_disabled" and caught.value.param == "store"  # type: ignore[attr-defined]
    # store left at its default: answered, not stored, and the Response says so.
    answered = await client.responses.create(model="sim-chat", input="x")
    assert answered.store is False and answered.status in ("completed", "incomplete")
    streamed = [e async for e in await client.responses.create(model="sim-chat", input="x", stream=True)]
    assert streamed[-1].response.store is False  # type: ignore[union-attr]
    assert routers.store.values == before  # nothing written, nothing lost


async def test_a_key_at_its_quota_is_refused_before_the_engine_and_keeps_what_it_stored(
    routers: Routers, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    router = await routers.start(_keys("k1"), responses_max_per_key=3)
    api_key, _ = routers.cluster.issue_key("team")
    other_key, _ = routers.cluster.issue_key("other")
    client = openai_for(router, api_key)
    kept = [await client.responses.create(model="sim-chat", input=f"turn {n}") for n in range(3)]
    served = (await routers.cluster.engines[0].stats(http))["requests_total"]
    with pytest.raises(openai.RateLimitError) as caught:
        await client.responses.create(model="sim-chat", input="one more")
    error = caught.value
    assert error.code == "stored_responses_quota_exceeded" and error.type == "insufficient_quota"  # type: ignore[attr-defined]
    assert "3 stored responses" in error.message and "store set to false" in error.message
    assert error.response.headers["x-should-retry"] == "false"
    assert (await routers.cluster.engines[0].stats(http))[
        "requests_total"
    ] == served  # refused before the engine
    # Nothing lost: every stored one continues (a follow-up that stores is over too,
    # one that does not is served), store false is served, another key is not affected.
    for response in kept:
        unstored = await client.responses.create(
            model="sim-chat", input="go on", previous_response_id=response.id, store=False
        )
        assert unstored.previous_response_id == response.id
    assert (await openai_for(router, other_key).responses.create(model="sim-chat", input="mine")).store


async def test_parallel_stores_of_one_key_cannot_pass_its_quota_together(
    routers: Routers, openai_for: OpenAIFor
) -> None:
    router = await routers.start(_keys("k1"), responses_max_per_key=3)
    api_key, record = routers.cluster.issue_key("team")
    key_id = record.key_id
    client = openai_for(router, api_key)
    results = await asyncio.gather(
        *(client.responses.create(model="sim-chat", input=f"n{n}") for n in range(12)), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(refused) == 9 and len(results) - len(refused) == 3
    assert len([n for n in routers.store.values if n.startswith(key_id + "/")]) == 3


async def test_a_key_at_its_bytes_quota_is_refused_and_an_answer_that_overflows_it_says_so(
    routers: Routers, openai_for: OpenAIFor
) -> None:
    router = await routers.start(_keys("k1"), responses_max_bytes_per_key=3000)
    api_key, record = routers.cluster.issue_key("team")
    key_id = record.key_id
    client = openai_for(router, api_key)
    big = await client.responses.create(model="sim-chat", input="word " * 400)  # about 2 kB stored
    # The next one fits at the door (its input is small) but not once sealed with its answer.
    over = await client.responses.create(model="sim-chat", input="word " * 40, max_output_tokens=300)
    assert len(over.output_text) > 800
    assert await _follow_up_code(client, over.id) == "stored_responses_quota_exceeded"
    used = sum(len(v) for n, v in routers.store.values.items() if n.startswith(key_id + "/"))
    assert used <= 3000
    with pytest.raises(openai.RateLimitError):
        await client.responses.create(model="sim-chat", input="word " * 300)
    assert (
        await client.responses.create(model="sim-chat", input="on", previous_response_id=big.id, store=False)
    ).id


def test_the_keys_variable_is_checked_and_never_echoed() -> None:
    from llmgw.core.sealing import SealingKeysInvalid, parse_sealing_keys
    from llmgw.flags import RESPONSES_KEYS, SettingError

    good = base64.b64encode(b"k" * 32).decode()
    keys = parse_sealing_keys(f"new:{good}, old:{base64.b64encode(b'o' * 32).decode()}")
    assert [k.key_id for k in keys.keys] == ["new", "old"] and keys.sealing_id == "new"
    assert "kkkk" not in repr(keys)
    short = base64.b64encode(b"s" * 16).decode()
    for raw in (good, f"a:{short}", f"a:{good},a:{good}", "a:not base64!", f"a b:{good}", f":{good}", ""):
        with pytest.raises(SealingKeysInvalid):
            parse_sealing_keys(raw)
    with pytest.raises(SettingError) as caught:
        RESPONSES_KEYS.read({"LLMGW_RESPONSES_KEYS": f"a:{short}"})
    assert short not in str(caught.value) and "value not shown" in str(caught.value)
