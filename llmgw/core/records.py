"""The values llmgw keeps in Consul, and their JSON.

Owns: the records routers and the control plane exchange through Consul (the
engine endpoints they see in the health API, demand reports, draining marks,
API keys, catalog versions, the models the control plane cannot serve now) and
the one JSON spelling of each, plus ``unavailable_trusted`` (when routers may
trust that last one).

Must not: do I/O, read a clock or know about Consul's HTTP API. The Consul
adapter (``llmgw.adapters.consul``) moves these values in and out of Consul.

Each record is a frozen dataclass whose fields say, once, both the Python type
and the check a stored value must pass (``Text``, ``Count``, ``Seconds``...);
pydantic builds each record's codec from those fields (one ``TypeAdapter`` per
kind). They stay plain dataclasses rather than ``BaseModel``: llmgw builds them
positionally and in hot loops, and a value llmgw builds itself is not checked
again; only what is read back from Consul is.

Decoding is strict because KV content is untrusted input (anyone holding a
Consul token with write access to ``llmgw/`` can put anything there): every
field is type-checked and bounded, and a bad document raises
``RecordDecodeError`` (a ``ValueError``) naming the field and what was wrong
(the first fault found). JSON text is parsed by the standard library (``NaN``
and ``Infinity`` refused, as are numbers of more than 4300 digits and nesting
deeper than Python's recursion limit), and pydantic checks the parsed value.
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
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    Strict,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from llmgw.core.budgets import MAX_BUDGET_TOKENS, BudgetPeriod, parse_budget_period
from llmgw.core.json_values import json_kind

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


# --- the checks a stored field must pass ----------------------------------------------------------
# Each raises a ``_fault`` saying what is wrong with the value; ``_decode_error``
# prefixes the field's path (``DemandReport.models[0].in_flight``).


def _fault(message: str, *, field: str | None = None) -> PydanticCustomError:
    """``field``: a check on a whole record that blames one of its fields."""
    return PydanticCustomError("record", "{message}", {"message": message, "field": field})


def _text(value: object, *, nonempty: bool = True) -> str:
    """What ``Text`` checks, for the checks that go on to look inside the string."""
    if not isinstance(value, str):
        raise _fault(f"expected a string, got {json_kind(value)}")
    if len(value) > MAX_TEXT_CHARS:
        raise _fault(f"{len(value)} characters, more than the {MAX_TEXT_CHARS} allowed")
    if nonempty and not value:
        raise _fault("must not be empty")
    return value


def _whole_number(*, minimum: int = 0, maximum: int = MAX_INT) -> Callable[[object], int]:
    def check(value: object) -> int:
        # JSON has one number type; 3.0 is accepted as 3, 3.5 is not.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fault(f"expected a whole number, got {json_kind(value)}")
        if not minimum <= value <= maximum:
            raise _fault(f"{value} is outside {minimum}..{maximum}")
        return value

    return check


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fault(f"expected unix seconds (a number), got {json_kind(value)}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_UNIX_SECONDS:
        raise _fault(f"{value} is not a plausible unix time in seconds")
    return seconds


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _sha256(value: object) -> str:
    if not _SHA256_HEX.match(text := _text(value)):
        raise _fault("expected 64 lowercase hex digits")
    return text


def _sha256_or_nothing(value: object) -> str:
    text = _text(value, nonempty=False)
    if text and not _SHA256_HEX.match(text):
        raise _fault("expected 64 lowercase hex digits or nothing")
    return text


E = TypeVar("E", bound=StrEnum)


def _member_of(kind: type[E]) -> Callable[[object], E]:
    """A string that must be one of ``kind``'s values."""

    def check(value: object) -> E:
        text = _text(value)
        try:
            return kind(text)
        except ValueError:
            *first, last = [str(member.value) for member in kind]
            raise _fault(f"{text!r} is not {', '.join(first)} or {last}") from None

    return check


def _array(value: object) -> list[object]:
    if not isinstance(value, list):
        raise _fault(f"expected a JSON array, got {json_kind(value)}")
    if len(value) > MAX_ITEMS:
        raise _fault(f"{len(value)} items, more than the {MAX_ITEMS} allowed")
    return value


def _nullable(check: Callable[[object], Any]) -> Callable[[object], Any]:
    return lambda value: None if value is None else check(value)


def _as_given(value: object) -> object:
    return value


