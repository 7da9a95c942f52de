"""``llmgw mirror fetch``: a node pulls a complete version into its model cache and verifies every byte.

Runs as the prestart task of a replica's job, so its contract is the exit code:
0 only when every file of the manifest is in ``--dest`` with its manifest sha256;
otherwise non-zero with the failing file named on stderr, and a file that failed
verification deleted (a ``.part`` never becomes a file). Idempotent: files
already in place are hashed (or, with ``trust_stamps``, matched against the
stamp of an earlier verified fetch) instead of fetched again. Two fetches into
the same directory take turns on ``DEST/.llmgw-fetch.lock``.

Must not write outside ``--dest``: every path comes from a manifest checked by
``llmgw.core.mirror.check_rel_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from yarl import URL

from llmgw.core.mirror import Manifest, ManifestError, ManifestFile, MirrorRef
from llmgw.mirror.errors import ChecksumMismatch, DownloadFailed, MirrorError
from llmgw.mirror.progress import ProgressSink
from llmgw.mirror.settings import MirrorSettings
from llmgw.mirror.transfer import Downloaded, Downloader, DownloadJob, Throttle, hash_file, safe_url

LOCK_NAME = ".llmgw-fetch.lock"
STAMPS_NAME = ".llmgw-verified.json"
MANIFEST_COPY = ".llmgw-manifest.json"
# Seconds between tries for the destination's lock while another fetch holds it.
LOCK_POLL_INTERVAL = 1.0


@dataclass(frozen=True)
class FetchReport:
    manifest: Manifest
    fetched: tuple[Downloaded, ...]
    kept: tuple[str, ...]  # already present and verified
    replaced: tuple[str, ...]  # present but wrong: deleted and fetched again


class FetchFailed(MirrorError):
    def __init__(self, failures: list[DownloadFailed]) -> None:
        super().__init__("; ".join(str(f) for f in failures))
        self.failures = failures


def manifest_url(mirror: str, ref: MirrorRef) -> str:
    return str(URL(mirror.rstrip("/")) / "models" / ref.name / ref.version / "manifest.json")


def file_url(mirror: str, ref: MirrorRef, path: str) -> str:
    return str(URL(mirror.rstrip("/")) / "models" / ref.name / ref.version / "files" / path)


async def get_manifest(session: aiohttp.ClientSession, mirror: str, ref: MirrorRef) -> Manifest:
    url = manifest_url(mirror, ref)
    try:
        async with session.get(url) as resp:
            body = await resp.text()
            if resp.status == 404:
                raise MirrorError(
                    f"{ref.source} is not available from {safe_url(mirror)}: {_error_text(body)}"
                )
            if resp.status != 200:
                raise MirrorError(f"{safe_url(url)}: HTTP {resp.status}")
    except aiohttp.ClientError as exc:
        raise MirrorError(f"{safe_url(url)}: {type(exc).__name__}: the mirror is unreachable") from None
    try:
        manifest = Manifest.from_json(body)
    except ManifestError as exc:
        raise MirrorError(f"{safe_url(url)}: refusing the manifest: {exc}") from None
    if manifest.ref != ref:
        raise MirrorError(f"{safe_url(url)}: the manifest is for {manifest.ref}, not {ref}")
    return manifest


def _error_text(body: str) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.strip()[:200] or "not found"


@contextlib.asynccontextmanager
async def _dest_lock(dest: Path, wait: float) -> AsyncIterator[None]:
    fd = os.open(dest / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if loop.time() >= deadline:
                    raise MirrorError(
                        f"{dest}: another `llmgw mirror fetch` held it for {wait:.0f}s"
                    ) from None
                await asyncio.sleep(LOCK_POLL_INTERVAL)
        yield
    finally:
        os.close(fd)


def _read_stamps(dest: Path) -> dict[str, dict[str, object]]:
    try:
        doc = json.loads((dest / STAMPS_NAME).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _stamp(path: Path, entry: ManifestFile) -> dict[str, object]:
    st = path.stat()
    return {"sha256": entry.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _local_state(
    path: Path,
    entry: ManifestFile,
    stamps: dict[str, dict[str, object]],
    *,
    trust_stamps: bool,
    chunk_size: int,
) -> str:
    """'ok', 'missing' or why the local copy is wrong; disk-bound, so run in a thread."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    if st.st_size != entry.size:
        return f"size {st.st_size} differs from the manifest's {entry.size}"
    if trust_stamps and stamps.get(entry.path) == _stamp(path, entry):
        return "ok"
    digest = hash_file(path, chunk_size)[0].hexdigest()
    if digest != entry.sha256:
        return f"sha256 {digest} differs from the manifest's {entry.sha256}"
    return "ok"


async def fetch_version(
    mirror: str,
    ref: MirrorRef,
    dest: Path,
    settings: MirrorSettings,
    progress: ProgressSink,
    *,
    trust_stamps: bool = False,
) -> FetchReport:
    await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
    async with aiohttp.ClientSession() as session, _dest_lock(dest, settings.lock_wait):
        manifest = await get_manifest(session, mirror, ref)
        stamps = _read_stamps(dest)
        kept: list[str] = []
        replaced: list[str] = []
        todo: list[ManifestFile] = []
        # Hash what is already there, several files at once: hashlib releases the GIL,
        # so a 100 GB model re-verifies at the disk's speed rather than one core's.
        slots = asyncio.Semaphore(settings.concurrency)

        async def check(entry: ManifestFile) -> str:
            async with slots:
                return await asyncio.to_thread(
                    _local_state,
                    dest / entry.path,
                    entry,
                    stamps,
                    trust_stamps=trust_stamps,
                    chunk_size=settings.chunk_size,
                )

        states = await asyncio.gather(*(check(e) for e in manifest.files))
        for entry, state in zip(manifest.files, states, strict=True):
            path = dest / entry.path
            if state == "ok":
                kept.append(entry.path)
                continue
            if state != "missing":
                progress.note(f"{entry.path}: local copy is wrong ({state}); deleted, fetching it again")
                path.unlink()
                replaced.append(entry.path)
            stamps.pop(entry.path, None)
            todo.append(entry)
        fetched: list[Downloaded] = []
        failures: list[DownloadFailed] = []
        if todo:
            loop = asyncio.get_running_loop()
            throttle = Throttle(settings.bandwidth_limit, loop.time) if settings.bandwidth_limit else None
            downloader = Downloader(session, settings, progress, throttle=throttle)
            jobs = [
                DownloadJob(file_url(mirror, ref, e.path), dest / e.path, e.path, e.size, e.sha256)
                for e in todo
            ]
            progress.begin(len(jobs), sum(e.size for e in todo))
            try:
                for result in await downloader.fetch_all(jobs):
                    if isinstance(result, DownloadFailed):
                        failures.append(result)
                    else:
                        fetched.append(result)
            finally:
                progress.close()
        for entry in manifest.files:
            path = dest / entry.path
            if path.exists() and not any(f.label == entry.path for f in failures):
                stamps[entry.path] = _stamp(path, entry)
        _write_json(dest / STAMPS_NAME, stamps)
        if failures:
            for failure in failures:
                if isinstance(failure, ChecksumMismatch):
                    (dest / failure.label).unlink(missing_ok=True)
            (dest / MANIFEST_COPY).unlink(missing_ok=True)
            raise FetchFailed(failures)
        (dest / MANIFEST_COPY).write_text(manifest.to_json(), encoding="utf-8")
        return FetchReport(manifest, tuple(fetched), tuple(kept), tuple(replaced))


def _write_json(path: Path, doc: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
