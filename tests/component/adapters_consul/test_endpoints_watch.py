"""watch_endpoints against the Consul stand-in: endpoints appear, change status as
their HTTP checks flip, disappear; the last snapshot survives an outage; an index
that goes backwards (a Consul restored or replaced) restarts the loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from llmgw.adapters.consul import ConsulClient, WatchSettings, watch_endpoints
from llmgw.core.records import EndpointSnapshot, HealthStatus
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn, OutageMode

if TYPE_CHECKING:
    from conftest import Engines, Eventually, HealthEndpoint


def statuses(snapshot: EndpointSnapshot | None) -> dict[str, HealthStatus]:
    return {} if snapshot is None else {e.service_id: e.status for e in snapshot.endpoints}


async def test_endpoints_appear_flip_with_their_checks_and_disappear(
    client: ConsulClient,
    engines: Engines,
    health: HealthEndpoint,
    fast_watch: WatchSettings,
    eventually: Eventually,
) -> None:
    async with watch_endpoints(client, fast_watch) as watch:
        first = await watch.wait_ready()
        assert first.endpoints == ()

        await engines.register("e1", port=9001, check_url=health.url, model="m1")
        await engines.register("e2", port=9002, model="m2", replica="llmgw-m2-r1")
        await eventually(lambda: statuses(watch.latest) == {"e1": "passing", "e2": "passing"})
        snap = watch.latest
        assert snap is not None
        e1 = snap.for_model("m1")[0]
        assert (e1.node, e1.address, e1.port, e1.replica, e1.engine, e1.simulated) == (
            "gpu-1",
            "127.0.0.1",
            9001,
            "llmgw-m1-r1",
            "sim",
            True,
        )
        assert e1.url == "http://127.0.0.1:9001"

        health.status = 500
        await eventually(lambda: statuses(watch.latest).get("e1") == HealthStatus.CRITICAL)
        assert statuses(watch.latest)["e2"] == HealthStatus.PASSING  # one model's failure is its own

        health.status = 429  # Consul: 429 Too Many Requests is a warning
        await eventually(lambda: statuses(watch.latest).get("e1") == HealthStatus.WARNING)

        health.status = 200
        await eventually(lambda: statuses(watch.latest).get("e1") == HealthStatus.PASSING)

        await engines.deregister("e1")
        await eventually(lambda: set(statuses(watch.latest)) == {"e2"})
        assert watch.healthy and watch.last_success_at is not None


async def test_a_failed_node_makes_its_endpoints_critical(
    standin: ConsulStandIn,
    client: ConsulClient,
    engines: Engines,
    fast_watch: WatchSettings,
    eventually: Eventually,
) -> None:
    await engines.register("e1")
    async with watch_endpoints(client, fast_watch) as watch:
        await eventually(lambda: statuses(watch.latest) == {"e1": "passing"})
        standin.fail_node("gpu-1")  # serfHealth critical: the node's checks count too
        await eventually(lambda: statuses(watch.latest) == {"e1": "critical"})


async def test_malformed_registrations_are_skipped_with_one_warning(
    client: ConsulClient,
    engines: Engines,
    fast_watch: WatchSettings,
    eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.adapters.consul")
    await engines.register("good")
    await engines.register_raw_meta("no-meta", {})
    await engines.register("bad-profile", llmgw_profile="first")  # type: ignore[arg-type]
    async with watch_endpoints(client, fast_watch) as watch:
        await eventually(lambda: set(statuses(watch.latest)) == {"good"})
        await engines.register("good-2", model="m2")
        await eventually(lambda: set(statuses(watch.latest)) == {"good", "good-2"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "'no-meta'" in w
        and "Service.Meta lacks llmgw_model, llmgw_model_slug, llmgw_engine, llmgw_profile, llmgw_replica"
        in w
        for w in warnings
    ), warnings
    assert any("'bad-profile'" in w and "llmgw_profile='first'" in w for w in warnings), warnings
    # Warned once each, not on every snapshot.
    assert sum("'no-meta'" in w for w in warnings) == 1


@pytest.mark.parametrize("mode", [OutageMode.NO_LEADER, OutageMode.HANG, OutageMode.REFUSE])
async def test_the_last_snapshot_is_kept_through_an_outage_and_the_watch_recovers(
    mode: OutageMode,
    standin: ConsulStandIn,
    client: ConsulClient,
    engines: Engines,
    fast_watch: WatchSettings,
    eventually: Eventually,
) -> None:
    await engines.register("e1")
    async with watch_endpoints(client, fast_watch) as watch:
        await eventually(lambda: statuses(watch.latest) == {"e1": "passing"})
        kept = watch.latest
        await standin.start_outage(mode)
        # HANG: the long poll in flight times out (wait + wait/16 + slack) before it shows.
        await eventually(lambda: not watch.healthy)
        assert watch.latest is kept
        assert (
            watch.last_error is not None and "Consul GET /v1/health/service/llmgw-engine" in watch.last_error
        )
        failed_at = watch.last_success_at

        await standin.end_outage()
        await engines.register("e2", model="m2")
        await eventually(lambda: set(statuses(watch.latest)) == {"e1", "e2"})
        assert watch.healthy
        assert watch.last_success_at is not None and failed_at is not None
        assert watch.last_success_at > failed_at


async def test_an_index_that_goes_backwards_restarts_the_blocking_loop(
    consul_settings: ConsulSettings,
    connector: Callable[[str], ConsulClient],
    engines_at: Callable[[str], Engines],
    eventually: Eventually,
) -> None:
    """A Consul whose data was restored (or replaced) answers a lower index: the watch
    must read afresh and then block on the new index, or it would miss changes."""
    first = ConsulStandIn(consul_settings)
    await first.start()
    port = first.port
    await first.add_node("gpu-1")
    for i in range(40):  # push the first cluster's index well above the second's
        first.state.kv_put(f"noise/{i}", b"x", 0, 0.0)
    await engines_at(first.agent_url("gpu-1")).register("old")
    watch_settings = WatchSettings(wait=0.5, min_interval=0.01, backoff_initial=0.02, backoff_max=0.1)
    async with connector(first.url) as client, watch_endpoints(client, watch_settings) as watch:
        await eventually(lambda: set(statuses(watch.latest)) == {"old"})
        high = watch.status().index
        assert high > 40

        await first.stop()
        second = ConsulStandIn(consul_settings, port=port)
        await second.start()
        try:
            await second.add_node("gpu-1")
            engines = engines_at(second.agent_url("gpu-1"))
            await engines.register("new")
            await eventually(lambda: set(statuses(watch.latest)) == {"new"})
            assert watch.status().index < high  # reset, now blocking on the new cluster's index
            # And it keeps following the new cluster.
            await engines.register("newer", model="m2")
            await eventually(lambda: set(statuses(watch.latest)) == {"new", "newer"})
        finally:
            await second.stop()
