"""What applying catalog B over catalog A would do to each model, with a reason in words.

Owns: the classification of a catalog change per model (``Effect``: start, add, roll,
scale, update, stop, remove), the words that explain it, the catalog-wide routing
changes (aliases, fallbacks, guard policies), and the one JSON spelling of a diff
(``diff_to_dict`` / ``diff_from_dict``) that the admin API sends and ``llmgw ctl``
reads back.

The rules mirror the reconciler's (``llmgw.core.planning``): a replica is replaced when
the spec hash of what it would run changes; a changed scaling bound starts or stops
some replicas and replaces none; a model the catalog drops drains and stops; edits
the job never sees (description, roles, timers) restart nothing.

Must not: render jobs (the caller passes a ``SpecHasher``; the admin API's is
``llmgw.render``'s spec hash), know what runs now (a diff is between two catalogs;
the leader's status says what runs), do I/O or read a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from llmgw.core.catalog.model import Catalog, Model, ScalingMode
from llmgw.core.diagnostics import YamlPath, format_path

# How many changed keys a reason names before it says "and N more".
_SHOWN_PATHS = 4


class Effect(StrEnum):
    """What applying the new catalog does to one model's replicas."""

    START = "start"  # replicas start where none could run before (new, or turned on with min >= 1)
    ADD = "add"  # a new model with nothing to start now (on demand, off, or no scaling)
    ROLL = "roll"  # what its replicas run changes: each is replaced, one at a time
    SCALE = "scale"  # its bounds change: some replicas may start or stop, none is replaced
    UPDATE = "update"  # only what the router or the planner reads changes: nothing restarts
    STOP = "stop"  # removed or turned off: its replicas drain and stop
    REMOVE = "remove"  # removed, and it could run no replicas (off, or no scaling)


class SpecHasher(Protocol):
    """The spec hash the renderer gives a replica of ``model``'s profile ``profile_index``
    under ``catalog`` (None: it cannot be rendered here; the profile is then compared as
    written)."""

    def __call__(self, catalog: Catalog, model: str, profile_index: int) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ModelChange:
    model: str
    effect: Effect
    reason: str
    # The keys under models.<name> that differ, as jq paths (profiles[0].args, scaling.min).
    changed: tuple[str, ...] = ()
    # Profiles whose replicas are replaced (ROLL only).
    rolled_profiles: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CatalogDiff:
    models: tuple[ModelChange, ...]  # sorted by model name; unchanged models are left out
    routing: tuple[str, ...] = ()  # alias, fallback and guard policy changes, in words

    @property
    def unchanged(self) -> bool:
        return not self.models and not self.routing

    def names(self, effect: Effect) -> tuple[str, ...]:
        return tuple(c.model for c in self.models if c.effect is effect)

    def change(self, model: str) -> ModelChange | None:
        return next((c for c in self.models if c.model == model), None)

    def counts(self) -> dict[Effect, int]:
        out: dict[Effect, int] = {}
        for c in self.models:
            out[c.effect] = out.get(c.effect, 0) + 1
        return out


def catalog_diff(old: Catalog | None, new: Catalog, spec_hash: SpecHasher) -> CatalogDiff:
    """What applying ``new`` over ``old`` (None: no catalog yet) does, model by model."""
    base = old if old is not None else Catalog()
    changes: list[ModelChange] = []
    for name in sorted(set(base.models) | set(new.models)):
        change = _model_change(name, base, base.models.get(name), new, new.models.get(name), spec_hash)
        if change is not None:
            changes.append(change)
    return CatalogDiff(tuple(changes), _routing_changes(old, new))


# --- one model --------------------------------------------------------------------------------


def _runs(model: Model) -> bool:
    """Whether the model may have replicas at all (on demand or kept running)."""
    return model.scaling_mode in (ScalingMode.ON_DEMAND, ScalingMode.KEEP_RUNNING)


def _bounds(model: Model) -> tuple[int, int]:
    return (model.scaling.min, model.scaling.max) if model.scaling else (0, 0)


