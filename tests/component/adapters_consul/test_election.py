"""LeaderElection against the Consul stand-in: one leader at a time, handover when
the leader's session dies, stops or is cut off, and never two leaders at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import aiohttp
import pytest

from llmgw.adapters.consul import (
    ClientSettings,
    ConsulClient,
    ConsulSettingsError,
    ElectionSettings,
    LeaderElection,
)
from llmgw.core.conventions import KV_LEADER
from llmgw.devcluster.consul import ConsulStandIn, OutageMode
from llmgw.devcluster.partition import TcpProxy
from llmgw.settings import ConsulConnection

if TYPE_CHECKING:
    from conftest import Eventually

# TTL 0.5 s, renewed every 0.1 s, lock-delay = TTL (the safety minimum).
FAST = ElectionSettings(
    ttl=0.5,
    renew_interval=0.1,
    lock_delay=0.5,
    safety_margin=0.05,
    acquire_retry_interval=0.05,
    backoff_initial=0.02,
    backoff_max=0.1,
    key_wait=1.0,
)


class OverlapMonitor:
    """Samples every elector's is_leader on each loop turn and records any instant
    at which more than one claims leadership."""

    def __init__(self, electors: list[LeaderElection]) -> None:
        self.electors = electors
        self.overlaps: list[list[str]] = []
        self.leaders_seen: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            leaders = [e.instance_id for e in self.electors if e.is_leader]
            if len(leaders) > 1:
                self.overlaps.append(leaders)
            if len(leaders) == 1 and (not self.leaders_seen or self.leaders_seen[-1] != leaders[0]):
                self.leaders_seen.append(leaders[0])
            await asyncio.sleep(0.001)  # a sampler: it looks at every elector each millisecond

    def __enter__(self) -> OverlapMonitor:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


QUICK_CLIENT = ClientSettings(connect_timeout=0.5, request_timeout=1.0, blocking_slack=0.5)


def leader_of(electors: list[LeaderElection]) -> list[LeaderElection]:
    return [e for e in electors if e.is_leader]


@contextlib.asynccontextmanager
async def electors(
    *clients: ConsulClient, settings: ElectionSettings = FAST, first: int = 0
) -> AsyncIterator[list[LeaderElection]]:
    group = [LeaderElection(cl, f"ctl-{first + i}", settings) for i, cl in enumerate(clients)]
    try:
        for e in group:
            await e.start()
        yield group
    finally:
        for e in group:
            await e.stop()


async def destroy_session(url: str, session_id: str) -> None:
    async with aiohttp.ClientSession() as http, http.put(f"{url}/v1/session/destroy/{session_id}") as resp:
        assert resp.status == 200


async def test_one_of_two_leads_and_the_key_names_it(client: ConsulClient, eventually: Eventually) -> None:
    async with electors(client, client) as group:
        await eventually(lambda: len(leader_of(group)) == 1)
        leader = leader_of(group)[0]
        term = await leader.wait_for_leadership()
        assert term.number == 1 and not term.lost.is_set()
        assert await group[0].leader() == leader.instance_id
        entry, _ = await client.kv_get(KV_LEADER)
        assert entry is not None and entry.session == leader.session_id
        # The other keeps waiting: it never leads while the leader is healthy. Three TTLs
        # without a change is the claim, so this sleep is the test, not a wait for something.
        await asyncio.sleep(FAST.ttl * 3)
        assert leader_of(group) == [leader] and not term.lost.is_set()


async def test_destroying_the_leaders_session_hands_over_without_overlap(
    standin: ConsulStandIn, client: ConsulClient, eventually: Eventually
) -> None:
    async with electors(client, client) as group:
        await eventually(lambda: len(leader_of(group)) == 1)
        with OverlapMonitor(group) as monitor:
            for _ in range(4):
                old = leader_of(group)[0]
                term = await old.wait_for_leadership()
                dead = old.session_id
                assert dead is not None
                await destroy_session(standin.url, dead)
                await eventually(term.lost.is_set)
                assert term.reason is not None
                # A new term under a new session: either instance may win it (the old
                # leader campaigns again with a fresh session).
                await eventually(lambda dead=dead: [e.session_id != dead for e in leader_of(group)] == [True])
        assert monitor.overlaps == []


async def test_a_clean_stop_releases_the_lock_for_the_other(
    client: ConsulClient, eventually: Eventually
) -> None:
    slow_retry = ElectionSettings(
        ttl=0.5, renew_interval=0.1, lock_delay=30.0, safety_margin=0.05, acquire_retry_interval=0.05
    )
    async with electors(client, client, settings=slow_retry) as group:
        await eventually(lambda: len(leader_of(group)) == 1)
        with OverlapMonitor(group) as monitor:
            old = leader_of(group)[0]
            await old.stop()
            assert not old.is_leader
            # A 30 s lock-delay would hold the successor back had the lock not been released.
            await eventually(lambda: len(leader_of(group)) == 1, within=5.0)
        assert monitor.overlaps == []
        entry, _ = await client.kv_get(KV_LEADER)
        assert entry is not None and entry.session == leader_of(group)[0].session_id


async def test_leadership_context_yields_a_term_and_resigns(
    client: ConsulClient, eventually: Eventually, caplog: pytest.LogCaptureFixture
) -> None:
    election = LeaderElection(client, "ctl-solo", FAST)
    caplog.set_level(logging.INFO, logger="llmgw.adapters.consul.election")
    async with election.leadership() as term:
        assert election.is_leader and election.term is term
    assert term.lost.is_set() and not election.is_leader
    # A deliberate stop (Ctrl-C of llmgw dev or serve) steps down: news, not a warning.
    (ended,) = [r for r in caplog.records if "(term 1)" in r.getMessage() and "leads" not in r.getMessage()]
    assert (ended.levelno, ended.getMessage()) == (
        logging.INFO,
        "leader election: ctl-solo stepping down (term 1): this instance is stopping",
    )
    entry, _ = await client.kv_get(KV_LEADER)
    assert entry is not None and entry.session == ""  # released, not left to expire


async def test_a_failed_renewal_ends_the_term_at_once_and_leadership_returns(
    standin: ConsulStandIn, client: ConsulClient, eventually: Eventually, caplog: pytest.LogCaptureFixture
) -> None:
    async with electors(client) as (solo,):
        term = await asyncio.wait_for(solo.wait_for_leadership(), 5)
        await standin.start_outage(OutageMode.NO_LEADER)
        await eventually(lambda: term.lost.is_set())
        assert not solo.is_leader
        lost = [r for r in caplog.records if "lost leadership" in r.getMessage()]
        assert [r.levelno for r in lost] == [logging.WARNING], "a real loss of leadership warns"
        await standin.end_outage()
        again = await asyncio.wait_for(solo.wait_for_leadership(), 5)
        assert again.number > term.number


async def test_a_partitioned_leader_stops_before_anyone_else_starts(
    standin: ConsulStandIn, client: ConsulClient, proxy: TcpProxy, eventually: Eventually
) -> None:
    """The leader's connection to Consul goes silent (requests hang, nothing is
    refused): it hears nothing, yet must step down by its own deadline, before
    Consul expires its session (2 x TTL) and lets the other in (plus lock-delay)."""
    cut_off = ConsulClient(
        ConsulConnection.from_env({"CONSUL_HTTP_ADDR": proxy.url}),
        ClientSettings(request_timeout=5.0, blocking_slack=0.5),
    )
    async with cut_off, electors(cut_off) as (first,):
        await asyncio.wait_for(first.wait_for_leadership(), 5)
        async with electors(client) as (second,):
            second_group = [first, second]
            with OverlapMonitor(second_group) as monitor:
                loop = asyncio.get_running_loop()
                proxy.freeze()
                frozen_at = loop.time()
                await eventually(lambda: not first.is_leader)
                stepped_down_after = loop.time() - frozen_at
                await eventually(lambda: second.is_leader, within=10.0)
                took_over_after = loop.time() - frozen_at
            assert monitor.overlaps == []
            # Facts of the protocol, not speed: the old leader gave up within its TTL;
            # the new one could only start after the session died and lock-delay passed.
            assert stepped_down_after <= FAST.ttl + 0.2
            assert took_over_after >= FAST.lock_delay
            proxy.thaw()


async def test_a_failed_node_invalidates_the_leaders_session(
    standin: ConsulStandIn,
    connector: Callable[[str], ConsulClient],
    client: ConsulClient,
    eventually: Eventually,
) -> None:
    await standin.add_node("ctl-node", "127.0.0.3")
    on_node = connector(standin.agent_url("ctl-node"))  # its session lives on ctl-node
    async with on_node, electors(on_node) as (first,):
        term = await asyncio.wait_for(first.wait_for_leadership(), 5)
        async with electors(client) as (second,):
            with OverlapMonitor([first, second]) as monitor:
                standin.fail_node("ctl-node")
                await eventually(lambda: term.lost.is_set())
                await eventually(lambda: second.is_leader)
            assert monitor.overlaps == []


def test_settings_refuse_a_lock_delay_shorter_than_the_ttl() -> None:
    with pytest.raises(ConsulSettingsError, match="lock_delay"):
        ElectionSettings(ttl=15, lock_delay=5)
    with pytest.raises(ConsulSettingsError, match="renew_interval"):
        ElectionSettings(ttl=15, renew_interval=15)
    with pytest.raises(ConsulSettingsError, match="MaxLockDelay"):
        ElectionSettings(ttl=90, lock_delay=90)  # Consul would apply 60 s: no longer >= the ttl


async def test_a_crashed_leaders_session_ends_with_its_process_check_not_after_twice_the_ttl(
    standin: ConsulStandIn, client: ConsulClient, proxy: TcpProxy, eventually: Eventually
) -> None:
    """The leader's session is tied to a TTL check its process passes on the local agent.
    When the process is gone (here: nothing it sends arrives, as after a crash) the check
    goes critical within its TTL and Consul invalidates the session at once; the other
    takes over after lock-delay, well before Consul's 2 x TTL expiry would have let it."""
    settings = ElectionSettings(
        ttl=2.0,
        renew_interval=0.5,
        lock_delay=2.0,
        safety_margin=0.2,
        process_check_ttl=0.3,
        acquire_retry_interval=0.05,
        backoff_initial=0.02,
        backoff_max=0.1,
        key_wait=1.0,
    )
    crashed = ConsulClient(
        ConsulConnection.from_env({"CONSUL_HTTP_ADDR": proxy.url}),
        ClientSettings(request_timeout=5.0, blocking_slack=0.5),
    )
    async with crashed, electors(crashed, settings=settings) as (first,):
        await asyncio.wait_for(first.wait_for_leadership(), 5)
        checks = {c["CheckID"]: c for c in await agent_checks(standin.url)}
        assert checks[first.process_check_id]["Status"] == "passing"
        async with electors(client, settings=settings, first=1) as (second,):
            with OverlapMonitor([first, second]) as monitor:
                loop = asyncio.get_running_loop()
                proxy.freeze()
                crashed_at = loop.time()
                await eventually(lambda: second.is_leader, within=10.0)
                took_over_after = loop.time() - crashed_at
            assert monitor.overlaps == []
            # Without the check: 2 x TTL (4 s) before Consul drops the session, then lock-delay.
            assert settings.lock_delay <= took_over_after < 2 * settings.ttl
            checks = {c["CheckID"]: c for c in await agent_checks(standin.url)}
            assert checks[first.process_check_id]["Status"] == "critical"
            proxy.thaw()


