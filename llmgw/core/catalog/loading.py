"""From catalog text to a validated ``Catalog`` and every diagnostic, each with its line.

Owns the pipeline and its order: read YAML safely (``yaml_source``), apply the
legacy readings (``repairs``), check the shape (``model``, through pydantic,
whose errors are translated into plain words at the right position), then the
rules that span keys (``rules``). Every stage reports all it finds; a later
stage runs only on what the earlier one accepted.
"""

from __future__ import annotations

import difflib
import gc
import types
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from llmgw.core.catalog.allowlists import ClusterAllowlists
from llmgw.core.catalog.model import Catalog, Model, Profile
from llmgw.core.catalog.repairs import Repair, apply_repairs
from llmgw.core.catalog.rules import Finding, check_catalog, check_profile_policy, check_profile_rules
from llmgw.core.catalog.security import SecurityPolicy
from llmgw.core.catalog.yaml_source import DEFAULT_LIMITS, ReadLimits, SourceMap, read_yaml
from llmgw.core.diagnostics import Diagnostic, Severity, YamlPath, has_errors, sort_diagnostics

_MODELS = TypeAdapter(dict[str, Model])
# Sections of named entries, each checked on its own.
_ENTRY_SECTIONS = frozenset({"aliases", "fallbacks", "guard_policies"})


@dataclass(frozen=True, slots=True)
class LoadResult:
    catalog: Catalog | None  # None when any error was found
    diagnostics: tuple[Diagnostic, ...]
    repairs: tuple[Repair, ...] = ()

    @property
    def ok(self) -> bool:
        return self.catalog is not None

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity is Severity.ERROR)


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Loading allocates hundreds of thousands of short-lived objects and makes no
    reference cycles; Python's cycle collector would walk them again and again
    (half the time of a 2,000-model catalog). Reference counting still frees them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_catalog(
    text: str,
    *,
    filename: str,
    policy: SecurityPolicy,
    limits: ReadLimits = DEFAULT_LIMITS,
    allowlists: ClusterAllowlists | None = None,
) -> LoadResult:
    """The catalog in ``text``, or every diagnostic. ``allowlists``: the cluster's
    (images, source networks), given at the doors a catalog comes in by; without them
    the renderer refuses what they would (``llmgw.core.catalog.allowlists``)."""
    with _cycle_collector_paused():
        return _load(text, filename=filename, policy=policy, limits=limits, allowlists=allowlists)


def _load(
    text: str,
    *,
    filename: str,
    policy: SecurityPolicy,
    limits: ReadLimits,
    allowlists: ClusterAllowlists | None,
) -> LoadResult:
    read = read_yaml(text, filename=filename, limits=limits)
    diagnostics = list(read.diagnostics)
    if has_errors(diagnostics) and read.data is None:
        return LoadResult(None, tuple(sort_diagnostics(diagnostics)))
    data: Any = read.data if read.data is not None else {}
    if not isinstance(data, dict):
        diagnostics.append(
            Diagnostic(
                Severity.ERROR,
                (),
                "the catalog must be a mapping with models:, and optionally aliases:, "
                "fallbacks: and guard_policies:",
                filename,
                read.source_map.value_position(()),
            )
        )
        return LoadResult(None, tuple(sort_diagnostics(diagnostics)))

    # Top-level x-* keys hold YAML anchors for reuse, as in docker compose files.
    data = {key: value for key, value in data.items() if not key.startswith("x-")}
    repairs, repair_findings = apply_repairs(data, read.source_map)
    diagnostics += _locate(repair_findings, read.source_map, filename)

    # Shape errors in one model must not hide the rule errors of the others (an
    # operator fixes a whole file in one round), so models are validated one by
    # one and the rules run on every part whose shape is right.
    models = data.get("models")
    valid_models: dict[str, Model] = {}
    invalid_models: set[str] = set()
    if isinstance(models, dict):
        try:  # the common case, a valid catalog, in one call
            valid_models = _MODELS.validate_python(models)
            models = {}
        except ValidationError:
            pass
        for name, model in models.items():
            try:
                valid_models[name] = Model.model_validate(model)
            except ValidationError as exc:
                invalid_models.add(name)
                diagnostics += _translate(exc, read.source_map, filename, prefix=("models", name))
                diagnostics += _locate(
                    _rules_of_valid_profiles(name, model, policy, allowlists), read.source_map, filename
                )
    # The other sections likewise: each entry on its own, so a broken alias hides neither
    # the other aliases' errors nor the fallbacks' and guard policies' (nor the models').
    sections = {key: value for key, value in data.items() if key != "models" or not isinstance(value, dict)}
    valid_sections: dict[str, Any] = {}
    models_readable = "models" not in data or isinstance(models, dict)
    for key, value in sections.items():
        try:
            valid_sections[key] = getattr(Catalog.model_validate({key: value}), key)
            continue
        except ValidationError as exc:
            if key not in _ENTRY_SECTIONS or not isinstance(value, dict):
                diagnostics += _translate(exc, read.source_map, filename)
                models_readable = models_readable and key != "models"
                continue
        entries: dict[str, Any] = {}
        for entry, entry_value in value.items():
            try:
                entries[entry] = getattr(Catalog.model_validate({key: {entry: entry_value}}), key)[entry]
            except ValidationError as exc:
                diagnostics += _translate(exc, read.source_map, filename)
                if key == "aliases" and isinstance(entry, str):
                    invalid_models.add(entry)  # a name that stands: references to it are not unknown
        valid_sections[key] = entries
    if models_readable:
        # References need the models: with no readable models: section, every one would
        # read as unknown, so the cross-section rules wait for it to be fixed.
        catalog = Catalog().model_copy(update={**valid_sections, "models": valid_models})
        findings = check_catalog(
            catalog, policy, unvalidated_models=frozenset(invalid_models), allowlists=allowlists
        )
        diagnostics += _locate(findings, read.source_map, filename)
    if has_errors(diagnostics):
        return LoadResult(None, tuple(sort_diagnostics(diagnostics)), tuple(repairs))
    catalog = Catalog().model_copy(update={**valid_sections, "models": valid_models})
    ordered = tuple(sort_diagnostics(diagnostics))
    if has_errors(ordered):
        return LoadResult(None, ordered, tuple(repairs))
    return LoadResult(catalog, ordered, tuple(repairs))


