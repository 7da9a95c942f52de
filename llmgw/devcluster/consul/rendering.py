"""Records as the JSON Consul sends: key-exact against consul-api-fields.json.

Owns one function per response shape (ServiceEntry, HealthCheck, AgentService,
AgentCheck, CatalogService, Node, KVPair, SessionEntry, /v1/agent/self). Keys are
the Go API structs' (``llmgw/apispec/consul-api-fields.json``); where real Consul
omits an empty field (``omitempty``) so does this, and where it writes ``null`` or
``[]`` for an empty one so does this (a service without Meta reads ``"Meta": null``
from health and catalog endpoints, ``{}`` from the agent's own endpoint).

Must not: filter, sort or decide anything; that is the store's and the handlers' job.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping

from llmgw.devcluster.consul.durations import format_go_duration
from llmgw.devcluster.consul.model import (
    CheckDefinition,
    CheckKind,
    CheckRecord,
    KVEntry,
    NodeRecord,
    ServiceAddress,
    ServiceRecord,
    SessionRecord,
)
from llmgw.devcluster.consul.settings import ConsulSettings

Json = dict[str, object]


def _tagged(addrs: Mapping[str, ServiceAddress]) -> Json:
    return {k: {"Address": v.address, "Port": v.port} for k, v in sorted(addrs.items())}


def _proxy() -> Json:
    # What Consul CE writes for a plain (non-mesh) service's empty proxy config.
    return {"Mode": "", "MeshGateway": {}, "Expose": {}}


def node(n: NodeRecord, datacenter: str) -> Json:
    """A ``Node`` (catalog nodes, ServiceEntry.Node)."""
    return {
        "ID": n.node_id,
        "Node": n.name,
        "Address": n.address,
        "Datacenter": datacenter,
        "TaggedAddresses": {"lan": n.address, "lan_ipv4": n.address, "wan": n.address, "wan_ipv4": n.address},
        "Meta": {"consul-network-segment": ""},
        "CreateIndex": n.create_index,
        "ModifyIndex": n.modify_index,
    }


def definition(d: CheckDefinition) -> Json:
    """A ``HealthCheckDefinition``: Consul omits empty fields and writes durations as strings."""
    out: Json = {}
    if d.http:
        out["HTTP"] = d.http
    if d.tls_server_name:
        out["TLSServerName"] = d.tls_server_name
    if d.tls_skip_verify:
        out["TLSSkipVerify"] = True
    if d.header:
        out["Header"] = {k: list(v) for k, v in d.header.items()}
    if d.method:
        out["Method"] = d.method
    if d.body:
        out["Body"] = d.body
    if d.tcp:
        out["TCP"] = d.tcp
    if d.interval:
        out["Interval"] = format_go_duration(d.interval)
    if d.timeout:
        out["Timeout"] = format_go_duration(d.timeout)
    if d.deregister_critical_after:
        out["DeregisterCriticalServiceAfter"] = format_go_duration(d.deregister_critical_after)
    return out


def _check_type(c: CheckRecord) -> str:
    kind = c.definition.kind
    return "" if kind in (CheckKind.SERF, CheckKind.MAINTENANCE) else kind.value


def health_check(c: CheckRecord) -> Json:
    """A ``HealthCheck`` as the servers know it (catalog status and output)."""
    return {
        "Node": c.node,
        "CheckID": c.check_id,
        "Name": c.name,
        "Status": c.catalog_status.value,
        "Notes": c.notes,
        "Output": c.catalog_output,
        "ServiceID": c.service_id,
        "ServiceName": c.service_name,
        "ServiceTags": list(c.service_tags),
        "Type": _check_type(c),
        "ExposedPort": 0,
        "Definition": definition(c.definition),
        "CreateIndex": c.create_index,
        "ModifyIndex": c.modify_index,
    }


def agent_check(c: CheckRecord) -> Json:
    """An ``AgentCheck``: the agent's own, possibly fresher, view of the check."""
    return {
        "Node": c.node,
        "CheckID": c.check_id,
        "Name": c.name,
        "Status": c.status.value,
        "Notes": c.notes,
        "Output": c.output,
        "ServiceID": c.service_id,
        "ServiceName": c.service_name,
        "Type": _check_type(c),
        "ExposedPort": 0,
        "Definition": definition(c.definition),
    }


def catalog_agent_service(s: ServiceRecord) -> Json:
    """``ServiceEntry.Service``: an ``AgentService`` as the health endpoint writes it."""
    out: Json = {
        "ID": s.service_id,
        "Service": s.name,
        "Tags": list(s.tags),
        "Address": s.address,
        "Meta": dict(s.meta) if s.meta is not None else None,
        "Port": s.port,
        "Weights": {"Passing": s.weights.passing, "Warning": s.weights.warning},
        "EnableTagOverride": s.enable_tag_override,
        "Proxy": _proxy(),
        "Connect": {},
        "CreateIndex": s.create_index,
        "ModifyIndex": s.modify_index,
    }
    if s.kind:
        out["Kind"] = s.kind
    if s.tagged_addresses:
        out["TaggedAddresses"] = _tagged(s.tagged_addresses)
    return out


