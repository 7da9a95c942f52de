"""The values the Consul stand-in stores: nodes, services, checks, KV entries, sessions.

Owns the record types (frozen; the store replaces a record whole to change it),
the statuses and kinds as ``StrEnum``s, and :class:`ConsulError`, an answer Consul
gives as an HTTP status with a plain-text body.

Must not: hold behaviour beyond tiny derived properties; rules live in
:mod:`llmgw.devcluster.consul.state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class ConsulError(Exception):
    """An error answer as Consul writes it: a status and a plain-text body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HealthStatus(StrEnum):
    PASSING = "passing"
    WARNING = "warning"
    CRITICAL = "critical"


class CheckKind(StrEnum):
    """What the agent runs for a check. Serf and maintenance checks run nothing."""

    HTTP = "http"
    TCP = "tcp"
    TTL = "ttl"
    SERF = ""
    MAINTENANCE = "maintenance"


class SessionBehavior(StrEnum):
    RELEASE = "release"
    DELETE = "delete"


class OutageMode(StrEnum):
    """How the stand-in stops answering during an outage fault.

    HANG: requests (and long polls in flight) wait until the outage ends.
    REFUSE: listeners close (new connections are refused) and open connections drop.
    NO_LEADER: agent-local endpoints answer; everything that needs the servers
    answers 500 "No cluster leader", as Consul does while it has lost quorum.
    """

    HANG = "hang"
    REFUSE = "refuse"
    NO_LEADER = "no-leader"


SERF_CHECK_ID = "serfHealth"
SERF_CHECK_NAME = "Serf Health Status"
SERF_ALIVE = "Agent alive and reachable"
SERF_FAILED = "Agent not live or unreachable"
SERVICE_MAINT_PREFIX = "_service_maintenance:"
DEFAULT_SERVICE_MAINT_REASON = (
    "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."
)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    address: str
    node_id: str
    create_index: int
    modify_index: int


@dataclass(frozen=True, slots=True)
class ServiceAddress:
    address: str
    port: int


@dataclass(frozen=True, slots=True)
class Weights:
    passing: int = 1
    warning: int = 1


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    """One service instance registered on one node's agent."""

    node: str
    service_id: str
    name: str
    tags: tuple[str, ...]
    address: str
    port: int
    meta: Mapping[str, str] | None  # None when the registration had none: catalog reads show null
    tagged_addresses: Mapping[str, ServiceAddress]
    weights: Weights
    enable_tag_override: bool
    kind: str
    create_index: int = 0
    modify_index: int = 0

    def same_definition(self, other: ServiceRecord) -> bool:
        """True when a re-registration changes nothing the catalog shows."""
        return (
            self.name,
            self.tags,
            self.address,
            self.port,
            dict(self.meta) if self.meta is not None else None,
            dict(self.tagged_addresses),
            self.weights,
            self.enable_tag_override,
            self.kind,
        ) == (
            other.name,
            other.tags,
            other.address,
            other.port,
            dict(other.meta) if other.meta is not None else None,
            dict(other.tagged_addresses),
            other.weights,
            other.enable_tag_override,
            other.kind,
        )


@dataclass(frozen=True, slots=True)
class CheckDefinition:
    """What the agent runs, and the thresholds that turn results into a status."""

    kind: CheckKind
    http: str = ""
    method: str = ""
    header: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    body: str = ""
    tls_server_name: str = ""
    tls_skip_verify: bool = False
    tcp: str = ""
    interval: float = 0.0
    timeout: float = 0.0
    ttl: float = 0.0
    deregister_critical_after: float = 0.0
    success_before_passing: int = 0
    failures_before_warning: int = 0
    failures_before_critical: int = 0


NO_DEFINITION = CheckDefinition(kind=CheckKind.SERF)


@dataclass(frozen=True, slots=True)
class CheckRecord:
    """A check on one node. ``status``/``output`` are the agent's own view; the
    ``catalog_*`` pair is what the servers know (health and catalog reads), which
    lags the agent for output-only changes and freezes while the node is failed."""

    node: str
    check_id: str
    name: str
    service_id: str
    service_name: str
    service_tags: tuple[str, ...]
    notes: str
    definition: CheckDefinition
    status: HealthStatus
    output: str
    catalog_status: HealthStatus
    catalog_output: str
    create_index: int
    modify_index: int
    # Agent-side clocks (loop time, seconds).
    ttl_deadline: float | None = None
    critical_since: float | None = None
    output_synced_at: float = 0.0
    output_sync_due: float | None = None
    # When the agent's sync of this check's first registration reaches the servers
    # (``ConsulSettings.catalog_sync_delay`` after it): before then a session can not
    # be tied to it (``Missing check '<id>' registration``).
    catalog_since: float = 0.0


@dataclass(frozen=True, slots=True)
class KVEntry:
    key: str
    value: bytes | None
    flags: int
    lock_index: int
    session: str
    create_index: int
    modify_index: int


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    name: str
    node: str
    lock_delay: float  # seconds
    behavior: SessionBehavior
    ttl: str  # as the client wrote it ("15s"), or ""
    ttl_seconds: float
    checks: tuple[str, ...]
    create_index: int
    deadline: float | None  # loop time after which the servers invalidate it
