"""The operator's drain and restart, from the admin API's call to the replicas.

Two halves, each on real pieces where it matters:

- the command path on the Consul stand-in (real sockets, the real Consul adapter): the
  admin API's endpoint, ``OperatorCommands``, the record in KV, its compare-and-set, its
  watch (what every control-plane instance reads);
- the control plane on recorded fakes and virtual time (``ControlHarness``): what the
  recorded commands do to Nomad's jobs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from llmgw.adapters.consul import (
    ApiKeyStore,
    CatalogStore,
    ClientSettings,
    ConsulClient,
    CorruptRecord,
    StatusPublisher,
    WatchSettings,
)
from llmgw.admin import AdminDeps, AdminSettings, start_admin
from llmgw.cli.serving import AdminModelCommands
from llmgw.control import ControlSettings
from llmgw.control.commands import ModelCommandStore, OperatorCommands, command_key
from llmgw.core import conventions as c
from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.core.planning import ModelCommand, PlanningSettings, model_key
from llmgw.core.records import CatalogVersion
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.render import Renderer, RenderSettings
from llmgw.settings import ConsulConnection
from tests.support.control import ControlHarness, FakeCommands, FakeWatch

CATALOG = """
models:
  chat:
    profiles:
      - engine: sim
        tp: 1
        gpu: {model: H100}
    scaling: {min: 2, max: 2}
  org/other:
    profiles:
      - engine: sim
        tp: 1
        gpu: {model: H100}
    scaling: {min: 1, max: 1}
