"""The Consul stand-in's store: catalog, agents' local state, KV, sessions and faults.

Owns every rule about data: the Raft-like index (one counter, bumped once per
write, recorded per table and per service name so each read knows its own
``X-Consul-Index``), agent registrations on each node, check status and the
agent-to-catalog sync, KV with check-and-set and locks, sessions with TTL,
lock-delay and invalidation, and the node faults.

Single-threaded by design: one event loop owns it, so there are no locks. Time
is a parameter (``now``, the loop's clock in seconds); :meth:`ConsulState.advance`
applies whatever is due (session expiry, TTL checks, the critical-service reaper,
deferred output syncs, the end of an outage) and :meth:`next_deadline` says when
to call it next. Listeners registered with :meth:`subscribe` are called after
every change, which is how blocking queries wake.

Must not: do I/O, sleep, or know about HTTP (handlers translate
:class:`~llmgw.devcluster.consul.model.ConsulError` into answers).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from llmgw.devcluster.acl import ConsulAcl, TokenBook
from llmgw.devcluster.acl.consul_rules import ConsulPolicy
from llmgw.devcluster.consul.acl_objects import AclObjects
from llmgw.devcluster.consul.decoding import CheckSpec, ServiceSpec, SessionSpec
from llmgw.devcluster.consul.durations import DurationError, format_go_duration, parse_go_duration
from llmgw.devcluster.consul.model import (
    DEFAULT_SERVICE_MAINT_REASON,
    NO_DEFINITION,
    SERF_ALIVE,
    SERF_CHECK_ID,
    SERF_CHECK_NAME,
    SERF_FAILED,
    SERVICE_MAINT_PREFIX,
    CheckDefinition,
    CheckKind,
    CheckRecord,
    ConsulError,
    HealthStatus,
    KVEntry,
    NodeRecord,
    OutageMode,
    ServiceRecord,
    SessionBehavior,
    SessionRecord,
)
from llmgw.devcluster.consul.settings import ConsulSettings


class Table(StrEnum):
    NODES = "nodes"
    SERVICES = "services"
    CHECKS = "checks"
    KVS = "kvs"
    SESSIONS = "sessions"


@dataclass(frozen=True, slots=True)
class Outage:
    mode: OutageMode
    until: float | None  # loop time; None -> until ended by hand


@dataclass(slots=True)
class Faults:
    """Faults injected by tests and ``llmgw dev``; owned by the store so every
    reader (handlers, check runners, the supervisor) sees one truth."""

    outage: Outage | None = None
    failed_nodes: set[str] = field(default_factory=set)
    check_latency: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServiceEntryView:
    """One row of /v1/health/service: the node, the instance, and the checks that
    bear on it (the node's own checks and the instance's)."""

    node: NodeRecord
    service: ServiceRecord
    checks: tuple[CheckRecord, ...]


def _node_id(name: str) -> str:
    # Stable across runs so a restarted stand-in keeps its node IDs.
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.node.llmgw-dev"))


@dataclass(frozen=True)
class AuthMethod:
    """A JWT auth method: the key identities are signed with (Nomad's JWKS, here shared),
    the audience it is bound to, and the roles its binding rule may bind (name -> policies)."""

    key: bytes = field(repr=False)
    audience: str = "consul.io"
    roles: dict[str, tuple[ConsulPolicy, ...]] = field(default_factory=dict)


class ConsulState:
    """All of one stand-in cluster's data. See the module docstring."""

    def __init__(self, settings: ConsulSettings | None = None) -> None:
        self.settings = settings or ConsulSettings()
        # The ACL tokens: settings.acl_token is a management token; DevCluster issues the
        # components' own (each with its ops/acl policy), and task logins add theirs.
        self.tokens: TokenBook[ConsulAcl] = TokenBook()
        if self.settings.acl_token is not None:
            self.tokens.add(self.settings.acl_token, "management", ConsulAcl("management", management=True))
        # JWT auth methods by name (``nomad-workloads``): what /v1/acl/login verifies.
        self.auth_methods: dict[str, AuthMethod] = {}
        # What the ACL API made (policies, roles, tokens, auth methods, binding rules).
        self.acl_objects = AclObjects()
        self.faults = Faults()
        self._index = 0
        self._tables: dict[Table, int] = dict.fromkeys(Table, 0)
        self._service_index: dict[str, int] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._services: dict[tuple[str, str], ServiceRecord] = {}
        self._checks: dict[tuple[str, str], CheckRecord] = {}
        self._kv: dict[str, KVEntry] = {}
        self._tombstones: dict[str, int] = {}
        self._lock_delays: dict[str, float] = {}
        self._sessions: dict[str, SessionRecord] = {}
        self._listeners: list[Callable[[], None]] = []
        self._next_reap: float | None = None
        self.add_node(self.settings.server_node, self.settings.server_address)

    # ------------------------------------------------------------------ plumbing

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after every change; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _write(self, *tables: Table) -> int:
        """Start one write: the next index, recorded on ``tables``."""
        self._index += 1
        for t in tables:
            self._tables[t] = self._index
        return self._index

    @property
    def index(self) -> int:
        """The last index any write used (Consul's raft applied index)."""
        return self._index

    def _table(self, *tables: Table) -> int:
        return max(1, *(self._tables[t] for t in tables))

    def _touch_service(self, name: str, idx: int) -> None:
        self._service_index[name] = idx

    def _touch_node_services(self, node: str, idx: int) -> None:
        for (n, _), svc in self._services.items():
            if n == node:
                self._service_index[svc.name] = idx

    # ------------------------------------------------------------------ nodes

    def add_node(self, name: str, address: str) -> NodeRecord:
        """Register a node (its agent joined) with a passing serfHealth check.
        Adding a known node again updates its address."""
        if not name:
            raise ConsulError(400, "Missing node name")
        existing = self._nodes.get(name)
        if existing is not None and existing.address == address:
            return existing
        idx = self._write(Table.NODES, Table.CHECKS)
        node = NodeRecord(
            name=name,
            address=address,
            node_id=_node_id(name),
            create_index=existing.create_index if existing else idx,
            modify_index=idx,
        )
        self._nodes[name] = node
        if existing is None:
            self._checks[(name, SERF_CHECK_ID)] = CheckRecord(
                node=name,
                check_id=SERF_CHECK_ID,
                name=SERF_CHECK_NAME,
                service_id="",
                service_name="",
                service_tags=(),
                notes="",
                definition=NO_DEFINITION,
                status=HealthStatus.PASSING,
                output=SERF_ALIVE,
                catalog_status=HealthStatus.PASSING,
                catalog_output=SERF_ALIVE,
                create_index=idx,
                modify_index=idx,
            )
        else:
            self._touch_node_services(name, idx)
        self._changed()
        return node

    def remove_node(self, name: str, now: float) -> None:
        """The node left: it, its services, checks and sessions are gone."""
        if name not in self._nodes or name == self.settings.server_node:
            return
        idx = self._write(Table.NODES, Table.SERVICES, Table.CHECKS)
        for key in [k for k in self._services if k[0] == name]:
            self._touch_service(self._services.pop(key).name, idx)
        for key in [k for k in self._checks if k[0] == name]:
            del self._checks[key]
        for sid in [s.session_id for s in self._sessions.values() if s.node == name]:
            self._invalidate_session(sid, idx, now)
        del self._nodes[name]
        self.faults.failed_nodes.discard(name)
        self.faults.check_latency.pop(name, None)
        self._changed()

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def require_node(self, name: str) -> NodeRecord:
        node = self._nodes.get(name)
        if node is None:
            raise ConsulError(500, f"Unknown node {name!r}: add it to the stand-in first")
        return node

    def fail_node(self, name: str, now: float) -> None:
        """Serf declares the node failed: serfHealth goes critical (so every service
        on it drops out of ``?passing``), sessions bound to it are invalidated, and
        the agent's check results stop reaching the catalog until it recovers."""
        self.require_node(name)
        if name in self.faults.failed_nodes:
            return
        self.faults.failed_nodes.add(name)
        self._set_catalog_status(name, SERF_CHECK_ID, HealthStatus.CRITICAL, SERF_FAILED, now)
        self._changed()

    def recover_node(self, name: str, now: float) -> None:
        """The node is back: serfHealth passes and anti-entropy pushes the agent's
        current check results to the catalog."""
        self.require_node(name)
        if name not in self.faults.failed_nodes:
            return
        self.faults.failed_nodes.discard(name)
        self._set_catalog_status(name, SERF_CHECK_ID, HealthStatus.PASSING, SERF_ALIVE, now)
        stale = [
            c
            for c in self._checks.values()
            if c.node == name
            and c.check_id != SERF_CHECK_ID
            and (c.status, c.output) != (c.catalog_status, c.catalog_output)
        ]
        if stale:
            idx = self._write(Table.CHECKS)
            for c in stale:
                self._checks[(name, c.check_id)] = replace(
                    c,
                    catalog_status=c.status,
                    catalog_output=c.output,
                    modify_index=idx,
                    output_synced_at=now,
                    output_sync_due=None,
                )
            self._touch_node_services(name, idx)
        self._changed()

    def set_check_latency(self, node: str, delay: float) -> None:
        """Every check the node's agent runs waits ``delay`` seconds first (inside its timeout)."""
        self.require_node(node)
        if delay > 0:
            self.faults.check_latency[node] = delay
        else:
            self.faults.check_latency.pop(node, None)
        self._changed()

    def set_outage(self, outage: Outage | None) -> None:
        self.faults.outage = outage
        self._changed()

    def nodes(self) -> list[NodeRecord]:
        return [self._nodes[n] for n in sorted(self._nodes)]

    # ------------------------------------------------------------------ agent: services

    def _check_record(
        self,
        node: str,
        spec: CheckSpec,
        check_id: str,
        name: str,
        service: ServiceRecord | None,
        idx: int,
        now: float,
    ) -> CheckRecord:
        existing = self._checks.get((node, check_id))
        status = spec.initial_status or HealthStatus.CRITICAL
        output = ""
        if existing is not None and existing.definition.kind is not CheckKind.MAINTENANCE:
            # Consul snapshots check state around a re-registration: same ID, same status.
            status, output = existing.status, existing.output
        ttl_deadline = now + spec.definition.ttl if spec.definition.kind is CheckKind.TTL else None
        if (
            existing is not None
            and existing.ttl_deadline is not None
            and spec.definition.kind is CheckKind.TTL
        ):
            ttl_deadline = existing.ttl_deadline
        return CheckRecord(
            node=node,
            check_id=check_id,
            name=name,
            service_id=service.service_id if service else "",
            service_name=service.name if service else "",
            service_tags=service.tags if service else (),
            notes=spec.notes,
            definition=spec.definition,
            status=status,
            output=output,
            catalog_status=existing.catalog_status if existing else status,
            catalog_output=existing.catalog_output if existing else output,
            create_index=existing.create_index if existing else idx,
            modify_index=idx,
            ttl_deadline=ttl_deadline,
            critical_since=(existing.critical_since if existing else None)
            if status is HealthStatus.CRITICAL
            else None,
            output_synced_at=existing.output_synced_at if existing else now,
            catalog_since=existing.catalog_since if existing else now + self.settings.catalog_sync_delay,
        )

    def _same_check(self, old: CheckRecord, new: CheckRecord) -> bool:
        return (old.name, old.notes, old.definition, old.service_id, old.service_tags, old.service_name) == (
            new.name,
            new.notes,
            new.definition,
            new.service_id,
            new.service_tags,
            new.service_name,
        )

    def register_service(
        self, node: str, spec: ServiceSpec, now: float, *, replace_existing_checks: bool
    ) -> None:
        """``PUT /v1/agent/service/register`` on ``node``'s agent."""
        self.require_node(node)
        key = (node, spec.service_id)
        existing = self._services.get(key)
        record = ServiceRecord(
            node=node,
            service_id=spec.service_id,
            name=spec.name,
            tags=spec.tags,
            address=spec.address,
            port=spec.port,
            meta=spec.meta,
            tagged_addresses=spec.tagged_addresses,
            weights=spec.weights,
            enable_tag_override=spec.enable_tag_override,
            kind=spec.kind,
        )
        # Work out the checks first so an idempotent re-registration writes nothing.
        new_checks: list[tuple[CheckSpec, str, str]] = []
        for i, c in enumerate(spec.checks):
            check_id = c.check_id or f"service:{spec.service_id}" + (
                f":{i + 1}" if len(spec.checks) > 1 else ""
            )
            new_checks.append((c, check_id, c.name or f"Service '{spec.name}' check"))
        wanted_ids = {cid for _, cid, _ in new_checks}
        stale_ids = []
        if replace_existing_checks or (existing is not None and existing.name != spec.name):
            stale_ids = [
                cid
                for (n, cid), c in self._checks.items()
                if n == node
                and c.service_id == spec.service_id
                and cid not in wanted_ids
                and not cid.startswith(SERVICE_MAINT_PREFIX)
            ]
        tentative = [self._check_record(node, c, cid, name, record, 0, now) for c, cid, name in new_checks]
        unchanged = (
            existing is not None
            and existing.same_definition(record)
            and not stale_ids
            and all(
                (old := self._checks.get((node, t.check_id))) is not None and self._same_check(old, t)
                for t in tentative
            )
        )
        if unchanged:
            return
        idx = self._write(Table.SERVICES, Table.CHECKS)
        if existing is not None and existing.name != spec.name:
            self._touch_service(existing.name, idx)
        self._services[key] = replace(
            record,
            create_index=existing.create_index if existing else idx,
            modify_index=idx,
        )
        for cid in stale_ids:
            self._delete_check(node, cid, idx, now)
        for c, cid, name in new_checks:
            self._checks[(node, cid)] = self._check_record(node, c, cid, name, record, idx, now)
        # Existing checks of the instance carry its tags in ServiceTags.
        for (n, cid), chk in list(self._checks.items()):
            if n == node and chk.service_id == spec.service_id and chk.service_tags != spec.tags:
                self._checks[(n, cid)] = replace(chk, service_tags=spec.tags, service_name=spec.name)
        self._touch_service(spec.name, idx)
        self._changed()

    def deregister_service(self, node: str, service_id: str, now: float) -> None:
        """``PUT /v1/agent/service/deregister/:id``: the instance and its checks go."""
        svc = self._services.get((node, service_id))
        if svc is None:
            raise ConsulError(404, f'Unknown service ID "{service_id}"')
        idx = self._write(Table.SERVICES, Table.CHECKS)
        self._remove_service(node, service_id, idx, now)
        self._changed()

    def _remove_service(self, node: str, service_id: str, idx: int, now: float) -> None:
        svc = self._services.pop((node, service_id))
        for cid in [cid for (n, cid), c in self._checks.items() if n == node and c.service_id == service_id]:
            self._delete_check(node, cid, idx, now)
        self._touch_service(svc.name, idx)

    def _delete_check(self, node: str, check_id: str, idx: int, now: float) -> None:
        self._checks.pop((node, check_id), None)
        self._tables[Table.CHECKS] = idx
        # Consul invalidates sessions whose health depended on a check that is gone.
        for sess in [s for s in self._sessions.values() if s.node == node and check_id in s.checks]:
            self._invalidate_session(sess.session_id, idx, now)

    def agent_services(self, node: str) -> list[ServiceRecord]:
        return sorted((s for (n, _), s in self._services.items() if n == node), key=lambda s: s.service_id)

    def agent_service(self, node: str, service_id: str) -> ServiceRecord | None:
        return self._services.get((node, service_id))

    # ------------------------------------------------------------------ agent: checks

    def register_check(self, node: str, spec: CheckSpec, now: float) -> None:
        """``PUT /v1/agent/check/register``: a check of the node, or of a service on it."""
        self.require_node(node)
        service = None
        if spec.service_id:
            service = self._services.get((node, spec.service_id))
            if service is None:
                raise ConsulError(500, f'ServiceID "{spec.service_id}" does not exist')
        check_id = spec.check_id or spec.name
        record = self._check_record(node, spec, check_id, spec.name, service, 0, now)
        old = self._checks.get((node, check_id))
        if old is not None and self._same_check(old, record):
            return
        idx = self._write(Table.CHECKS)
        self._checks[(node, check_id)] = self._check_record(
            node, spec, check_id, spec.name, service, idx, now
        )
        if service is not None:
            self._touch_service(service.name, idx)
        else:
            self._touch_node_services(node, idx)
        self._changed()

    def deregister_check(self, node: str, check_id: str, now: float) -> None:
        chk = self._checks.get((node, check_id))
        if chk is None or check_id == SERF_CHECK_ID:
            raise ConsulError(404, f'Unknown check ID "{check_id}"')
        idx = self._write(Table.CHECKS)
        self._delete_check(node, check_id, idx, now)
        if chk.service_name:
            self._touch_service(chk.service_name, idx)
        else:
            self._touch_node_services(node, idx)
        self._changed()

    def agent_checks(self, node: str) -> list[CheckRecord]:
        """The checks the node's agent owns (serfHealth belongs to the servers)."""
        return sorted(
            (c for (n, cid), c in self._checks.items() if n == node and cid != SERF_CHECK_ID),
            key=lambda c: c.check_id,
        )

    def http_checks(self) -> list[CheckRecord]:
        """Every check an agent must run on a timer (HTTP and TCP)."""
        return [c for c in self._checks.values() if c.definition.kind in (CheckKind.HTTP, CheckKind.TCP)]

    def check(self, node: str, check_id: str) -> CheckRecord | None:
        return self._checks.get((node, check_id))

    def update_check(self, node: str, check_id: str, status: HealthStatus, output: str, now: float) -> None:
        """A check result on the node's agent (from a runner, a TTL update, or expiry).

        A status change reaches the catalog at once (one index bump); an output-only
        change waits for ``check_update_interval``, as Consul's agent defers it; a
        failed node's results stay agent-local until it recovers."""
        chk = self._checks.get((node, check_id))
        if chk is None:
            return
        limit = self.settings.check_output_max
        if len(output) > limit:
            output = f"{output[:limit]} ... (captured {limit} of {len(output)} bytes)"
        if (status, output) == (chk.status, chk.output):
            return
        critical_since = chk.critical_since
        if status is HealthStatus.CRITICAL:
            critical_since = critical_since if critical_since is not None else now
        else:
            critical_since = None
        chk = replace(chk, status=status, output=output, critical_since=critical_since)
        self._checks[(node, check_id)] = chk
        if node in self.faults.failed_nodes:
            return
        if status is not chk.catalog_status:
            self._set_catalog_status(node, check_id, status, output, now)
        elif output != chk.catalog_output:
            due = chk.output_synced_at + self.settings.check_update_interval
            if due <= now:
                self._set_catalog_status(node, check_id, status, output, now)
            elif chk.output_sync_due is None:
                self._checks[(node, check_id)] = replace(chk, output_sync_due=due)
        self._changed()

    def _set_catalog_status(
        self, node: str, check_id: str, status: HealthStatus, output: str, now: float
    ) -> None:
        chk = self._checks[(node, check_id)]
        idx = self._write(Table.CHECKS)
        local = (status, output) if check_id == SERF_CHECK_ID else (chk.status, chk.output)
        self._checks[(node, check_id)] = replace(
            chk,
            status=local[0],
            output=local[1],
            catalog_status=status,
            catalog_output=output,
            modify_index=idx,
            output_synced_at=now,
            output_sync_due=None,
        )
        if chk.service_name:
            self._touch_service(chk.service_name, idx)
        else:
            self._touch_node_services(node, idx)
        if status is HealthStatus.CRITICAL:
            for sess in [s for s in self._sessions.values() if s.node == node and check_id in s.checks]:
                self._invalidate_session(sess.session_id, idx, now)

    def update_ttl(self, node: str, check_id: str, status: HealthStatus, output: str, now: float) -> None:
        """``PUT /v1/agent/check/pass|warn|fail/:id``."""
        chk = self._checks.get((node, check_id))
        if chk is None:
            raise ConsulError(
                404, f'Unknown check ID "{check_id}". Ensure that the check ID is passed, not the check name.'
            )
        if chk.definition.kind is not CheckKind.TTL:
            raise ConsulError(500, f'CheckID "{check_id}" does not have associated TTL')
        self._checks[(node, check_id)] = replace(chk, ttl_deadline=now + chk.definition.ttl)
        self.update_check(node, check_id, status, output, now)

    def set_service_maintenance(
        self, node: str, service_id: str, enable: bool, reason: str, now: float
    ) -> None:
        svc = self._services.get((node, service_id))
        if svc is None:
            raise ConsulError(404, f'Unknown service ID "{service_id}"')
        check_id = SERVICE_MAINT_PREFIX + service_id
        self._set_maintenance(
            node,
            check_id,
            "Service Maintenance Mode",
            svc,
            enable,
            reason or DEFAULT_SERVICE_MAINT_REASON,
            now,
        )

    def _set_maintenance(
        self,
        node: str,
        check_id: str,
        name: str,
        svc: ServiceRecord | None,
        enable: bool,
        reason: str,
        now: float,
    ) -> None:
        present = (node, check_id) in self._checks
        if enable == present:
            return  # Consul: enabling twice, or disabling when off, changes nothing
        idx = self._write(Table.CHECKS)
        if enable:
            self._checks[(node, check_id)] = CheckRecord(
                node=node,
                check_id=check_id,
                name=name,
                service_id=svc.service_id if svc else "",
                service_name=svc.name if svc else "",
                service_tags=svc.tags if svc else (),
                notes=reason,
                definition=CheckDefinition(kind=CheckKind.MAINTENANCE),
                status=HealthStatus.CRITICAL,
                output="",
                catalog_status=HealthStatus.CRITICAL,
                catalog_output="",
                create_index=idx,
                modify_index=idx,
                critical_since=now,
            )
        else:
            self._delete_check(node, check_id, idx, now)
        if svc is not None:
            self._touch_service(svc.name, idx)
        else:
            self._touch_node_services(node, idx)
        self._changed()

    # ------------------------------------------------------------------ health and catalog reads

    def _node_checks(self, node: str) -> list[CheckRecord]:
        return [c for (n, _), c in self._checks.items() if n == node and not c.service_id]

    def _instance_checks(self, svc: ServiceRecord) -> list[CheckRecord]:
        return [c for (n, _), c in self._checks.items() if n == svc.node and c.service_id == svc.service_id]

    def _instances(self, name: str) -> list[ServiceRecord]:
        return sorted(
            (s for s in self._services.values() if s.name == name), key=lambda s: (s.node, s.service_id)
        )

    def service_index(self, name: str, *, with_checks: bool) -> int:
        """The index a read of service ``name`` reports: its own while it has
        instances, else the table maximum (Consul's maxIndexForService)."""
        if self._instances(name) and name in self._service_index:
            return max(1, self._service_index[name])
        return self._table(Table.SERVICES, Table.CHECKS) if with_checks else self._table(Table.SERVICES)

    def health_service(
        self,
        name: str,
        *,
        passing_only: bool,
        tags: Iterable[str] = (),
        node_meta: Mapping[str, str] | None = None,
    ) -> tuple[int, list[ServiceEntryView]]:
        """``GET /v1/health/service/:name``: instances with their checks, node checks first-class."""
        wanted = {t.lower() for t in tags}
        rows: list[ServiceEntryView] = []
        for svc in self._instances(name):
            if wanted and not wanted <= {t.lower() for t in svc.tags}:
                continue
            checks = sorted(
                self._node_checks(svc.node) + self._instance_checks(svc), key=lambda c: c.check_id
            )
            if passing_only and any(c.catalog_status is not HealthStatus.PASSING for c in checks):
                continue
            rows.append(ServiceEntryView(self._nodes[svc.node], svc, tuple(checks)))
        return self.service_index(name, with_checks=True), rows

    def health_checks_of_service(self, name: str) -> tuple[int, list[CheckRecord]]:
        checks = [
            c
            for svc in self._instances(name)
            for c in sorted(self._instance_checks(svc), key=lambda c: c.check_id)
        ]
        return self.service_index(name, with_checks=True), checks

    def health_state(self, state: str) -> tuple[int, list[CheckRecord]]:
        """``GET /v1/health/state/:state`` (any, passing, warning, critical)."""
        if state not in ("any", "passing", "warning", "critical"):
            raise ConsulError(400, f"Invalid check state: {state!r}")
        checks = sorted(self._checks.values(), key=lambda c: (c.node, c.check_id))
        if state != "any":
            checks = [c for c in checks if c.catalog_status == state]
        return self._table(Table.CHECKS), checks

    def health_node(self, node: str) -> tuple[int, list[CheckRecord]]:
        checks = sorted((c for (n, _), c in self._checks.items() if n == node), key=lambda c: c.check_id)
        return self._table(Table.CHECKS), checks

    def catalog_services(self) -> tuple[int, dict[str, list[str]]]:
        """``GET /v1/catalog/services``: every service name with the union of its tags."""
        out: dict[str, set[str]] = {}
        for svc in self._services.values():
            out.setdefault(svc.name, set()).update(svc.tags)
        return self._table(Table.SERVICES), {k: sorted(v) for k, v in sorted(out.items())}

    def catalog_service(
        self, name: str, tags: Iterable[str] = ()
    ) -> tuple[int, list[tuple[NodeRecord, ServiceRecord]]]:
        wanted = {t.lower() for t in tags}
        rows = [
            (self._nodes[s.node], s)
            for s in self._instances(name)
            if not wanted or wanted <= {t.lower() for t in s.tags}
        ]
        return self.service_index(name, with_checks=False), rows

    def catalog_nodes(self) -> tuple[int, list[NodeRecord]]:
        return self._table(Table.NODES), self.nodes()

    # ------------------------------------------------------------------ KV

    def _kv_prefix_index(self, prefix: str, entries: Iterable[KVEntry]) -> int:
        """Consul's kvsListTxn: the highest ModifyIndex or tombstone under the prefix,
        or the whole table's index for the empty prefix or when nothing matched."""
        if not prefix:
            return self._table(Table.KVS)
        idx = max((e.modify_index for e in entries), default=0)
        idx = max(idx, max((i for k, i in self._tombstones.items() if k.startswith(prefix)), default=0))
        return idx if idx > 0 else self._table(Table.KVS)

    def kv_get(self, key: str) -> tuple[int, KVEntry | None]:
        entry = self._kv.get(key)
        if entry is not None:
            return max(1, entry.modify_index), entry
        return self._table(Table.KVS), None

    def kv_list(self, prefix: str) -> tuple[int, list[KVEntry]]:
        entries = [self._kv[k] for k in sorted(self._kv) if k.startswith(prefix)]
        return self._kv_prefix_index(prefix, entries), entries

    def kv_keys(self, prefix: str, separator: str) -> tuple[int, list[str]]:
        idx, entries = self.kv_list(prefix)
        keys: list[str] = []
        for e in entries:
            if separator:
                cut = e.key.find(separator, len(prefix))
                name = e.key[: cut + len(separator)] if cut >= 0 else e.key
            else:
                name = e.key
            if not keys or keys[-1] != name:
                keys.append(name)
        return idx, keys

    def kv_put(
        self,
        key: str,
        value: bytes | None,
        flags: int,
        now: float,
        *,
        cas: int | None = None,
        acquire: str | None = None,
        release: str | None = None,
    ) -> bool:
        """``PUT /v1/kv/:key`` with Consul's semantics; False when a CAS, acquire or
        release did not apply."""
        existing = self._kv.get(key)
        if cas is not None:
            if cas == 0 and existing is not None:
                return False
            if cas != 0 and (existing is None or existing.modify_index != cas):
                return False
        if acquire is not None:
            if acquire not in self._sessions:
                raise ConsulError(500, f'Invalid session "{acquire}"')
            if self._lock_delays.get(key, 0.0) > now:
                return False  # lock-delay after the previous holder was invalidated
            if existing is not None and existing.session and existing.session != acquire:
                return False
            idx = self._write(Table.KVS)
            held = existing is not None and existing.session == acquire
            lock_index = (existing.lock_index if existing else 0) + (0 if held else 1)
            self._put(key, value, flags, idx, lock_index=lock_index, session=acquire)
            return True
        if release is not None:
            if existing is None or existing.session != release:
                return False
            idx = self._write(Table.KVS)
            self._put(key, value, flags, idx, lock_index=existing.lock_index, session="")
            return True
        idx = self._write(Table.KVS)
        self._put(
            key,
            value,
            flags,
            idx,
            lock_index=existing.lock_index if existing else 0,
            session=existing.session if existing else "",
        )
        return True

    def _put(
        self, key: str, value: bytes | None, flags: int, idx: int, *, lock_index: int, session: str
    ) -> None:
        existing = self._kv.get(key)
        self._kv[key] = KVEntry(
            key=key,
            value=value if value else None,
            flags=flags,
            lock_index=lock_index,
            session=session,
            create_index=existing.create_index if existing else idx,
            modify_index=idx,
        )
        self._tombstones.pop(key, None)
        self._changed()

    def kv_delete(self, key: str, *, recurse: bool, cas: int | None = None) -> bool:
        """``DELETE /v1/kv/:key``; ``cas`` deletes only at that ModifyIndex."""
        if cas is not None:
            existing = self._kv.get(key)
            if existing is None or existing.modify_index != cas:
                return existing is None
        keys = [k for k in self._kv if k.startswith(key)] if recurse else ([key] if key in self._kv else [])
        if not keys:
            return True
        idx = self._write(Table.KVS)
        for k in keys:
            del self._kv[k]
            self._tombstones[k] = idx
        self._changed()
        return True

    # ------------------------------------------------------------------ sessions

    def session_create(self, node_default: str, spec: SessionSpec, now: float) -> SessionRecord:
        """``PUT /v1/session/create``: validated as Consul's servers do."""
        node = spec.node or node_default
        if node not in self._nodes:
            raise ConsulError(500, f"Missing node registration: {node!r}")
        ttl_seconds = 0.0
        if spec.ttl:
            try:
                ttl_seconds = parse_go_duration(spec.ttl)
            except DurationError as exc:
                raise ConsulError(400, f"Request decode failed: TTL: {exc}") from None
            lo, hi = self.settings.session_ttl_min, self.settings.session_ttl_max
            if ttl_seconds != 0 and not lo <= ttl_seconds <= hi:
                raise ConsulError(
                    500,
                    f"Invalid Session TTL '{spec.ttl}', must be between "
                    f"[{format_go_duration(lo)}={format_go_duration(hi)}]",
                )
        checks = spec.checks if spec.checks is not None else (SERF_CHECK_ID,)
        for cid in checks:
            chk = self._checks.get((node, cid))
            if chk is None or chk.catalog_since > now:
                # The servers validate against their catalog, which learns of an agent's
                # new check only when the agent's sync of it lands.
                raise ConsulError(500, f"Missing check '{cid}' registration")
            if chk.catalog_status is HealthStatus.CRITICAL:
                raise ConsulError(500, f"Check '{cid}' is in critical state")
        idx = self._write(Table.SESSIONS)
        record = SessionRecord(
            session_id=str(uuid.uuid4()),
            name=spec.name,
            node=node,
            lock_delay=self.settings.default_lock_delay if spec.lock_delay is None else spec.lock_delay,
            behavior=spec.behavior,
            ttl=spec.ttl if ttl_seconds else "",
            ttl_seconds=ttl_seconds,
            checks=tuple(checks),
            create_index=idx,
            deadline=now + ttl_seconds * self.settings.session_ttl_multiplier if ttl_seconds else None,
        )
        self._sessions[record.session_id] = record
        self._changed()
        return record

    def session_destroy(self, session_id: str, now: float) -> None:
        if session_id not in self._sessions:
            return  # Consul: destroying an unknown session succeeds
        idx = self._write(Table.SESSIONS)
        self._invalidate_session(session_id, idx, now)
        self._changed()

    def session_renew(self, session_id: str, now: float) -> SessionRecord:
        sess = self._sessions.get(session_id)
        if sess is None:
            raise ConsulError(404, f"Session id '{session_id}' not found")
        if sess.ttl_seconds:
            sess = replace(sess, deadline=now + sess.ttl_seconds * self.settings.session_ttl_multiplier)
            self._sessions[session_id] = sess
        return sess

    def session_info(self, session_id: str) -> tuple[int, SessionRecord | None]:
        return self._table(Table.SESSIONS), self._sessions.get(session_id)

    def session_list(self, node: str | None = None) -> tuple[int, list[SessionRecord]]:
        rows = sorted(
            (s for s in self._sessions.values() if node is None or s.node == node), key=lambda s: s.session_id
        )
        return self._table(Table.SESSIONS), rows

    def _invalidate_session(self, session_id: str, idx: int, now: float) -> None:
        """Drop the session and apply its Behavior to the keys it holds; each such
        key honours the session's lock-delay before anyone may acquire it again."""
        sess = self._sessions.pop(session_id, None)
        if sess is None:
            return
        self._tables[Table.SESSIONS] = idx
        for key, entry in list(self._kv.items()):
            if entry.session != session_id:
                continue
            self._tables[Table.KVS] = idx
            if sess.behavior is SessionBehavior.DELETE:
                del self._kv[key]
                self._tombstones[key] = idx
            else:
                self._kv[key] = replace(entry, session="", modify_index=idx)
            delay = min(sess.lock_delay, self.settings.max_lock_delay)  # Consul's MaxLockDelay
            if delay > 0:
                self._lock_delays[key] = now + delay

    # ------------------------------------------------------------------ time

    def advance(self, now: float) -> None:
        """Apply everything due at ``now``: session expiry, TTL-check expiry,
        deferred output syncs, the critical-service reaper, the end of an outage."""
        for sess in [s for s in self._sessions.values() if s.deadline is not None and s.deadline <= now]:
            idx = self._write(Table.SESSIONS)
            self._invalidate_session(sess.session_id, idx, now)
            self._changed()
        for chk in [c for c in self._checks.values() if c.ttl_deadline is not None and c.ttl_deadline <= now]:
            self._checks[(chk.node, chk.check_id)] = replace(chk, ttl_deadline=None)
            expired = (
                "TTL expired"
                if not chk.output
                else f"TTL expired (last output before timeout follows): {chk.output}"
            )
            self.update_check(chk.node, chk.check_id, HealthStatus.CRITICAL, expired, now)
        for chk in [
            c for c in self._checks.values() if c.output_sync_due is not None and c.output_sync_due <= now
        ]:
            if chk.node in self.faults.failed_nodes:
                # Nothing reaches the catalog from a failed node; recovery syncs everything.
                self._checks[(chk.node, chk.check_id)] = replace(chk, output_sync_due=None)
                continue
            self._set_catalog_status(chk.node, chk.check_id, chk.catalog_status, chk.output, now)
            self._changed()
        if self._reapable():
            if self._next_reap is None:
                self._next_reap = now + self.settings.check_reap_interval
            elif self._next_reap <= now:
                self._next_reap = now + self.settings.check_reap_interval
                self._reap(now)
        else:
            self._next_reap = None
        outage = self.faults.outage
        if outage is not None and outage.until is not None and outage.until <= now:
            self.set_outage(None)

    def _reapable(self) -> bool:
        return any(c.definition.deregister_critical_after > 0 for c in self._checks.values())

    def _reap(self, now: float) -> None:
        """The agent's reaper: deregister services whose check has been critical
        longer than its DeregisterCriticalServiceAfter."""
        doomed: set[tuple[str, str]] = set()
        floor = self.settings.min_deregister_critical_after
        for c in self._checks.values():
            after = c.definition.deregister_critical_after
            if after <= 0 or not c.service_id or c.critical_since is None:
                continue
            if now - c.critical_since >= max(after, floor):
                doomed.add((c.node, c.service_id))
        if not doomed:
            return
        idx = self._write(Table.SERVICES, Table.CHECKS)
        for node, service_id in sorted(doomed):
            if (node, service_id) in self._services:
                self._remove_service(node, service_id, idx, now)
        self._changed()

    def next_deadline(self) -> float | None:
        """The earliest loop time at which :meth:`advance` has something to do."""
        times: list[float] = [s.deadline for s in self._sessions.values() if s.deadline is not None]
        for c in self._checks.values():
            if c.ttl_deadline is not None:
                times.append(c.ttl_deadline)
            if c.output_sync_due is not None:
                times.append(c.output_sync_due)
        if self._next_reap is not None:
            times.append(self._next_reap)
        elif self._reapable():
            times.append(0.0)  # arm the reaper on the next pass
        if self.faults.outage is not None and self.faults.outage.until is not None:
            times.append(self.faults.outage.until)
        return min(times) if times else None
