"""A ``Catalog`` written back as YAML that loads to the same catalog.

Used by ``llmgw catalog`` tooling and the admin API to show what is applied.
Keys the operator left at their defaults are omitted, so the output reads like
a hand-written catalog.
"""

from __future__ import annotations

import hashlib

import yaml

from llmgw.core.catalog.model import Catalog


def dump_catalog(catalog: Catalog) -> str:
    data = catalog.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)


def catalog_digest(catalog: Catalog) -> str:
    """sha256 of the catalog's canonical YAML: equal catalogs, equal digests, whatever the formatting."""
    return hashlib.sha256(dump_catalog(catalog).encode("utf-8")).hexdigest()