def _mode_words(model: Model) -> str:
    mode = model.scaling_mode
    if mode is ScalingMode.KEEP_RUNNING:
        low, high = _bounds(model)
        return f"keeps {_replicas(low)} running" + (f" (up to {high} on load)" if high > low else "")
    if mode is ScalingMode.ON_DEMAND:
        return "on demand: it starts at its first request"
    if mode is ScalingMode.OFF:
        return "off (max 0): nothing starts"
    return "no scaling: the router knows it, nothing starts"


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _model_change(
    name: str,
    old_catalog: Catalog,
    a: Model | None,
    new_catalog: Catalog,
    b: Model | None,
    spec_hash: SpecHasher,
) -> ModelChange | None:
    if a is None:
        if b is None:
            return None
        if b.scaling_mode is ScalingMode.KEEP_RUNNING:
            return ModelChange(name, Effect.START, f"new model; {_mode_words(b)}")
        return ModelChange(name, Effect.ADD, f"new model; {_mode_words(b)}")
    if b is None:
        if _runs(a):
            return ModelChange(name, Effect.STOP, "removed from the catalog: its replicas drain and stop")
        return ModelChange(name, Effect.REMOVE, "removed from the catalog; it ran no replicas")
    changed = _changed_paths(a, b)
    if not changed:
        return None
    shown = tuple(format_path(p) for p in changed)
    if _runs(a) and not _runs(b):
        why = "turned off (max 0)" if b.scaling_mode is ScalingMode.OFF else "its scaling was removed"
        return ModelChange(name, Effect.STOP, f"{why}: its replicas drain and stop", shown)
    if not _runs(a) and _runs(b):
        effect = Effect.START if b.scaling_mode is ScalingMode.KEEP_RUNNING else Effect.SCALE
        return ModelChange(name, effect, f"turned on; {_mode_words(b)}", shown)
    scaling = _scaling_words(a, b) if _runs(a) else []
    if _runs(a):
        rolled, unrenderable = _rolled_profiles(name, old_catalog, a, new_catalog, b, spec_hash)
        if rolled:
            what = ", ".join(_profile_words(i, changed, a, b) for i in rolled)
            reason = f"{what}: its replicas are replaced one at a time"
            if unrenderable:
                reason += " (compared as written: the renderer cannot render it here)"
            if scaling:
                reason += "; " + "; ".join(scaling)
            return ModelChange(name, Effect.ROLL, reason, shown, rolled)
    if scaling:
        return ModelChange(name, Effect.SCALE, "; ".join(scaling) + "; no replica is replaced", shown)
    return ModelChange(name, Effect.UPDATE, f"{_listed(shown)} changed; nothing restarts", shown)


def _rolled_profiles(
    name: str, old_catalog: Catalog, a: Model, new_catalog: Catalog, b: Model, spec_hash: SpecHasher
) -> tuple[tuple[int, ...], bool]:
    """The profile indexes whose replicas would run something else, and whether any was
    compared as written because the renderer gave no hash."""
    rolled: list[int] = []
    unrenderable = False
    for index in range(len(a.profiles)):
        if index >= len(b.profiles):
            rolled.append(index)  # its replicas run a profile the catalog no longer has
            continue
        before = spec_hash(old_catalog, name, index)
        after = spec_hash(new_catalog, name, index)
        if before is None or after is None:
            unrenderable = True
            if a.profiles[index] != b.profiles[index]:
                rolled.append(index)
        elif before != after:
            rolled.append(index)
    return tuple(rolled), unrenderable and bool(rolled)


def _profile_words(index: int, changed: list[YamlPath], a: Model, b: Model) -> str:
    if index >= len(b.profiles):
        return f"profile {index} was removed"
    keys = [format_path(p[2:]) for p in changed if len(p) > 2 and p[0] == "profiles" and p[1] == index]
    if not keys and len(a.profiles) != len(b.profiles):
        keys = ["the profile list"]
    detail = f" ({_listed(tuple(keys))})" if keys else ""
    return f"profile {index} changes what runs{detail}"


def _scaling_words(a: Model, b: Model) -> list[str]:
    (lo_a, hi_a), (lo_b, hi_b) = _bounds(a), _bounds(b)
    words: list[str] = []
    if lo_b > lo_a:
        words.append(f"min {lo_a} -> {lo_b}: at least {_replicas(lo_b)} kept running")
    elif lo_b < lo_a:
        if lo_b == 0:
            words.append(f"min {lo_a} -> 0: on demand now, its replicas unload when idle")
        else:
            words.append(f"min {lo_a} -> {lo_b}: replicas above {lo_b} stop when load allows")
    if hi_b < hi_a:
        words.append(f"max {hi_a} -> {hi_b}: replicas above {hi_b} drain and stop")
    elif hi_b > hi_a:
        words.append(f"max {hi_a} -> {hi_b}: may scale up to {hi_b} on load")
    return words


