"""The router's ports: what it needs from the outside world, as narrow Protocols.

Owns: the Protocols and ``RouterDeps`` (the one bundle ``create_app`` takes), plus
``FixedValue`` (a watched value that never changes: a catalog read from a file,
an empty draining set in development) and ``SystemClock``.

The Consul adapter satisfies them as it is:

- ``watch_endpoints(client)`` is a ``Watched[EndpointSnapshot]``;
- ``DrainingMarks(client).watch()`` is a ``Watched[Mapping[str, DrainMark]]``;
- ``ApiKeyStore(client).watch()`` is a ``Watched[Mapping[str, ApiKeyRecord]]``;
- ``CatalogStore(client).watch()`` is a ``Watched[CatalogVersion | None]``;
- ``UnavailableStore(client).watch()`` is a ``Watched[UnavailableModels | None]``;
- ``DemandPublisher(client, router_id)`` is a ``DemandSink``;
- ``ResponseKV(client)`` is a ``ResponseStore`` (every router shares it).

And the Nomad adapter's ``AllocationWatch(nomad_client)`` is a ``Watched[NomadView]``.

Must not: import an adapter (the CLI wires them) or aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from llmgw.core.engine_keys import EngineKeys
from llmgw.core.records import (
    ApiKeyRecord,
    CatalogVersion,
    DemandReport,
    DrainMark,
    EndpointSnapshot,
    UnavailableModels,
)
from llmgw.core.routing import NomadView
from llmgw.gateway.tracing import Tracing

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class Watched(Protocol[T_co]):
    """The latest value of something kept current by a background loop (a Consul
    blocking query). The loop keeps the last good value when its source fails and
    says so through ``healthy``; the router then keeps routing on that value."""

    @property
    def name(self) -> str: ...

    @property
    def latest(self) -> T_co | None: ...

    @property
    def generation(self) -> int: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def last_error(self) -> str | None: ...

    @property
    def last_success_at(self) -> float | None:
        """Event-loop clock of the last answer, None before the first."""
        ...

    async def wait_changed(self, generation: int) -> T_co:
        """The value, once more than ``generation`` values have been published."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class DemandSink(Protocol):
    """Where this router's use of models goes (``llmgw/demand/<router id>``)."""

    async def publish(self, report: DemandReport) -> None: ...

    async def withdraw(self) -> None: ...


class Clock(Protocol):
    def wall(self) -> float:
        """Unix seconds (demand reports and key records are stamped with it)."""
        ...


class SystemClock:
    def wall(self) -> float:
        return time.time()


class FixedValue(Watched[T]):
    """A value that never changes, published once: always healthy."""

    def __init__(self, value: T, name: str = "fixed") -> None:
        self._value = value
        self._name = name
        self._started_at: float | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def latest(self) -> T:
        return self._value

    @property
    def generation(self) -> int:
        return 1

    @property
    def healthy(self) -> bool:
        return True

    @property
    def last_error(self) -> str | None:
        return None

    @property
    def last_success_at(self) -> float | None:
        return self._started_at

    async def wait_changed(self, generation: int) -> T:
        if generation < 1:
            return self._value
        await asyncio.Event().wait()  # never changes: wait until cancelled
        raise AssertionError("unreachable")

    async def start(self) -> None:
        self._started_at = asyncio.get_running_loop().time()

    async def stop(self) -> None:
        return None


class NoDemandSink:
    """Drops reports: a router without a control plane (a benchmark, a test)."""

    async def publish(self, report: DemandReport) -> None:
        return None

    async def withdraw(self) -> None:
        return None


class ResponseStore(Protocol):
    """Where the Responses API's stored conversations are kept, by response id (a
    ``resp_`` id the router drew; callers check its shape before asking)."""

    async def get(self, response_id: str) -> bytes | None: ...

    async def put(self, response_id: str, value: bytes) -> None: ...

    async def delete(self, response_id: str) -> None: ...

    async def ids(self) -> list[str]:
        """Every stored id (the names only: the sweep reads no values)."""
        ...


class MemoryResponseStore:
    """A ``ResponseStore`` in this process: one router's own (tests, a router with no Consul)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def get(self, response_id: str) -> bytes | None:
        return self.values.get(response_id)

    async def put(self, response_id: str, value: bytes) -> None:
        self.values[response_id] = value

    async def delete(self, response_id: str) -> None:
        self.values.pop(response_id, None)

    async def ids(self) -> list[str]:
        return list(self.values)


@dataclass(frozen=True)
class RouterDeps:
    """Everything the router reads from or writes to outside itself.

    The router starts and stops each watched value in its ``cleanup_ctx``.
    ``api_keys`` None serves without keys (allowed on loopback only; see settings).
    """

    endpoints: Watched[EndpointSnapshot]
    catalog: Watched[CatalogVersion | None]
    draining: Watched[Mapping[str, DrainMark]] = field(
        default_factory=lambda: FixedValue[Mapping[str, DrainMark]]({}, "draining")
    )
    api_keys: Watched[Mapping[str, ApiKeyRecord]] | None = None
    # The models the control plane cannot serve now (``llmgw/unavailable``). None (the
    # default, and what a router without a control plane has): every model is loadable.
    unavailable: Watched[UnavailableModels | None] = field(
        default_factory=lambda: FixedValue[UnavailableModels | None](None, "unavailable")
    )
    demand: DemandSink = field(default_factory=NoDemandSink)
    # Nomad's allocations of llmgw's jobs and its gone nodes: an endpoint is routed to
    # only while Nomad vouches for it (``routing.vouch``). None trusts Consul alone: a
    # router with no Nomad (a benchmark, a test); ``llmgw serve`` and ``llmgw dev``
    # always give one.
    allocations: Watched[NomadView] | None = None
    clock: Clock = field(default_factory=SystemClock)
    # The engines' API keys (derived per replica from the cluster secret the control plane
    # shares, llmgw.core.engine_keys), sent to each engine as Authorization: Bearer.
    # None: the engines run without keys.
    # Where a request's trace goes: the client's trace context on to the engines, and a span
    # per request when OpenTelemetry's OTLP variables name a collector (``gateway/tracing.py``).
    tracing: Tracing = field(default_factory=Tracing)
    engine_keys: EngineKeys | None = None
    # The Responses API's stored conversations (``store``, ``previous_response_id``):
    # ``llmgw serve`` gives Consul KV, which every router reads; the default is this
    # router's memory, right for one router alone.
    responses: ResponseStore = field(default_factory=MemoryResponseStore)
