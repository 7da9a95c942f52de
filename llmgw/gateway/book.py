"""The endpoint book: the one owner of which engine endpoints exist and what this
router has outstanding on each.

Owns: the current endpoint snapshot (replaced whole, never patched), the set of
replicas marked draining, the endpoints that refused a connection lately (tried
last for ``suspect_for`` seconds), the control plane's last word on the models it cannot
serve now (``llmgw/unavailable``, trusted only while fresh and judged against the
catalog routed by: ``records.unavailable_trusted``), Nomad's word on each endpoint
(``routing.vouch``: only an endpoint whose allocation Nomad shows running at its
address is routable; one whose allocation stops, fails or loses its node is taken
away at the event, and a registration no allocation matches is ignored and reported
once), the endpoints that count as a replica starting (``routing.loading_endpoints``:
seen to register, not passing yet) and the replicas Nomad places or runs that Consul
does not list yet (``routing.placed_replicas``; a model with either is answered as
loading), the in-flight count per endpoint
(kept across snapshots, so a request that started on an endpoint is released on
it even after the endpoint left the snapshot), the waiters for a change, and how far
the router's watch loops have got: the generation of each watched value they have
applied (``processed``), so a caller can wait until the router has seen a value
(``wait_processed``) instead of guessing how long that takes.

Everything runs on the event loop's thread, so there are no locks: an in-flight
slot is taken in the same synchronous step that chooses the endpoint (no await
between the read and the write: a read that gates a mutation must not yield) and
released in ``finally``, so a cancelled handler releases its slot.

Must not: talk to Consul (the watch loops in ``app`` feed it) or decide the
balancing rule (``llmgw.core.routing.choose_by_prefix`` and ``choose_endpoint`` do).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from llmgw.core import routing
from llmgw.core.catalog import Model
from llmgw.core.names import slug
from llmgw.core.records import (
    Endpoint,
    EndpointSnapshot,
    UnavailableModel,
    UnavailableModels,
    unavailable_trusted,
)
from llmgw.core.routing import NomadView, Vouch

K = TypeVar("K")  # a count's key: a service id, or (model, service id)

# Nomad's words under which a registered endpoint not passing yet may be a replica starting:
# its allocation runs (the engine loads) or is starting; one stopping, gone or unknown is not.
_STARTING_VOUCHES = frozenset({Vouch.ROUTE, Vouch.STARTING})


class EndpointBook:
    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        unavailable_stale_after: float = 90.0,
        *,
        suspect_for: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        nomad_checked: bool = False,
        on_unmatched: Callable[[Endpoint], None] = lambda endpoint: None,
    ) -> None:
        """``nomad_checked``: route only to endpoints Nomad vouches for (``set_nomad``);
        False trusts Consul alone (a router without Nomad: tests, benchmarks).
        ``on_unmatched`` is told once of each registration no allocation matches."""
        self._nomad_checked = nomad_checked
        self._on_unmatched = on_unmatched
        self._nomad_view: NomadView | None = None
        self._nomad_current = False
        self._vouches: dict[str, Vouch] = {}  # by service id
        # The service ids Nomad vouches for; None while Nomad is not checked.
        self._routable: frozenset[str] | None = frozenset() if nomad_checked else None
        self._reported_unmatched: set[str] = set()
        self._by_model: dict[str, tuple[Endpoint, ...]] = {}
        # The service ids of the last snapshot (None before the first) and those of its
        # endpoints that count as starting (``routing.loading_endpoints``).
        self._present: frozenset[str] | None = None
        self._loading: frozenset[str] = frozenset()
        # By model slug: replicas placed or running with no registration yet
        # (``routing.placed_replicas``), while Nomad is checked and its view current.
        self._placed: Mapping[str, int] = {}
        self._suspect_for = suspect_for
        self._monotonic = monotonic
        self._suspect_until: dict[str, float] = {}  # by service id: refused a connection lately
        self._draining: frozenset[str] = frozenset()  # replica (job) ids
        self._wall = wall
        self._stale_after = unavailable_stale_after
        self._unavailable: UnavailableModels | None = None
        self._unavailable_by_model: Mapping[str, UnavailableModel] = {}
        self._catalog_sha: str | None = None  # of the catalog the router routes by
        self._in_flight: dict[str, int] = {}  # by service id
        self._held = HeldConversations()
        self._key_in_flight: dict[str, int] = {}  # by affinity key: a burst of one key
        self._turn = 0
        self._changed = asyncio.Event()
        self.snapshot_index = 0  # Consul's index of the snapshot in use
        self.generation = 0  # bumped on every change
        # By watched value (a Watched, compared by identity): the generation its loop applied last.
        self._processed: dict[int, int] = {}
        self._processed_now = asyncio.Event()

    # --- changes (from the watch loops) ----------------------------------------------------------

    def replace(self, snapshot: EndpointSnapshot) -> None:
        by_model: dict[str, list[Endpoint]] = {}
        for endpoint in snapshot.endpoints:
            by_model.setdefault(endpoint.model, []).append(endpoint)
        # A stable order per model, so round-robin among equals is fair.
        self._by_model = {m: tuple(sorted(es, key=lambda e: e.service_id)) for m, es in by_model.items()}
        self.snapshot_index = snapshot.index
        self._loading = routing.loading_endpoints(self._present, snapshot.endpoints, self._loading)
        self._present = frozenset(e.service_id for e in snapshot.endpoints)
        self._revouch()
        if self._suspect_until:  # forget suspects that left or served their time
            now = self._monotonic()
            present = {e.service_id for e in snapshot.endpoints}
            self._suspect_until = {k: t for k, t in self._suspect_until.items() if k in present and t > now}
        self._changed_now()

    def set_nomad(self, view: NomadView | None, *, current: bool) -> None:
        """Nomad's latest allocations and gone nodes; ``current`` False while Nomad cannot
        be reached (the view is the last one it gave)."""
        self._nomad_view = view
        self._nomad_current = current
        self._revouch()
        self._changed_now()

    def _revouch(self) -> None:
        if not self._nomad_checked:
            return
        view, current = self._nomad_view, self._nomad_current
        self._replace_placed()
        vouches = {e.service_id: routing.vouch(e, view, current=current) for e in self.endpoints()}
        self._vouches = vouches
        self._routable = frozenset(k for k, v in vouches.items() if v is Vouch.ROUTE)
        unmatched = {k for k, v in vouches.items() if v is Vouch.UNMATCHED}
        for endpoint in self.endpoints():
            if endpoint.service_id in unmatched and endpoint.service_id not in self._reported_unmatched:
                self._on_unmatched(endpoint)
        # Remembered while it stays unmatched, so each is reported once, and the set stays small.
        self._reported_unmatched = unmatched

    def _replace_placed(self) -> None:
        # A stale view is not trusted to say a replica is coming: it may have failed since.
        view = self._nomad_view
        if view is None or not self._nomad_current:
            self._placed = {}
            return
        self._placed = routing.placed_replicas(view, self.endpoints(), self._draining)

    def vouch_of(self, endpoint: Endpoint) -> Vouch | None:
        """Nomad's word on ``endpoint``; None when Nomad is not checked."""
        return self._vouches.get(endpoint.service_id) if self._nomad_checked else None

    def set_draining(self, replicas: Collection[str]) -> None:
        self._draining = frozenset(replicas)
        if self._nomad_checked:
            self._replace_placed()
        self._changed_now()

    def set_unavailable(self, document: UnavailableModels | None) -> None:
        self._unavailable = document
        self._unavailable_by_model = document.by_model() if document is not None else {}
        self._changed_now()

    def set_catalog(self, sha256: str | None) -> None:
        """The catalog the router routes by: the control plane's word holds only for it."""
        if sha256 != self._catalog_sha:
            self._catalog_sha = sha256
            self._changed_now()

    def _changed_now(self) -> None:
        self.generation += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_changed(self) -> None:
        """Returns at the next change (callers bound it with a timeout)."""
        await self._changed.wait()

    def processed(self, source: object, generation: int) -> None:
        """Told by the loop that follows ``source`` (a watched value) once it has applied
        (or, failing, skipped) the value ``source`` had at ``generation``."""
        self._processed[id(source)] = max(generation, self._processed.get(id(source), 0))
        event, self._processed_now = self._processed_now, asyncio.Event()
        event.set()

    async def wait_processed(self, source: object, generation: int) -> None:
        """Returns once the router has processed ``source``'s value at ``generation`` or a
        later one (callers bound it with a timeout)."""
        while self._processed.get(id(source), 0) < generation:
            await self._processed_now.wait()

    # --- reading ---------------------------------------------------------------------------------

    def _usable(self, endpoint: Endpoint) -> bool:
        routable = self._routable
        return (
            endpoint.passing
            and endpoint.replica not in self._draining
            and (routable is None or endpoint.service_id in routable)
        )

    def usable_count(self, model: str) -> int:
        draining = self._draining
        routable = self._routable
        count = 0
        for endpoint in self._by_model.get(model, ()):  # a loop: this runs on every request
            if (
                endpoint.passing
                and endpoint.replica not in draining
                and (routable is None or endpoint.service_id in routable)
            ):
                count += 1
        return count

    def loading_count(self, model: str) -> int:
        """The replicas of ``model`` that count as starting: endpoints not passing yet
        since they registered (``routing.loading_endpoints``), not draining, and, when
        Nomad is checked, of an allocation it shows running or starting; and, when Nomad
        is checked, its allocations placed or running that Consul does not list yet
        (``routing.placed_replicas``)."""
        count = self._placed.get(slug(model), 0) if self._placed else 0
        loading = self._loading
        if not loading:
            return count
        for endpoint in self._by_model.get(model, ()):
            if endpoint.service_id not in loading or endpoint.replica in self._draining:
                continue
            if self._nomad_checked and self._vouches.get(endpoint.service_id) not in _STARTING_VOUCHES:
                continue
            count += 1
        return count

    def unavailable(self) -> Mapping[str, UnavailableModel]:
        """The models the control plane says it cannot serve now; empty when its word
        is missing, stale or about another catalog (then loads are waited for as usual)."""
        if not self._unavailable_by_model:
            return self._unavailable_by_model
        if unavailable_trusted(self._unavailable, self._catalog_sha, self._wall(), self._stale_after):
            return self._unavailable_by_model
        return {}

    def seconds_until_retry(self, model: str) -> float | None:
        """Until the control plane tries ``model`` again, when its word says (a failing model's
        backoff), else None."""
        why = self.unavailable().get(model)
        if why is None or why.until is None:
            return None
        return why.until - self._wall()

    def state(
        self, name: str, model: Model, unavailable: Mapping[str, UnavailableModel] | None = None
    ) -> routing.ModelState:
        if unavailable is None:
            unavailable = self.unavailable()
        usable = self.usable_count(name)
        loading = self.loading_count(name) if usable == 0 else 0
        return routing.model_state(model, usable, name in unavailable, loading)

    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(e for es in self._by_model.values() for e in es)

    def in_flight(self) -> Mapping[str, int]:
        return dict(self._in_flight)

    def is_draining(self, endpoint: Endpoint) -> bool:
        return endpoint.replica in self._draining

    # --- choosing and leasing ----------------------------------------------------------------------

    def choose(self, model: str, avoid: Collection[str]) -> Endpoint | None:
        """The endpoint for the next try (see ``routing.choose_endpoint``); lease it at once."""
        return self.choose_by_prefix(model, avoid, None)[0]

    def choose_by_prefix(
        self, model: str, avoid: Collection[str], key: str | None, history: bool = True
    ) -> tuple[Endpoint | None, routing.RouteOutcome]:
        """The endpoint for the next try of a request whose conversation has ``key``
        (``routing.choose_by_prefix``; None: least outstanding) and, with ``history``,
        has been answered before (``routing.has_history``), and how it was chosen;
        lease it at once. A conversation with history is counted on the endpoint chosen
        (``HeldConversations``), the load its next turns are balanced by."""
        endpoints = self._by_model.get(model, ())
        if not endpoints:
            return None, routing.RouteOutcome.NO_KEY
        in_flight = self._in_flight
        suspects = self._suspect_until
        held = self._held if key is not None and history else None
        now = self._monotonic() if suspects or held is not None else 0.0
        if held is not None:
            held.expire(now)
        candidates = (
            routing.Candidate(
                e.service_id,
                in_flight.get(e.service_id, 0),
                self._usable(e),
                suspects.get(e.service_id, 0.0) > now,
                None if held is None or key is None else held.load(model, key, e.service_id),
            )
            for e in endpoints
        )
        concurrent = self._key_in_flight.get(key, 0) if key is not None else 0
        choice = routing.choose_by_prefix(
            candidates, avoid, key, self._turn, history=history, concurrent=concurrent
        )
        self._turn += 1
        if choice.key is None:
            return None, choice.outcome
        if held is not None and key is not None:
            held.record(model, key, choice.key, now)
        return next(e for e in endpoints if e.service_id == choice.key), choice.outcome

    def report_failure(self, endpoint: Endpoint, failure: routing.Failure) -> None:
        """An attempt on ``endpoint`` failed: a refused connection makes it a suspect
        (tried last, see ``routing.choose_endpoint``) for ``suspect_for`` seconds."""
        if self._suspect_for > 0 and routing.marks_suspect(failure):
            self._suspect_until[endpoint.service_id] = self._monotonic() + self._suspect_for

    def lease(self, endpoint: Endpoint, affinity: str | None = None) -> Lease:
        """Count one outstanding request on ``endpoint`` (and of the conversation key
        ``affinity``, when given) until the lease is closed (``close()`` or the end of
        a ``with`` block; closing twice counts once)."""
        key = endpoint.service_id
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        if affinity is not None:
            self._key_in_flight[affinity] = self._key_in_flight.get(affinity, 0) + 1
            return Lease(self._in_flight, key, self._key_in_flight, affinity)
        return Lease(self._in_flight, key)