async def test_a_clean_stop_removes_the_process_check(client: ConsulClient, standin: ConsulStandIn) -> None:
    election = LeaderElection(client, "ctl-tidy", FAST)
    async with election.leadership():
        assert election.process_check_id in {c["CheckID"] for c in await agent_checks(standin.url)}
    assert election.process_check_id not in {c["CheckID"] for c in await agent_checks(standin.url)}


async def agent_checks(url: str) -> list[dict[str, str]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/agent/checks") as resp:
        assert resp.status == 200
        return list((await resp.json()).values())


async def test_the_first_session_waits_for_the_agent_to_sync_its_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent answers the check's registration before its sync puts it in the servers'
    catalog, so the session tied to it meets 500 "Missing check ... registration" at
    first: the election retries that quietly and leads, as against a real agent."""
    from llmgw.devcluster.consul import ConsulSettings

    async with ConsulStandIn(ConsulSettings.for_tests(catalog_sync_delay=0.2)) as standin:
        client = ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": standin.url}), QUICK_CLIENT)
        async with client, electors(client) as (only,):
            with caplog.at_level(logging.DEBUG, logger="llmgw.adapters.consul.election"):
                await asyncio.wait_for(only.wait_for_leadership(), 5)
            assert only.last_error is None
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert any("has not synced its check yet" in r.getMessage() for r in caplog.records)


async def test_a_check_that_never_syncs_fails_the_campaign_after_the_bounded_retries(
    caplog: pytest.LogCaptureFixture, eventually: Eventually
) -> None:
    from llmgw.devcluster.consul import ConsulSettings

    settings = ElectionSettings(
        ttl=FAST.ttl,
        renew_interval=FAST.renew_interval,
        lock_delay=FAST.lock_delay,
        safety_margin=FAST.safety_margin,
        backoff_initial=5.0,
        backoff_max=5.0,
        check_sync_attempts=3,
        check_sync_backoff_initial=0.01,
        check_sync_backoff_max=0.02,
    )
    async with ConsulStandIn(ConsulSettings.for_tests(catalog_sync_delay=60.0)) as standin:
        client = ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": standin.url}), QUICK_CLIENT)
        async with client, electors(client, settings=settings) as (only,):
            with caplog.at_level(logging.DEBUG, logger="llmgw.adapters.consul.election"):
                await eventually(lambda: only.last_error is not None, within=3.0)
            assert "Missing check 'llmgw-control-alive:ctl-0' registration" in (only.last_error or "")
            retried = [r for r in caplog.records if "has not synced its check yet" in r.getMessage()]
            assert len(retried) == settings.check_sync_attempts - 1
            assert not only.is_leader