# Strings and booleans are checked by pydantic itself (faster than a Python check
# per field: the router reads every endpoint on each health change); ``_decode_error``
# words their faults as ``_text`` words its own.
Text = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_TEXT_CHARS)]
MaybeEmptyText = Annotated[str, StringConstraints(strict=True, max_length=MAX_TEXT_CHARS)]
CatalogText = Annotated[str, StringConstraints(strict=True, max_length=MAX_CATALOG_CHARS)]
Count = Annotated[int, BeforeValidator(_whole_number())]
# Seconds are written as the writer gave them (an int stays an int), read as floats.
Seconds = Annotated[float, BeforeValidator(_seconds), PlainSerializer(_as_given)]
MaybeSeconds = Annotated[float | None, BeforeValidator(_nullable(_seconds)), PlainSerializer(_as_given)]
Flag = Annotated[bool, Strict()]
Sha256Hex = Annotated[str, BeforeValidator(_sha256)]
PerMinute = Annotated[int | None, BeforeValidator(_nullable(_whole_number(minimum=1)))]
TokenBudget = Annotated[
    int | None, BeforeValidator(_nullable(_whole_number(minimum=1, maximum=MAX_BUDGET_TOKENS)))
]


def _budget_period(value: object) -> str:
    """A budget's period as ``core.budgets`` reads it, or nothing (no budget)."""
    text = _text(value, nonempty=False)
    if text:
        try:
            parse_budget_period(text)
        except ValueError as exc:
            raise _fault(str(exc)) from None
    return text


BudgetPeriodText = Annotated[str, BeforeValidator(_budget_period)]


# --- the records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One rank-0 engine instance of the ``llmgw-engine`` service, healthy or not."""

    service_id: Text
    node: Text
    model: Text
    model_slug: Text
    replica: Text  # the replica's Nomad job id
    alloc_id: MaybeEmptyText
    address: Text
    port: Annotated[int, BeforeValidator(_whole_number(minimum=1, maximum=65535))]
    engine: Text
    profile: Count
    simulated: Flag
    status: Annotated[HealthStatus, BeforeValidator(_member_of(HealthStatus))]

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

    endpoints: Annotated[tuple[Endpoint, ...], BeforeValidator(_array)]
    index: Count  # Consul's X-Consul-Index of the answer this came from

    def for_model(self, model: str) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.model == model)


@dataclass(frozen=True, slots=True)
class ModelUse:
    model: Text
    last_used: Seconds  # the router's wall clock
    in_flight: Count
    queued: Count
    wake: Flag  # an on-demand model has a waiting request and no replica


@dataclass(frozen=True, slots=True)
class DemandReport:
    """One per router, at ``llmgw/demand/<router id>``."""

    router_id: Text
    sent_at: Seconds  # the router's wall clock
    models: Annotated[tuple[ModelUse, ...], BeforeValidator(_array)]


@dataclass(frozen=True, slots=True)
class DrainMark:
    """At ``llmgw/draining/<job id>``: routers stop sending new requests to this replica."""

    job_id: Text
    model: Text
    since: Seconds
    reason: MaybeEmptyText


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """One key's use of one model since its usage was first counted (routers
    with shared limits count it: ``llmgw.adapters.redis.limits``), or in one period
    of its budget."""

    model: str
    requests: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """At ``llmgw/keys/<key id>``. Only the secret's SHA-256 is stored, never the secret."""

    key_id: Text
    name: MaybeEmptyText
    secret_sha256: Sha256Hex
    models: Annotated[tuple[Text, ...] | None, BeforeValidator(_nullable(_array))]  # None: every model
    requests_per_minute: PerMinute  # None: unlimited
    tokens_per_minute: PerMinute
    created_at: Seconds
    revoked_at: MaybeSeconds
    # Tokens (input + output) the key may use per ``budget_period``; None: no budget.
    token_budget: TokenBudget = None
    budget_period: BudgetPeriodText = ""  # ``core.budgets``' spelling; "" without a budget

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def budget(self) -> BudgetPeriod | None:
        """The period of the key's token budget (None: no budget)."""
        if self.token_budget is None:
            return None
        return parse_budget_period(self.budget_period or "monthly")

    def allows(self, model: str) -> bool:
        return not self.revoked and (self.models is None or model in self.models)


