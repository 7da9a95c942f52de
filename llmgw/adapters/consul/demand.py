"""Demand reports in Consul KV: each router publishes its own, the control plane reads them all.

Owns ``llmgw/demand/<router id>``: :class:`DemandPublisher` (a router puts its
latest :class:`DemandReport`, and withdraws it on a clean stop) and
:class:`DemandReader` (the control plane: every report under the prefix with ONE
blocking query, reports older than ``max_age`` ignored, because a router that
died leaves its last report behind).

Age is judged by the reader's wall clock against the router's ``sent_at``: hosts
must keep their clocks in NTP sync well within ``max_age``. A report dated further
in the future than ``max_age`` is ignored too (a broken clock must not keep a
dead router's demand alive forever).

Must not: decide anything from demand (``llmgw.core`` scaling does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import TracebackType

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.kv import key_part, watch_prefix
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core.conventions import KV_DEMAND_PREFIX
from llmgw.core.records import DemandReport, to_json

# A router publishes every few seconds (and at once for a wake-up); a report not
# refreshed for a minute is from a router that is gone or cut off.
DEFAULT_MAX_AGE = 60.0


def demand_key(router_id: str) -> str:
    return KV_DEMAND_PREFIX + key_part(router_id, "router id")


class DemandPublisher:
    """A router's own demand key."""

    def __init__(self, client: ConsulClient, router_id: str) -> None:
        self._client = client
        self._router_id = router_id
        self._key = demand_key(router_id)

    @property
    def key(self) -> str:
        return self._key

    async def publish(self, report: DemandReport) -> None:
        """Replace this router's report. Raises ConsulError when Consul did not take it."""
        if report.router_id != self._router_id:
            raise ValueError(f"report of router {report.router_id!r} published as {self._router_id!r}")
        await self._client.kv_put(self._key, to_json(report).encode("utf-8"))

    async def withdraw(self) -> None:
        """Remove this router's report (on a clean stop, so its demand ends at once)."""
        await self._client.kv_delete(self._key)


class DemandReader:
    """Every router's latest report, kept current by one blocking query.

    ``async with DemandReader(client) as demand:`` then :meth:`reports` at any
    time; :attr:`watch` to wait for a change (``await demand.watch.wait_changed(g)``)
    or read its health.
    """

    def __init__(
        self,
        client: ConsulClient,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        settings: WatchSettings | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if max_age <= 0:
            raise ValueError("max_age must be positive")
        self._max_age = max_age
        self._wall_clock = wall_clock
        self.watch: Watch[Mapping[str, DemandReport]] = watch_prefix(
            client, KV_DEMAND_PREFIX, DemandReport, lambda r: r.router_id, settings
        )

    def reports(self, now: float | None = None) -> tuple[DemandReport, ...]:
        """The fresh reports (by router id), as of wall-clock ``now`` (default: the clock)."""
        latest = self.watch.latest
        if latest is None:
            return ()
        at = self._wall_clock() if now is None else now
        return tuple(
            report for _, report in sorted(latest.items()) if abs(at - report.sent_at) <= self._max_age
        )

    async def start(self) -> None:
        await self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()

    async def __aenter__(self) -> DemandReader:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
