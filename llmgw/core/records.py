"""The values llmgw keeps in Consul, and their JSON.

Owns: the records routers and the control plane exchange through Consul (the
engine endpoints they see in the health API, demand reports, draining marks,
API keys, catalog versions, the models the control plane cannot serve now) and
the one JSON spelling of each, plus ``unavailable_trusted`` (when routers may
trust that last one).

Must not: do I/O, read a clock or know about Consul's HTTP API. The Consul
adapter (``llmgw.adapters.consul``) moves these values in and out of Consul.

Decoding is strict because KV content is untrusted input (anyone holding a
Consul token with write access to ``llmgw/`` can put anything there): every
field is type-checked and bounded, and a bad document raises
``RecordDecodeError`` (a ``ValueError``) naming the field and what was wrong.
Unknown keys are ignored so that a newer llmgw can add fields that an older one
running beside it during an upgrade skips (add fields, never rename them).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

# --- limits on untrusted input --------------------------------------------------------------------
# Consul refuses KV values above 512 KiB by default; a document larger than this
# is not one llmgw wrote.
MAX_DOCUMENT_BYTES = 1024 * 1024
# Ids, names, addresses, reasons: generous, but a bound.
MAX_TEXT_CHARS = 1024
# A catalog is the one large text.
MAX_CATALOG_CHARS = 900 * 1024
# Models in one demand report, models one API key may use, endpoints in a snapshot.
MAX_ITEMS = 100_000
# Counts and versions fit an IEEE double exactly, so other tools' JSON parsers agree.
MAX_INT = 2**53 - 1
# Unix seconds up to the year 5138: a larger timestamp is a bug or an attack.
MAX_UNIX_SECONDS = 1e11

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class RecordDecodeError(ValueError):
    """A stored record is not valid JSON of the expected shape; the message says where."""


class HealthStatus(StrEnum):
    """A service instance's aggregated check status, worst check wins (as Consul aggregates)."""

    PASSING = "passing"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {HealthStatus.PASSING: 0, HealthStatus.WARNING: 1, HealthStatus.CRITICAL: 2}


def aggregate_status(statuses: list[str] | tuple[str, ...]) -> HealthStatus:
    """Consul's ``AggregatedStatus``: critical beats warning beats passing; an unknown
    status (``maintenance`` included) counts as critical; no checks at all is passing."""
    worst = HealthStatus.PASSING
    for raw in statuses:
        try:
            status = HealthStatus(raw)
        except ValueError:
            return HealthStatus.CRITICAL
        if status.severity > worst.severity:
            worst = status
    return worst


# --- the records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One rank-0 engine instance of the ``llmgw-engine`` service, healthy or not."""

    service_id: str
    node: str
    model: str
    model_slug: str
    replica: str  # the replica's Nomad job id
    alloc_id: str
    address: str
    port: int
    engine: str
    profile: int
    simulated: bool
    status: HealthStatus

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    @property
    def passing(self) -> bool:
        return self.status is HealthStatus.PASSING


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """Every engine endpoint Consul knows, replaced whole on each change."""

    endpoints: tuple[Endpoint, ...]
    index: int  # Consul's X-Consul-Index of the answer this came from

    def for_model(self, model: str) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.model == model)


@dataclass(frozen=True, slots=True)
class ModelUse:
    model: str
    last_used: float  # unix seconds, the router's wall clock
    in_flight: int
    queued: int
    wake: bool  # an on-demand model has a waiting request and no replica


@dataclass(frozen=True, slots=True)
class DemandReport:
    """One per router, at ``llmgw/demand/<router id>``."""

    router_id: str
    sent_at: float  # unix seconds, the router's wall clock
    models: tuple[ModelUse, ...]


