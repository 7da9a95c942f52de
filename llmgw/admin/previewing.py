"""What a catalog text would do if applied: validated the way ``llmgw catalog check`` does,
then compared with the applied catalog through the renderer's spec hashes.

Owns: ``preview(text, ...)`` -> ``Preview`` (the load result, the diff, notes), and
``RenderedSpecHashes``, the ``SpecHasher`` over ``llmgw.render`` that the pure
``llmgw.core.catalog_diff`` is given.

Every catalog that reaches ``CatalogStore.apply`` went through ``load_catalog`` here,
with the control plane's security policy and the cluster's allowlists (images, source
networks): the admin API's door of the engine policy, so a diff and an apply refuse
what the renderer would, with a diagnostic at the key. The applied catalog the diff is
against is loaded without the allowlists: it is only compared with.

Must not: store anything, or talk HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.admin.ports import SpecRenderer
from llmgw.core.catalog import Catalog, ClusterAllowlists, LoadResult, SecurityPolicy, load_catalog
from llmgw.core.catalog_diff import CatalogDiff, catalog_diff
from llmgw.core.records import CatalogVersion
from llmgw.render import RenderError, ReplicaRequest

# The replica a diff renders: any fixed id works, since the two catalogs are compared
# for the same replica (the job id is part of what is hashed).
_DIFF_REPLICA = "diff"
# Multi-node replicas are constrained to a fabric; any fixed one compares alike.
_DIFF_FABRIC = "diff"
APPLIED_FILENAME = "<applied catalog>"


class RenderedSpecHashes:
    """The spec hash of one fixed replica per profile, rendered once per distinct profile."""

    def __init__(self, renderer: SpecRenderer) -> None:
        self._renderer = renderer
        self._cache: dict[tuple[str, int, str], str | None] = {}

    def __call__(self, catalog: Catalog, model: str, profile_index: int) -> str | None:
        entry = catalog.models.get(model)
        if entry is None or not 0 <= profile_index < len(entry.profiles):
            return None
        profile = entry.profiles[profile_index]
        # What is rendered depends on the model's name, the profile and its index only,
        # so a profile unchanged between the two catalogs is rendered once.
        key = (model, profile_index, profile.model_dump_json())
        if key not in self._cache:
            request = ReplicaRequest(
                model, profile_index, _DIFF_REPLICA, _DIFF_FABRIC if profile.node_count > 1 else None
            )
            try:
                rendered = self._renderer.render(catalog, request, catalog_hash="")
            except RenderError:
                self._cache[key] = None
            else:
                self._cache[key] = rendered.spec_hash
        return self._cache[key]


@dataclass(frozen=True, slots=True)
class Preview:
    loaded: LoadResult
    base: CatalogVersion | None  # the applied version the diff is against
    diff: CatalogDiff | None  # None when the text has errors
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.diff is not None


def preview(
    text: str,
    *,
    filename: str,
    base: CatalogVersion | None,
    policy: SecurityPolicy,
    renderer: SpecRenderer,
    allowlists: ClusterAllowlists,
) -> Preview:
    loaded = load_catalog(text, filename=filename, policy=policy, allowlists=allowlists)
    if loaded.catalog is None:
        return Preview(loaded, base, None)
    notes: list[str] = []
    old: Catalog | None = None
    if base is not None:
        applied = load_catalog(base.text, filename=APPLIED_FILENAME, policy=policy)
        old = applied.catalog
        if old is None:
            first = applied.errors[0].format() if applied.errors else "unknown error"
            notes.append(
                f"the applied catalog (version {base.version}) no longer loads ({first}); "
                "the diff is shown against an empty catalog"
            )
    diff = catalog_diff(old, loaded.catalog, RenderedSpecHashes(renderer))
    return Preview(loaded, base, diff, tuple(notes))
