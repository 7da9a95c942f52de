"""The narrow interfaces the control plane's loops depend on, and nothing else.

Owns: the Protocols. The real implementations are the lead's Nomad client
(``llmgw.adapters.nomad.NomadClient``), the renderer (``llmgw.render.Renderer``) and
the Consul adapter (``llmgw.adapters.consul``: ``LeaderElection``, ``Watch`` values from
``CatalogStore.watch()``, ``watch_endpoints``, ``DrainingMarks``, ``DemandReader.watch``,
``StatusPublisher``); they satisfy these structurally. Tests use the recorded fakes
in ``tests/support/control.py`` (outside the wheel).

Must not: grow methods the loops do not call. Each Protocol is the loops' syscall table
for one outside system; a wider one makes every fake wider.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from llmgw.core.catalog import Catalog
from llmgw.core.planning import ModelCommand
from llmgw.core.records import DemandReport, DrainMark, Endpoint, EndpointSnapshot, UnavailableModels
from llmgw.render import RenderedJob, ReplicaRequest

JSON = dict[str, Any]
T_co = TypeVar("T_co", covariant=True)


# --- Nomad -------------------------------------------------------------------------------------


class PageLike(Protocol):
    """A list answer and the Raft index it reflects."""

    @property
    def items(self) -> list[JSON]: ...
    @property
    def index(self) -> int: ...


class PlanAnswer(Protocol):
    @property
    def feasible(self) -> bool: ...
    @property
    def explanation(self) -> str: ...
    @property
    def warnings(self) -> tuple[str, ...]: ...


class RegisterAnswer(Protocol):
    """A register's evaluation and what Nomad warned about in the job, one entry per warning."""

    @property
    def eval_id(self) -> str: ...
    @property
    def warnings(self) -> tuple[str, ...]: ...


class EventBatchLike(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def events(self) -> list[JSON]: ...


class NomadPort(Protocol):
    """What the reconciler asks of Nomad. Deregistering a job that is gone is success."""

    async def parse_hcl(self, hcl: str) -> JSON: ...
    async def plan(self, job: JSON) -> PlanAnswer: ...
    async def register(self, job: JSON) -> RegisterAnswer: ...
    async def deregister(self, job_id: str, *, purge: bool = True) -> None: ...
    # Nomad Variables (a replica's engine key, see llmgw.core.engine_keys); deleting one
    # that is already gone is done.
    async def put_variable(self, path: str, items: Mapping[str, str]) -> None: ...
    async def delete_variable(self, path: str) -> None: ...
    async def jobs(self, *, prefix: str | None = None) -> PageLike: ...
    async def job(self, job_id: str) -> JSON | None: ...
    # List stubs: ``job_allocations`` never carries ``AllocatedResources`` (Nomad leaves it
    # out), ``allocations`` only with ``resources=True``; ``allocation`` is the whole thing.
    async def job_allocations(self, job_id: str) -> PageLike: ...
    async def allocations(self, *, resources: bool = False) -> PageLike: ...
    async def allocation(self, alloc_id: str) -> JSON | None: ...
    async def nodes(self) -> PageLike: ...
    async def node(self, node_id: str) -> JSON | None: ...
    def events(self, topics: Sequence[str], *, index: int = 0) -> AsyncIterator[EventBatchLike]: ...


class JobRenderer(Protocol):
    """``llmgw.render.Renderer``: HCL and spec hash of a replica; ``check`` refuses a bad job."""

    def render(self, catalog: Catalog, request: ReplicaRequest, *, catalog_hash: str) -> RenderedJob: ...
    def check(self, rendered: RenderedJob, *, model: str) -> JSON: ...


# --- Consul ------------------------------------------------------------------------------------


class Watched(Protocol[T_co]):
    """The latest value of something watched (``llmgw.adapters.consul.Watch``).

    ``latest`` is None until the first answer; ``generation`` counts published values;
    ``wait_changed(g)`` returns once a value newer than generation ``g`` is published.
    """

    @property
    def latest(self) -> T_co | None: ...
    @property
    def generation(self) -> int: ...
    async def wait_changed(self, generation: int) -> T_co: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class CatalogText(Protocol):
    """``llmgw.core.records.CatalogVersion`` as far as the control plane reads it."""

    @property
    def version(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def text(self) -> str: ...


class DrainMarksPort(Protocol):
    """``llmgw.adapters.consul.DrainingMarks``: the marks routers read. Clearing a missing one is fine."""

    async def set(self, mark: DrainMark) -> None: ...
    async def clear(self, job_id: str) -> None: ...


class CommandsPort(Protocol):
    """``llmgw.control.commands.ModelCommandStore``: the operator's commands per model.

    ``end_drain`` clears the drain of ``model`` only if it is still the one recorded under
    ``drained_key`` (a drain asked for meanwhile stays); a record that is gone is fine."""

    async def end_drain(self, model: str, drained_key: str) -> None: ...


class StatusSink(Protocol):
    """``llmgw.adapters.consul.StatusPublisher``: the leader's status, a JSON object."""

    async def publish(self, text: str) -> None: ...


class UnavailableSink(Protocol):
    """``llmgw.adapters.consul.UnavailableStore``: the models the leader cannot serve now,
    for every router (``llmgw/unavailable``)."""

    async def publish(self, document: UnavailableModels) -> None: ...


class TermLike(Protocol):
    """One continuous stretch of leadership; ``lost`` is set the moment it ends."""

    @property
    def lost(self) -> asyncio.Event: ...


class LeaderPort(Protocol):
    """``llmgw.adapters.consul.LeaderElection``."""

    @property
    def instance_id(self) -> str: ...
    @property
    def is_leader(self) -> bool: ...
    async def wait_for_leadership(self) -> TermLike: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class InFlightProbe(Protocol):
    """Requests an engine is serving now (None: it cannot tell). Speeds drains up: without
    a probe a replica of a busy model drains until no router reports any request of the
    model in flight, or until the drain timeout."""

    async def in_flight(self, endpoint: Endpoint) -> int | None: ...


class NoProbe:
    async def in_flight(self, endpoint: Endpoint) -> int | None:
        return None


# --- time --------------------------------------------------------------------------------------


class Clock(Protocol):
    """Wall time for decisions (demand reports carry the routers' wall clocks) and sleeping.

    Tests pass ``tests.support.control.ManualClock``, whose sleeps end when the test
    advances it: virtual time, no real waiting.
    """

    def time(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


# The inputs the loop watches, with the value types the Consul adapter publishes.
CatalogWatch = Watched[CatalogText | None]
EndpointWatch = Watched[EndpointSnapshot]
DrainMarkWatch = Watched[Mapping[str, DrainMark]]
DemandWatch = Watched[Mapping[str, DemandReport]]
# The operator's commands by model name (``ModelCommandStore.watch()``).
CommandWatch = Watched[Mapping[str, ModelCommand]]
