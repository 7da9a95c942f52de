"""Key-exact checking of JSON documents against Nomad's and Consul's API structs.

Owns: ``check_document`` (every unknown key, miscased key and wrong JSON type, each
with a JSON path) and ``decode_like_nomad`` (what Go's encoding/json keeps: keys
matched case-insensitively to the field name, unknown keys dropped).

Why both: a real Nomad or Consul decodes request bodies with Go's encoding/json,
which matches keys case-insensitively and silently drops unknown ones, so a
misspelt key is lost without an error. llmgw checks what it sends with
``check_document``; the dev stand-ins' lenient mode uses ``decode_like_nomad`` to
behave like the real servers, their strict mode ``check_document``.

Must not: do I/O, or descend into free-form values (``map[string]any``, such as a
task's driver ``Config``), whose keys are the driver's business.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from llmgw.apispec.tables import ApiName, GoType, Kind, StructSpec, go_type, struct
from llmgw.core.json_values import json_kind


class ProblemKind(StrEnum):
    UNKNOWN_KEY = "unknown-key"  # Go would drop it silently
    MISCASED_KEY = "miscased-key"  # Go would accept it, but it is not the spelling Nomad uses
    WRONG_TYPE = "wrong-type"  # Go would refuse the whole body


@dataclass(frozen=True, slots=True)
class KeyProblem:
    """One problem found in a document: where (a JSON path such as
    ``Job.TaskGroups[0].Tasks[1].Resources.Devices[0].Count``), what, and a sentence."""

    path: str
    kind: ProblemKind
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ApiDecodeError(ValueError):
    """The document has values of the wrong JSON type: a real server answers 400."""

    def __init__(self, problems: list[KeyProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}"


def _map_path(path: str, key: str) -> str:
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _expected(t: GoType) -> str:
    k = t.kind
    if k is Kind.STRUCT:
        return f"an object ({t.name})"
    if k is Kind.SLICE:
        return "an array"
    if k is Kind.MAP:
        return "an object"
    if k is Kind.STRING:
        return "a string"
    if k is Kind.BOOL:
        return "a bool"
    if k is Kind.INT:
        return f"an integer ({t.name})"
    if k is Kind.FLOAT:
        return "a number"
    if k is Kind.DURATION:
        return "an integer of nanoseconds (time.Duration)"
    if k is Kind.TIME:
        return "an RFC 3339 time string"
    if k is Kind.BYTES:
        return "a base64 string ([]byte)"
    return "any value"


def _int_in_range(value: int, t: GoType) -> bool:
    if t.signed:
        lo, hi = -(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1
    else:
        lo, hi = 0, (1 << t.bits) - 1
    return lo <= value <= hi


def _scalar_problem(value: object, t: GoType) -> str | None:
    """Why ``value`` does not decode into scalar type ``t``, or None."""
    k = t.kind
    if k is Kind.STRING or k is Kind.TIME or k is Kind.BYTES:
        return None if isinstance(value, str) else "x"
    if k is Kind.BOOL:
        return None if isinstance(value, bool) else "x"
    if k is Kind.INT or k is Kind.DURATION:
        # Go parses the literal with ParseInt: 5.0 and 1e3 are refused as well.
        if isinstance(value, bool) or not isinstance(value, int):
            return "x"
        if not _int_in_range(value, t):
            return f"{value} overflows {t.name}"
        return None
    if k is Kind.FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "x"
        return None if not isinstance(value, float) or math.isfinite(value) else "not a finite number"
    return None


class _Walker:
    def __init__(self, api: ApiName, *, collect_case: bool) -> None:
        self.api = api
        self.problems: list[KeyProblem] = []
        self.collect_case = collect_case

    def wrong(self, path: str, value: object, t: GoType, why: str | None = None) -> None:
        detail = why if why and why != "x" else f"expected {_expected(t)}, got {json_kind(value)}"
        self.problems.append(KeyProblem(path, ProblemKind.WRONG_TYPE, detail))

    def value(self, value: object, t: GoType, path: str) -> object:
        """Check ``value`` against ``t`` and return what Go would keep."""
        if value is None:
            # Go: null into a pointer, slice, map or interface sets nil; into anything else it is a no-op.
            return None
        t = t.deref()
        k = t.kind
        if k is Kind.ANY:
            return value
        if k is Kind.STRUCT:
            if not isinstance(value, dict):
                self.wrong(path, value, t)
                return value
            return self.struct(value, struct(t.name, self.api), path)
        if k is Kind.SLICE:
            if not isinstance(value, list | tuple):
                self.wrong(path, value, t)
                return value
            assert t.elem is not None
            return [self.value(v, t.elem, f"{path}[{i}]") for i, v in enumerate(value)]
        if k is Kind.MAP:
            if not isinstance(value, dict):
                self.wrong(path, value, t)
                return value
            assert t.elem is not None
            if t.elem.kind is Kind.ANY:
                return value  # free-form (a driver's config): not ours to check
            return {str(mk): self.value(mv, t.elem, _map_path(path, str(mk))) for mk, mv in value.items()}
        why = _scalar_problem(value, t)
        if why is not None:
            self.wrong(path, value, t, why)
        return value

    def struct(self, doc: Mapping[str, object], spec: StructSpec, path: str) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, val in doc.items():
            if not isinstance(key, str):
                self.problems.append(KeyProblem(path, ProblemKind.UNKNOWN_KEY, f"non-string key {key!r}"))
                continue
            field = spec.fields.get(key)
            if field is None:
                canonical = spec.folded.get(key.lower())
                if canonical is None:
                    self.problems.append(
                        KeyProblem(
                            _key_path(path, key),
                            ProblemKind.UNKNOWN_KEY,
                            f"{spec.name} has no field {key!r}: a real server would drop it silently"
                            + _suggest(key, spec),
                        )
                    )
                    continue
                field = spec.fields[canonical]
                if self.collect_case:
                    self.problems.append(
                        KeyProblem(
                            _key_path(path, key),
                            ProblemKind.MISCASED_KEY,
                            f"{spec.name} spells this key {canonical!r}, not {key!r}",
                        )
                    )
            # Go's decoder overwrites in document order, so the last spelling wins.
            out[field.name] = self.value(val, go_type(field.go_type, self.api), _key_path(path, field.name))
        return out


def _suggest(key: str, spec: StructSpec) -> str:
    stripped = key.replace("_", "").lower()
    for canonical in spec.fields:
        if canonical.lower() == stripped:
            return f" (did you mean {canonical!r}?)"
    return ""


def check_document(doc: object, root: str, *, api: ApiName = "nomad") -> list[KeyProblem]:
    """Every unknown key, miscased key and wrong JSON type in ``doc`` read as struct ``root``.

    Paths start with ``root`` (``Job.TaskGroups[0].Count``); map entries are written
    ``Meta["key"]``. Free-form maps (``map[string]any``) are not descended. An empty
    list means the document is key-exact.
    """
    walker = _Walker(api, collect_case=True)
    walker.value(doc, go_type(root, api), root)
    return walker.problems


def decode_like_nomad(doc: object, root: str, *, api: ApiName = "nomad") -> dict[str, object]:
    """What Go's encoding/json would keep of ``doc`` decoded into struct ``root``.

    Keys are matched case-insensitively (exact spelling first) and rewritten to the
    field's name; unknown keys are dropped, as a real Nomad or Consul does silently.
    Raises :class:`ApiDecodeError` when a value has the wrong JSON type, for which
    a real server refuses the whole body.
    """
    if not isinstance(doc, dict):
        raise ApiDecodeError(
            [KeyProblem(root, ProblemKind.WRONG_TYPE, f"expected an object, got {json_kind(doc)}")]
        )
    walker = _Walker(api, collect_case=False)
    out = walker.struct(doc, struct(root, api), root)
    wrong = [p for p in walker.problems if p.kind is ProblemKind.WRONG_TYPE]
    if wrong:
        raise ApiDecodeError(wrong)
    return out