def secret_sha256(secret: str) -> str:
    """The digest an ``ApiKeyRecord`` stores for a bearer secret."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    """At ``llmgw/catalog/current`` and ``llmgw/catalog/history/<version:08d>``."""

    version: Count
    sha256: Sha256Hex  # of ``text`` as UTF-8
    text: CatalogText  # the YAML exactly as applied
    applied_by: Text
    applied_at: Seconds

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


def _is_none(value: object) -> bool:
    return value is None


@dataclass(frozen=True, slots=True)
class UnavailableModel:
    model: Text
    why: Annotated[Unavailability, BeforeValidator(_member_of(Unavailability))]
    reason: MaybeEmptyText  # in words, shown to clients: Nomad's explanation, or who drained it
    since: Seconds  # when placing first failed (or was judged hopeless), or was drained
    # When the control plane tries again (failing only). Absent from documents of
    # leaders older than the failing kind, so written only when set.
    until: Annotated[MaybeSeconds, Field(exclude_if=_is_none)] = None


def _known_kinds(value: object) -> list[object]:
    """The entries of an ``UnavailableModels.models`` array but those whose ``why``
    only a newer leader knows: skipped, not fatal (the router then waits for that
    model as it always did)."""
    known = {str(kind) for kind in Unavailability}
    return [item for item in _array(value) if not _newer_kind(item, known)]


def _newer_kind(item: object, known: set[str]) -> bool:
    why = item.get("why") if isinstance(item, Mapping) else None
    return isinstance(why, str) and why not in known


@dataclass(frozen=True, slots=True)
class UnavailableModels:
    """At ``llmgw/unavailable``: written by the leading control plane after a pass when
    it changed, and again every ``status_refresh`` (so ``published_at`` says it is alive).

    Routers answer a request for a listed model at once (503 ``model_unavailable``)
    instead of waiting for a load that will not come, but only while the document is
    fresh and was judged against the catalog they route by (``unavailable_now``)."""

    catalog_sha256: Annotated[str, BeforeValidator(_sha256_or_nothing)]  # the catalog judged ("" when none)
    published_at: Seconds
    models: Annotated[tuple[UnavailableModel, ...], BeforeValidator(_known_kinds)]

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
    # warnings=False: a record llmgw built with a plain str for an enum or a list
    # for a tuple is written as its value says, as ``str()`` and ``list()`` would.
    encoded: dict[str, Any] = _adapter(type(record)).dump_python(record, mode="json", warnings=False)
    return encoded


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
    try:
        record: R = _adapter(kind).validate_python(raw)
    except ValidationError as exc:
        raise _decode_error(kind.__name__, exc.errors(include_url=False)[0]) from None
    return record


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _digest_matches(version: CatalogVersion) -> CatalogVersion:
    if version.sha256 != catalog_sha256(version.text):
        raise _fault("does not match the text (the record is corrupt)", field="sha256")
    return version


# What pydantic checks a stored ``kind`` as: its fields, and then, for some, the whole record.
_CHECKED_AS: dict[type[Any], Any] = {
    CatalogVersion: Annotated[CatalogVersion, AfterValidator(_digest_matches)]
}
_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(kind: type[Any]) -> TypeAdapter[Any]:
    """The codec of ``kind``, built from its fields on first use (not at import:
    most commands import this module and never decode)."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(_CHECKED_AS.get(kind, kind))
    return adapter


def _decode_error(kind: str, error: ErrorDetails) -> RecordDecodeError:
    """The first fault pydantic found, said as ``Kind.path.to[3].field: what is wrong``."""
    loc = error["loc"]
    if error["type"] == "missing":
        return RecordDecodeError(f"{_path(kind, loc[:-1])}: missing key {loc[-1]!r}")
    if error["type"] in {"dataclass_type", "dataclass_exact_type"}:
        return RecordDecodeError(
            f"{_path(kind, loc)}: expected a JSON object, got {json_kind(error['input'])}"
        )
    field = error.get("ctx", {}).get("field")
    where = _path(kind, loc if field is None else (*loc, field))
    return RecordDecodeError(f"{where}: {_PYDANTIC_FAULTS.get(error['type'], _as_said)(error)}")


# pydantic's own checks (``Text``, ``Flag``), worded as llmgw words its own.
_PYDANTIC_FAULTS: dict[str, Callable[[ErrorDetails], str]] = {
    "string_type": lambda error: f"expected a string, got {json_kind(error['input'])}",
    "string_too_short": lambda error: "must not be empty",
    "string_too_long": lambda error: (
        f"{len(error['input'])} characters, more than the {error.get('ctx', {})['max_length']} allowed"
    ),
    "bool_type": lambda error: f"expected true or false, got {json_kind(error['input'])}",
}


def _as_said(error: ErrorDetails) -> str:
    return error["msg"]  # a ``_fault``'s message, or (never expected) pydantic's own


def _path(kind: str, loc: tuple[int | str, ...]) -> str:
    return kind + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
