"""Running HTTP and TCP health checks the way a Consul agent does.

Owns :class:`StatusCounter` (Consul's StatusHandler: SuccessBeforePassing,
FailuresBeforeWarning, FailuresBeforeCritical, with counters starting at their
thresholds so the first result counts at once), the probes (an HTTP request with
Consul's User-Agent and Accept headers, no keep-alive, redirects followed, 2xx
passing, 429 warning, anything else or an error critical; a TCP connect), and
:class:`CheckRunners`, one task per check on the check's interval after a random
initial stagger, reporting results to the store.

The node faults act here: a slowed node's probes wait first (inside the timeout,
so a delay past it times the check out).

Must not: decide what a result means for the catalog (the store's
``update_check`` does), or run anything but HTTP and TCP (TTL checks are timers
in the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict

from llmgw.devcluster.consul.model import CheckDefinition, CheckKind, CheckRecord, HealthStatus
from llmgw.devcluster.consul.settings import ConsulSettings
from llmgw.devcluster.consul.state import ConsulState

log = logging.getLogger(__name__)

USER_AGENT = "Consul Health Check"
ACCEPT = "text/plain, text/*, */*"


class StatusCounter:
    """Consul's StatusHandler: which status, if any, a result should set."""

    def __init__(self, d: CheckDefinition) -> None:
        self._success_before_passing = d.success_before_passing
        self._failures_before_warning = d.failures_before_warning
        self._failures_before_critical = d.failures_before_critical
        # Consul starts both counters at their thresholds: the first result counts.
        self._successes = d.success_before_passing
        self._failures = d.failures_before_critical

    def feed(self, status: HealthStatus) -> HealthStatus | None:
        if status is not HealthStatus.CRITICAL:
            self._successes += 1
            self._failures = 0
            return status if self._successes >= self._success_before_passing else None
        self._failures += 1
        self._successes = 0
        if self._failures >= self._failures_before_critical:
            return HealthStatus.CRITICAL
        if self._failures >= self._failures_before_warning:
            return HealthStatus.WARNING
        return None


def _go_op(method: str) -> str:
    # Go's url.Error writes the method as "Get", "Post", ...
    return method[:1].upper() + method[1:].lower()


async def probe_http(
    session: aiohttp.ClientSession, d: CheckDefinition, time_limit: float, latency: float, output_max: int
) -> tuple[HealthStatus, str]:
    method = (d.method or "GET").upper()
    headers: CIMultiDict[str] = CIMultiDict()
    for name, values in d.header.items():
        for v in values:
            headers.add(name, v)
    headers.setdefault("User-Agent", USER_AGENT)
    headers.setdefault("Accept", ACCEPT)
    try:
        async with asyncio.timeout(time_limit):
            if latency > 0:
                await asyncio.sleep(latency)
            async with session.request(
                method,
                d.http,
                headers=headers,
                data=d.body.encode() if d.body else None,
                ssl=not d.tls_skip_verify,
                server_hostname=d.tls_server_name or None,
            ) as resp:
                body = await resp.read()
                reason = resp.reason or ""
                code = resp.status
    except TimeoutError:
        return (
            HealthStatus.CRITICAL,
            f'{_go_op(method)} "{d.http}": context deadline exceeded '
            "(Client.Timeout exceeded while awaiting headers)",
        )
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return HealthStatus.CRITICAL, f'{_go_op(method)} "{d.http}": {exc}'
    text = body[-output_max:].decode("utf-8", errors="replace")
    output = f"HTTP {method} {d.http}: {code} {reason} Output: {text}"
    if 200 <= code <= 299:
        return HealthStatus.PASSING, output
    if code == 429:
        return HealthStatus.WARNING, output
    return HealthStatus.CRITICAL, output


async def probe_tcp(d: CheckDefinition, time_limit: float, latency: float) -> tuple[HealthStatus, str]:
    host, _, port = d.tcp.rpartition(":")
    try:
        async with asyncio.timeout(time_limit):
            if latency > 0:
                await asyncio.sleep(latency)
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except TimeoutError:
        return HealthStatus.CRITICAL, f"dial tcp {d.tcp}: i/o timeout"
    except (OSError, ValueError) as exc:
        return HealthStatus.CRITICAL, f"dial tcp {d.tcp}: {exc}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return HealthStatus.PASSING, f"TCP connect {d.tcp}: Success"


@dataclass(frozen=True, slots=True)
class _Key:
    node: str
    check_id: str


class CheckRunners:
    """One task per HTTP/TCP check in the store; :meth:`reconcile` starts, restarts
    (definition changed) and cancels them to match the store."""

    def __init__(self, state: ConsulState, settings: ConsulSettings) -> None:
        self._state = state
        self._settings = settings
        self._tasks: dict[_Key, tuple[CheckDefinition, asyncio.Task[None]]] = {}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Consul disables keep-alive for checks so a stale connection never fails one.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True), auto_decompress=True
            )
        return self._session

    def reconcile(self) -> None:
        wanted: dict[_Key, CheckRecord] = {_Key(c.node, c.check_id): c for c in self._state.http_checks()}
        for key in list(self._tasks):
            definition, task = self._tasks[key]
            chk = wanted.get(key)
            if chk is None or chk.definition != definition or task.done():
                task.cancel()
                del self._tasks[key]
        for key, chk in wanted.items():
            if key not in self._tasks:
                task = asyncio.create_task(
                    self._run(key, chk.definition), name=f"consul-check:{key.node}:{key.check_id}"
                )
                self._tasks[key] = (chk.definition, task)

    async def close(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self, key: _Key, d: CheckDefinition) -> None:
        interval = max(d.interval, self._settings.min_check_interval)
        timeout = d.timeout if d.timeout > 0 else self._settings.default_check_timeout
        counter = StatusCounter(d)
        loop = asyncio.get_running_loop()
        # Consul staggers each check's first run randomly within one interval.
        await asyncio.sleep(random.uniform(0, interval))  # noqa: S311 (stagger, not secrets)
        while True:
            latency = self._state.faults.check_latency.get(key.node, 0.0)
            try:
                if d.kind is CheckKind.HTTP:
                    status, output = await probe_http(
                        self._client(), d, timeout, latency, self._settings.check_output_max
                    )
                else:
                    status, output = await probe_tcp(d, timeout, latency)
            except asyncio.CancelledError:
                raise
            except Exception:  # a probe bug must not kill the check silently
                log.exception("check %s on %s crashed", key.check_id, key.node)
                status, output = HealthStatus.CRITICAL, "llmgw stand-in: the check crashed (see the log)"
            decided = counter.feed(status)
            if decided is not None:
                self._state.update_check(key.node, key.check_id, decided, output, loop.time())
            await asyncio.sleep(interval)