class HeldConversations:
    """Per model, the endpoint this router last sent each conversation to, kept for
    ``routing.CONVERSATION_SECONDS`` after its last turn: the conversations each
    endpoint holds (``routing.Candidate.load``), as this router alone sees them. No
    I/O and no clock of its own: the caller passes ``now`` (monotonic seconds)."""

    __slots__ = ("_counts", "_last", "_limit", "_seconds")

    def __init__(self, seconds: float = routing.CONVERSATION_SECONDS, limit: int = 100_000) -> None:
        self._seconds = seconds
        self._limit = limit  # conversations kept at most: the oldest go first
        # By (model, key): (service id, last seen), the least recently seen first.
        self._last: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._counts: dict[tuple[str, str], int] = {}  # by (model, service id)

    def __len__(self) -> int:
        return len(self._last)

    def expire(self, now: float) -> None:
        while self._last:
            (model, _), (service_id, seen) = next(iter(self._last.items()))
            if now - seen <= self._seconds and len(self._last) <= self._limit:
                return
            self._last.popitem(last=False)
            _uncount(self._counts, (model, service_id))

    def load(self, model: str, key: str, service_id: str) -> int:
        """The conversations of ``model`` held on ``service_id``, ``key``'s own left out."""
        count = self._counts.get((model, service_id), 0)
        entry = self._last.get((model, key))
        return count - 1 if entry is not None and entry[0] == service_id else count

    def record(self, model: str, key: str, service_id: str, now: float) -> None:
        previous = self._last.pop((model, key), None)
        if previous is not None:
            _uncount(self._counts, (model, previous[0]))
        self._last[(model, key)] = (service_id, now)
        self._counts[(model, service_id)] = self._counts.get((model, service_id), 0) + 1


class Lease:
    """One in-flight slot. A class rather than a generator context manager: it is
    taken and released on every request."""

    __slots__ = ("_affinity", "_by_affinity", "_in_flight", "_key")

    def __init__(
        self,
        in_flight: dict[str, int],
        key: str,
        by_affinity: dict[str, int] | None = None,
        affinity: str = "",
    ) -> None:
        self._in_flight: dict[str, int] | None = in_flight
        self._key = key
        self._by_affinity = by_affinity
        self._affinity = affinity

    def close(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        _uncount(in_flight, self._key)
        if self._by_affinity is not None:
            _uncount(self._by_affinity, self._affinity)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _uncount(counts: dict[K, int], key: K) -> None:
    """One less of ``key``; a count that reaches 0 is removed, so the maps stay as small
    as what is outstanding."""
    remaining = counts[key] - 1
    if remaining:
        counts[key] = remaining
    else:
        del counts[key]