@dataclass(frozen=True, slots=True)
class DrainMark:
    """At ``llmgw/draining/<job id>``: routers stop sending new requests to this replica."""

    job_id: str
    model: str
    since: float  # unix seconds
    reason: str


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """At ``llmgw/keys/<key id>``. Only the secret's SHA-256 is stored, never the secret."""

    key_id: str
    name: str
    secret_sha256: str  # lowercase hex
    models: tuple[str, ...] | None  # None: every model
    requests_per_minute: int | None  # None: unlimited
    tokens_per_minute: int | None
    created_at: float
    revoked_at: float | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def allows(self, model: str) -> bool:
        return not self.revoked and (self.models is None or model in self.models)


def secret_sha256(secret: str) -> str:
    """The digest an ``ApiKeyRecord`` stores for a bearer secret."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    """At ``llmgw/catalog/current`` and ``llmgw/catalog/history/<version:08d>``."""

    version: int
    sha256: str  # of ``text`` as UTF-8, lowercase hex
    text: str  # the catalog YAML exactly as applied
    applied_by: str
    applied_at: float  # unix seconds

    @classmethod
    def of(cls, version: int, text: str, applied_by: str, applied_at: float) -> CatalogVersion:
        return cls(version, catalog_sha256(text), text, applied_by, applied_at)


def catalog_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Unavailability(StrEnum):
    """Why the control plane cannot serve a model now, whatever a router waits for."""

    UNPLACEABLE = "unplaceable"  # Nomad said no profile fits, and capacity has not changed since
    DRAINED = "drained"  # an operator drained it (``llmgw ctl drain``)
    FAILING = "failing"  # its replicas kept failing; no new one before ``until`` (rebuild backoff)


@dataclass(frozen=True, slots=True)
class UnavailableModel:
    model: str
    why: Unavailability
    reason: str  # in words, shown to clients: Nomad's explanation, or who drained it
    since: float  # unix seconds: when placing first failed (or was judged hopeless), or was drained
    until: float | None = None  # unix seconds: when the control plane tries again (failing only)


@dataclass(frozen=True, slots=True)
class UnavailableModels:
    """At ``llmgw/unavailable``: written by the leading control plane after a pass when
    it changed, and again every ``status_refresh`` (so ``published_at`` says it is alive).

    Routers answer a request for a listed model at once (503 ``model_unavailable``)
    instead of waiting for a load that will not come, but only while the document is
    fresh and was judged against the catalog they route by (``unavailable_now``)."""

    catalog_sha256: str  # the catalog the control plane judged ("" when it had none)
    published_at: float  # unix seconds
    models: tuple[UnavailableModel, ...]

    def by_model(self) -> dict[str, UnavailableModel]:
        return {m.model: m for m in self.models}


NO_UNAVAILABLE: Mapping[str, UnavailableModel] = {}


def unavailable_trusted(
    document: UnavailableModels | None, catalog_sha: str | None, now: float, stale_after: float
) -> bool:
    """May a router act on ``document``? Not when there is none, when it is older than
    ``stale_after`` (the control plane stopped refreshing it: dead, or not leading),
    or when it judged another catalog than the router's (an apply may have fixed the
    model). Then every model counts as loadable: today's wait and ``model_loading``."""
    if document is None or not catalog_sha or document.catalog_sha256 != catalog_sha:
        return False
    return now - document.published_at <= stale_after


def unavailable_now(
    document: UnavailableModels | None, catalog_sha: str | None, now: float, stale_after: float
) -> Mapping[str, UnavailableModel]:
    """The models a router may refuse at once, by name (empty when not trusted)."""
    if document is None or not unavailable_trusted(document, catalog_sha, now, stale_after):
        return NO_UNAVAILABLE
    return document.by_model()


Record = (
    Endpoint
    | EndpointSnapshot
    | ModelUse
    | DemandReport
    | DrainMark
    | ApiKeyRecord
    | CatalogVersion
    | UnavailableModel
    | UnavailableModels
)
E = TypeVar("E", bound=StrEnum)
R = TypeVar(
    "R",
    Endpoint,
    EndpointSnapshot,
    ModelUse,
    DemandReport,
    DrainMark,
    ApiKeyRecord,
    CatalogVersion,
    UnavailableModel,
    UnavailableModels,
)


