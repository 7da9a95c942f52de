"""How llmgw's Consul adapter times itself: every timeout, interval and backoff, with its reason.

Owns :class:`ClientSettings` (one HTTP request), :class:`WatchSettings` (a
blocking-query loop) and :class:`ElectionSettings` (the leader lock). The
defaults suit production; tests pass small values. Where to reach Consul (address,
token, TLS) is :class:`llmgw.settings.ConsulConnection`, not here.

Must not: read the environment, or do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.core.backoff import BackoffPolicy


class ConsulSettingsError(ValueError):
    """A timing setting that cannot work; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    # Opening a TCP (and TLS) connection to the local agent: it is on the same host
    # or LAN, so a few seconds means it is down, not slow.
    connect_timeout: float = 5.0
    # A request that does not block (a write, a plain read): Consul answers these in
    # milliseconds unless it has lost its leader; then the caller should retry.
    request_timeout: float = 10.0
    # Added to a blocking query's wait (plus Consul's wait/16 jitter) before the
    # client gives up on the answer: covers a slow server, never a hung one for long.
    blocking_slack: float = 5.0
    # Connections kept to the agent. A router holds about five long polls at once;
    # the agent allows 200 connections per client address by default (http_max_conns_per_client).
    max_connections: int = 16
    # Error bodies quoted in exceptions are cut here (they can be whole HTML pages behind a proxy).
    error_body_chars: int = 300

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "request_timeout", "blocking_slack"):
            if getattr(self, name) <= 0:
                raise ConsulSettingsError(f"ClientSettings.{name} must be positive")
        if self.max_connections < 1:
            raise ConsulSettingsError("ClientSettings.max_connections must be at least 1")


@dataclass(frozen=True, slots=True)
class WatchSettings:
    # How long Consul holds one blocking query open (?wait=). Consul's own default
    # is 5 min; 60 s bounds how long a silently dead connection goes unnoticed
    # (the watcher reports unhealthy within wait + wait/16 + slack), at one cheap
    # request per minute per watch when nothing changes.
    wait: float = 60.0
    # Rate limit, as Consul's "Blocking Queries" page advises: a token bucket that
    # lets `burst` answers through at once, then one per `min_interval`, so a value
    # that churns (checks flapping in an incident) degrades into polling instead of
    # a busy loop that loads the servers.
    min_interval: float = 1.0
    burst: int = 2
    # After a failed request: exponential backoff from `backoff_initial` doubling up to
    # `backoff_max`, with equal jitter (each delay between half the step and the step),
    # so a thousand routers do not reconnect in step when Consul comes back.
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # ?stale lets any Consul server answer (not only the leader): reads scale with
    # the servers and keep working while a leader is being elected, at the price of
    # data up to a few hundred ms old. Off by default; the endpoint watch may turn it on.
    stale: bool = False

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.backoff_initial, self.backoff_max, jitter=0.5)

    def __post_init__(self) -> None:
        if self.wait <= 0:
            raise ConsulSettingsError("WatchSettings.wait must be positive")
        if self.wait > 600:
            raise ConsulSettingsError("WatchSettings.wait must be at most 600 s (Consul's cap is 10 min)")
        if self.min_interval < 0 or self.backoff_initial <= 0 or self.backoff_max < self.backoff_initial:
            raise ConsulSettingsError(
                "WatchSettings: min_interval >= 0 and 0 < backoff_initial <= backoff_max are required"
            )
        if self.burst < 1:
            raise ConsulSettingsError("WatchSettings.burst must be at least 1")


