"""Whether a mirrored version exists yet: the completeness rule, the index of versions, ``check_reference``.

Owns the one rule that decides when a version may be used: nothing of it is
downloading, every planned file is present and verified, and every shard the
safetensors index names is among them. Until then the version does not exist
for the catalog. Must not look at a disk or the network: the store and the
server gather the facts and call ``assess_version``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from llmgw.core.mirror.manifest import ManifestError, ManifestFile, RelPath, VersionPlan
from llmgw.core.mirror.refs import MirrorRef, check_name, check_version

INDEX_FORMAT = 1


class VersionState(StrEnum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    DOWNLOADING = "downloading"


@dataclass(frozen=True)
class VersionStatus:
    ref: MirrorRef
    state: VersionState
    files_total: int
    files_verified: int
    bytes_total: int  # known sizes only: a plain URL may not say its size until fetched
    bytes_verified: int
    source: str
    revision: str | None

    @property
    def summary(self) -> str:
        return f"{self.files_verified} of {self.files_total} files"


def assess_version(
    plan: VersionPlan,
    verified: Mapping[RelPath, ManifestFile],
    *,
    downloading: bool,
) -> VersionStatus:
    """``verified``: files present at their final path, with the size and hash recorded when verified.

    A file counts only if the plan wants it and its recorded size matches what
    the plan expected (and its hash, when the plan knew one).
    """
    good = {
        f.path: verified[f.path]
        for f in plan.files
        if f.path in verified
        and (f.size is None or verified[f.path].size == f.size)
        and (f.sha256 is None or verified[f.path].sha256 == f.sha256)
    }
    planned = {f.path for f in plan.files}
    shards_ok = plan.index_shards <= planned and all(s in good for s in plan.index_shards)
    all_ok = len(good) == len(plan.files) and shards_ok and bool(plan.files)
    if downloading:
        state = VersionState.DOWNLOADING
    elif all_ok:
        state = VersionState.COMPLETE
    else:
        state = VersionState.INCOMPLETE
    return VersionStatus(
        ref=plan.ref,
        state=state,
        files_total=len(plan.files),
        files_verified=len(good),
        bytes_total=sum(good[f.path].size if f.path in good else (f.size or 0) for f in plan.files),
        bytes_verified=sum(m.size for m in good.values()),
        source=plan.source,
        revision=plan.revision,
    )


@dataclass(frozen=True)
class MirrorIndex:
    """Every version a mirror knows of, complete or not, in ref order."""

    versions: tuple[VersionStatus, ...]

    @classmethod
    def of(cls, statuses: Iterable[VersionStatus]) -> MirrorIndex:
        return cls(tuple(sorted(statuses, key=lambda s: s.ref)))

    def get(self, ref: MirrorRef) -> VersionStatus | None:
        return next((v for v in self.versions if v.ref == ref), None)

    def versions_of(self, name: str) -> tuple[VersionStatus, ...]:
        return tuple(v for v in self.versions if v.ref.name == name)

    def to_json(self) -> str:
        doc = {
            "format": INDEX_FORMAT,
            "versions": [
                {
                    "name": v.ref.name,
                    "version": v.ref.version,
                    "state": v.state.value,
                    "files_total": v.files_total,
                    "files_verified": v.files_verified,
                    "bytes_total": v.bytes_total,
                    "bytes_verified": v.bytes_verified,
                    "source": v.source,
                    "revision": v.revision,
                }
                for v in self.versions
            ],
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> MirrorIndex:
        try:
            doc = json.loads(text)
            if doc.get("format") != INDEX_FORMAT:
                raise ManifestError(f"mirror index format {doc.get('format')!r} is not {INDEX_FORMAT}")
            return cls.of(
                VersionStatus(
                    ref=MirrorRef(check_name(v["name"]), check_version(v["version"])),
                    state=VersionState(v["state"]),
                    files_total=int(v["files_total"]),
                    files_verified=int(v["files_verified"]),
                    bytes_total=int(v["bytes_total"]),
                    bytes_verified=int(v["bytes_verified"]),
                    source=str(v["source"]),
                    revision=None if v.get("revision") is None else str(v["revision"]),
                )
                for v in doc["versions"]
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"mirror index is malformed: {exc}") from None


def check_reference(ref: MirrorRef, index: MirrorIndex) -> str | None:
    """None when ``mirror:NAME@VERSION`` may be used; otherwise the message for ``llmgw catalog check``."""
    status = index.get(ref)
    if status is None:
        known = index.versions_of(ref.name)
        if known:
            listed = ", ".join(f"{v.ref} ({v.state.value})" for v in known)
            return f"{ref.source}: unknown mirror version; the mirror has {listed}"
        return f"{ref.source}: unknown mirror version; the mirror has no model named {ref.name!r}"
    if status.state is VersionState.DOWNLOADING:
        return f"{ref.source} is not complete: still downloading, {status.summary}"
    if status.state is VersionState.INCOMPLETE:
        return f"{ref.source} is not complete: {status.summary}"
    return None
