"""catalog_diff: what applying catalog B over catalog A starts, stops, rolls, scales, per model."""

from __future__ import annotations

import hashlib
import textwrap

import pytest

from llmgw.admin.previewing import RenderedSpecHashes
from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.catalog_diff import (
    CatalogDiff,
    DiffDecodeError,
    Effect,
    ModelChange,
    catalog_diff,
    diff_from_dict,
    diff_to_dict,
)
from llmgw.render import Renderer, RenderSettings

BASE = """
models:
  chat:
    description: the chat model
    profiles:
      - engine: sim
        tp: 2
        args: ["--max-num-seqs", "8"]
    scaling: {min: 1, max: 3}
  lazy:
    profiles:
      - engine: sim
    scaling: {min: 0, max: 2, idle_timeout: 10m}
  dormant:
    profiles:
      - engine: sim
    scaling: {min: 0, max: 0}
  known:
    profiles:
      - engine: sim
aliases:
  gpt: chat
"""


def load(text: str, policy: SecurityPolicy) -> Catalog:
    result = load_catalog(textwrap.dedent(text), filename="catalog.yaml", policy=policy)
    assert result.catalog is not None, "\n".join(d.format() for d in result.diagnostics)
    return result.catalog


def as_written(catalog: Catalog, model: str, profile_index: int) -> str | None:
    """A stand-in for the renderer: the hash of the profile as written (and its place)."""
    profile = catalog.models[model].profiles[profile_index]
    return hashlib.sha256(f"{model}/{profile_index}/{profile.model_dump_json()}".encode()).hexdigest()


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# (edit of BASE, model, expected effect, words the reason must hold)
CASES = [
    # a changed spec rolls; the reason names the profile and the key
    (
        ('"--max-num-seqs", "8"', '"--max-num-seqs", "16"'),
        "chat",
        Effect.ROLL,
        "profile 0 changes what runs (args)",
    ),
    (("tp: 2", "tp: 4"), "chat", Effect.ROLL, "profile 0 changes what runs (tp)"),
    # a changed bound scales and replaces nothing
    (
        ("{min: 1, max: 3}", "{min: 2, max: 3}"),
        "chat",
        Effect.SCALE,
        "min 1 -> 2: at least 2 replicas kept running",
    ),
    (
        ("{min: 1, max: 3}", "{min: 1, max: 2}"),
        "chat",
        Effect.SCALE,
        "max 3 -> 2: replicas above 2 drain and stop",
    ),
    (("{min: 1, max: 3}", "{min: 0, max: 3}"), "chat", Effect.SCALE, "on demand now"),
    (
        ("{min: 0, max: 2, idle_timeout: 10m}", "{min: 0, max: 5, idle_timeout: 10m}"),
        "lazy",
        Effect.SCALE,
        "max 2 -> 5",
    ),
    # both at once: the roll says the scaling too
    (
        (
            'tp: 2\n        args: ["--max-num-seqs", "8"]\n    scaling: {min: 1, max: 3}',
            'tp: 4\n        args: ["--max-num-seqs", "8"]\n    scaling: {min: 2, max: 3}',
        ),
        "chat",
        Effect.ROLL,
        "(tp): its replicas are replaced one at a time; min 1 -> 2",
    ),
    # what the job never sees restarts nothing
    (
        ("description: the chat model", "description: another"),
        "chat",
        Effect.UPDATE,
        "description changed; nothing restarts",
    ),
    (("idle_timeout: 10m", "idle_timeout: 20m"), "lazy", Effect.UPDATE, "scaling.idle_timeout changed"),
    # turned off, turned on
    (
        ("{min: 1, max: 3}", "{min: 0, max: 0}"),
        "chat",
        Effect.STOP,
        "turned off (max 0): its replicas drain and stop",
    ),
    (("{min: 0, max: 0}", "{min: 1, max: 1}"), "dormant", Effect.START, "turned on; keeps 1 replica running"),
    (("{min: 0, max: 0}", "{min: 0, max: 1}"), "dormant", Effect.SCALE, "turned on; on demand"),
    # a model that runs nothing changes without effect on replicas
    (
        (
            "  known:\n    profiles:\n      - engine: sim\n",
            "  known:\n    profiles:\n      - engine: sim\n        tp: 2\n",
        ),
        "known",
        Effect.UPDATE,
        "profiles[0].tp changed",
    ),
    # removed, added
    (("  known:\n    profiles:\n      - engine: sim\n", ""), "known", Effect.REMOVE, "it ran no replicas"),
    (
        (
            "  lazy:\n    profiles:\n      - engine: sim\n    scaling: {min: 0, max: 2, idle_timeout: 10m}\n",
            "",
        ),
        "lazy",
        Effect.STOP,
        "removed from the catalog: its replicas drain and stop",
    ),
    (
        ("models:\n", "models:\n  fresh:\n    profiles: [{engine: sim}]\n    scaling: {min: 2, max: 2}\n"),
        "fresh",
        Effect.START,
        "new model; keeps 2 replicas running",
    ),
    (
        ("models:\n", "models:\n  fresh:\n    profiles: [{engine: sim}]\n    scaling: {min: 0, max: 2}\n"),
        "fresh",
        Effect.ADD,
        "on demand: it starts at its first request",
    ),
    (("models:\n", "models:\n  fresh:\n    profiles: [{engine: sim}]\n"), "fresh", Effect.ADD, "no scaling"),
]


@pytest.mark.parametrize(("change", "model", "effect", "words"), CASES)
def test_one_edit_one_effect(
    change: tuple[str, str], model: str, effect: Effect, words: str, shipped_policy: SecurityPolicy
) -> None:
    old = load(BASE, shipped_policy)
    new = load(edit(*change), shipped_policy)
    diff = catalog_diff(old, new, as_written)
    assert [c.model for c in diff.models] == [model], diff
    found = diff.change(model)
    assert found is not None
    assert found.effect is effect
    assert words in found.reason