def _content_hash(doc: Json) -> str:
    return hashlib.sha256(repr(sorted(doc.items())).encode()).hexdigest()[:16]


def agent_service(s: ServiceRecord, datacenter: str, *, with_hash: bool = False) -> Json:
    """An ``AgentService`` as the agent's own endpoints write it."""
    out: Json = {
        "ID": s.service_id,
        "Service": s.name,
        "Tags": list(s.tags),
        "Meta": dict(s.meta) if s.meta is not None else {},
        "Port": s.port,
        "Address": s.address,
        "Weights": {"Passing": s.weights.passing, "Warning": s.weights.warning},
        "EnableTagOverride": s.enable_tag_override,
        "Datacenter": datacenter,
    }
    if s.kind:
        out["Kind"] = s.kind
    if s.tagged_addresses:
        out["TaggedAddresses"] = _tagged(s.tagged_addresses)
    if with_hash:
        out["ContentHash"] = _content_hash(out)
    return out


def service_entry(n: NodeRecord, s: ServiceRecord, checks: list[CheckRecord], datacenter: str) -> Json:
    """A ``ServiceEntry`` of /v1/health/service/:name."""
    return {
        "Node": node(n, datacenter),
        "Service": catalog_agent_service(s),
        "Checks": [health_check(c) for c in checks],
    }


def catalog_service(n: NodeRecord, s: ServiceRecord, datacenter: str) -> Json:
    """A ``CatalogService`` of /v1/catalog/service/:name."""
    doc = node(n, datacenter)
    out: Json = {
        "ID": n.node_id,
        "Node": n.name,
        "Address": n.address,
        "Datacenter": datacenter,
        "TaggedAddresses": doc["TaggedAddresses"],
        "NodeMeta": doc["Meta"],
        "ServiceID": s.service_id,
        "ServiceName": s.name,
        "ServiceAddress": s.address,
        "ServiceTags": list(s.tags),
        "ServiceMeta": dict(s.meta) if s.meta is not None else None,
        "ServicePort": s.port,
        "ServiceWeights": {"Passing": s.weights.passing, "Warning": s.weights.warning},
        "ServiceEnableTagOverride": s.enable_tag_override,
        "ServiceProxy": _proxy(),
        "CreateIndex": s.create_index,
        "ModifyIndex": s.modify_index,
    }
    if s.tagged_addresses:
        out["ServiceTaggedAddresses"] = _tagged(s.tagged_addresses)
    return out


def kv_pair(e: KVEntry) -> Json:
    """A ``KVPair``: Value in base64 (null when empty); Session only while held."""
    out: Json = {
        "LockIndex": e.lock_index,
        "Key": e.key,
        "Flags": e.flags,
        "Value": base64.b64encode(e.value).decode("ascii") if e.value else None,
        "CreateIndex": e.create_index,
        "ModifyIndex": e.modify_index,
    }
    if e.session:
        out["Session"] = e.session
    return out


def session(s: SessionRecord) -> Json:
    """A ``SessionEntry``; LockDelay as integer nanoseconds, TTL as the client wrote it."""
    return {
        "ID": s.session_id,
        "Name": s.name,
        "Node": s.node,
        "LockDelay": round(s.lock_delay * 1e9),
        "Behavior": s.behavior.value,
        "TTL": s.ttl,
        "Checks": list(s.checks),
        "CreateIndex": s.create_index,
    }


def agent_self(n: NodeRecord, settings: ConsulSettings) -> Json:
    """The small part of /v1/agent/self that clients (Nomad's fingerprint, py-consul) read."""
    server = n.name == settings.server_node
    return {
        "Config": {
            "Datacenter": settings.datacenter,
            "PrimaryDatacenter": settings.datacenter,
            "NodeName": n.name,
            "NodeID": n.node_id,
            "Revision": "llmgw-dev",
            "Server": server,
            "Version": settings.version,
        },
        "DebugConfig": {"SegmentName": "", "GRPCPort": -1, "GRPCTLSPort": -1, "ConnectEnabled": False},
        "Member": {
            "Name": n.name,
            "Addr": n.address,
            "Port": 8301,
            "Tags": {
                "dc": settings.datacenter,
                "role": "consul" if server else "node",
                "build": settings.version,
            },
            "Status": 1,
        },
        "Meta": {"consul-network-segment": ""},
    }
