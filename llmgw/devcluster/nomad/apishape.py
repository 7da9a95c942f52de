"""Nomad's API field list as shapes: zero-filled responses, lenient and strict request decoding.

Owns: reading ``llmgw/apispec/nomad-api-fields.json`` and the three things the stand-in
does with it:

* ``fill(struct, doc)`` completes a response document with every field of the Go
  API struct at its Go zero value (nil pointers, slices and maps marshal to ``null``),
  so that responses carry the same keys as real Nomad's and no others;
* ``decode_lenient(doc, struct)`` does what Go's ``encoding/json`` does to a request
  body: matches keys case-insensitively and silently drops unknown ones;
* ``strict_problems(doc, struct)`` names every key that real Nomad would silently
  lose (unknown, or spelt with the wrong case).

When ``llmgw.apispec`` offers ``decode_like_nomad`` / ``check_document`` they are
used instead of the local fallbacks (see ``_apispec_hooks``).

Must not: know about jobs, allocations or HTTP; it only walks documents.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

_FIELDS_FILE = Path(__file__).resolve().parents[2] / "apispec" / "nomad-api-fields.json"

# Go's zero time.Time as encoding/json writes it.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"

_INT_TYPES = frozenset(
    {"int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "byte"}
)
_FLOAT_TYPES = frozenset({"float32", "float64"})
# Named Go string types that are not structs: they marshal as plain strings.
_NAMED_STRINGS = frozenset(
    {"Topic", "DrainStatus", "ReconcileOption", "SchedulerAlgorithm", "CSIPluginType", "HostVolumeState"}
)


@dataclass(frozen=True)
class GoType:
    """A Go type from the field list, split into its wrappers and base name."""

    kind: str  # "pointer" | "slice" | "map" | "base"
    elem: GoType | None
    name: str  # base name for kind == "base"


def parse_go_type(text: str) -> GoType:
    if text.startswith("*"):
        return GoType("pointer", parse_go_type(text[1:]), "")
    if text == "[]byte":
        return GoType("base", None, "[]byte")
    if text.startswith("[]"):
        return GoType("slice", parse_go_type(text[2:]), "")
    match = re.match(r"^map\[[^\]]+\](.*)$", text)
    if match:
        return GoType("map", parse_go_type(match.group(1)), "")
    return GoType("base", None, text)


@functools.cache
def _structs() -> dict[str, dict[str, Any]]:
    data = json.loads(_FIELDS_FILE.read_text(encoding="utf-8"))
    return cast(dict[str, dict[str, Any]], data["structs"])


@functools.cache
def struct_fields(name: str) -> dict[str, GoType]:
    """Every JSON key of struct ``name`` (embedded structs flattened) with its Go type."""
    info = _structs()[name]
    fields: dict[str, GoType] = {}
    for embedded in info.get("embedded", []):
        if embedded in _structs():
            fields.update(struct_fields(embedded))
    for key, field in info["fields"].items():
        fields[key] = parse_go_type(field["type"])
    return fields


@functools.cache
def own_fields(name: str) -> dict[str, GoType]:
    """The struct's own fields, without embedded ones (QueryMeta / WriteMeta)."""
    return {key: parse_go_type(f["type"]) for key, f in _structs()[name]["fields"].items()}


def zero_value(go_type: GoType) -> Any:
    if go_type.kind in ("pointer", "slice", "map"):
        return None
    name = go_type.name
    if name in _structs():
        return fill(name, {})
    if name == "string" or name in _NAMED_STRINGS:
        return ""
    if name in _INT_TYPES or name == "time.Duration":
        return 0
    if name in _FLOAT_TYPES:
        return 0.0
    if name == "bool":
        return False
    if name == "time.Time":
        return GO_ZERO_TIME
    return None


def fill(struct: str, doc: Mapping[str, Any], *, own_only: bool = False) -> dict[str, Any]:
    """``doc`` completed with every missing field of ``struct`` at its zero value.

    Nested objects whose type is a known struct are completed too. Keys of ``doc``
    that the struct does not have are kept (so a bug shows up in the key check
    rather than being hidden here).
    """
    fields = own_fields(struct) if own_only else struct_fields(struct)
    out: dict[str, Any] = {}
    for key, go_type in fields.items():
        if key in doc:
            out[key] = _fill_value(go_type, doc[key])
        else:
            out[key] = zero_value(go_type)
    for key, value in doc.items():
        if key not in out:
            out[key] = value
    return out


def _fill_value(go_type: GoType, value: Any) -> Any:
    if value is None:
        return None
    if go_type.kind == "pointer" and go_type.elem is not None:
        return _fill_value(go_type.elem, value)
    if go_type.kind == "slice" and go_type.elem is not None and isinstance(value, list):
        return [_fill_value(go_type.elem, v) for v in value]
    if go_type.kind == "map" and go_type.elem is not None and isinstance(value, dict):
        return {k: _fill_value(go_type.elem, v) for k, v in value.items()}
    if go_type.kind == "base" and go_type.name in _structs() and isinstance(value, Mapping):
        return fill(go_type.name, value)
    return value