def test_an_identical_catalog_does_nothing(shipped_policy: SecurityPolicy) -> None:
    reformatted = BASE.replace("{min: 1, max: 3}", "\n      min: 1\n      max: 3")
    diff = catalog_diff(load(BASE, shipped_policy), load(reformatted, shipped_policy), as_written)
    assert diff.unchanged
    assert diff.models == () and diff.routing == ()


def test_no_catalog_yet_starts_what_keeps_running(shipped_policy: SecurityPolicy) -> None:
    diff = catalog_diff(None, load(BASE, shipped_policy), as_written)
    assert diff.names(Effect.START) == ("chat",)
    assert diff.names(Effect.ADD) == ("dormant", "known", "lazy")
    assert diff.routing == ('alias "gpt" added: -> chat',)


def test_profiles_moved_roll_by_index(shipped_policy: SecurityPolicy) -> None:
    """A profile inserted first changes what index 0 runs: those replicas roll; a profile
    appended last changes nothing that runs."""
    two = edit(
        '        args: ["--max-num-seqs", "8"]\n',
        '        args: ["--max-num-seqs", "8"]\n      - engine: sim\n',
    )
    old = load(BASE, shipped_policy)
    appended = catalog_diff(old, load(two, shipped_policy), as_written).change("chat")
    assert appended is not None and appended.effect is Effect.UPDATE
    first = edit(
        "    profiles:\n      - engine: sim\n        tp: 2",
        "    profiles:\n      - engine: sim\n      - engine: sim\n        tp: 2",
    )
    inserted = catalog_diff(old, load(first, shipped_policy), as_written).change("chat")
    assert inserted is not None and inserted.effect is Effect.ROLL
    assert inserted.rolled_profiles == (0,)
    # ... and a dropped profile rolls the replicas that ran it.
    dropped = catalog_diff(load(two, shipped_policy), old, as_written).change("chat")
    assert dropped is not None and dropped.effect is Effect.ROLL
    assert dropped.rolled_profiles == (1,)
    assert "profile 1 was removed" in dropped.reason


def test_routing_changes_are_listed_without_touching_models(shipped_policy: SecurityPolicy) -> None:
    new = edit("  gpt: chat\n", "  gpt: lazy\n  fast: chat\nfallbacks:\n  chat: [lazy]\n")
    diff = catalog_diff(load(BASE, shipped_policy), load(new, shipped_policy), as_written)
    assert diff.models == ()
    assert diff.routing == (
        'alias "fast" added: -> chat',
        'alias "gpt" changed: -> chat => -> lazy',
        'fallbacks of "chat" added: [lazy]',
    )


def test_a_profile_the_renderer_cannot_hash_is_compared_as_written(shipped_policy: SecurityPolicy) -> None:
    old = load(BASE, shipped_policy)
    new = load(edit("tp: 2", "tp: 4"), shipped_policy)
    diff = catalog_diff(old, new, lambda catalog, model, index: None)
    change = diff.change("chat")
    assert change is not None and change.effect is Effect.ROLL
    assert "compared as written" in change.reason
    # Unchanged as written, unrenderable: no roll.
    same = catalog_diff(
        old,
        load(edit("description: the chat model", "description: x"), shipped_policy),
        lambda catalog, model, index: None,
    )
    assert same.change("chat") == ModelChange(
        "chat", Effect.UPDATE, "description changed; nothing restarts", ("description",)
    )


def test_the_json_round_trips(shipped_policy: SecurityPolicy) -> None:
    old = load(BASE, shipped_policy)
    new = load(edit("tp: 2", "tp: 4").replace("  gpt: chat", "  gpt: lazy"), shipped_policy)
    diff = catalog_diff(old, new, as_written)
    raw = diff_to_dict(diff)
    assert raw["counts"] == {"roll": 1}
    assert diff_from_dict(raw) == diff
    with pytest.raises(DiffDecodeError):
        diff_from_dict({"models": [{"model": "m", "effect": "explode", "reason": ""}], "routing": []})
    assert diff_from_dict({"models": [], "routing": []}) == CatalogDiff(())


# --- with the real renderer: the spec hash decides ------------------------------------------


@pytest.fixture(scope="module")
def rendered(shipped_policy: SecurityPolicy) -> RenderedSpecHashes:
    return RenderedSpecHashes(Renderer(RenderSettings(), shipped_policy))


@pytest.mark.parametrize(
    ("change", "effect"),
    [
        (('"--max-num-seqs", "8"', '"--max-num-seqs", "16"'), Effect.ROLL),
        (("tp: 2", "tp: 4"), Effect.ROLL),
        (("description: the chat model", "description: renamed"), Effect.UPDATE),
        (("{min: 1, max: 3}", "{min: 2, max: 5}"), Effect.SCALE),
    ],
)
def test_the_renderers_spec_hash_decides_the_roll(
    change: tuple[str, str], effect: Effect, rendered: RenderedSpecHashes, shipped_policy: SecurityPolicy
) -> None:
    diff = catalog_diff(load(BASE, shipped_policy), load(edit(*change), shipped_policy), rendered)
    found = diff.change("chat")
    assert found is not None and found.effect is effect, diff


def test_a_renderer_setting_only_the_diff_cannot_see_rolls_nothing(
    rendered: RenderedSpecHashes, shipped_policy: SecurityPolicy
) -> None:
    """The same catalog under the same renderer: equal hashes, nothing to do."""
    catalog = load(BASE, shipped_policy)
    assert catalog_diff(catalog, catalog, rendered).unchanged
