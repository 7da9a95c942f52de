"""The engine endpoints routers send requests to, as Consul's health API reports them.

Owns reading ``GET /v1/health/service/llmgw-engine`` (every instance, passing or
not: the router wants to see statuses) into an :class:`EndpointSnapshot`, and
:func:`watch_endpoints`, ONE blocking query for all models (see
``llmgw.core.conventions.ENGINE_SERVICE`` for why one).

An instance's status is Consul's aggregate over its node's and its own checks:
the worst wins, and maintenance mode counts as critical. An entry llmgw cannot
read (meta missing or malformed, a bad port) is skipped with one warning per
instance, never a crash: the service catalog is written by Nomad from job specs
anyone with submit rights controls.

Must not: choose endpoints (``llmgw.core`` routing does) or filter by status.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from llmgw.adapters.consul.client import ConsulClient
from llmgw.adapters.consul.settings import WatchSettings
from llmgw.adapters.consul.watch import Watch
from llmgw.core import conventions as c
from llmgw.core.records import (
    Endpoint,
    EndpointSnapshot,
    HealthStatus,
    RecordDecodeError,
    aggregate_status,
    from_dict,
)

log = logging.getLogger(__name__)

# Consul's maintenance checks: their status is critical, but name them as such in logs.
_NODE_MAINT = "_node_maintenance"
_SERVICE_MAINT_PREFIX = "_service_maintenance:"
_REQUIRED_META = (c.META_MODEL, c.META_MODEL_SLUG, c.META_ENGINE, c.META_PROFILE)


class EndpointParseError(ValueError):
    """One health entry is not a readable llmgw engine instance."""


def parse_endpoint(entry: object) -> Endpoint:
    """One ServiceEntry (``{"Node": ..., "Service": ..., "Checks": [...]}``) as an Endpoint."""
    if not isinstance(entry, Mapping):
        raise EndpointParseError("entry is not a JSON object")
    service = entry.get("Service")
    node = entry.get("Node")
    checks = entry.get("Checks")
    if not isinstance(service, Mapping) or not isinstance(node, Mapping):
        raise EndpointParseError("entry has no Service or Node object")
    meta = service.get("Meta") or {}
    if not isinstance(meta, Mapping):
        raise EndpointParseError("Service.Meta is not an object")

    def meta_text(key: str, *, required: bool = True) -> str:
        value = meta.get(key)
        if value is None or value == "":
            if required:
                raise EndpointParseError(f"Service.Meta.{key} is missing")
            return ""
        if not isinstance(value, str):
            raise EndpointParseError(f"Service.Meta.{key} is not a string")
        return value

    missing = [key for key in _REQUIRED_META if not meta.get(key)]
    if not meta.get(c.META_REPLICA) and not meta.get(c.META_JOB):
        missing.append(c.META_REPLICA)
    if missing:
        raise EndpointParseError(f"Service.Meta lacks {', '.join(missing)}")
    rank = meta_text(c.META_RANK, required=False)
    if rank not in ("", "0"):
        raise EndpointParseError(f"rank {rank!r} registered as {c.ENGINE_SERVICE} (only rank 0 serves)")
    profile_text = meta_text(c.META_PROFILE)
    if not profile_text.isdigit():
        raise EndpointParseError(f"Service.Meta.{c.META_PROFILE}={profile_text!r} is not a whole number")
    node_address = node.get("Address")
    address = service.get("Address") or node_address
    raw = {
        "service_id": service.get("ID"),
        "node": node.get("Node"),
        "model": meta_text(c.META_MODEL),
        "model_slug": meta_text(c.META_MODEL_SLUG),
        # An endpoint's replica is named by its Nomad job id everywhere (drain marks,
        # the control plane's view); llmgw_replica is only the short id inside it.
        "replica": meta_text(c.META_JOB),
        "alloc_id": meta_text(c.META_ALLOC, required=False),
        "address": address,
        "port": service.get("Port"),
        "engine": meta_text(c.META_ENGINE),
        "profile": int(profile_text),
        "simulated": meta_text(c.META_SIMULATED, required=False).lower() == "true",
        "status": str(_status(checks)),
    }
    try:
        return from_dict(Endpoint, raw)
    except RecordDecodeError as exc:
        raise EndpointParseError(str(exc).replace("Endpoint.", "")) from None


def _status(checks: object) -> HealthStatus:
    # Nomad registers a service first and its checks a moment later, and Consul
    # counts a service without checks as passing: an engine endpoint with no
    # check of its own yet is not known to be healthy.
    if not isinstance(checks, list):
        raise EndpointParseError("Checks is not a list")
    if not any(isinstance(check, Mapping) and check.get("ServiceID") for check in checks):
        return HealthStatus.CRITICAL
    statuses: list[str] = []
    for check in checks:
        if not isinstance(check, Mapping):
            raise EndpointParseError("a check is not an object")
        check_id = check.get("CheckID")
        if isinstance(check_id, str) and (
            check_id == _NODE_MAINT or check_id.startswith(_SERVICE_MAINT_PREFIX)
        ):
            return HealthStatus.CRITICAL
        status = check.get("Status")
        statuses.append(status if isinstance(status, str) else "")
    return aggregate_status(statuses)


class EndpointReader:
    """Turns health answers into snapshots, warning once per unreadable instance."""

    def __init__(self) -> None:
        self._warned: dict[str, str] = {}
        self._filtered = False

    def note_filtered(self, filtered: bool) -> None:
        """Warn (once per episode) when ACLs hid instances: a router would route to fewer."""
        if filtered and not self._filtered:
            log.warning(
                "Consul hid some %s instances from this token (ACL filtering): give the token "
                "service:read on %s and node:read on every node",
                c.ENGINE_SERVICE,
                c.ENGINE_SERVICE,
            )
        self._filtered = filtered

    def snapshot(self, entries: list[object], index: int) -> EndpointSnapshot:
        endpoints: list[Endpoint] = []
        bad: dict[str, str] = {}
        for position, entry in enumerate(entries):
            try:
                endpoints.append(parse_endpoint(entry))
            except EndpointParseError as exc:
                ident = _ident(entry, position)
                bad[ident] = str(exc)
                if self._warned.get(ident) != str(exc):
                    log.warning("Consul %s instance %s skipped: %s", c.ENGINE_SERVICE, ident, exc)
        # Remember only what is still bad, so the set stays as small as the catalog.
        self._warned = bad
        endpoints.sort(key=lambda e: (e.model, e.node, e.service_id))
        return EndpointSnapshot(endpoints=tuple(endpoints), index=index)


def _ident(entry: object, position: int) -> str:
    if isinstance(entry, Mapping):
        service = entry.get("Service")
        node = entry.get("Node")
        sid = service.get("ID") if isinstance(service, Mapping) else None
        name = node.get("Node") if isinstance(node, Mapping) else None
        if isinstance(sid, str) and sid:
            return f"{sid!r} on {name!r}"[:300]
    return f"#{position}"


def watch_endpoints(client: ConsulClient, settings: WatchSettings | None = None) -> Watch[EndpointSnapshot]:
    """A watch (not yet started) of every ``llmgw-engine`` instance and its status.

    A new snapshot is published only when an endpoint or a status changed, so a
    router can rebuild its endpoint book on every one."""
    reader = EndpointReader()
    settings = settings or WatchSettings()

    async def fetch(index: int, wait: float) -> tuple[EndpointSnapshot, int]:
        entries, meta = await client.health_service(
            c.ENGINE_SERVICE, index=index, wait=wait, stale=settings.stale
        )
        reader.note_filtered(meta.results_filtered)
        return reader.snapshot(entries, meta.index), meta.index

    return Watch(
        f"health/{c.ENGINE_SERVICE}",
        fetch,
        settings,
        same=lambda a, b: a.endpoints == b.endpoints,
    )
