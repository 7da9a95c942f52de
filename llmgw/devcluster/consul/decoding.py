"""Request bodies and query values, read the way a Consul agent reads them.

Owns turning the JSON of ``PUT /v1/agent/service/register``,
``/v1/agent/check/register`` and ``/v1/session/create`` into typed specs, and the small query-value parsers
(booleans, unsigned integers) with Consul's error texts.

Like Consul (Go's encoding/json plus ``lib.TranslateKeys``): keys match
case-insensitively, snake_case spellings such as ``tagged_addresses`` or
``deregister_critical_service_after`` are accepted, unknown keys are dropped
silently and a value of the wrong JSON type refuses the whole body (400).

Must not: touch the store; validation that needs state (does the service exist?)
belongs to :mod:`llmgw.devcluster.consul.state`.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from llmgw.apispec import ApiDecodeError, Kind, decode_like_nomad, go_type, struct
from llmgw.devcluster.consul.durations import DurationError, parse_go_duration
from llmgw.devcluster.consul.model import (
    CheckDefinition,
    CheckKind,
    ConsulError,
    HealthStatus,
    ServiceAddress,
    SessionBehavior,
    Weights,
)

# Spellings lib.TranslateKeys accepts that are not the field name with underscores dropped.
_KEY_ALIASES: Mapping[str, str] = {"args": "ScriptArgs", "script_args": "ScriptArgs"}


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """A check as registered (AgentServiceCheck or AgentCheckRegistration)."""

    check_id: str  # "" -> the agent picks ("service:<id>" or the name)
    name: str  # "" -> the agent picks
    notes: str
    service_id: str
    initial_status: HealthStatus | None
    definition: CheckDefinition


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    service_id: str
    name: str
    tags: tuple[str, ...]
    address: str
    port: int
    meta: Mapping[str, str] | None
    tagged_addresses: Mapping[str, ServiceAddress]
    weights: Weights
    enable_tag_override: bool
    kind: str
    checks: tuple[CheckSpec, ...]


@dataclass(frozen=True, slots=True)
class SessionSpec:
    name: str
    node: str | None
    lock_delay: float | None  # seconds; None -> the default
    behavior: SessionBehavior
    ttl: str
    checks: tuple[str, ...] | None  # None -> ["serfHealth"]


def _bad(message: str) -> ConsulError:
    return ConsulError(400, message)


def _translate_keys(doc: object, type_name: str) -> object:
    """``doc`` with snake_case keys renamed to the field names of ``type_name``."""
    t = go_type(type_name, "consul").deref()
    if t.kind is Kind.SLICE and isinstance(doc, list) and t.elem is not None:
        elem = t.elem.deref()
        if elem.kind is Kind.STRUCT:
            return [_translate_keys(v, elem.name) for v in doc]
        return doc
    if t.kind is Kind.MAP and isinstance(doc, dict) and t.elem is not None:
        elem = t.elem.deref()
        if elem.kind is Kind.STRUCT:
            return {k: _translate_keys(v, elem.name) for k, v in doc.items()}
        return doc
    if t.kind is not Kind.STRUCT or not isinstance(doc, dict):
        return doc
    spec = struct(t.name, "consul")
    out: dict[str, object] = {}
    for key, value in doc.items():
        canonical = spec.folded.get(str(key).lower())
        if canonical is None:
            canonical = _KEY_ALIASES.get(str(key).lower()) or spec.folded.get(
                str(key).replace("_", "").lower()
            )
        if canonical is None or canonical not in spec.fields:
            out[str(key)] = value  # decode_like_nomad drops it, as Go would
            continue
        out[canonical] = _translate_keys(value, spec.fields[canonical].go_type)
    return out


def _decode(body: bytes, root: str) -> dict[str, object]:
    if not body.strip():
        return {}
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"Request decode failed: {exc}") from None
    if raw is None:
        return {}
    try:
        return decode_like_nomad(_translate_keys(raw, root), root, api="consul")
    except ApiDecodeError as exc:
        raise _bad(f"Request decode failed: {exc}") from None


def _str(doc: Mapping[str, object], key: str) -> str:
    v = doc.get(key)
    return v if isinstance(v, str) else ""


def _int(doc: Mapping[str, object], key: str) -> int:
    v = doc.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _bool(doc: Mapping[str, object], key: str) -> bool:
    return doc.get(key) is True


def _str_map(doc: Mapping[str, object], key: str) -> dict[str, str] | None:
    v = doc.get(key)
    if not isinstance(v, dict):
        return None
    return {str(k): str(x) for k, x in v.items()}


def _duration(doc: Mapping[str, object], key: str, where: str) -> float:
    text = _str(doc, key)
    if not text:
        return 0.0
    try:
        return parse_go_duration(text)
    except DurationError as exc:
        raise _bad(f"Request decode failed: {where}.{key}: {exc}") from None


def _status(text: str, where: str) -> HealthStatus | None:
    if not text:
        return None
    try:
        return HealthStatus(text)
    except ValueError:
        raise _bad(f'Invalid check: {where}: Status "{text}" must be passing, warning or critical') from None


def _check(doc: Mapping[str, object], where: str) -> CheckSpec:
    unsupported = [
        k
        for k in ("ScriptArgs", "GRPC", "H2PING", "DockerContainerID", "AliasService", "AliasNode")
        if doc.get(k)
    ]
    if unsupported:
        # Real Consul would run these; the stand-in says so loudly instead of leaving them critical forever.
        raise _bad(
            f"Invalid check: {where}: the llmgw Consul stand-in runs HTTP, TCP and TTL checks only, "
            f"not {', '.join(unsupported)}"
        )
    http, tcp = _str(doc, "HTTP"), _str(doc, "TCP")
    interval = _duration(doc, "Interval", where)
    ttl = _duration(doc, "TTL", where)
    if http or tcp:
        kind = CheckKind.HTTP if http else CheckKind.TCP
        if interval <= 0:
            raise _bad(
                f"Invalid check: {where}: "
                "Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or GRPC checks"
            )
    elif ttl > 0:
        kind = CheckKind.TTL
    else:
        raise _bad(f"Invalid check: {where}: TTL must be > 0 for TTL checks")
    header_raw = doc.get("Header")
    header: dict[str, tuple[str, ...]] = {}
    if isinstance(header_raw, dict):
        for k, vs in header_raw.items():
            header[str(k)] = tuple(str(v) for v in vs) if isinstance(vs, list) else ()
    failures_critical = _int(doc, "FailuresBeforeCritical")
    definition = CheckDefinition(
        kind=kind,
        http=http,
        method=_str(doc, "Method"),
        header=MappingProxyType(header),
        body=_str(doc, "Body"),
        tls_server_name=_str(doc, "TLSServerName"),
        tls_skip_verify=_bool(doc, "TLSSkipVerify"),
        tcp=tcp,
        interval=interval,
        timeout=_duration(doc, "Timeout", where),
        ttl=ttl,
        deregister_critical_after=_duration(doc, "DeregisterCriticalServiceAfter", where),
        success_before_passing=_int(doc, "SuccessBeforePassing"),
        # Consul: a failures_before_warning of 0 means "same as failures_before_critical".
        failures_before_warning=_int(doc, "FailuresBeforeWarning") or failures_critical,
        failures_before_critical=failures_critical,
    )
    return CheckSpec(
        check_id=_str(doc, "CheckID") or _str(doc, "ID"),
        name=_str(doc, "Name"),
        notes=_str(doc, "Notes"),
        service_id=_str(doc, "ServiceID"),
        initial_status=_status(_str(doc, "Status"), where),
        definition=definition,
    )


def _default_tagged(address: str, port: int) -> dict[str, ServiceAddress]:
    """Consul tags an IP-literal service address as lan_ipv4/wan_ipv4 (or _ipv6)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return {}
    family = "ipv4" if ip.version == 4 else "ipv6"
    return {f"lan_{family}": ServiceAddress(address, port), f"wan_{family}": ServiceAddress(address, port)}


