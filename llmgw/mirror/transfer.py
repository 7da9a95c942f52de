"""Downloading files: resumable (HTTP Range on a ``.part`` file), throttled, hashed while written, verified.

Owns the one way bytes come into the mirror or onto a node. A file is written to
``PATH.part``, hashed as it is written, and renamed to ``PATH`` only when its
size and sha256 match what was promised; a mismatch deletes the ``.part`` and
raises ``ChecksumMismatch``. A dropped connection is retried with
``Range: bytes=N-`` from where it stopped; a server that ignores the range
restarts the file. Several files run at once within ``concurrency`` and a
shared bandwidth limit.

The Hub token is attached only to requests for the Hub's own origin (aiohttp
drops it on a redirect to another origin, e.g. the Hub's CDN); it never appears
in a message. Must not decide what to download: callers hand it jobs.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import stamina
from yarl import URL

from llmgw.core.mirror import Sha256Hex
from llmgw.mirror.credentials import HubToken
from llmgw.mirror.errors import ChecksumMismatch, DownloadFailed
from llmgw.mirror.progress import ProgressSink
from llmgw.mirror.settings import MirrorSettings

PART_SUFFIX = ".part"
_CONTENT_RANGE = re.compile(r"bytes (?:(?P<start>\d+)-(?P<end>\d+)|\*)/(?P<total>\d+|\*)")
# Statuses worth another try: rate limiting and server trouble.
_RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class DownloadJob:
    url: str
    dest: Path
    label: str  # what progress lines and errors call the file (its relative path)
    size: int | None
    sha256: Sha256Hex | None


@dataclass(frozen=True)
class Downloaded:
    job: DownloadJob
    size: int
    sha256: Sha256Hex
    resumed_from: int  # bytes already in the .part when this run started
    requests: int


def retrying(settings: MirrorSettings, *, on: tuple[type[Exception], ...]) -> AsyncIterator[stamina.Attempt]:
    """The mirror's HTTP retries (hub calls and downloads), stamina's: ``retries`` more tries
    after the first on the exceptions ``on`` declares, waits doubling from ``backoff_initial``
    up to ``backoff_max`` plus up to ``backoff_initial`` of jitter (a node's ranks fetch from
    one mirror at once and should not retry in step). No overall deadline: the connect and
    read timeouts bound each try, and a large file may take hours."""
    return stamina.retry_context(
        on=on,
        attempts=settings.retries + 1,
        timeout=None,
        wait_initial=settings.backoff_initial,
        wait_max=settings.backoff_max,
        wait_jitter=settings.backoff_initial,
        wait_exp_base=2,
    ).__aiter__()


class _Incomplete(Exception):
    """A request that did not finish the file; another resumes where it stopped."""


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + PART_SUFFIX)


def safe_url(url: str) -> str:
    """A URL fit for a message: no query string (presigned signatures), no user info."""
    parsed = URL(url)
    return str(parsed.with_query(None).with_fragment(None).with_user(None))


def hash_file(path: Path, chunk_size: int, limit: int | None = None) -> tuple[hashlib._Hash, int]:
    """sha256 of the first ``limit`` bytes (all when None); run in a thread, it is disk-bound."""
    hasher = hashlib.sha256()
    done = 0
    with open(path, "rb") as fh:
        while limit is None or done < limit:
            want = chunk_size if limit is None else min(chunk_size, limit - done)
            block = fh.read(want)
            if not block:
                break
            hasher.update(block)
            done += len(block)
    return hasher, done


class Throttle:
    """A shared byte budget: callers wait so that all downloads together stay under ``rate`` bytes/s.

    Each take books its bytes at the end of the schedule and sleeps until its
    slot; idle time is saved up as at most one second of burst.
    """

    def __init__(
        self,
        rate: int,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._rate = rate
        self._clock = clock  # the event loop's clock; tests pass a virtual one
        self._sleep = sleep
        self._next = clock()

    async def take(self, nbytes: int) -> None:
        now = self._clock()
        self._next = max(self._next, now - 1.0)
        wait = self._next - now
        self._next += nbytes / self._rate
        if wait > 0:
            await self._sleep(wait)


class Downloader:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: MirrorSettings,
        progress: ProgressSink,
        *,
        token: HubToken | None = None,
        token_origin: str | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self._session = session
        self._settings = settings
        self._progress = progress
        self._token = token
        self._token_origin = URL(token_origin).origin() if token_origin else None
        self._throttle = throttle
        self._slots = asyncio.Semaphore(settings.concurrency)

    def _auth_headers(self, url: str) -> dict[str, str]:
        if self._token is None or self._token_origin is None or URL(url).origin() != self._token_origin:
            return {}
        return self._token.authorization_header()

    async def fetch_all(self, jobs: Sequence[DownloadJob]) -> list[Downloaded | DownloadFailed]:
        """Every job runs to success or its own failure; one file failing does not stop the others."""

        async def one(job: DownloadJob) -> Downloaded | DownloadFailed:
            try:
                return await self.fetch(job)
            except DownloadFailed as exc:
                return exc

        return list(await asyncio.gather(*(one(j) for j in jobs)))

    async def fetch(self, job: DownloadJob) -> Downloaded:
        async with self._slots:
            try:
                result = await self._fetch(job, allow_fresh_retry=True)
            except DownloadFailed as exc:
                self._progress.end_file(job.label, False, str(exc).removeprefix(f"{job.label}: "))
                raise
            resumed = f" (resumed at {result.resumed_from} bytes)" if result.resumed_from else ""
            self._progress.end_file(job.label, True, f"sha256 {result.sha256} verified{resumed}")
            return result

    async def _fetch(self, job: DownloadJob, *, allow_fresh_retry: bool) -> Downloaded:
        part = part_path(job.dest)
        job.dest.parent.mkdir(parents=True, exist_ok=True)
        offset = part.stat().st_size if part.exists() else 0
        if job.size is not None and offset > job.size:
            offset = _truncate(part, 0)
        if offset:
            hasher, offset = await asyncio.to_thread(hash_file, part, self._settings.chunk_size)
        else:
            hasher = hashlib.sha256()
        resumed_from = offset
        self._progress.start_file(job.label, job.size, offset)
        requests = 0
        try:
            async for attempt in retrying(self._settings, on=(_Incomplete,)):
                with attempt:
                    if job.size is not None and offset == job.size:
                        break
                    requests += 1
                    offset, hasher, done, problem = await self._request(job, part, offset, hasher)
                    # A connection dropped after the last byte still delivered the file.
                    if not done and (job.size is None or offset != job.size):
                        raise _Incomplete(problem)
        except _Incomplete as exc:
            raise DownloadFailed(
                job.label, f"gave up after {requests} request(s) at {offset} bytes: {exc}"
            ) from None
        digest = Sha256Hex(hasher.hexdigest())
        if job.size is not None and offset != job.size:
            raise DownloadFailed(job.label, f"got {offset} bytes, expected {job.size}")
        if job.sha256 is not None and digest != job.sha256:
            part.unlink(missing_ok=True)
            if resumed_from and allow_fresh_retry:
                # Bytes left by an earlier, killed run may be torn: one fresh try before blaming the source.
                self._progress.note(f"{job.label}: resumed copy did not verify; downloading it again from 0")
                return await self._fetch(job, allow_fresh_retry=False)
            raise ChecksumMismatch(job.label, job.sha256, digest)
        os.replace(part, job.dest)
        return Downloaded(job, offset, digest, resumed_from, requests)

    async def _request(
        self, job: DownloadJob, part: Path, offset: int, hasher: hashlib._Hash
    ) -> tuple[int, hashlib._Hash, bool, str]:
        """One GET -> (offset, hasher, finished, problem); raises DownloadFailed when retrying is futile."""
        headers = self._auth_headers(job.url)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._settings.connect_timeout, sock_read=self._settings.read_timeout
        )
        try:
            async with self._session.get(job.url, headers=headers, timeout=timeout) as resp:
                if resp.status == 416 and offset:
                    total = _content_range_total(resp.headers.get("Content-Range", ""))
                    if total == offset and job.size is None:
                        return offset, hasher, True, ""
                    _truncate(part, 0)
                    self._progress.restart_file(job.label, 0)
                    return (
                        0,
                        hashlib.sha256(),
                        False,
                        f"server refused the range at {offset} bytes (HTTP 416)",
                    )
                if resp.status in _RETRYABLE_STATUS:
                    return offset, hasher, False, f"HTTP {resp.status} from {safe_url(job.url)}"
                if resp.status not in (200, 206):
                    raise DownloadFailed(
                        job.label, _status_message(resp.status, job.url, self._token is not None)
                    )
                if resp.status == 206:
                    start = _content_range_start(resp.headers.get("Content-Range", ""))
                    if start != offset:
                        offset = _truncate(part, 0)
                        hasher = hashlib.sha256()
                        self._progress.restart_file(job.label, 0)
                        return offset, hasher, False, "server answered a different range; restarting the file"
                elif offset:
                    # 200 to a range request: the server sends the whole file, so start over.
                    offset = _truncate(part, 0)
                    hasher = hashlib.sha256()
                    self._progress.restart_file(job.label, 0)
                # Plain writes: they land in the page cache, and a thread hop per chunk costs
                # more than it saves; only the fsync, which can wait on the disk, leaves the loop.
                with open(part, "ab") as fh:  # noqa: ASYNC230
                    try:
                        async for chunk in resp.content.iter_chunked(self._settings.chunk_size):
                            if self._throttle is not None:
                                await self._throttle.take(len(chunk))
                            fh.write(chunk)
                            hasher.update(chunk)
                            offset += len(chunk)
                            self._progress.advance(job.label, len(chunk))
                            if job.size is not None and offset > job.size:
                                break
                    finally:
                        fh.flush()
                        await asyncio.to_thread(os.fsync, fh.fileno())
        except (aiohttp.ClientError, TimeoutError) as exc:
            return offset, hasher, False, f"{type(exc).__name__} at {offset} bytes"
        if job.size is not None and offset > job.size:
            _truncate(part, 0)
            self._progress.restart_file(job.label, 0)
            raise DownloadFailed(job.label, f"server sent more than the expected {job.size} bytes")
        if job.size is not None and offset < job.size:
            return offset, hasher, False, f"server ended the file at {offset} of {job.size} bytes"
        return offset, hasher, True, ""


def _truncate(path: Path, size: int) -> int:
    with open(path, "r+b") as fh:
        fh.truncate(size)
    return size


def _content_range_start(value: str) -> int | None:
    match = _CONTENT_RANGE.fullmatch(value.strip())
    return int(match["start"]) if match and match["start"] is not None else None


def _content_range_total(value: str) -> int | None:
    match = _CONTENT_RANGE.fullmatch(value.strip())
    return int(match["total"]) if match and match["total"] != "*" else None


def _status_message(status: int, url: str, have_token: bool) -> str:
    where = safe_url(url)
    if status in (401, 403):
        hint = "the token was refused" if have_token else "set HF_TOKEN (or log in with `hf auth login`)"
        return f"HTTP {status} from {where}: access denied; {hint}"
    if status == 404:
        return f"HTTP 404 from {where}: not found"
    return f"HTTP {status} from {where}"
