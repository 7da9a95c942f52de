"""Leader election for the control plane: a Consul session and a lock on ``llmgw/leader``.

Owns :class:`LeaderElection`: this process's own service ``llmgw-control`` on the
local agent with a TTL check it passes while it lives, a session tied to that check
(TTL, renewed every TTL/2, lock-delay, behavior ``release``; Consul invalidates it
the moment the check goes critical, so a crash frees the lock after the check's TTL
plus lock-delay, not after 2 x TTL), the ``?acquire=`` of the leader key with this
instance's id as its value, and the rule for when this instance may act as leader.
It is leader only while ALL of these hold:

- the key is held by its session (as last read; a blocking query on the key
  notices another holder or a release at once);
- its last renewal succeeded (any failed renewal ends the term);
- the loop clock is before ``last successful renewal SENT + TTL - safety_margin``
  (a timer ends the term then, even if nothing else could be heard).

Consul will not let anyone else take the lock until the session is invalidated
(at the earliest when it is destroyed or its check goes critical, at the latest
2 x TTL after the last renewal) plus lock-delay (>= TTL and <= Consul's 60 s cap,
enforced by ElectionSettings). So an old
leader has stopped before a new one can start, without relying on the old one
hearing anything; DESIGN.md writes the argument out.

A :class:`Term` is one continuous stretch of leadership; its ``lost`` event is
set the moment it ends. The control plane acts only inside a term and stops on
``lost``.

Must not: do the control plane's work, or call ``time.time()`` (loop clock only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable
from types import TracebackType
from typing import TypeVar

from llmgw.adapters.consul.client import (
    ConsulClient,
    ConsulError,
    ConsulRejected,
    ConsulUnavailable,
    KvEntry,
    QueryMeta,
    go_duration,
)
from llmgw.adapters.consul.settings import ElectionSettings
from llmgw.adapters.consul.watch import next_index
from llmgw.cancellation import cancel_and_wait
from llmgw.core.conventions import KV_LEADER

log = logging.getLogger(__name__)

T = TypeVar("T")

# The service each control-plane instance registers on its local agent, with the TTL
# check its leader session is tied to (``ElectionSettings.process_check_ttl``).
PROCESS_SERVICE = "llmgw-control"


def _check_not_synced(exc: ConsulError, checks: tuple[str, ...]) -> bool:
    """Consul's answer to a session naming a check its servers' catalog lacks
    (``validateSessionChecksTxn`` in agent/consul/state/session.go)."""
    text = str(exc)
    return any(f"Missing check '{check}' registration" in text for check in checks)


class Term:
    """One continuous stretch of leadership. ``lost`` is set when it ends, for good."""

    __slots__ = ("lost", "number", "reason", "session_id", "started_at")

    def __init__(self, number: int, session_id: str, started_at: float) -> None:
        self.number = number
        self.session_id = session_id
        self.started_at = started_at  # loop clock
        self.lost = asyncio.Event()
        self.reason: str | None = None  # why it ended

    def __repr__(self) -> str:
        state = f"lost: {self.reason}" if self.lost.is_set() else "active"
        return f"Term(number={self.number}, {state})"


class LeaderElection:
    """Campaigns for ``key`` in the background once started.

    Typical use by the control plane::

        election = LeaderElection(client, instance_id)
        while running:
            async with election.leadership() as term:
                await run_reconciler_until(term.lost)

    or :meth:`start`, :meth:`wait_for_leadership`, :attr:`is_leader`, :meth:`stop`.
    """

    def __init__(
        self,
        client: ConsulClient,
        instance_id: str,
        settings: ElectionSettings | None = None,
        *,
        key: str = KV_LEADER,
        rng: random.Random | None = None,
    ) -> None:
        if not instance_id:
            raise ValueError("instance_id must not be empty")
        self._client = client
        self._instance = instance_id
        self._settings = settings or ElectionSettings()
        self._key = key
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrets)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session_id: str | None = None
        self._renewed_at = 0.0  # loop time the last successful renewal (or create) was sent
        self._renew_ok = False
        self._term: Term | None = None
        self._terms = 0
        self._poked = asyncio.Event()
        self._changed = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self._last_error: str | None = None
        self._check_registered = False

    # ------------------------------------------------------------------ reading

    @property
    def instance_id(self) -> str:
        return self._instance

    @property
    def is_leader(self) -> bool:
        """True only while every condition in the module docstring holds, checked now."""
        term = self._term
        if term is None or term.lost.is_set() or not self._renew_ok or self._loop is None:
            return False
        return self._loop.time() < self._deadline()

    @property
    def term(self) -> Term | None:
        """The current term if this instance leads, else None."""
        return self._term if self.is_leader else None

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def process_service_id(self) -> str:
        """The service (on the local agent) whose TTL check says this process is alive."""
        return f"{PROCESS_SERVICE}-{self._instance}"

    @property
    def process_check_id(self) -> str:
        return f"{PROCESS_SERVICE}-alive:{self._instance}"

    async def wait_for_leadership(self) -> Term:
        """The current term, waiting for one to begin if needed. Needs a started election."""
        while True:
            if not self._running:
                raise RuntimeError("LeaderElection.wait_for_leadership needs start() first")
            term = self.term
            if term is not None:
                return term
            await self._changed.wait()

    @contextlib.asynccontextmanager
    async def leadership(self) -> AsyncIterator[Term]:
        """Start campaigning, yield the term once leader; on exit, resign and stop."""
        await self.start()
        try:
            yield await self.wait_for_leadership()
        finally:
            await self.stop()

    async def leader(self) -> str | None:
        """The instance id of whoever holds the lock now (as Consul sees it), or None."""
        entry, _ = await self._client.kv_get(self._key)
        if entry is None or not entry.session:
            return None
        return entry.value.decode("utf-8", "replace")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._tasks = [
            asyncio.create_task(self._campaign_loop(), name=f"leader-campaign:{self._instance}"),
            asyncio.create_task(self._renew_loop(), name=f"leader-renew:{self._instance}"),
        ]
        if self._settings.process_check_every is not None:
            self._tasks.append(
                asyncio.create_task(self._process_check_loop(), name=f"leader-check:{self._instance}")
            )

    async def stop(self) -> None:
        """Stop acting (the term ends first), then release the lock and destroy the
        session so a successor need not wait out lock-delay. Safe to call twice."""
        if not self._running:
            return
        self._running = False
        self._lose("this instance is stopping", stepping_down=True)
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        session, self._session_id = self._session_id, None
        self._renew_ok = False
        self._notify()
        registered, self._check_registered = self._check_registered, False
        if session is None and not registered:
            return
        try:
            await asyncio.wait_for(self._release(session, registered), self._settings.release_timeout)
        except (ConsulError, TimeoutError) as exc:
            log.warning(
                "leader election %s: could not release the lock cleanly (%s); it frees itself when the "
                "session times out",
                self._instance,
                str(exc) or "no answer in time",
            )

    async def _release(self, session: str | None, registered: bool) -> None:
        if session is not None:
            await self._client.kv_put(self._key, self._instance.encode("utf-8"), release=session)
            await self._client.session_destroy(session)
        if registered:
            await self._client.agent_service_deregister(self.process_service_id)

    async def __aenter__(self) -> LeaderElection:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ terms

    def _deadline(self) -> float:
        return self._renewed_at + self._settings.ttl - self._settings.safety_margin

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _poke(self) -> None:
        self._poked.set()

    def _arm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._term is not None and self._loop is not None:
            self._expiry = self._loop.call_at(self._deadline(), self._expire)

    def _expire(self) -> None:
        self._expiry = None
        if self._loop is not None and self._loop.time() >= self._deadline():
            self._renew_ok = False
            self._lose("no successful session renewal within the TTL")
        else:
            self._arm_expiry()

    def _begin(self, session_id: str) -> None:
        if self._term is not None and not self._term.lost.is_set():
            return
        assert self._loop is not None
        self._terms += 1
        self._term = Term(self._terms, session_id, self._loop.time())
        log.info("leader election: %s leads (term %d)", self._instance, self._terms)
        self._arm_expiry()
        self._notify()

    def _lose(self, reason: str, *, stepping_down: bool = False) -> None:
        """End the term. ``stepping_down``: this instance chose to (a clean stop), which is
        news (INFO), not trouble; any other loss is a WARNING."""
        term, self._term = self._term, None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if term is None or term.lost.is_set():
            return
        term.reason = reason
        term.lost.set()
        if stepping_down:
            log.info("leader election: %s stepping down (term %d): %s", self._instance, term.number, reason)
        else:
            log.warning(
                "leader election: %s lost leadership (term %d): %s", self._instance, term.number, reason
            )
        self._notify()

    def _backoff(self, failures: int) -> float:
        return self._settings.backoff.delay(failures, self._rng.random())

    # ------------------------------------------------------------------ the session

    async def _renew_loop(self) -> None:
        assert self._loop is not None
        failures = 0
        while True:
            await asyncio.sleep(self._settings.renew_every if failures == 0 else self._backoff(failures))
            session = self._session_id
            if session is None:
                continue
            sent = self._loop.time()
            try:
                alive = await self._client.session_renew(session)
            except ConsulError as exc:
                failures += 1
                self._last_error = str(exc)
                if session == self._session_id:
                    # The session may well live on; but unheard renewals end a term (safety first).
                    self._renew_ok = False
                    self._lose(f"renewing the session failed: {exc}")
                continue
            if session != self._session_id:
                continue
            failures = 0
            if alive:
                was_ok = self._renew_ok
                self._renewed_at = max(self._renewed_at, sent)
                self._renew_ok = True
                self._arm_expiry()
                if not was_ok:
                    self._poke()  # a campaign waiting for a healthy session may lead again
            else:
                self._session_id = None
                self._renew_ok = False
                self._lose("the session expired or was destroyed")
                self._poke()

    # ------------------------------------------------------------------ the process check

    async def _register_process_check(self) -> None:
        """Register (again: idempotent) this process's service with a passing TTL check.
        Registered passing, so a session can be tied to it at once (Consul refuses a
        critical check, and a new check without a Status starts critical)."""
        ttl = self._settings.process_check_ttl
        assert ttl is not None
        registration: dict[str, object] = {
            "ID": self.process_service_id,
            "Name": PROCESS_SERVICE,
            "Meta": {"instance": self._instance[:512]},
            "Check": {
                "CheckID": self.process_check_id,
                "Name": "llmgw control plane process alive",
                "TTL": go_duration(ttl),
                "Status": "passing",
                "DeregisterCriticalServiceAfter": go_duration(self._settings.process_check_deregister_after),
            },
        }
        try:
            await self._client.agent_service_register(registration)
        except ConsulRejected as exc:
            if exc.status != 403:
                raise
            raise ConsulRejected(
                f'{exc}; the control plane\'s token also needs service "{PROCESS_SERVICE}" write '
                "(its leader session is tied to this process's check: ops/README.md, Consul ACLs)",
                exc.status,
            ) from None
        self._check_registered = True

    async def _process_check_loop(self) -> None:
        """Pass the check while this process lives. A failed pass is retried at the next
        beat; if the check expires meanwhile Consul invalidates the session, and the
        campaign registers the check again before the next session."""
        every = self._settings.process_check_every
        assert every is not None
        while True:
            await asyncio.sleep(every)
            if not self._check_registered:
                continue
            try:
                await self._client.agent_check_pass(self.process_check_id)
            except ConsulError as exc:
                self._last_error = str(exc)
                if isinstance(exc, ConsulRejected) and exc.status == 404:
                    self._check_registered = False  # reaped or removed: register before the next session
                    # The session tied to it is gone too (or soon is): end the term now.
                    self._renew_ok = False
                    self._lose("this process's check is gone from the agent")
                    self._poke()

    # ------------------------------------------------------------------ the lock

    async def _campaign_loop(self) -> None:
        assert self._loop is not None
        failures = 0
        while True:
            try:
                session = self._session_id
                if session is None:
                    checks: tuple[str, ...] = ()
                    if self._settings.process_check_ttl is not None:
                        await self._register_process_check()
                        checks = (self.process_check_id,)
                    session, sent = await self._create_session(checks)
                    self._session_id = session
                    self._renewed_at = sent
                    self._renew_ok = True
                await self._campaign(session)
                failures = 0
            except ConsulError as exc:
                failures += 1
                self._last_error = str(exc)
                self._lose(f"Consul did not answer the election: {exc}")
                if failures == 1:
                    log.warning("leader election %s: %s", self._instance, exc)
                await asyncio.sleep(self._backoff(failures))

    async def _create_session(self, checks: tuple[str, ...]) -> tuple[str, float]:
        """A session tied to ``checks``, and the loop time its create was sent.

        A check registered a moment ago may not have reached the servers' catalog yet
        (the agent syncs it in the background), which Consul answers with 500 "Missing
        check '<id>' registration": that answer alone is retried, a bounded number of
        times with backoff, before it fails the campaign as any other error does."""
        assert self._loop is not None
        attempt = 0
        while True:
            sent = self._loop.time()
            try:
                session = await self._client.session_create(
                    name=f"llmgw leader lock: {self._instance}"[:200],
                    ttl=self._settings.ttl,
                    lock_delay=self._settings.lock_delay,
                    behavior="release",
                    service_checks=checks,
                )
            except ConsulUnavailable as exc:
                attempt += 1
                if (
                    not (checks and _check_not_synced(exc, checks))
                    or attempt >= self._settings.check_sync_attempts
                ):
                    raise
                delay = self._settings.check_sync_backoff.delay(attempt, self._rng.random())
                log.debug(
                    "leader election %s: the agent has not synced its check yet (%s); retrying in %.2fs",
                    self._instance,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            return session, sent

    async def _campaign(self, session: str) -> None:
        """Hold or seek the lock with ``session`` until that session is dropped."""
        entry, meta = await self._client.kv_get(self._key)
        index = meta.index
        while self._session_id == session:
            self._poked.clear()
            holder = entry.session if entry is not None else ""
            wait = self._settings.key_wait
            if holder == session:
                if self._renew_ok and self._loop is not None and self._loop.time() < self._deadline():
                    self._begin(session)
            else:
                if self._term is not None:
                    self._lose("another session holds the lock" if holder else "the lock was released")
                if not holder and self._renew_ok:
                    value = self._instance.encode("utf-8")
                    if await self._client.kv_put(self._key, value, acquire=session):
                        entry, meta = await self._client.kv_get(self._key)
                        index = meta.index
                        continue
                    # Refused while free: lock-delay after the last holder, or a faster contender.
                    wait = self._settings.acquire_retry_interval
            answer = await self._unless_poked(self._client.kv_get(self._key, index=max(1, index), wait=wait))
            if answer is None:
                entry, meta = await self._client.kv_get(self._key)
                index = meta.index
                continue
            entry, meta = answer
            index = next_index(index, meta.index)

    async def _unless_poked(
        self, read: Awaitable[tuple[KvEntry | None, QueryMeta]]
    ) -> tuple[KvEntry | None, QueryMeta] | None:
        """The read's answer, or None if a renewal's news arrives first (the read is cancelled)."""
        reading = asyncio.ensure_future(read)
        poked = asyncio.ensure_future(self._poked.wait())
        try:
            await asyncio.wait({reading, poked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(poked, reading)
        return reading.result() if not reading.cancelled() else None