def decode_service_registration(body: bytes) -> ServiceSpec:
    """The AgentServiceRegistration in ``body``; 400 when Consul would refuse it."""
    doc = _decode(body, "AgentServiceRegistration")
    name = _str(doc, "Name")
    if not name:
        raise _bad("Missing service name")
    port = _int(doc, "Port")
    address = _str(doc, "Address")
    weights = Weights()
    raw_weights = doc.get("Weights")
    if isinstance(raw_weights, dict):
        weights = Weights(_int(raw_weights, "Passing"), _int(raw_weights, "Warning"))
        if weights.passing < 1:
            raise _bad("Invalid Weights: Passing must be greater than 0")
    tagged: dict[str, ServiceAddress] = _default_tagged(address, port)
    raw_tagged = doc.get("TaggedAddresses")
    if isinstance(raw_tagged, dict):
        for k, v in raw_tagged.items():
            if isinstance(v, dict):
                tagged[str(k)] = ServiceAddress(_str(v, "Address"), _int(v, "Port"))
    raw_checks: list[Mapping[str, object]] = []
    one, many = doc.get("Check"), doc.get("Checks")
    if isinstance(one, dict):
        raw_checks.append(one)
    if isinstance(many, list):
        raw_checks.extend(c for c in many if isinstance(c, dict))
    checks = tuple(_check(c, f"Checks[{i}]") for i, c in enumerate(raw_checks))
    tags = doc.get("Tags")
    return ServiceSpec(
        service_id=_str(doc, "ID") or name,
        name=name,
        tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
        address=address,
        port=port,
        meta=_str_map(doc, "Meta"),
        tagged_addresses=MappingProxyType(tagged),
        weights=weights,
        enable_tag_override=_bool(doc, "EnableTagOverride"),
        kind=_str(doc, "Kind"),
        checks=checks,
    )


