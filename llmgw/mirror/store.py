"""Where mirrored versions live: a directory store, behind the small interface an S3 store shares.

Owns the on-disk layout of a version and the facts the completeness rule needs::

    STORE/NAME/VERSION/plan.json       what the version should hold (written when `add` starts)
    STORE/NAME/VERSION/verified.json   files verified so far: path -> size, sha256
    STORE/NAME/VERSION/manifest.json   written when the version is complete (a copy for people)
    STORE/NAME/VERSION/.lock           flock-ed by the `mirror add` downloading the version
    STORE/NAME/VERSION/files/PATH      a verified file (renamed into place only after its hash matched)
    STORE/NAME/VERSION/files/PATH.part a download in progress

"Downloading" is a held ``flock`` on ``.lock``, so a killed ``add`` stops
counting as downloading the moment it dies. A file counts as verified only if it
is recorded in ``verified.json`` *and* present at its final path with the
recorded size. Decisions (complete or not, what gc deletes) are the core's;
this module only gathers facts and moves files. It must not download.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from llmgw.core.mirror import (
    Manifest,
    ManifestError,
    ManifestFile,
    MirrorIndex,
    MirrorRef,
    MirrorRefError,
    RelPath,
    VersionPlan,
    VersionState,
    VersionStatus,
    assess_version,
    check_name,
    check_rel_path,
    check_sha256_text,
    check_version,
    is_valid_segment,
    manifest_from_plan,
)
from llmgw.mirror.errors import MirrorError, VersionBusy

PLAN_FILE = "plan.json"
VERIFIED_FILE = "verified.json"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".lock"
FILES_DIR = "files"
PART_SUFFIX = ".part"


class MirrorStore(Protocol):
    """What the HTTP server and ``mirror list`` need from a store, whatever its backend.

    Calls may block on I/O (a disk, a bucket): the server makes them from worker threads.
    """

    def describe(self) -> str: ...

    def index(self) -> MirrorIndex: ...

    def status(self, ref: MirrorRef) -> VersionStatus | None: ...

    def complete_manifest(self, ref: MirrorRef) -> Manifest | None: ...

    def local_path(self, ref: MirrorRef, path: RelPath) -> Path | None:
        """The file on this machine's disk, or None when the store is remote (then it reads ranges)."""
        ...


@runtime_checkable
class RangeReader(Protocol):
    """A remote store's files, read by byte range (the server streams them; nodes resume with Range)."""

    def read_range(self, ref: MirrorRef, path: RelPath, start: int, stop: int) -> Iterator[bytes]:
        """Bytes ``start`` up to (not including) ``stop`` of a file, in chunks."""
        ...


def open_store(location: str) -> DirectoryStore:
    """The store ``mirror add`` and ``mirror gc`` write: a directory.

    They hold a version's ``flock`` while they change it, which only a file system has;
    a bucket is filled by copying a directory store into it (see ``open_read_store``).
    """
    if location.startswith("s3://"):
        raise MirrorError(
            f"{location}: mirror add and gc write to a directory store (they lock versions with flock); "
            "add into a directory, then copy it to the bucket (aws s3 sync STORE s3://BUCKET/PREFIX) and "
            "serve the bucket with llmgw mirror serve --store s3://BUCKET/PREFIX"
        )
    if "://" in location:
        raise MirrorError(f"{location}: --store is a directory path or s3://BUCKET/PREFIX")
    return DirectoryStore(Path(location))


def open_read_store(location: str) -> MirrorStore:
    """The store ``mirror serve``, ``mirror list`` and ``catalog check`` read: a directory or ``s3://``."""
    if location.startswith("s3://"):
        from llmgw.mirror.s3store import S3Store  # boto3 loads only for a bucket

        return S3Store.from_url(location)
    return open_store(location)


def parse_verified(text: str) -> dict[RelPath, ManifestFile]:
    """``verified.json``'s records; a torn or foreign record is skipped (it only costs a re-download)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    records = {}
    for path, entry in files.items() if isinstance(files, dict) else ():
        try:
            record = ManifestFile(
                check_rel_path(path), int(entry["size"]), check_sha256_text(entry["sha256"])
            )
        except (ManifestError, KeyError, TypeError, ValueError):
            continue
        records[record.path] = record
    return records


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class VersionReader(ABC):
    """A store's versions, read the same way whatever the backend: the backend gives
    the versions, their plans, their verified files and whether a download holds one;
    what a version's state and manifest are follows from those, here."""

    @abstractmethod
    def refs(self) -> list[MirrorRef]: ...

    @abstractmethod
    def read_plan(self, ref: MirrorRef) -> VersionPlan | None: ...

    @abstractmethod
    def read_verified(self, ref: MirrorRef) -> dict[RelPath, ManifestFile]: ...

    @abstractmethod
    def is_downloading(self, ref: MirrorRef) -> bool: ...

    def status(self, ref: MirrorRef, *, holding_lock: bool = False) -> VersionStatus | None:
        plan = self.read_plan(ref)
        if plan is None:
            return None
        downloading = False if holding_lock else self.is_downloading(ref)
        return assess_version(plan, self.read_verified(ref), downloading=downloading)

    def index(self) -> MirrorIndex:
        statuses = []
        for ref in self.refs():
            try:
                status = self.status(ref)
            except ManifestError:
                continue  # an unreadable plan is not a version; `mirror list` on the store says so
            if status is not None:
                statuses.append(status)
        return MirrorIndex.of(statuses)

    def complete_manifest(self, ref: MirrorRef) -> Manifest | None:
        """The manifest, only while the version is complete (computed: it cannot disagree with the files)."""
        plan = self.read_plan(ref)
        if plan is None:
            return None
        verified = self.read_verified(ref)
        status = assess_version(plan, verified, downloading=self.is_downloading(ref))
        if status.state is not VersionState.COMPLETE:
            return None
        return manifest_from_plan(plan, verified)


