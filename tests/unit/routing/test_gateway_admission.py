"""What every request goes through before the dispatcher, without a server: the per-model
gates (free slot, FIFO queue, timeouts, hand-off on cancellation) and the routes the
catalog holder works out once per name (and forgets when the catalog changes)."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.records import CatalogVersion
from llmgw.core.routing import Api
from llmgw.gateway.catalogs import ROUTES_KEPT, CatalogHolder
from llmgw.gateway.errors import ApiError
from llmgw.gateway.limits import ModelGates

CATALOG_V1 = """
models:
  big:   {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  small: {roles: [chat, completion], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  judge: {roles: [guard], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
aliases:
  gpt-4o: big
fallbacks:
  big: [small]
guard_policies:
  safe:
    judge: judge
    models: [small]
"""

CATALOG_V2 = """
models:
  big:   {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
  small: {roles: [chat, completion], profiles: [{engine: sim}], scaling: {min: 1, max: 1}}
aliases:
  gpt-4o: small
"""


def _holder(text: str = CATALOG_V1) -> CatalogHolder:
    holder = CatalogHolder(read_security_policy())
    assert holder.update(CatalogVersion.of(1, text, "test", 0.0), now=0.0)
    return holder


# --- gates ------------------------------------------------------------------------------------------


async def test_a_free_slot_is_taken_at_once_and_given_back() -> None:
    gates = ModelGates(concurrency=2, queue=0, queue_timeout=1.0, retry_after=1)
    assert gates.enter_now("m") and gates.enter_now("m")
    assert not gates.enter_now("m")  # both taken
    assert gates.running("m") == 2
    gates.release("m")
    gates.release("m")
    assert (gates.running("m"), gates.queued("m")) == (0, 0)
    assert gates.enter_now("m")  # nothing left over from before


async def test_a_full_queue_refuses_at_once_and_a_long_wait_times_out() -> None:
    gates = ModelGates(concurrency=1, queue=1, queue_timeout=0.05, retry_after=3)
    assert gates.enter_now("m")
    waiting = asyncio.create_task(gates.enter("m"))
    await asyncio.sleep(0)
    assert gates.queued("m") == 1
    with pytest.raises(ApiError) as full:
        await gates.enter("m")  # the queue's one place is taken
    assert (full.value.refusal.status, full.value.refusal.retry_after) == (429, 3)
    with pytest.raises(ApiError):
        await waiting  # no slot came within the queue timeout
    assert (gates.running("m"), gates.queued("m")) == (1, 0)


async def test_waiters_get_freed_slots_in_arrival_order() -> None:
    gates = ModelGates(concurrency=1, queue=5, queue_timeout=5.0, retry_after=1)
    assert gates.enter_now("m")
    order: list[int] = []

    async def wait(n: int) -> None:
        await gates.enter("m")
        order.append(n)

    tasks = [asyncio.create_task(wait(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert not gates.enter_now("m")  # a newcomer does not jump the queue
    for _ in range(3):
        gates.release("m")
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    gates.release("m")
    assert (gates.running("m"), gates.queued("m")) == (0, 0)


async def test_a_waiter_cancelled_as_its_slot_came_passes_the_slot_on() -> None:
    gates = ModelGates(concurrency=1, queue=5, queue_timeout=5.0, retry_after=1)
    assert gates.enter_now("m")
    first = asyncio.create_task(gates.enter("m"))
    second = asyncio.create_task(gates.enter("m"))
    await asyncio.sleep(0)
    gates.release("m")  # the slot goes to `first`...
    first.cancel()  # ...which is cancelled before it runs again
    await asyncio.sleep(0)
    await second  # the slot went on to the next waiter
    assert first.cancelled()
    assert (gates.running("m"), gates.queued("m")) == (1, 0)
    gates.release("m")
    assert gates.running("m") == 0


# --- routes -----------------------------------------------------------------------------------------


def test_a_route_names_the_model_its_chain_and_whether_a_guard_screens_it() -> None:
    holder = _holder()
    route = holder.route("gpt-4o", Api.CHAT, None)
    assert route is not None
    assert (route.model, route.chain) == ("big", ("big", "small"))
    assert route.serves_api and route.guarded  # the guard covers the fallback
    completion = holder.route("big", Api.COMPLETIONS, None)
    assert completion is not None and not completion.serves_api
    assert holder.route("gpt-5", Api.CHAT, None) is None


def test_a_key_limited_to_one_model_gets_no_fallback_it_may_not_use() -> None:
    holder = _holder()
    route = holder.route("big", Api.CHAT, ("big",))
    assert route is not None and route.chain == ("big",) and not route.guarded
    assert holder.route("small", Api.CHAT, ("big",)) is None  # unknown to that key
    everyone = holder.route("big", Api.CHAT, None)
    assert everyone is not None and everyone.chain == ("big", "small")  # not the key's


def test_routes_follow_a_new_catalog() -> None:
    holder = _holder()
    first = holder.route("gpt-4o", Api.CHAT, None)
    assert first is not None and first.model == "big"
    assert holder.update(CatalogVersion.of(2, CATALOG_V2, "test", 0.0), now=1.0)
    then = holder.route("gpt-4o", Api.CHAT, None)
    assert then is not None and (then.model, then.chain, then.guarded) == ("small", ("small",), False)


def test_a_catalog_that_does_not_load_keeps_the_routes_of_the_last_good_one() -> None:
    holder = _holder()
    assert not holder.update(CatalogVersion.of(2, "models: [", "test", 0.0), now=1.0)
    route = holder.route("gpt-4o", Api.CHAT, None)
    assert route is not None and route.model == "big"


def test_made_up_names_are_not_kept() -> None:
    holder = _holder()
    for n in range(ROUTES_KEPT + 10):
        assert holder.route(f"no-such-model-{n}", Api.CHAT, None) is None
    assert holder.route("big", Api.CHAT, None) is not None
    assert len(holder._routes) == 1