def decode_check_registration(body: bytes) -> CheckSpec:
    """The AgentCheckRegistration in ``body``: a check with its own ID, Name and ServiceID."""
    doc = _decode(body, "AgentCheckRegistration")
    if not _str(doc, "Name"):
        raise _bad("Missing check name")
    return _check(doc, "Check")


def _lock_delay(raw: object) -> float | None:
    """Consul's FixupLockDelay: a string is a Go duration; a number under 1000 is
    seconds, larger numbers are nanoseconds."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return parse_go_duration(raw)
        except DurationError as exc:
            raise _bad(f"Request decode failed: LockDelay: {exc}") from None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw) if raw < 1000 else float(raw) / 1e9
    raise _bad("Request decode failed: LockDelay must be a duration string or a number")


def decode_session_create(body: bytes) -> SessionSpec:
    """The body of ``PUT /v1/session/create`` (fields of SessionEntry, plus the
    newer NodeChecks/ServiceChecks, which count as checks like Checks does)."""
    if not body.strip():
        raw: Any = {}
    else:
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _bad(f"Request decode failed: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _bad("Request decode failed: expected a JSON object")
    doc = {str(k).replace("_", "").lower(): v for k, v in raw.items()}
    behavior_text = doc.get("behavior") or "release"
    try:
        behavior = SessionBehavior(str(behavior_text))
    except ValueError:
        raise _bad(f"Invalid Behavior setting '{behavior_text}'") from None
    checks: list[str] | None = None
    for key in ("checks", "nodechecks"):
        value = doc.get(key)
        if isinstance(value, list):
            checks = (checks or []) + [str(c) for c in value]
    service_checks = doc.get("servicechecks")
    if isinstance(service_checks, list):
        checks = (checks or []) + [str(c.get("ID", "")) for c in service_checks if isinstance(c, dict)]
    ttl = doc.get("ttl")
    node = doc.get("node")
    return SessionSpec(
        name=str(doc.get("name") or ""),
        node=str(node) if node else None,
        lock_delay=_lock_delay(doc.get("lockdelay")),
        behavior=behavior,
        ttl=str(ttl) if ttl else "",
        checks=tuple(checks) if checks is not None else None,
    )


def parse_bool(text: str, name: str) -> bool:
    """A Go strconv.ParseBool value ("1", "t", "True", "false", ...)."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise _bad(f"Invalid value for {name}: {text!r}")


def parse_uint(text: str, what: str) -> int:
    """A uint64 query value such as ?cas= or ?flags=; 400 with Consul's text otherwise."""
    try:
        value = int(text, 10)
    except ValueError:
        raise _bad(f"Invalid {what}") from None
    if value < 0 or value >= 1 << 64:
        raise _bad(f"Invalid {what}")
    return value