def _listed(items: tuple[str, ...]) -> str:
    if len(items) <= _SHOWN_PATHS:
        return ", ".join(items)
    return ", ".join(items[:_SHOWN_PATHS]) + f" and {len(items) - _SHOWN_PATHS} more"


def _changed_paths(a: Model, b: Model) -> list[YamlPath]:
    out: list[YamlPath] = []
    _compare(a.model_dump(mode="json"), b.model_dump(mode="json"), (), out)
    return out


def _compare(a: object, b: object, path: YamlPath, out: list[YamlPath]) -> None:
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            _compare(a.get(key), b.get(key), (*path, str(key)), out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and path and path[-1] == "profiles":
        # Profiles are compared one by one (a roll names the profile); other lists
        # (args, roles) change as a whole.
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _compare(x, y, (*path, index), out)
        return
    out.append(path)


# --- routing --------------------------------------------------------------------------------------


def _routing_changes(old: Catalog | None, new: Catalog) -> tuple[str, ...]:
    before = old or Catalog()
    out: list[str] = []
    out += _mapping_changes("alias", before.aliases, new.aliases, lambda v: f"-> {v}")
    out += _mapping_changes(
        "fallbacks of", before.fallbacks, new.fallbacks, lambda v: "[" + ", ".join(v) + "]"
    )
    out += _mapping_changes(
        "guard policy",
        before.guard_policies,
        new.guard_policies,
        lambda p: (
            f"judge {p.judge} screens {', '.join(p.models)} "
            f"(on error: {p.on_error}, too long: {p.on_too_long})"
        ),
    )
    return tuple(out)


def _mapping_changes(
    what: str, a: Mapping[str, Any], b: Mapping[str, Any], show: Callable[[Any], str]
) -> list[str]:
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        if key not in a:
            out.append(f'{what} "{key}" added: {show(b[key])}')
        elif key not in b:
            out.append(f'{what} "{key}" removed (was {show(a[key])})')
        elif a[key] != b[key]:
            out.append(f'{what} "{key}" changed: {show(a[key])} => {show(b[key])}')
    return out


# --- JSON -------------------------------------------------------------------------------------------


class DiffDecodeError(ValueError):
    """A diff document is not one ``diff_to_dict`` wrote; the message says where."""


def diff_to_dict(diff: CatalogDiff) -> dict[str, Any]:
    return {
        "models": [
            {
                "model": c.model,
                "effect": str(c.effect),
                "reason": c.reason,
                "changed": list(c.changed),
                "rolled_profiles": list(c.rolled_profiles),
            }
            for c in diff.models
        ],
        "routing": list(diff.routing),
        "counts": {str(effect): n for effect, n in sorted(diff.counts().items())},
    }


def diff_from_dict(raw: object) -> CatalogDiff:
    """Read back what ``diff_to_dict`` wrote (``counts`` is derived, so it is not read)."""
    if not isinstance(raw, dict):
        raise DiffDecodeError("diff: expected a JSON object")
    models = raw.get("models")
    routing = raw.get("routing")
    if not isinstance(models, list) or not isinstance(routing, list):
        raise DiffDecodeError("diff: expected lists under models and routing")
    changes: list[ModelChange] = []
    for i, item in enumerate(models):
        where = f"diff.models[{i}]"
        if not isinstance(item, dict):
            raise DiffDecodeError(f"{where}: expected a JSON object")
        try:
            effect = Effect(str(item.get("effect")))
        except ValueError:
            raise DiffDecodeError(f"{where}.effect: {item.get('effect')!r} is not an effect") from None
        model, reason = item.get("model"), item.get("reason")
        changed, rolled = item.get("changed", []), item.get("rolled_profiles", [])
        if not isinstance(model, str) or not isinstance(reason, str):
            raise DiffDecodeError(f"{where}: model and reason must be strings")
        if not isinstance(changed, list) or not all(isinstance(p, str) for p in changed):
            raise DiffDecodeError(f"{where}.changed: expected a list of strings")
        if not isinstance(rolled, list) or not all(type(p) is int for p in rolled):
            raise DiffDecodeError(f"{where}.rolled_profiles: expected a list of whole numbers")
        changes.append(ModelChange(model, effect, reason, tuple(changed), tuple(rolled)))
    if not all(isinstance(r, str) for r in routing):
        raise DiffDecodeError("diff.routing: expected a list of strings")
    return CatalogDiff(tuple(changes), tuple(routing))
