"""The struct tables of Nomad's and Consul's Go API packages, loaded from the vendored JSON.

Owns: reading ``nomad-api-fields.json`` / ``consul-api-fields.json`` (packaged data,
byte-identical copies of ``../shared/*/api-fields.json``) into frozen values, with
embedded structs' fields promoted into their parent, and parsing Go type strings
into :class:`GoType` trees.

Must not: check documents (that is :mod:`llmgw.apispec.checking`) or know anything
about HCL decoding beyond carrying the ``hcl`` tag as written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Literal

ApiName = Literal["nomad", "consul"]

_DATA_FILES: Mapping[str, str] = {"nomad": "nomad-api-fields.json", "consul": "consul-api-fields.json"}

# Named non-struct Go types the tables use but do not define (they live in other
# files of the api package). Each is a string or int enum or a plain map in Go;
# anything not listed here and not a struct is treated as free-form.
_NOMAD_ALIASES: Mapping[str, str] = {
    "CSIPluginType": "string",
    "CSIVolumeAccessMode": "string",
    "CSIVolumeAttachmentMode": "string",
    "CSISecrets": "map[string]string",
    "DrainStatus": "string",
    "EncryptionAlgorithm": "string",
    "HostVolumeAccessMode": "string",
    "HostVolumeAttachmentMode": "string",
    "HostVolumeState": "string",
    "OIDCClientAssertionKeyIDHeader": "string",
    "OIDCClientAssertionKeySource": "string",
    "ReconcileOption": "string",
    "RootKeyState": "string",
    "SchedulerAlgorithm": "string",
    "Topic": "string",
    "VariableItems": "map[string]string",
    "contexts.Context": "string",
    "http.Header": "map[string][]string",
}


class Kind(StrEnum):
    """The shape a Go type takes in JSON."""

    STRUCT = "struct"
    POINTER = "pointer"
    SLICE = "slice"
    MAP = "map"
    STRING = "string"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    DURATION = "duration"  # time.Duration: integer nanoseconds
    TIME = "time"  # time.Time: an RFC 3339 string
    BYTES = "bytes"  # []byte: a base64 string
    ANY = "any"  # interface{} / any, or a type the tables do not describe


@dataclass(frozen=True, slots=True)
class GoType:
    """A parsed Go type: ``elem`` for pointer, slice and map; ``name`` for structs and basics."""

    kind: Kind
    name: str = ""
    elem: GoType | None = None
    bits: int = 64
    signed: bool = True

    def deref(self) -> GoType:
        """The type behind any number of pointers."""
        t = self
        while t.kind is Kind.POINTER and t.elem is not None:
            t = t.elem
        return t


class HclKind(StrEnum):
    """How jobspec2's gohcl decoder reads a field, from its ``hcl`` tag."""

    ATTRIBUTE = "optional"  # name = value
    REQUIRED = "required"  # an attribute that must be given
    BLOCK = "block"  # name { ... }, repeatable when the Go type is a slice or a map
    LABEL = "label"  # the block's label


@dataclass(frozen=True, slots=True)
class HclTag:
    name: str
    kind: HclKind


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a struct as it travels in JSON (``name`` is the JSON key)."""

    name: str
    go_type: str
    hcl: HclTag | None


@dataclass(frozen=True, slots=True)
class StructSpec:
    """A struct's fields (embedded structs' fields promoted), in the tables' order."""

    name: str
    fields: Mapping[str, FieldSpec]
    file: str
    # lowercased JSON key -> canonical key, for Go's case-insensitive match
    folded: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ApiTables:
    api: ApiName
    structs: Mapping[str, StructSpec]
    aliases: Mapping[str, str]
    endpoints: Mapping[str, object]


def _parse_hcl_tag(tag: str) -> HclTag | None:
    if tag in ("", "-"):
        return None
    name, _, rest = tag.partition(",")
    flags = rest.split(",") if rest else []
    if "block" in flags:
        return HclTag(name, HclKind.BLOCK)
    if "label" in flags:
        return HclTag(name, HclKind.LABEL)
    if "optional" in flags:
        return HclTag(name, HclKind.ATTRIBUTE)
    if not flags:
        return HclTag(name, HclKind.REQUIRED)
    return None


def _raw(api: ApiName) -> Mapping[str, object]:
    text = resources.files("llmgw.apispec").joinpath(_DATA_FILES[api]).read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{_DATA_FILES[api]} is not a JSON object")
    return data


