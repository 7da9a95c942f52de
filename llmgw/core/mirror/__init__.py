"""The model mirror's pure side: references, source parsing, file selection, manifests, completeness.

Everything here is values and decisions; ``llmgw.mirror`` does the I/O. The
catalog checker needs only ``parse_ref``/``is_mirror_source`` and
``check_reference(ref, index)``; ``llmgw.mirror.load_index`` builds the index.
"""

from llmgw.core.mirror.gc import GcDecision, GcPlan, plan_gc
from llmgw.core.mirror.index import MirrorIndex, VersionState, VersionStatus, assess_version, check_reference
from llmgw.core.mirror.manifest import (
    Manifest,
    ManifestError,
    ManifestFile,
    PlannedFile,
    RelPath,
    Sha256Hex,
    VersionPlan,
    check_rel_path,
    check_sha256,
    check_sha256_text,
    is_sha256,
    manifest_from_plan,
)
from llmgw.core.mirror.refs import (
    MirrorName,
    MirrorRef,
    MirrorRefError,
    MirrorVersion,
    check_name,
    check_version,
    is_mirror_source,
    is_valid_segment,
    parse_ref,
)
from llmgw.core.mirror.selection import (
    RepoFile,
    Selection,
    SelectionError,
    gguf_to_load,
    index_path,
    select_files,
    shards_of_index,
)
from llmgw.core.mirror.sources import FileUrl, HubRepo, Source, SourceError, parse_source, parse_sources

__all__ = [
    "FileUrl",
    "GcDecision",
    "GcPlan",
    "HubRepo",
    "Manifest",
    "ManifestError",
    "ManifestFile",
    "MirrorIndex",
    "MirrorName",
    "MirrorRef",
    "MirrorRefError",
    "MirrorVersion",
    "PlannedFile",
    "RelPath",
    "RepoFile",
    "Selection",
    "SelectionError",
    "Sha256Hex",
    "Source",
    "SourceError",
    "VersionPlan",
    "VersionState",
    "VersionStatus",
    "assess_version",
    "check_name",
    "check_reference",
    "check_rel_path",
    "check_sha256",
    "check_sha256_text",
    "check_version",
    "gguf_to_load",
    "index_path",
    "is_mirror_source",
    "is_sha256",
    "is_valid_segment",
    "manifest_from_plan",
    "parse_ref",
    "parse_source",
    "parse_sources",
    "plan_gc",
    "select_files",
    "shards_of_index",
]