class DirectoryStore(VersionReader):
    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        return str(self.root)

    # -- layout -------------------------------------------------------------
    def version_dir(self, ref: MirrorRef) -> Path:
        return self.root / ref.name / ref.version

    def local_path(self, ref: MirrorRef, path: RelPath) -> Path:
        return self.version_dir(ref) / FILES_DIR / check_rel_path(path)

    def refs(self) -> list[MirrorRef]:
        """Every version with a plan, in order; directories that are not versions are ignored."""
        if not self.root.is_dir():
            return []
        found = []
        for name_dir in sorted(self.root.iterdir()):
            if not name_dir.is_dir() or not is_valid_segment(name_dir.name):
                continue
            for version_dir in sorted(name_dir.iterdir()):
                if not (version_dir / PLAN_FILE).is_file():
                    continue
                try:
                    found.append(MirrorRef(check_name(name_dir.name), check_version(version_dir.name)))
                except MirrorRefError:
                    continue  # not a name llmgw would have made (".x.deleting", a stray directory)
        return found

    # -- documents ----------------------------------------------------------
    def read_plan(self, ref: MirrorRef) -> VersionPlan | None:
        try:
            text = (self.version_dir(ref) / PLAN_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        plan = VersionPlan.from_json(text)
        if plan.ref != ref:
            raise ManifestError(f"{self.version_dir(ref) / PLAN_FILE} is for {plan.ref}, not {ref}")
        return plan

    def write_plan(self, plan: VersionPlan) -> None:
        directory = self.version_dir(plan.ref)
        (directory / FILES_DIR).mkdir(parents=True, exist_ok=True)
        _write_atomic(directory / PLAN_FILE, plan.to_json())

    def read_verified(self, ref: MirrorRef) -> dict[RelPath, ManifestFile]:
        """Recorded files still present at their final path with their recorded size."""
        try:
            text = (self.version_dir(ref) / VERIFIED_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        verified = {}
        for record in parse_verified(text).values():
            try:
                present = self.local_path(ref, record.path).stat().st_size == record.size
            except FileNotFoundError:
                present = False
            if present:
                verified[record.path] = record
        return verified

    def record_verified(self, ref: MirrorRef, record: ManifestFile) -> None:
        """Called by the one process holding the version's lock, after the file is at its final path."""
        current = self.read_verified(ref)
        current[record.path] = record
        doc = {"files": {p: {"size": m.size, "sha256": m.sha256} for p, m in sorted(current.items())}}
        _write_atomic(self.version_dir(ref) / VERIFIED_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")

    def forget_verified(self, ref: MirrorRef, path: RelPath) -> None:
        current = self.read_verified(ref)
        if current.pop(path, None) is not None:
            doc = {"files": {p: {"size": m.size, "sha256": m.sha256} for p, m in sorted(current.items())}}
            _write_atomic(
                self.version_dir(ref) / VERIFIED_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n"
            )

    def write_manifest(self, manifest: Manifest) -> None:
        _write_atomic(self.version_dir(manifest.ref) / MANIFEST_FILE, manifest.to_json())

    # -- state ----------------------------------------------------------------
    def is_downloading(self, ref: MirrorRef) -> bool:
        try:
            fd = os.open(self.version_dir(ref) / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing releases the probe's shared lock
        return False

    @contextlib.contextmanager
    def locked(self, ref: MirrorRef) -> Iterator[None]:
        """Hold the version exclusively (downloading or deleting it); VersionBusy if someone else does."""
        directory = self.version_dir(ref)
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise VersionBusy(
                    f"{ref} is being downloaded by another `llmgw mirror add`; wait for it"
                ) from None
            yield
        finally:
            os.close(fd)

    # -- removal ----------------------------------------------------------------
    def delete(self, ref: MirrorRef) -> None:
        """Remove a version under its lock: a version a download holds is never deleted."""
        directory = self.version_dir(ref)
        with self.locked(ref):
            trash = directory.with_name(f".{ref.version}.deleting")
            os.replace(directory, trash)
        shutil.rmtree(trash)
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # the name's directory, once its last version is gone