@cache
def tables(api: ApiName = "nomad") -> ApiTables:
    """The parsed tables of one API (cached for the process)."""
    data = _raw(api)
    raw_structs = data.get("structs")
    if not isinstance(raw_structs, dict):
        raise ValueError(f"{_DATA_FILES[api]} has no 'structs' object")

    def own_fields(name: str) -> dict[str, FieldSpec]:
        raw = raw_structs[name]
        out: dict[str, FieldSpec] = {}
        for key, spec in raw.get("fields", {}).items():
            out[key] = FieldSpec(key, str(spec["type"]), _parse_hcl_tag(str(spec.get("hcl", ""))))
        return out

    def all_fields(name: str, seen: frozenset[str]) -> dict[str, FieldSpec]:
        fields = own_fields(name)
        # Go promotes an embedded struct's fields unless the outer struct has one of the same name.
        for emb in raw_structs[name].get("embedded", []) or []:
            if emb in raw_structs and emb not in seen:
                for key, spec in all_fields(emb, seen | {emb}).items():
                    fields.setdefault(key, spec)
        return fields

    structs: dict[str, StructSpec] = {}
    for name, raw in raw_structs.items():
        fields = all_fields(name, frozenset({name}))
        folded: dict[str, str] = {}
        for key in fields:
            folded.setdefault(key.lower(), key)
        structs[name] = StructSpec(
            name=name,
            fields=MappingProxyType(fields),
            file=str(raw.get("file", "")),
            folded=MappingProxyType(folded),
        )

    aliases: dict[str, str] = dict(_NOMAD_ALIASES) if api == "nomad" else {}
    raw_types = data.get("types")
    if isinstance(raw_types, dict):
        for name, spec in raw_types.items():
            if isinstance(spec, dict) and "type" in spec:
                aliases[name] = str(spec["type"])
    raw_endpoints = data.get("endpoints")
    endpoints = dict(raw_endpoints) if isinstance(raw_endpoints, dict) else {}
    return ApiTables(
        api=api,
        structs=MappingProxyType(structs),
        aliases=MappingProxyType(aliases),
        endpoints=MappingProxyType(endpoints),
    )


def struct(name: str, api: ApiName = "nomad") -> StructSpec:
    """One struct's spec; ``KeyError`` names the struct when it is not in the tables."""
    try:
        return tables(api).structs[name]
    except KeyError:
        raise KeyError(f"{api} api has no struct named {name!r}") from None


_INTS: Mapping[str, tuple[int, bool]] = {
    "int": (64, True),
    "int8": (8, True),
    "int16": (16, True),
    "int32": (32, True),
    "int64": (64, True),
    "uint": (64, False),
    "uint8": (8, False),
    "byte": (8, False),
    "uint16": (16, False),
    "uint32": (32, False),
    "uint64": (64, False),
    "rune": (32, True),
}


@cache
def go_type(text: str, api: ApiName = "nomad") -> GoType:
    """Parse a Go type string such as ``[]*Task`` or ``map[string]any`` (cached)."""
    return _go_type(text, api, 0)


def _go_type(text: str, api: ApiName, depth: int) -> GoType:
    if depth > 16:
        return GoType(Kind.ANY, text)
    if text.startswith("*"):
        return GoType(Kind.POINTER, elem=_go_type(text[1:], api, depth + 1))
    if text == "[]byte":
        return GoType(Kind.BYTES, text)
    if text.startswith("[]"):
        return GoType(Kind.SLICE, elem=_go_type(text[2:], api, depth + 1))
    if text.startswith("map["):
        close = text.index("]")
        return GoType(Kind.MAP, name=text[4:close], elem=_go_type(text[close + 1 :], api, depth + 1))
    if text in ("any", "interface{}"):
        return GoType(Kind.ANY, text)
    if text == "string":
        return GoType(Kind.STRING, text)
    if text == "bool":
        return GoType(Kind.BOOL, text)
    if text in _INTS:
        bits, signed = _INTS[text]
        return GoType(Kind.INT, text, bits=bits, signed=signed)
    if text in ("float32", "float64"):
        return GoType(Kind.FLOAT, text)
    if text == "time.Duration":
        return GoType(Kind.DURATION, text)
    if text == "time.Time":
        return GoType(Kind.TIME, text)
    t = tables(api)
    if text in t.structs:
        return GoType(Kind.STRUCT, text)
    if text in t.aliases:
        return _go_type(t.aliases[text], api, depth + 1)
    return GoType(Kind.ANY, text)
