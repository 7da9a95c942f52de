"""A mirrored version's plan (what it should hold) and manifest (what it verifiably holds).

Owns the two documents a version's directory carries, their JSON forms, and the
rule that every file path in them is a safe relative path: a manifest read from
the network decides where a node writes, so ``..``, absolute paths and odd
characters are refused here, before anything touches a disk. Must not read or
write files itself; callers pass and receive text.

Neither document ever holds a credential: sources are recorded as a repository
id or a URL without its query string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NewType, TypeVar

from llmgw.core.mirror.refs import MirrorRef, MirrorRefError, check_name, check_version

Sha256Hex = NewType("Sha256Hex", str)
RelPath = NewType("RelPath", str)

MANIFEST_FORMAT = 1
PLAN_FORMAT = 1

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=@,-]{0,254}")
# Names the store and the node-side fetch use for their own bookkeeping.
RESERVED_SUFFIXES: tuple[str, ...] = (".part",)


class ManifestError(ValueError):
    """A plan or manifest that cannot be trusted; the message names the field."""


def is_sha256(text: str) -> bool:
    return _SHA256.fullmatch(text) is not None


def check_sha256(text: str, what: str) -> Sha256Hex:
    if not is_sha256(text):
        raise ManifestError(f"{what}: sha256 must be 64 lower-case hex digits, got {text!r}")
    return Sha256Hex(text)


def check_sha256_text(text: object) -> Sha256Hex:
    """``check_sha256`` for a value read from a document of unknown shape."""
    if not isinstance(text, str):
        raise ManifestError(f"sha256 must be a string, got {type(text).__name__}")
    return check_sha256(text, "sha256")


def check_rel_path(text: str) -> RelPath:
    """A relative POSIX path whose every segment is plain: no ``..``, no hidden files, no reserved suffix."""
    segments = text.split("/")
    if not text or any(_PATH_SEGMENT.fullmatch(s) is None for s in segments):
        raise ManifestError(
            f"unsafe file path {text!r}: paths are relative, '/'-separated, and each part starts "
            "with a letter, digit or '_'"
        )
    if text.endswith(RESERVED_SUFFIXES):
        raise ManifestError(f"file path {text!r} ends in a suffix the mirror reserves for partial downloads")
    return RelPath(text)


@dataclass(frozen=True, order=True)
class ManifestFile:
    path: RelPath
    size: int
    sha256: Sha256Hex


@dataclass(frozen=True)
class Manifest:
    """Given out only for a complete version: every file present, sized and hashed as listed."""

    ref: MirrorRef
    source: str
    revision: str | None
    files: tuple[ManifestFile, ...]

    def __post_init__(self) -> None:
        # Kept in path order so equal manifests compare and serialize equal.
        object.__setattr__(self, "files", tuple(sorted(self.files)))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> ManifestFile | None:
        return next((f for f in self.files if f.path == path), None)

    def to_json(self) -> str:
        """Deterministic: the same version always serializes to the same bytes."""
        return _version_json(MANIFEST_FORMAT, self.ref, self.source, self.revision, self.files)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        doc = _load_object(text, "manifest")
        if doc.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"manifest format {doc.get('format')!r} is not {MANIFEST_FORMAT}")
        files = tuple(
            ManifestFile(
                path=check_rel_path(_str(item, "path")),
                size=_size(item, "size"),
                sha256=check_sha256(_str(item, "sha256"), f"manifest file {item.get('path')!r}"),
            )
            for item in _objects(doc.get("files"), "manifest files")
        )
        _no_duplicates((f.path for f in files), "manifest")
        return cls(
            ref=_ref(doc),
            source=_str(doc, "source"),
            revision=_optional_str(doc, "revision"),
            files=tuple(sorted(files)),
        )


@dataclass(frozen=True, order=True)
class PlannedFile:
    """A file a version should hold; ``size``/``sha256`` are None where the source does not say."""

    path: RelPath
    size: int | None
    sha256: Sha256Hex | None


@dataclass(frozen=True)
class VersionPlan:
    """Written when ``mirror add`` starts: the files chosen, and the shards the safetensors index names.

    ``revision`` is the resolved commit for a repository (the ``--revision`` the
    user gave may be a branch), None for plain URLs.
    """

    ref: MirrorRef
    source: str
    revision: str | None
    files: tuple[PlannedFile, ...]
    index_shards: frozenset[RelPath] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(sorted(self.files)))

    @property
    def known_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def same_content(self, other: VersionPlan) -> bool:
        return (self.ref, self.source, self.revision, set(self.files), self.index_shards) == (
            other.ref,
            other.source,
            other.revision,
            set(other.files),
            other.index_shards,
        )

    def to_json(self) -> str:
        return _version_json(
            PLAN_FORMAT,
            self.ref,
            self.source,
            self.revision,
            self.files,
            index_shards=sorted(self.index_shards),
        )

    @classmethod
    def from_json(cls, text: str) -> VersionPlan:
        doc = _load_object(text, "plan")
        if doc.get("format") != PLAN_FORMAT:
            raise ManifestError(f"plan format {doc.get('format')!r} is not {PLAN_FORMAT}")
        files = []
        for item in _objects(doc.get("files"), "plan files"):
            sha = item.get("sha256")
            files.append(
                PlannedFile(
                    path=check_rel_path(_str(item, "path")),
                    size=None if item.get("size") is None else _size(item, "size"),
                    sha256=None if sha is None else check_sha256(_str(item, "sha256"), "plan file"),
                )
            )
        _no_duplicates((f.path for f in files), "plan")
        shards = doc.get("index_shards", [])
        if not isinstance(shards, list) or not all(isinstance(s, str) for s in shards):
            raise ManifestError("plan index_shards must be a list of paths")
        return cls(
            ref=_ref(doc),
            source=_str(doc, "source"),
            revision=_optional_str(doc, "revision"),
            files=tuple(sorted(files)),
            index_shards=frozenset(check_rel_path(s) for s in shards),
        )


def manifest_from_plan(plan: VersionPlan, verified: Mapping[RelPath, ManifestFile]) -> Manifest:
    """The manifest of a plan whose every file is verified; raises if one is not."""
    missing = [f.path for f in plan.files if f.path not in verified]
    if missing:
        raise ManifestError(f"{plan.ref} is not complete: {', '.join(missing[:5])} not verified")
    return Manifest(
        ref=plan.ref,
        source=plan.source,
        revision=plan.revision,
        files=tuple(sorted(verified[f.path] for f in plan.files)),
    )


_File = TypeVar("_File", ManifestFile, PlannedFile)


def _version_json(
    document_format: int,
    ref: MirrorRef,
    source: str,
    revision: str | None,
    files: Iterable[_File],
    **more: object,
) -> str:
    """A manifest's or a plan's JSON, the same bytes for the same version: the version,
    its source, its files in path order, and the document's ``more`` fields."""
    doc = {
        "format": document_format,
        "name": ref.name,
        "version": ref.version,
        "source": source,
        "revision": revision,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in sorted(files)],
        **more,
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _load_object(text: str, what: str) -> dict[str, object]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} must be a JSON object")
    return doc


def _objects(value: object, what: str) -> list[dict[str, object]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ManifestError(f"{what} must be a list of objects")
    return value


def _str(doc: Mapping[str, object], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ManifestError(f"{key!r} must be a string")
    return value


def _optional_str(doc: Mapping[str, object], key: str) -> str | None:
    return None if doc.get(key) is None else _str(doc, key)


def _size(doc: Mapping[str, object], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{key!r} must be a non-negative integer")
    return value


def _ref(doc: Mapping[str, object]) -> MirrorRef:
    try:
        return MirrorRef(check_name(_str(doc, "name")), check_version(_str(doc, "version")))
    except MirrorRefError as exc:
        raise ManifestError(str(exc)) from None


def _no_duplicates(paths: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise ManifestError(f"{what} lists {path!r} twice")
        seen.add(path)
