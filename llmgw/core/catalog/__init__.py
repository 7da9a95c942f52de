"""The model catalog: the operators' contract, validated with a position for every problem.

Public face:

- ``load_catalog(text, filename=, policy=[, allowlists=]) -> LoadResult``: the catalog, or every
  diagnostic; with ``ClusterAllowlists``, the operator's images and source networks checked too.
- ``dump_catalog(catalog) -> str``: YAML that loads back to the same catalog.
- ``upgrade_catalog(text, filename=, policy=) -> UpgradeResult``: legacy spellings rewritten, comments kept.
- ``json_schema()``: the catalog's JSON Schema, for editors.
- ``check_profile(policy, engine, args, env)``: the engine security check every door calls.
- the model types: ``Catalog``, ``Model``, ``Profile``, ``Scaling``, ``GuardPolicy``, ``Engine``, ``Role``...
"""

from llmgw.core.catalog.allowlists import ClusterAllowlists, allowlist_refusals
from llmgw.core.catalog.dumping import catalog_digest, dump_catalog
from llmgw.core.catalog.loading import LoadResult, load_catalog
from llmgw.core.catalog.model import (
    Catalog,
    Engine,
    GpuSpec,
    GuardErrorPolicy,
    GuardPolicy,
    GuardTooLongPolicy,
    Model,
    Profile,
    Resources,
    Role,
    Routing,
    Scaling,
    ScalingMode,
    SimOptions,
    json_schema,
)
from llmgw.core.catalog.repairs import Repair, RepairKind
from llmgw.core.catalog.security import SecurityPolicy, Violation, check_profile, parse_policy
from llmgw.core.catalog.sources import (
    FileUrlSource,
    MirrorSource,
    RepositorySource,
    Source,
    SourceError,
    parse_source,
)
from llmgw.core.catalog.upgrade import UpgradeResult, upgrade_catalog
from llmgw.core.catalog.yaml_source import DEFAULT_LIMITS, ReadLimits

__all__ = [
    "DEFAULT_LIMITS",
    "Catalog",
    "ClusterAllowlists",
    "Engine",
    "FileUrlSource",
    "GpuSpec",
    "GuardErrorPolicy",
    "GuardPolicy",
    "GuardTooLongPolicy",
    "LoadResult",
    "MirrorSource",
    "Model",
    "Profile",
    "ReadLimits",
    "Repair",
    "RepairKind",
    "RepositorySource",
    "Resources",
    "Role",
    "Routing",
    "Scaling",
    "ScalingMode",
    "SecurityPolicy",
    "SimOptions",
    "Source",
    "SourceError",
    "UpgradeResult",
    "Violation",
    "allowlist_refusals",
    "catalog_digest",
    "check_profile",
    "dump_catalog",
    "json_schema",
    "load_catalog",
    "parse_policy",
    "parse_source",
    "upgrade_catalog",
]