# Consul applies at most this lock-delay, whatever a session asks for
# (structs.MaxLockDelay, enforced in agent/consul/state/session.go).
CONSUL_MAX_LOCK_DELAY = 60.0


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    # The leader session's TTL: Consul's minimum (10 s; it refuses shorter). Consul
    # invalidates a session only after 2 x TTL without a renewal
    # (agent/consul/session_ttl.go); the leader itself gives up at TTL.
    ttl: float = 10.0
    # Renew this often (None: ttl / 2, so one lost renewal still leaves time for another).
    renew_interval: float | None = None
    # Consul refuses to let anyone take the lock for this long after the holder's
    # session is invalidated. Must be >= ttl: that is what keeps an old leader that
    # has not heard of its loss from overlapping a new one (see DESIGN.md). At most
    # 60 s: Consul cuts longer ones to that.
    lock_delay: float = 10.0
    # The leader stops considering itself leader this long before its TTL runs out,
    # to absorb clock-rate differences and event-loop lag.
    safety_margin: float = 1.0
    # The session is also tied to a TTL check of this process on the local agent
    # (service llmgw-control), which the process passes every process_check_ttl / 3:
    # when the process dies, the check goes critical within this long and Consul
    # invalidates the session at once, instead of after 2 x ttl. A failover after a
    # crash then takes about process_check_ttl + lock_delay + acquire_retry_interval
    # (~14 s) instead of 2 x ttl + lock_delay (~30 s). None: no check (only the TTL).
    process_check_ttl: float | None = 3.0
    # A crashed instance's check (critical for good) is removed by Consul after this
    # long (DeregisterCriticalServiceAfter; Consul's minimum is 1 min).
    process_check_deregister_after: float = 60.0
    # A contender whose acquire was refused while the key was free (lock-delay)
    # tries again after this long (Consul's Go client waits 5 s, DefaultLockRetryTime;
    # 1 s keeps a failover within a second of the lock-delay's end, at one PUT a second).
    acquire_retry_interval: float = 1.0
    # After a failed session create, renew or acquire: retry after this long
    # (doubling up to backoff_max, with equal jitter as the watches have).
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    # A session tied to this process's check, created right after the check was
    # registered, can be refused with 500 "Missing check '<id>' registration": the
    # agent answered the registration before its background sync put the check in
    # the servers' catalog (agent/local/state.go TriggerSyncChanges; the servers
    # validate against the catalog, agent/consul/state/session.go). That answer is
    # retried up to check_sync_attempts times, waiting check_sync_backoff_initial
    # doubling up to check_sync_backoff_max (equal jitter), before it counts as a
    # failure of the election (about 3 s in all by default).
    check_sync_attempts: int = 6
    check_sync_backoff_initial: float = 0.05
    check_sync_backoff_max: float = 1.0
    # The blocking query on the leader key while leading or waiting: shorter than
    # the watchers' wait so a hung connection is noticed well within one TTL.
    key_wait: float = 10.0
    # A clean stop releases the lock and destroys the session; if Consul does not
    # answer within this long, give up (the session then times out by itself).
    release_timeout: float = 5.0

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.backoff_initial, self.backoff_max, jitter=0.5)

    @property
    def check_sync_backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.check_sync_backoff_initial, self.check_sync_backoff_max, jitter=0.5)

    @property
    def renew_every(self) -> float:
        return self.renew_interval if self.renew_interval is not None else self.ttl / 2

    @property
    def process_check_every(self) -> float | None:
        """How often the process passes its own check: three tries within its TTL."""
        return None if self.process_check_ttl is None else self.process_check_ttl / 3

    def __post_init__(self) -> None:
        if self.ttl <= 0 or self.safety_margin < 0 or self.safety_margin >= self.ttl:
            raise ConsulSettingsError("ElectionSettings: ttl > safety_margin >= 0 is required")
        if not 0 < self.renew_every < self.ttl - self.safety_margin:
            raise ConsulSettingsError(
                "ElectionSettings.renew_interval must be positive and shorter than ttl - safety_margin"
            )
        if self.lock_delay < self.ttl:
            raise ConsulSettingsError(
                f"ElectionSettings.lock_delay ({self.lock_delay}s) must be at least the ttl ({self.ttl}s): "
                "otherwise a new leader may act before an old one that missed its loss has stopped"
            )
        if self.lock_delay > CONSUL_MAX_LOCK_DELAY:
            raise ConsulSettingsError(
                f"ElectionSettings.lock_delay ({self.lock_delay}s) is more than Consul applies "
                f"({CONSUL_MAX_LOCK_DELAY:g}s, its MaxLockDelay): use a ttl and lock_delay of at most "
                f"{CONSUL_MAX_LOCK_DELAY:g}s"
            )
        if self.process_check_ttl is not None and self.process_check_ttl <= 0:
            raise ConsulSettingsError("ElectionSettings.process_check_ttl must be positive (or None)")
        if min(self.acquire_retry_interval, self.backoff_initial, self.key_wait, self.release_timeout) <= 0:
            raise ConsulSettingsError("ElectionSettings: intervals must be positive")
        if self.backoff_max < self.backoff_initial:
            raise ConsulSettingsError("ElectionSettings.backoff_max must be at least backoff_initial")
        if (
            self.check_sync_attempts < 1
            or not 0 < self.check_sync_backoff_initial <= self.check_sync_backoff_max
        ):
            raise ConsulSettingsError(
                "ElectionSettings: check_sync_attempts >= 1 and "
                "0 < check_sync_backoff_initial <= check_sync_backoff_max are required"
            )
