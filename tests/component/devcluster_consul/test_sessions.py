"""Sessions and locks: create, acquire by two sessions, release, TTL expiry, lock-delay, behaviours.

py-consul refuses TTLs under 10 s, so short-TTL sessions are created with plain
HTTP, as any client may; the test settings allow TTLs down to 50 ms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import consul.aio
import consul.exceptions
import pytest
from aiohttp import ClientSession

from llmgw.devcluster.consul import ConsulStandIn

if TYPE_CHECKING:
    from conftest import Eventually, KeyExact


async def create_session(http: ClientSession, base: str, **body: object) -> str:
    async with http.put(base + "/v1/session/create", json=body) as resp:
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
    assert list(doc) == ["ID"]
    return str(doc["ID"])


async def test_two_sessions_race_for_a_lock_and_one_wins(
    server_client: consul.aio.Consul, key_exact: KeyExact
) -> None:
    a = await server_client.session.create(name="ctl-a", ttl=15)
    b = await server_client.session.create(name="ctl-b", ttl=15)
    _, info = await server_client.session.info(a)
    key_exact([info], "[]*SessionEntry")
    assert info is not None
    assert (info["Name"], info["Node"], info["TTL"], info["Behavior"], info["Checks"]) == (
        "ctl-a",
        "consul-server-1",
        "15s",
        "release",
        ["serfHealth"],
    )
    assert info["LockDelay"] == 100_000_000  # the test settings' default lock-delay, in ns

    assert await server_client.kv.put("llmgw/leader", "a", acquire=a) is True
    assert await server_client.kv.put("llmgw/leader", "b", acquire=b) is False
    _, entry = await server_client.kv.get("llmgw/leader")
    assert entry is not None
    assert (entry["Session"], entry["Value"], entry["LockIndex"]) == (a, b"a", 1)

    # Re-acquiring by the holder updates the value and keeps the lock index.
    assert await server_client.kv.put("llmgw/leader", "a2", acquire=a) is True
    _, entry = await server_client.kv.get("llmgw/leader")
    assert entry is not None and (entry["Value"], entry["LockIndex"]) == (b"a2", 1)

    # Only the holder can release.
    assert await server_client.kv.put("llmgw/leader", "x", release=b) is False
    assert await server_client.kv.put("llmgw/leader", "free", release=a) is True
    _, entry = await server_client.kv.get("llmgw/leader")
    assert entry is not None and "Session" not in entry and entry["Value"] == b"free"

    # A voluntary release has no lock-delay: b takes it at once; the lock index counts acquisitions.
    assert await server_client.kv.put("llmgw/leader", "b", acquire=b) is True
    _, entry = await server_client.kv.get("llmgw/leader")
    assert entry is not None and (entry["Session"], entry["LockIndex"]) == (b, 2)

    _, sessions = await server_client.session.list()
    key_exact(sessions, "[]*SessionEntry")
    assert sorted(s["ID"] for s in sessions) == sorted([a, b])


async def test_ttl_expiry_releases_the_lock_after_lock_delay(
    standin: ConsulStandIn, server_client: consul.aio.Consul, http: ClientSession, eventually: Eventually
) -> None:
    holder = await create_session(http, standin.url, Name="holder", TTL="200ms", LockDelay="300ms")
    waiter = await create_session(http, standin.url, Name="waiter", TTL="10s")
    assert await server_client.kv.put("llmgw/leader", "holder", acquire=holder) is True
    # Renewing keeps it alive past its TTL...
    for _ in range(3):
        renewed = await server_client.session.renew(holder)
        assert renewed["ID"] == holder
    assert await server_client.kv.put("llmgw/leader", "waiter", acquire=waiter) is False

    # ...and without renewals it is invalidated (within 2 x TTL) and its lock released.
    async def released() -> bool:
        _, entry = await server_client.kv.get("llmgw/leader")
        return entry is not None and "Session" not in entry

    await eventually(released)
    assert (await server_client.session.info(holder))[1] is None
    with pytest.raises(consul.exceptions.NotFound):
        await server_client.session.renew(holder)
    # Lock-delay: the key cannot be taken for 300 ms after the holder was invalidated.
    assert await server_client.kv.put("llmgw/leader", "waiter", acquire=waiter) is False

    async def acquired() -> bool:
        return bool(await server_client.kv.put("llmgw/leader", "waiter", acquire=waiter))

    await eventually(acquired)


async def test_destroy_with_delete_behavior_removes_held_keys(
    standin: ConsulStandIn, server_client: consul.aio.Consul, http: ClientSession
) -> None:
    sid = await create_session(http, standin.url, Behavior="delete", LockDelay="0s")
    assert await server_client.kv.put("ephemeral/ctl-1", "here", acquire=sid) is True
    assert await server_client.kv.put("ephemeral/other", "stays") is True
    assert await server_client.session.destroy(sid) is True
    assert (await server_client.kv.get("ephemeral/ctl-1"))[1] is None
    assert (await server_client.kv.get("ephemeral/other"))[1] is not None
    assert await server_client.session.destroy(sid) is True  # destroying twice is fine


async def test_session_on_a_failed_node_is_invalidated(
    standin: ConsulStandIn, http: ClientSession, eventually: Eventually
) -> None:
    node1 = standin.agent_url("node-1")
    sid = await create_session(http, node1, Name="on-node-1")
    async with http.get(f"{node1}/v1/session/node/node-1") as resp:
        assert [s["ID"] for s in await resp.json()] == [sid]
    async with http.put(f"{node1}/v1/kv/lock?acquire={sid}") as resp:
        assert await resp.json() is True
    standin.fail_node("node-1")
    async with http.get(f"{standin.url}/v1/session/info/{sid}") as resp:
        assert await resp.json() == []
    async with http.get(f"{standin.url}/v1/kv/lock") as resp:
        assert "Session" not in (await resp.json())[0]
    # Consul refuses a session whose checks are critical.
    async with http.put(f"{node1}/v1/session/create", json={}) as resp:
        assert (resp.status, await resp.text()) == (500, "Check 'serfHealth' is in critical state")


async def test_session_validation(
    standin: ConsulStandIn, http: ClientSession, server_client: consul.aio.Consul
) -> None:
    async with http.put(standin.url + "/v1/session/create", json={"TTL": "1ms"}) as resp:
        assert resp.status == 500
        assert (await resp.text()).startswith("Invalid Session TTL '1ms'")
    async with http.put(standin.url + "/v1/session/create", json={"Behavior": "explode"}) as resp:
        assert (resp.status, await resp.text()) == (400, "Invalid Behavior setting 'explode'")
    async with http.put(standin.url + "/v1/session/create", json={"Checks": ["nope"]}) as resp:
        assert (resp.status, await resp.text()) == (500, "Missing check 'nope' registration")
    with pytest.raises(consul.exceptions.ConsulException, match="Invalid session"):
        await server_client.kv.put("k", "v", acquire="00000000-0000-0000-0000-00000000dead")
    # A number under 1000 is seconds, as Consul's FixupLockDelay reads it.
    sid = await create_session(http, standin.url, LockDelay=7, Checks=[])
    _, info = await server_client.session.info(sid)
    assert info is not None and (info["LockDelay"], info["Checks"]) == (7_000_000_000, [])


def test_lock_delay_is_cut_to_consuls_60_second_cap() -> None:
    """Consul applies at most structs.MaxLockDelay (60 s) whatever a session asked for
    (agent/consul/state/session.go, "Enforce the max lock delay"); the store's clock is a
    parameter, so an hour-long lock-delay is checked without waiting."""
    from llmgw.devcluster.consul import ConsulSettings, ConsulState
    from llmgw.devcluster.consul.decoding import decode_session_create

    state = ConsulState(ConsulSettings())
    state.add_node("gpu-1", "127.0.0.1")
    holder = state.session_create("gpu-1", decode_session_create(b'{"LockDelay": "1h"}'), 0.0)
    waiter = state.session_create("gpu-1", decode_session_create(b'{"LockDelay": "1h"}'), 0.0)
    assert holder.lock_delay == 3600.0  # kept as asked (session info shows it)...
    assert state.kv_put("llmgw/leader", b"h", 0, 0.0, acquire=holder.session_id) is True
    state.session_destroy(holder.session_id, 100.0)
    assert state.kv_put("llmgw/leader", b"w", 0, 159.0, acquire=waiter.session_id) is False
    # ...but applied for 60 s only.
    assert state.kv_put("llmgw/leader", b"w", 0, 160.5, acquire=waiter.session_id) is True


def test_a_session_on_a_check_the_agent_has_not_synced_yet_is_refused_until_it_lands() -> None:
    """An agent answers a registration once its local state has the check and syncs it
    to the servers afterwards (agent/local/state.go, TriggerSyncChanges); the servers
    validate a session's checks against their catalog (agent/consul/state/session.go,
    validateSessionChecksTxn), so a session created at once can meet a 500."""
    from llmgw.devcluster.consul import ConsulSettings, ConsulState
    from llmgw.devcluster.consul.decoding import decode_service_registration, decode_session_create
    from llmgw.devcluster.consul.model import ConsulError

    settings = ConsulSettings()
    state = ConsulState(settings)
    state.add_node("gpu-1", "127.0.0.1")
    service = (
        b'{"ID": "ctl", "Name": "ctl", "Check": {"CheckID": "alive", "TTL": "10s", "Status": "passing"}}'
    )
    state.register_service("gpu-1", decode_service_registration(service), 0.0, replace_existing_checks=False)
    tied = decode_session_create(b'{"NodeChecks": ["serfHealth"], "ServiceChecks": [{"ID": "alive"}]}')
    with pytest.raises(ConsulError) as refused:
        state.session_create("gpu-1", tied, 0.0)
    assert (refused.value.status, refused.value.message) == (500, "Missing check 'alive' registration")
    landed = settings.catalog_sync_delay
    assert state.session_create("gpu-1", tied, landed).checks == ("serfHealth", "alive")
    # Registering the same check again does not unsync it.
    state.register_service(
        "gpu-1", decode_service_registration(service), landed, replace_existing_checks=False
    )
    assert state.session_create("gpu-1", tied, landed).checks == ("serfHealth", "alive")
