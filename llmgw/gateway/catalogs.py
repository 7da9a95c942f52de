"""The catalog the router routes by: the last good one read from the catalog source.

Owns: parsing each published ``CatalogVersion`` (the text the control plane
applied) into a ``Catalog``, keeping the previous one when a version does not
load (it was validated when applied; a failure here means a bug or a hand
edit in Consul, and routing on the last good catalog beats refusing everyone),
and the time it was loaded (``created`` in ``/v1/models``).

Must not: watch Consul itself (``app`` feeds it from the ``Watched`` port).
"""

from __future__ import annotations

import logging

from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.records import CatalogVersion

log = logging.getLogger("llmgw.gateway.catalog")


class CatalogHolder:
    def __init__(self, policy: SecurityPolicy) -> None:
        self._policy = policy
        self.catalog: Catalog | None = None
        self.version: int | None = None
        self.sha256: str | None = None  # of the version's text (the control plane judges by it)
        self.loaded_at = 0  # unix seconds, whole

    def update(self, version: CatalogVersion | None, now: float) -> bool:
        """Take a new version; False (and the old catalog kept) when it does not load."""
        if version is None:
            if self.catalog is None:
                log.warning(
                    "no catalog published yet (llmgw/catalog/current is empty): every model is unknown"
                )
                self.catalog, self.loaded_at = Catalog(), int(now)
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
        log.info("routing by catalog v%d (%d models)", version.version, len(result.catalog.models))
        return True
