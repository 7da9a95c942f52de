"""Putting a version into a directory store from bytes in hand: for llmgw's own tests.

Owns ``put_version``: it writes a version the way ``mirror add`` leaves one (plan,
files at their final paths, the verified records, the manifest copy once complete),
through the store's own methods, so the server, ``mirror list``, ``catalog check
--mirror`` and ``mirror fetch`` see exactly what a real add would have produced.
``verified`` lets a test leave some files out to make an incomplete version.

Must not: be used by llmgw's commands (a real version comes from ``mirror add``, which
checks its sources; this module lives outside the package, and the import contract
refuses it there), or import pytest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

from llmgw.core.mirror import (
    ManifestFile,
    MirrorRef,
    PlannedFile,
    RelPath,
    Sha256Hex,
    VersionPlan,
    VersionState,
    check_rel_path,
    manifest_from_plan,
    parse_ref,
)
from llmgw.mirror.store import DirectoryStore


def put_version(
    store: DirectoryStore,
    ref: str | MirrorRef,
    files: Mapping[str, bytes],
    *,
    verified: Collection[str] | None = None,
    source: str = "test:put_version",
) -> MirrorRef:
    """Plan ``files`` as ``ref`` and write those in ``verified`` (default: all) as verified."""
    version = parse_ref(ref) if isinstance(ref, str) else ref
    planned = {check_rel_path(path): data for path, data in files.items()}
    plan = VersionPlan(
        ref=version,
        source=source,
        revision=None,
        files=tuple(
            PlannedFile(path, len(data), Sha256Hex(hashlib.sha256(data).hexdigest()))
            for path, data in planned.items()
        ),
    )
    store.write_plan(plan)
    keep = set(planned) if verified is None else {check_rel_path(p) for p in verified}
    for path, data in planned.items():
        if path not in keep:
            continue
        target = store.local_path(version, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        store.record_verified(
            version, ManifestFile(RelPath(path), len(data), Sha256Hex(hashlib.sha256(data).hexdigest()))
        )
    status = store.status(version)
    if status is not None and status.state is VersionState.COMPLETE:
        store.write_manifest(manifest_from_plan(plan, store.read_verified(version)))
    return version
