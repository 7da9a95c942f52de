"""The catalog the router routes by: the last good one read from the catalog source.

Owns: parsing each published ``CatalogVersion`` (the text the control plane
applied) into a ``Catalog``, keeping the previous one when a version does not
load (it was validated when applied; a failure here means a bug or a hand
edit in Consul, and routing on the last good catalog beats refusing everyone),
and the time it was loaded (``created`` in ``/v1/models``); what a client's model
name comes to under the catalog in use (``route``), worked out once per name, API
and key's model list rather than on every request.

Must not: watch Consul itself (``app`` feeds it from the ``Watched`` port).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llmgw.core import routing
from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.records import CatalogVersion

log = logging.getLogger("llmgw.gateway.catalog")

# Routes kept at most (names x APIs x key model lists); past it they are worked out anew.
ROUTES_KEPT = 4096


@dataclass(frozen=True, slots=True)
class CatalogRoute:
    """What a client's model name comes to under one API, for one key's model list."""

    model: str  # the catalog model the name stands for (``routing.resolve``)
    serves_api: bool  # ``routing.serves_api``: else the request is refused, not routed
    chain: tuple[str, ...]  # ``routing.fallback_chain``: the model, then its fallbacks
    guarded: bool  # a guard policy covers a model of the chain: the guard screens it


class CatalogHolder:
    def __init__(self, policy: SecurityPolicy) -> None:
        self._policy = policy
        self.catalog: Catalog | None = None
        self.version: int | None = None
        self.sha256: str | None = None  # of the version's text (the control plane judges by it)
        self.loaded_at = 0  # unix seconds, whole
        self._routes: dict[tuple[str, routing.Api, tuple[str, ...] | None], CatalogRoute] = {}

    def route(self, name: str, api: routing.Api, allowed: tuple[str, ...] | None) -> CatalogRoute | None:
        """``name`` under ``api`` for a key allowed ``allowed`` (None: every model), or
        None when the name is unknown to that key. Call with a catalog in place.

        Only names the catalog knows are kept (a client cannot grow the table with
        made-up ones), and only until the catalog changes."""
        found = self._routes.get((name, api, allowed))
        if found is not None:
            return found
        catalog = self.catalog
        assert catalog is not None, "route() before a catalog"
        model = routing.resolve(catalog, name, allowed)
        if model is None:
            return None
        chain = routing.fallback_chain(catalog, model, api, allowed)
        found = CatalogRoute(
            model=model,
            serves_api=routing.serves_api(catalog.models[model], api),
            chain=chain,
            guarded=any(catalog.guard_policy_for(m) is not None for m in chain),
        )
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()
        self._routes[(name, api, allowed)] = found
        return found

    def update(self, version: CatalogVersion | None, now: float) -> bool:
        """Take a new version; False (and the old catalog kept) when it does not load."""
        if version is None:
            if self.catalog is None:
                log.warning(
                    "no catalog published yet (llmgw/catalog/current is empty): every model is unknown"
                )
                self.catalog, self.loaded_at = Catalog(), int(now)
                self._routes.clear()
            return True
        if version.version == self.version:
            return True
        result = load_catalog(version.text, filename=f"catalog v{version.version}", policy=self._policy)
        if result.catalog is None:
            first = result.errors[0] if result.errors else None
            log.error(
                "catalog v%d does not load (%d errors, first: %s); still routing by v%s",
                version.version, len(result.errors), first, self.version,
            )  # fmt: skip
            return False
        self.catalog, self.version, self.loaded_at = result.catalog, version.version, int(now)
        self.sha256 = version.sha256
        self._routes.clear()
        log.info("routing by catalog v%d (%d models)", version.version, len(result.catalog.models))
        return True
