"""The router's view of Nomad: the allocations of llmgw's jobs and the nodes that are gone.

Owns :class:`AllocationWatch`, a watched ``NomadView`` kept by one background task:
a full read (``GET /v1/allocations?resources=true`` and ``GET /v1/nodes``), then
Nomad's event stream (topics ``Allocation`` and ``Node``) after the older of the two
reads' indexes (what a read already holds is skipped), each batch applied and
published at once; after a broken or silent stream a backoff,
a full read again and the stream from there, as the control plane's observing loop
does (``llmgw.control.observing``: Nomad silently starts at its oldest retained
batch when the index asked for has left its buffer). A periodic full read repairs
anything a stream could have missed. On any failure it KEEPS the last view and says
so (``healthy`` False, ``last_error``); it never raises out of its loop. The
published side (latest view, generation, health, waiting) is
``llmgw.adapters.watched``'s ``WatchedState``, shared with the Consul watches.

Parses right here, at the edge, the fields routing needs (``routing.AllocationFact``):
an allocation's id, job, task group, node, client and desired status, and the host IP and port of
every port Nomad allocated it (``AllocatedResources.Shared.Ports``, and the older
``Shared.Networks``), which is where Nomad registers its services in Consul
(``client/serviceregistration/address.go``, ``GetAddress``: address mode ``auto``
and ``host`` give the port mapping's ``HostIP`` and ``Value``).

Must not: decide what is routable (``llmgw.core.routing.vouch`` does), or read jobs
(allocation events carry no job; the job id is enough, see ``routing.named_consistently``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.adapters.nomad.client import EventBatch, NomadError, Page
from llmgw.adapters.watched import WatchedState
from llmgw.core.backoff import BackoffPolicy
from llmgw.core.planning import JOB_PREFIX
from llmgw.core.routing import AllocationFact, NomadView, canonical_address

log = logging.getLogger(__name__)

JSON = Mapping[str, Any]

TOPICS = ("Allocation", "Node")
# A node in one of these states runs nothing the router may send to (``disconnected``:
# its allocations are ``unknown`` until it returns or their ``lost_after`` runs out).
_GONE_NODE_STATUSES = frozenset({"down", "disconnected"})


class NomadReader(Protocol):
    """The part of ``NomadClient`` the watch uses."""

    async def allocations(
        self, *, resources: bool = False, index: int | None = None, wait_s: float | None = None
    ) -> Page: ...

    async def nodes(self, *, index: int | None = None, wait_s: float | None = None) -> Page: ...

    def events(self, topics: Sequence[str], *, index: int = 0) -> AsyncIterator[EventBatch]: ...


@dataclass(frozen=True, slots=True)
class AllocationWatchSettings:
    # Reopening the stream after it broke: the first delay, doubling up to the max
    # (with equal jitter: every router reopens when a Nomad server restarts). A full
    # read comes before every reopening.
    retry_initial: float = 0.5
    retry_max: float = 10.0
    # A full read this often even while the stream runs (it repairs what a stream can
    # miss; the control plane's resync_interval is the same).
    resync_interval: float = 300.0


class ParseError(ValueError):
    """A Nomad object without a field routing needs; it is skipped and logged."""


def parse_allocation(raw: JSON) -> AllocationFact:
    """An allocation (event payload or list stub with ``resources=true``)."""
    alloc_id, job_id = raw.get("ID"), raw.get("JobID")
    if not isinstance(alloc_id, str) or not alloc_id or not isinstance(job_id, str) or not job_id:
        raise ParseError(f"an allocation without ID or JobID: {str(raw)[:200]}")
    return AllocationFact(
        alloc_id=alloc_id,
        job_id=job_id,
        node_id=str(raw.get("NodeID") or ""),
        client_status=str(raw.get("ClientStatus") or "pending"),
        desired_run=(raw.get("DesiredStatus") or "run") == "run",
        addresses=frozenset(_addresses(raw)),
        group=str(raw.get("TaskGroup") or ""),
    )


def _addresses(raw: JSON) -> list[tuple[str, int]]:
    shared = (raw.get("AllocatedResources") or {}).get("Shared") or {}
    out: list[tuple[str, int]] = []
    for port in shared.get("Ports") or ():
        if isinstance(port, Mapping) and port.get("HostIP") and isinstance(port.get("Value"), int):
            out.append((canonical_address(str(port["HostIP"])), int(port["Value"])))
    for network in shared.get("Networks") or ():
        if not isinstance(network, Mapping) or not network.get("IP"):
            continue
        for key in ("ReservedPorts", "DynamicPorts"):
            for port in network.get(key) or ():
                if isinstance(port, Mapping) and isinstance(port.get("Value"), int):
                    out.append((canonical_address(str(network["IP"])), int(port["Value"])))
    return out


class AllocationWatch(WatchedState[NomadView]):
    """A ``Watched[NomadView]`` (``llmgw.gateway.ports``) over Nomad's event stream.

    ``healthy`` is True while the last full read succeeded and the stream it was
    followed by is open; the view is then current. Before the first read ``latest``
    is None. A change of health publishes the view again (the router re-reads
    ``healthy`` with each view).
    """

    def __init__(
        self,
        nomad: NomadReader,
        settings: AllocationWatchSettings | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__("nomad", task_name="nomad-watch:allocations", same=_same_view)
        self._nomad = nomad
        self._settings = settings or AllocationWatchSettings()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrets)
        self._allocs: dict[str, AllocationFact] = {}
        self._nodes_gone: set[str] = set()
        self._index = 0
        self._read_index: dict[str, int] = {}  # by topic: the index of the last full read's table

    # --- the loop --------------------------------------------------------------------------------

    def _publish_view(self) -> None:
        self._publish(NomadView(dict(self._allocs), frozenset(self._nodes_gone), self._index))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                await self._resync()
                if failures:
                    log.info("Nomad answers the router again after %d failed attempts", failures)
                failures = 0
                self._set_health(at=loop.time())
                async with asyncio.timeout(self._settings.resync_interval):
                    async for batch in self._nomad.events(TOPICS, index=self._index + 1):
                        self._apply(batch)
                        self._succeeded(loop.time())
                # The stream ended (a server restarting): read afresh and reopen, not in a busy loop.
                await asyncio.sleep(self._settings.retry_initial)
                continue
            except TimeoutError:
                continue  # the periodic full read
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self._fail(exc, failures)
            await asyncio.sleep(self._backoff(failures))

    async def _resync(self) -> None:
        allocs_page = await self._nomad.allocations(resources=True)
        nodes_page = await self._nomad.nodes()
        allocs: dict[str, AllocationFact] = {}
        for raw in allocs_page.items:
            if not str(raw.get("JobID", "")).startswith(JOB_PREFIX):
                continue
            fact = _parse_or_none(raw)
            if fact is not None:
                allocs[fact.alloc_id] = fact
        gone = {
            str(raw.get("ID"))
            for raw in nodes_page.items
            if str(raw.get("Status") or "") in _GONE_NODE_STATUSES
        }
        self._allocs, self._nodes_gone = allocs, gone
        # The stream resumes after the OLDER of the two reads, so a change between them is
        # not missed; what each read already holds is not applied again (an older state
        # of an allocation, even for a moment, could be routed to).
        self._read_index = {"Allocation": allocs_page.index, "Node": nodes_page.index}
        self._index = min(allocs_page.index, nodes_page.index)
        self._publish_view()

    def _apply(self, batch: EventBatch) -> None:
        if batch.index <= self._index:
            return  # Nomad re-sends its newest batch to a stream opened past it
        for event in batch.events:
            topic, payload = event.get("Topic"), event.get("Payload") or {}
            if batch.index <= self._read_index.get(str(topic), 0):
                continue  # the full read already holds it
            if topic == "Allocation":
                raw = payload.get("Allocation") or {}
                if not str(raw.get("JobID", "")).startswith(JOB_PREFIX):
                    continue
                fact = _parse_or_none(raw)
                if fact is not None:
                    self._allocs[fact.alloc_id] = fact
            elif topic == "Node":
                raw = payload.get("Node") or {}
                node_id = str(raw.get("ID") or event.get("Key") or "")
                gone = event.get("Type") == "NodeDeregistration" or (
                    str(raw.get("Status") or "") in _GONE_NODE_STATUSES
                )
                if gone:
                    self._nodes_gone.add(node_id)
                else:
                    self._nodes_gone.discard(node_id)
        self._index = batch.index
        self._publish_view()

    def _set_health(self, *, at: float | None = None, error: str | None = None) -> None:
        """Record a success at ``at`` or a failure with ``error``. A change of health
        publishes the view again: the book re-reads "current" with each view."""
        was = self.healthy
        if error is None:
            self._succeeded(at if at is not None else asyncio.get_running_loop().time())
        else:
            self._failed(error)
        if was != self.healthy and self.latest is not None:
            self._publish(self.latest, even_if_same=True)

    def _fail(self, exc: Exception, failures: int) -> None:
        if isinstance(exc, NomadError):
            message = str(exc)
            if exc.status == 403:
                message += (
                    " (the router's NOMAD_TOKEN needs a policy with read-job on llmgw's namespace "
                    "and node read: see ops/README.md)"
                )
        else:
            message = f"{type(exc).__name__}: {exc}"
            log.error("Nomad allocation watch: unexpected error", exc_info=exc)
        if failures == 1 or message != self.last_error:
            log.warning(
                "the router cannot follow Nomad (%s): it keeps routing to the endpoints it trusted, "
                "and new ones wait until Nomad answers",
                message,
            )
        self._set_health(error=message)

    def _backoff(self, failures: int) -> float:
        reopening = BackoffPolicy(self._settings.retry_initial, self._settings.retry_max, jitter=0.5)
        return reopening.delay(failures, self._rng.random())


def _same_view(a: NomadView, b: NomadView) -> bool:
    return a.nodes_gone == b.nodes_gone and a.allocations == b.allocations


def _parse_or_none(raw: JSON) -> AllocationFact | None:
    try:
        return parse_allocation(raw)
    except (ParseError, TypeError, ValueError, AttributeError) as exc:
        log.warning("skipping a Nomad allocation the router cannot read (%s)", exc)
        return None