# --- encoding -----------------------------------------------------------------------------------


def to_dict(record: Record) -> dict[str, Any]:
    """The JSON object of a record (plain dicts, lists, strings and numbers)."""
    if isinstance(record, Endpoint):
        return {
            "service_id": record.service_id,
            "node": record.node,
            "model": record.model,
            "model_slug": record.model_slug,
            "replica": record.replica,
            "alloc_id": record.alloc_id,
            "address": record.address,
            "port": record.port,
            "engine": record.engine,
            "profile": record.profile,
            "simulated": record.simulated,
            "status": str(record.status),
        }
    if isinstance(record, EndpointSnapshot):
        return {"endpoints": [to_dict(e) for e in record.endpoints], "index": record.index}
    if isinstance(record, ModelUse):
        return {
            "model": record.model,
            "last_used": record.last_used,
            "in_flight": record.in_flight,
            "queued": record.queued,
            "wake": record.wake,
        }
    if isinstance(record, DemandReport):
        return {
            "router_id": record.router_id,
            "sent_at": record.sent_at,
            "models": [to_dict(m) for m in record.models],
        }
    if isinstance(record, DrainMark):
        return {
            "job_id": record.job_id,
            "model": record.model,
            "since": record.since,
            "reason": record.reason,
        }
    if isinstance(record, ApiKeyRecord):
        return {
            "key_id": record.key_id,
            "name": record.name,
            "secret_sha256": record.secret_sha256,
            "models": None if record.models is None else list(record.models),
            "requests_per_minute": record.requests_per_minute,
            "tokens_per_minute": record.tokens_per_minute,
            "created_at": record.created_at,
            "revoked_at": record.revoked_at,
        }
    if isinstance(record, UnavailableModel):
        entry = {
            "model": record.model,
            "why": str(record.why),
            "reason": record.reason,
            "since": record.since,
        }
        return entry if record.until is None else {**entry, "until": record.until}
    if isinstance(record, UnavailableModels):
        return {
            "catalog_sha256": record.catalog_sha256,
            "published_at": record.published_at,
            "models": [to_dict(m) for m in record.models],
        }
    return {
        "version": record.version,
        "sha256": record.sha256,
        "text": record.text,
        "applied_by": record.applied_by,
        "applied_at": record.applied_at,
    }