# ---------------------------------------------------------------------------
# Decoding request bodies


def _local_decode_lenient(doc: Any, struct: str) -> Any:
    if not isinstance(doc, Mapping):
        return doc
    fields = struct_fields(struct)
    by_fold = {key.casefold(): key for key in fields}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        canonical = key if key in fields else by_fold.get(str(key).casefold())
        if canonical is None:
            continue  # Go drops unknown keys silently.
        out[canonical] = _decode_value(fields[canonical], value)
    return out


def _decode_value(go_type: GoType, value: Any) -> Any:
    if value is None:
        return None
    if go_type.kind == "pointer" and go_type.elem is not None:
        return _decode_value(go_type.elem, value)
    if go_type.kind == "slice" and go_type.elem is not None and isinstance(value, list):
        return [_decode_value(go_type.elem, v) for v in value]
    if go_type.kind == "map" and go_type.elem is not None and isinstance(value, dict):
        return {k: _decode_value(go_type.elem, v) for k, v in value.items()}
    if go_type.kind == "base" and go_type.name in _structs():
        return _local_decode_lenient(value, go_type.name)
    return value


def _local_strict_problems(doc: Any, struct: str, path: str = "") -> list[str]:
    problems: list[str] = []
    if not isinstance(doc, Mapping):
        return problems
    fields = struct_fields(struct)
    by_fold = {key.casefold(): key for key in fields}
    for key, value in doc.items():
        where = f"{path}.{key}" if path else str(key)
        if key in fields:
            problems.extend(_strict_value(fields[key], value, where))
            continue
        canonical = by_fold.get(str(key).casefold())
        if canonical is not None:
            problems.append(f"{where}: key {key!r} is miscased, Nomad's field is {canonical!r}")
            problems.extend(_strict_value(fields[canonical], value, where))
        else:
            problems.append(f"{where}: unknown key {key!r} for {struct} (real Nomad would drop it silently)")
    return problems


def _strict_value(go_type: GoType, value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if go_type.kind == "pointer" and go_type.elem is not None:
        return _strict_value(go_type.elem, value, where)
    if go_type.kind == "slice" and go_type.elem is not None and isinstance(value, list):
        out: list[str] = []
        for i, v in enumerate(value):
            out.extend(_strict_value(go_type.elem, v, f"{where}[{i}]"))
        return out
    if go_type.kind == "map" and go_type.elem is not None and isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.extend(_strict_value(go_type.elem, v, f"{where}[{k!r}]"))
        return out
    if go_type.kind == "base" and go_type.name in _structs():
        return _local_strict_problems(value, go_type.name, where)
    return []


def _apispec_hooks() -> tuple[Callable[[Any, str], Any] | None, Callable[[Any, str], list[Any]] | None]:
    """The shared decoder and checker from ``llmgw.apispec`` when they exist."""
    try:
        module = importlib.import_module("llmgw.apispec")
    except ImportError:  # pragma: no cover - the package always exists
        return None, None
    decode = getattr(module, "decode_like_nomad", None)
    check = getattr(module, "check_document", None)
    return decode, check


def decode_lenient(doc: Any, struct: str) -> Any:
    """The document as Go's decoder would see it: canonical keys, unknown keys dropped."""
    decode, _ = _apispec_hooks()
    if decode is not None:
        try:
            return decode(doc, struct)
        except Exception:  # noqa: S110 - fall back to the local decoder on any API mismatch
            pass
    return _local_decode_lenient(doc, struct)


def strict_problems(doc: Any, struct: str) -> list[str]:
    """Every key that real Nomad would silently lose, as human-readable problems."""
    return _local_strict_problems(doc, struct)


# Keys the server's own struct sends that the Go API struct lacks (its client drops them
# on decode); an HTTP client reads them. ``AllocStates``: nomad/structs/alloc.go,
# ``Allocation.AllocStates`` (v2.0.5), sent by ``GET /v1/allocation/:id`` and in
# Allocation events (not in list stubs); ``LastUnknown`` reads it.
SERVER_ONLY_FIELDS: Mapping[str, frozenset[str]] = {"Allocation": frozenset({"AllocStates"})}


def response_problems(doc: Any, struct: str) -> list[str]:
    """Key-exact problems of a response document (used by tests and debug assertions)."""
    extra = SERVER_ONLY_FIELDS.get(struct)
    if extra and isinstance(doc, Mapping):
        doc = {k: v for k, v in doc.items() if k not in extra}
    _, check = _apispec_hooks()
    if check is not None:
        try:
            return [str(p) for p in check(doc, struct)]
        except Exception:  # noqa: S110 - fall back to the local checker on any API mismatch
            pass
    return _local_strict_problems(doc, struct)
