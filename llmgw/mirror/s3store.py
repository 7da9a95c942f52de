"""An S3-compatible bucket as a mirror store, for reading: serve, list and check what was copied there.

Layout: the directory store's, under ``s3://BUCKET/PREFIX/`` (``NAME/VERSION/plan.json``,
``verified.json``, ``files/PATH``). Versions are made by ``mirror add`` in a directory
store and copied up (``aws s3 sync STORE s3://BUCKET/PREFIX``, ``rclone sync``...). The
completeness rule is the directory store's, applied to what the bucket holds: a file
counts only when ``verified.json`` records it *and* its object exists with the recorded
size. An S3 PUT is atomic, so a copy in progress shows as incomplete, never as complete
with a file missing, and ``.part`` objects a copy may bring along are never a file.

Owns: reading plans, records and object sizes from a bucket, and byte ranges of files
(the server streams them to nodes, which resume with ``Range``). Must not write to the
bucket: ``mirror add`` and ``gc`` lock versions with ``flock``, which a bucket does not
have, so they work on a directory store. "Downloading" is therefore never reported here.

boto3 is synchronous; the server calls these methods from worker threads. Connection and
credentials come from the standard AWS variables and files (``AWS_ENDPOINT_URL`` or
``AWS_ENDPOINT_URL_S3`` for MinIO, Ceph or Garage; ``AWS_ACCESS_KEY_ID``...; ``AWS_REGION``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from llmgw.core.mirror import (
    ManifestError,
    ManifestFile,
    MirrorRef,
    MirrorRefError,
    RelPath,
    VersionPlan,
    check_name,
    check_rel_path,
    check_version,
)
from llmgw.mirror.errors import MirrorError
from llmgw.mirror.store import FILES_DIR, PART_SUFFIX, PLAN_FILE, VERIFIED_FILE, VersionReader, parse_verified

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Bytes per chunk streamed from the bucket: large enough that a 10 GB shard is not a
# million round trips through a worker thread, small enough to keep memory flat.
CHUNK_SIZE = 1024 * 1024
# Seconds to open a connection to the bucket's endpoint and to wait for one read.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
# Retries: botocore's "standard" mode (throttling, 5xx and resets; 3 attempts unless
# AWS_MAX_ATTEMPTS or the AWS config file says otherwise).
RETRY_MODE: Final = "standard"


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or "path/inside" without slashes at either end

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """``s3://BUCKET[/PREFIX]``."""
        if not url.startswith("s3://"):
            raise MirrorError(f"{url}: an S3 store is written s3://BUCKET/PREFIX")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket or "?" in url or "#" in url:
            raise MirrorError(f"{url}: an S3 store is written s3://BUCKET/PREFIX")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class S3Store(VersionReader):
    """The read side of a store kept in a bucket; see the module docstring for the layout."""

    def __init__(self, location: S3Location, client: S3Client) -> None:
        self.location = location
        self._client = client

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        try:
            import boto3
            from botocore.config import Config
        except ModuleNotFoundError as exc:
            raise MirrorError(
                f"{url}: an S3 store needs boto3; install it with: pip install 'llmgw[s3]'"
            ) from exc

        config = Config(
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=READ_TIMEOUT,
            retries={"mode": RETRY_MODE},
        )
        return cls(S3Location.parse(url), boto3.client("s3", config=config))

    def describe(self) -> str:
        return str(self.location)

    # -- reading objects --------------------------------------------------------
    def _failed(self, what: str, exc: Exception) -> MirrorError:
        return MirrorError(f"{self.location}: {what}: {type(exc).__name__}: {exc}")

    def _text(self, key: str) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self._client.get_object(Bucket=self.location.bucket, Key=key)
            return answer["Body"].read().decode("utf-8")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._failed(f"reading {key}", exc) from None
        except (BotoCoreError, UnicodeDecodeError) as exc:
            raise self._failed(f"reading {key}", exc) from None

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    yield item["Key"], item["Size"]
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(f"listing {prefix or '/'}", exc) from None

    # -- the store's facts -------------------------------------------------------
    def refs(self) -> list[MirrorRef]:
        """Every version with a plan, in order; objects that are not part of a version are ignored."""
        root = self.location.key() + "/" if self.location.prefix else ""
        found = []
        for key, _ in self._list(root):
            parts = key[len(root) :].split("/")
            if len(parts) != 3 or parts[2] != PLAN_FILE:
                continue
            try:
                found.append(MirrorRef(check_name(parts[0]), check_version(parts[1])))
            except MirrorRefError:
                continue
        return sorted(found)

    def read_plan(self, ref: MirrorRef) -> VersionPlan | None:
        text = self._text(self.location.key(ref.name, ref.version, PLAN_FILE))
        if text is None:
            return None
        plan = VersionPlan.from_json(text)
        if plan.ref != ref:
            raise ManifestError(f"{self.location}/{ref.name}/{ref.version}/{PLAN_FILE} is for {plan.ref}")
        return plan

    def read_verified(self, ref: MirrorRef) -> dict[RelPath, ManifestFile]:
        """Recorded files whose object exists with the recorded size."""
        text = self._text(self.location.key(ref.name, ref.version, VERIFIED_FILE))
        if text is None:
            return {}
        files = self.location.key(ref.name, ref.version, FILES_DIR) + "/"
        sizes: dict[str, int] = {}
        for key, size in self._list(files):
            path = key[len(files) :]
            if not path.endswith(PART_SUFFIX):
                sizes[path] = size
        return {p: r for p, r in parse_verified(text).items() if sizes.get(p) == r.size}

    def is_downloading(self, ref: MirrorRef) -> bool:
        return False  # nothing downloads into a bucket: llmgw only reads one

    # -- files ------------------------------------------------------------------
    def local_path(self, ref: MirrorRef, path: RelPath) -> Path | None:
        return None  # nothing of a bucket is on this machine: files are read by range

    def read_range(self, ref: MirrorRef, path: RelPath, start: int, stop: int) -> Iterator[bytes]:
        """Bytes ``start`` up to ``stop`` (exclusive) of a file, in chunks of at most CHUNK_SIZE."""
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.location.key(ref.name, ref.version, FILES_DIR, check_rel_path(path))
        if stop <= start:
            return
        try:
            answer = self._client.get_object(
                Bucket=self.location.bucket, Key=key, Range=f"bytes={start}-{stop - 1}"
            )
            body = answer["Body"]
            try:
                yield from body.iter_chunks(CHUNK_SIZE)
            finally:
                body.close()
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(f"reading {key}", exc) from None