"""
CHANGED = CATALOG.replace("scaling: {min: 2, max: 2}", "scaling: {min: 1, max: 1}")

FAST_CLIENT = ClientSettings(request_timeout=2.0, blocking_slack=0.5)
FAST_WATCH = WatchSettings(wait=1.0, min_interval=0.01, burst=2, backoff_initial=0.02, backoff_max=0.1)


def key_of(policy: SecurityPolicy, text: str, model: str) -> str:
    loaded = load_catalog(text, filename="t.yaml", policy=policy).catalog
    assert loaded is not None
    return model_key(loaded.models[model])


# --- the command path on the Consul stand-in -------------------------------------------------------


@pytest.fixture
async def consul() -> AsyncIterator[ConsulClient]:
    async with ConsulStandIn(ConsulSettings.for_tests()) as standin:
        client = ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": standin.url}), FAST_CLIENT)
        async with client:
            yield client


async def applied(consul: ConsulClient, text: str = CATALOG) -> CatalogStore:
    store = CatalogStore(consul)
    current = await store.current()
    await store.apply(
        CatalogVersion.of((current.version + 1) if current else 1, text, "test", time.time()),
        current.version if current else None,
    )
    return store


def commands_on(consul: ConsulClient, policy: SecurityPolicy, **kw: Any) -> OperatorCommands:
    return OperatorCommands(ModelCommandStore(consul), CatalogStore(consul), policy, **kw)


async def test_drain_records_the_model_as_the_catalog_has_it_and_every_instance_sees_it(
    consul: ConsulClient, test_policy: SecurityPolicy
) -> None:
    await applied(consul)
    store = ModelCommandStore(consul)
    watch = store.watch(FAST_WATCH)
    async with watch:
        assert await watch.wait_ready() == {}
        seen = watch.generation
        commands = commands_on(consul, test_policy, replicas=lambda m: [f"llmgw-{m}-b", f"llmgw-{m}-a"])
        receipt = await commands.drain("org/other", actor="ops via ci")
        assert receipt.replicas == ("llmgw-org/other-a", "llmgw-org/other-b")
        assert "draining org/other" in receipt.message and "2 replica(s)" in receipt.message
        records = await asyncio.wait_for(watch.wait_changed(seen), 5)
    command = records["org/other"]
    assert command.drained_key == key_of(test_policy, CATALOG, "org/other")
    assert (command.drained_by, command.restart_generation) == ("ops via ci", 0)
    # The key is one segment whatever the model's name is.
    entry, _ = await consul.kv_get(command_key("org/other"))
    assert entry is not None and entry.key.startswith(c.KV_COMMANDS_PREFIX) and entry.key.count("/") == 2

    again = await commands.drain("org/other", actor="someone else")
    assert "already drained (by ops via ci)" in again.message
    entry_after, _ = await consul.kv_get(command_key("org/other"))
    assert entry_after is not None and entry_after.modify_index == entry.modify_index  # nothing written


async def test_restart_raises_the_generation_and_ends_a_drain(
    consul: ConsulClient, test_policy: SecurityPolicy
) -> None:
    await applied(consul)
    commands = commands_on(consul, test_policy)
    store = ModelCommandStore(consul)
    first = await commands.restart("chat", actor="a")
    assert "generation 1" in first.message and "no replicas now" in first.message
    await commands.drain("chat", actor="b")
    second = await commands.restart("chat", actor="c")
    assert "generation 2" in second.message and "The drain ends." in second.message
    command = await store.get("chat")
    assert command is not None
    assert (command.restart_generation, command.restarted_by, command.drain_requested) == (2, "c", False)


async def test_concurrent_commands_from_two_instances_all_count(
    consul: ConsulClient, test_policy: SecurityPolicy
) -> None:
    await applied(consul)
    one, two = commands_on(consul, test_policy), commands_on(consul, test_policy)
    await asyncio.gather(*(cmd.restart("chat", actor=f"op{i}") for i, cmd in enumerate([one, two] * 4)))
    command = await ModelCommandStore(consul).get("chat")
    assert command is not None and command.restart_generation == 8


async def test_a_model_the_catalog_does_not_have_is_refused_and_nothing_is_written(
    consul: ConsulClient, test_policy: SecurityPolicy
) -> None:
    commands = commands_on(consul, test_policy)
    with pytest.raises(LookupError, match="no catalog has been applied"):
        await commands.drain("chat", actor="a")
    await applied(consul)
    with pytest.raises(LookupError, match="no model 'nope' in the applied catalog"):
        await commands.restart("nope", actor="a")
    entries, _ = await consul.kv_list(c.KV_COMMANDS_PREFIX)
    assert entries == []


async def test_a_record_llmgw_did_not_write_is_skipped_by_the_watch_and_refused_by_a_command(
    consul: ConsulClient, test_policy: SecurityPolicy
) -> None:
    await applied(consul)
    await consul.kv_put(command_key("chat"), b'{"model": "chat", "restart_generation": "many"}')
    await consul.kv_put(command_key("org/other"), json.dumps({"model": "chat"}).encode())  # wrong key
    watch = ModelCommandStore(consul).watch(FAST_WATCH)
    async with watch:
        assert await asyncio.wait_for(watch.wait_ready(), 5) == {}
    with pytest.raises(CorruptRecord, match="restart_generation"):
        await commands_on(consul, test_policy).restart("chat", actor="a")


async def test_end_drain_clears_only_the_drain_it_names(
    consul: ConsulClient, test_policy: SecurityPolicy
) -> None:
    await applied(consul)
    store = ModelCommandStore(consul)
    await commands_on(consul, test_policy).drain("chat", actor="a")
    await store.end_drain("chat", "some-older-key")
    still = await store.get("chat")
    assert still is not None and still.drain_requested
    await store.end_drain("chat", still.drained_key)
    assert await store.get("chat") == ModelCommand("chat")
    await store.end_drain("never-commanded", "k")  # nothing there: fine, nothing written
    assert await store.get("never-commanded") is None


async def test_the_admin_api_drains_and_restarts_through_the_control_planes_commands(
    consul: ConsulClient, shipped_policy: SecurityPolicy
) -> None:
    catalogs = await applied(consul)
    commands = OperatorCommands(
        ModelCommandStore(consul), catalogs, shipped_policy, replicas=lambda m: ["llmgw-chat-r1"]
    )
    listener = await start_admin(
        AdminSettings(host="127.0.0.1", port=0),
        AdminDeps(
            catalogs=catalogs,
            keys=ApiKeyStore(consul),
            status=StatusPublisher(consul),
            policy=shipped_policy,
            renderer=Renderer(RenderSettings(), shipped_policy),
            models=AdminModelCommands(commands),
        ),
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def post(path: str) -> tuple[int, dict[str, Any]]:
                async with http.post(
                    f"{listener.url}/admin/v1/models/{path}",
                    data="{}",
                    headers={"Content-Type": "application/json", "X-Llmgw-Actor": "alice"},
                ) as response:
                    return response.status, await response.json()

            status, body = await post("chat/drain")
            assert status == 202, body
            assert body["replicas"] == ["llmgw-chat-r1"] and "draining chat" in body["message"]
            status, body = await post("chat/restart")
            assert status == 202 and "The drain ends." in body["message"]
            status, body = await post("nope/drain")
            assert (status, body["error"]["code"]) == (404, "no_model")
    finally:
        await listener.stop()
    command = await ModelCommandStore(consul).get("chat")
    assert command is not None
    assert command.restart_generation == 1 and command.restarted_by.startswith("alice")


# --- what the recorded commands do, on the plane with fakes ---------------------------------------------

FAST = ControlSettings(
    planning=PlanningSettings(backoff_base=5.0, backoff_jitter=0.0, drain_min=1.0, drain_timeout=60.0),
    resync_interval=600.0,
)


def harness(policy: SecurityPolicy, **kw: Any) -> ControlHarness:
    h = ControlHarness(CATALOG, policy, settings=FAST, **kw)
    for i in range(4):
        h.cluster.add_node(f"n{i}")
    return h


def generation_of(h: ControlHarness, job_id: str) -> int:
    return int(h.cluster.jobs[job_id].job["Meta"].get(c.JOB_META_RESTART_GENERATION, "0"))


async def test_the_plane_drains_a_drained_model_and_places_nothing_for_it(
    test_policy: SecurityPolicy,
) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        chat = h.cluster.healthy_jobs("chat")
        other = h.cluster.running_jobs("org/other")
        assert len(chat) == 2
        h.commands.drain("chat", key_of(test_policy, CATALOG, "chat"), by="ops", at=h.clock.now)
        await h.advance(1.0)
        assert set(h.marks.watch.latest or {}) == set(chat)  # routers are told at once
        await h.advance(30)
        assert sorted(h.nomad.called("deregister")) == sorted(chat)
        assert h.cluster.running_jobs("chat") == [] and h.cluster.running_jobs("org/other") == other
        registers = len(h.nomad.called("register"))
        await h.advance(60)
        assert len(h.nomad.called("register")) == registers
        (status,) = [m for m in h.status.last()["models"] if m["model"] == "chat"]
        assert status["desired"] == 0 and "drained by ops" in status["scaling"]


async def test_the_plane_rolls_a_restarted_model_with_the_generation_in_job_meta(
    test_policy: SecurityPolicy,
) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        old = set(h.cluster.healthy_jobs("chat"))
        h.commands.restart("chat", by="ops", at=h.clock.now)
        lowest = 2
        for _ in range(60):
            await h.advance(1)
            lowest = min(lowest, len(h.cluster.healthy_jobs("chat")))
        new = set(h.cluster.running_jobs("chat"))
        assert len(new) == 2 and not new & old and lowest >= 2
        assert {generation_of(h, j) for j in new} == {1}
        assert h.cluster.running_jobs("org/other") and not set(h.nomad.called("deregister")) - old


async def test_a_catalog_change_ends_a_drain_through_the_command_store(test_policy: SecurityPolicy) -> None:
    async with harness(test_policy) as h:
        await h.advance(20)
        key = key_of(test_policy, CATALOG, "chat")
        h.commands.drain("chat", key, by="ops", at=h.clock.now)
        await h.advance(30)
        assert h.cluster.running_jobs("chat") == []
        h.apply_catalog(CHANGED)
        await h.advance(30)
        assert h.commands.ended == [("chat", key)]
        assert not (h.commands.watch.latest or {})["chat"].drain_requested
        assert len(h.cluster.healthy_jobs("chat")) == 1


async def test_nothing_is_decided_before_the_commands_have_been_read(test_policy: SecurityPolicy) -> None:
    unread: FakeWatch[Any] = FakeWatch(None, ready=False)
    h = harness(test_policy, commands=FakeCommands(unread))
    async with h:
        await h.advance(10)
        assert h.nomad.called("register") == []
        assert "model commands" in h.status.last()["note"]
        unread.set({})
        await h.advance(20)
        assert len(h.cluster.healthy_jobs("chat")) == 2


async def test_a_stopped_replica_leaves_the_view_even_when_nomad_sends_no_purge_event(
    test_policy: SecurityPolicy,
) -> None:
    # Nomad before 1.7.5 (and the dev stand-in) emits no JobDeregistered event for a purge;
    # the stopped allocations' events alone kept the job in the view until the next resync.
    h = harness(test_policy)
    h.cluster.purge_events = False
    async with h:
        await h.advance(20)
        h.commands.drain("chat", key_of(test_policy, CATALOG, "chat"), by="ops", at=h.clock.now)
        await h.advance(10)
        assert h.cluster.running_jobs("chat") == []
        jobs, _ = h.plane.view.snapshot()
        assert [j for j in jobs.values() if j.model == "chat"] == []
        (status,) = [m for m in h.status.last()["models"] if m["model"] == "chat"]
        assert status["replicas"] == []