def to_json(record: Record) -> str:
    """Compact, key-sorted JSON: the same record always has the same bytes."""
    return json.dumps(
        to_dict(record), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


# --- decoding -----------------------------------------------------------------------------------


def from_json(kind: type[R], data: str | bytes) -> R:
    """Parse and validate one record of ``kind``; ``RecordDecodeError`` if it is not one."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise RecordDecodeError(
            f"{kind.__name__}: document is {len(data)} bytes, more than the {MAX_DOCUMENT_BYTES} allowed"
        )
    try:
        raw = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise RecordDecodeError(f"{kind.__name__}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError and int() refusing a number of more than 4300 digits.
        raise RecordDecodeError(f"{kind.__name__}: not valid JSON ({exc})") from None
    return from_dict(kind, raw)


def from_dict(kind: type[R], raw: object) -> R:
    """Validate an already parsed JSON value as a record of ``kind``."""
    decoder: Callable[[_Fields], Any] = _DECODERS[kind]
    return decoder(_Fields(kind.__name__, raw))  # type: ignore[no-any-return]


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


class _Fields:
    """Typed, bounded reads of one JSON object's keys, with error messages naming the path."""

    def __init__(self, path: str, raw: object) -> None:
        if not isinstance(raw, Mapping):
            raise RecordDecodeError(f"{path}: expected a JSON object, got {_kind(raw)}")
        self.path = path
        self.raw: Mapping[str, object] = raw

    def _get(self, key: str) -> object:
        if key not in self.raw:
            raise RecordDecodeError(f"{self.path}: missing key {key!r}")
        return self.raw[key]

    def _where(self, key: str) -> str:
        return f"{self.path}.{key}"

    def text(self, key: str, *, max_chars: int = MAX_TEXT_CHARS, nonempty: bool = True) -> str:
        return _text(self._where(key), self._get(key), max_chars=max_chars, nonempty=nonempty)

    def integer(self, key: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
        return _integer(self._where(key), self._get(key), minimum=minimum, maximum=maximum)

    def optional_integer(self, key: str, *, minimum: int = 0) -> int | None:
        value = self._get(key)
        return None if value is None else _integer(self._where(key), value, minimum=minimum)

    def seconds(self, key: str) -> float:
        return _seconds(self._where(key), self._get(key))

    def optional_seconds(self, key: str, *, may_be_absent: bool = False) -> float | None:
        """``may_be_absent``: a key newer than some writers (absent reads as null)."""
        value = self.raw.get(key) if may_be_absent else self._get(key)
        return None if value is None else _seconds(self._where(key), value)

    def member(self, key: str, kind: type[E]) -> E:
        """A string that must be one of ``kind``'s values."""
        value = self.text(key)
        try:
            return kind(value)
        except ValueError:
            *first, last = [str(member.value) for member in kind]
            raise RecordDecodeError(
                f"{self._where(key)}: {value!r} is not {', '.join(first)} or {last}"
            ) from None

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise RecordDecodeError(f"{self._where(key)}: expected true or false, got {_kind(value)}")
        return value

    def items(self, key: str) -> list[tuple[str, object]]:
        value = self._get(key)
        if not isinstance(value, list):
            raise RecordDecodeError(f"{self._where(key)}: expected a JSON array, got {_kind(value)}")
        if len(value) > MAX_ITEMS:
            raise RecordDecodeError(
                f"{self._where(key)}: {len(value)} items, more than the {MAX_ITEMS} allowed"
            )
        return [(f"{self._where(key)}[{i}]", item) for i, item in enumerate(value)]

    def optional_items(self, key: str) -> list[tuple[str, object]] | None:
        return None if self._get(key) is None else self.items(key)

    def sha256(self, key: str) -> str:
        value = self.text(key)
        if not _SHA256_HEX.match(value):
            raise RecordDecodeError(f"{self._where(key)}: expected 64 lowercase hex digits")
        return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def _text(where: str, value: object, *, max_chars: int = MAX_TEXT_CHARS, nonempty: bool = True) -> str:
    if not isinstance(value, str):
        raise RecordDecodeError(f"{where}: expected a string, got {_kind(value)}")
    if len(value) > max_chars:
        raise RecordDecodeError(f"{where}: {len(value)} characters, more than the {max_chars} allowed")
    if nonempty and not value:
        raise RecordDecodeError(f"{where}: must not be empty")
    return value


def _integer(where: str, value: object, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    # JSON has one number type; 3.0 is accepted as 3, 3.5 is not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordDecodeError(f"{where}: expected a whole number, got {_kind(value)}")
    if not minimum <= value <= maximum:
        raise RecordDecodeError(f"{where}: {value} is outside {minimum}..{maximum}")
    return value


def _seconds(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordDecodeError(f"{where}: expected unix seconds (a number), got {_kind(value)}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_UNIX_SECONDS:
        raise RecordDecodeError(f"{where}: {value} is not a plausible unix time in seconds")
    return seconds


def _decode_endpoint(f: _Fields) -> Endpoint:
    health = f.member("status", HealthStatus)
    return Endpoint(
        service_id=f.text("service_id"),
        node=f.text("node"),
        model=f.text("model"),
        model_slug=f.text("model_slug"),
        replica=f.text("replica"),
        alloc_id=f.text("alloc_id", nonempty=False),
        address=f.text("address"),
        port=f.integer("port", minimum=1, maximum=65535),
        engine=f.text("engine"),
        profile=f.integer("profile"),
        simulated=f.boolean("simulated"),
        status=health,
    )


def _decode_snapshot(f: _Fields) -> EndpointSnapshot:
    return EndpointSnapshot(
        endpoints=tuple(_decode_endpoint(_Fields(p, item)) for p, item in f.items("endpoints")),
        index=f.integer("index"),
    )


def _decode_model_use(f: _Fields) -> ModelUse:
    return ModelUse(
        model=f.text("model"),
        last_used=f.seconds("last_used"),
        in_flight=f.integer("in_flight"),
        queued=f.integer("queued"),
        wake=f.boolean("wake"),
    )


def _decode_demand(f: _Fields) -> DemandReport:
    return DemandReport(
        router_id=f.text("router_id"),
        sent_at=f.seconds("sent_at"),
        models=tuple(_decode_model_use(_Fields(p, item)) for p, item in f.items("models")),
    )


def _decode_drain(f: _Fields) -> DrainMark:
    return DrainMark(
        job_id=f.text("job_id"),
        model=f.text("model"),
        since=f.seconds("since"),
        reason=f.text("reason", nonempty=False),
    )


def _decode_api_key(f: _Fields) -> ApiKeyRecord:
    models = f.optional_items("models")
    return ApiKeyRecord(
        key_id=f.text("key_id"),
        name=f.text("name", nonempty=False),
        secret_sha256=f.sha256("secret_sha256"),
        models=None if models is None else tuple(_text(p, item) for p, item in models),
        requests_per_minute=f.optional_integer("requests_per_minute", minimum=1),
        tokens_per_minute=f.optional_integer("tokens_per_minute", minimum=1),
        created_at=f.seconds("created_at"),
        revoked_at=f.optional_seconds("revoked_at"),
    )


def _decode_catalog(f: _Fields) -> CatalogVersion:
    text = f.text("text", max_chars=MAX_CATALOG_CHARS, nonempty=False)
    digest = f.sha256("sha256")
    if digest != catalog_sha256(text):
        raise RecordDecodeError(f"{f.path}.sha256: does not match the text (the record is corrupt)")
    return CatalogVersion(
        version=f.integer("version"),
        sha256=digest,
        text=text,
        applied_by=f.text("applied_by"),
        applied_at=f.seconds("applied_at"),
    )


def _decode_unavailable_model(f: _Fields) -> UnavailableModel:
    return UnavailableModel(
        model=f.text("model"),
        why=f.member("why", Unavailability),
        reason=f.text("reason", nonempty=False),
        since=f.seconds("since"),
        # Absent from documents of leaders older than the failing kind.
        until=f.optional_seconds("until", may_be_absent=True),
    )


def _decode_unavailable(f: _Fields) -> UnavailableModels:
    digest = f.text("catalog_sha256", nonempty=False)
    if digest and not _SHA256_HEX.match(digest):
        raise RecordDecodeError(f"{f.path}.catalog_sha256: expected 64 lowercase hex digits or nothing")
    return UnavailableModels(
        catalog_sha256=digest,
        published_at=f.seconds("published_at"),
        models=tuple(
            _decode_unavailable_model(_Fields(p, item))
            for p, item in f.items("models")
            if not _newer_kind(item)
        ),
    )


def _newer_kind(item: object) -> bool:
    """An entry whose ``why`` only a newer leader knows: skipped, not fatal (the router
    then waits for that model as it always did)."""
    if not isinstance(item, Mapping):
        return False
    why = item.get("why")
    return isinstance(why, str) and why not in {str(kind) for kind in Unavailability}


_DECODERS: dict[type[Any], Callable[[_Fields], Any]] = {
    Endpoint: _decode_endpoint,
    EndpointSnapshot: _decode_snapshot,
    ModelUse: _decode_model_use,
    DemandReport: _decode_demand,
    DrainMark: _decode_drain,
    ApiKeyRecord: _decode_api_key,
    CatalogVersion: _decode_catalog,
    UnavailableModel: _decode_unavailable_model,
    UnavailableModels: _decode_unavailable,
}