def _rules_of_valid_profiles(
    name: str, model: object, policy: SecurityPolicy, allowlists: ClusterAllowlists | None
) -> list[Finding]:
    profiles = model.get("profiles") if isinstance(model, dict) else None
    if not isinstance(profiles, list):
        return []
    findings: list[Finding] = []
    for index, raw in enumerate(profiles):
        path = ("models", name, "profiles", index)
        try:
            profile = Profile.model_validate(raw)
        except ValidationError:
            # Its shape errors are already reported with the model's; the policy reads only
            # the engine, args and env, so it still speaks when those are right.
            policed = (
                {key: raw[key] for key in ("engine", "args", "env") if key in raw}
                if isinstance(raw, dict)
                else {}
            )
            with suppress(ValidationError):
                findings += check_profile_policy(path, Profile.model_validate(policed), policy)
            continue
        findings += check_profile_rules(path, profile, policy, allowlists)
    return findings


def _locate(findings: list[Finding], source_map: SourceMap, filename: str) -> list[Diagnostic]:
    return [
        Diagnostic(
            f.severity,
            f.path,
            f.message,
            filename,
            source_map.key_position(f.path) if f.at_key else source_map.value_position(f.path),
        )
        for f in findings
    ]


# --- pydantic's errors in the words of the catalog ---------------------------------------------

_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "string_type": "text",
    "bool_type": "true or false",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
}

_MISSING_HINTS = {
    ("scaling", "max"): " (max is never filled in for you: write the most replicas this model may have)",
    ("scaling", "min"): " (write min: 0 to allow unloading, or the replicas to keep running)",
}


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f'text "{shown}"'
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__  # pragma: no cover


def _translate(
    exc: ValidationError, source_map: SourceMap, filename: str, prefix: YamlPath = ()
) -> list[Diagnostic]:
    errors = exc.errors(include_url=False)
    error_locs = [(*prefix, *e["loc"]) for e in errors]
    out: list[Diagnostic] = []
    for err in errors:
        loc: YamlPath = (*prefix, *err["loc"])
        kind = err["type"]
        # "profiles should have at least 1 item after validation" repeats a child's error.
        if kind == "too_short" and any(
            len(other) > len(loc) and other[: len(loc)] == loc for other in error_locs
        ):
            continue
        message, at_key = _message(kind, loc, err)
        if kind == "missing":
            loc = loc[:-1]  # the mapping that lacks the key is where to write it
        position = source_map.key_position(loc) if at_key else source_map.value_position(loc)
        out.append(Diagnostic(Severity.ERROR, loc, message, filename, position))
    return out


def _message(kind: str, loc: YamlPath, err: Any) -> tuple[str, bool]:
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        known = f"; expected one of: {', '.join(allowed)}" if allowed and not close else ""
        return f'unknown key "{key}"{hint}{known}', True
    if kind == "missing":
        hint = _MISSING_HINTS.get((str(loc[-2]), str(loc[-1])) if len(loc) >= 2 else ("", ""), "")
        return f'missing required key "{loc[-1]}"{hint}', False
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {_describe(value)}", False
    if kind == "enum":
        expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
        return f'"{value}" is not one of: {expected}', False
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        words = {
            "greater_than_equal": "at least",
            "greater_than": "more than",
            "less_than_equal": "at most",
            "less_than": "less than",
        }[kind]
        bound = next(iter(ctx.values()), "")
        return f"must be {words} {bound}, got {value}", False
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length', 1)} item(s)", False
    if kind == "value_error":
        return str(ctx.get("error", err["msg"])), False
    if kind == "literal_error":
        return f"expected {ctx.get('expected', '')}, got {_describe(value)}", False
    message = str(err["msg"])
    return message[:1].lower() + message[1:], False


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            annotation = members[0]
        else:
            return annotation


def _allowed_keys(path: YamlPath) -> list[str]:
    """The keys the mapping at ``path`` may hold, found by walking the schema's types."""
    annotation: Any = Catalog
    for element in path:
        annotation = _unwrap(annotation)
        origin = get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(element))
            if field is None:
                return []
            annotation = field.annotation
        elif origin is dict:
            annotation = get_args(annotation)[1]
        elif origin in (tuple, list):
            annotation = get_args(annotation)[0]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []
