"""The Hugging Face Hub's API, as far as the mirror needs it: resolve a revision, list files, file URLs.

Owns the HTTP calls to the Hub and the parsing of its JSON, right at this edge:

- ``GET {endpoint}/api/models/{repo}/revision/{rev}`` -> ``{"sha": COMMIT, ...}``
- ``GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true`` -> a list of
  ``{"type": "file"|"directory", "path", "size", "oid", "lfs": {"oid": SHA256, "size", "pointerSize"}}``,
  paginated with a ``Link: <...>; rel="next"`` header
- ``{endpoint}/{repo}/resolve/{commit}/{path}``: the file (LFS files redirect to a CDN)

Listing at the resolved commit, not the branch, keeps a version's files from
mixing two commits. Must not choose files (``llmgw.core.mirror.selection``
does) nor write to disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from llmgw.core.mirror import RepoFile, Sha256Hex, is_sha256
from llmgw.mirror.credentials import HubToken
from llmgw.mirror.errors import HubError
from llmgw.mirror.settings import MirrorSettings
from llmgw.mirror.transfer import retrying, safe_url

_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# What another try may cure: a retryable status, a transport error, a timeout. A 401, 404 or
# a bad answer is a HubError, never retried.
_RETRYABLE = (aiohttp.ClientError, TimeoutError)


class _TryAgain(Exception):
    """A status worth another try (rate limiting, server trouble); the message names it."""


# Pages of a tree listing followed at most: a model repository has hundreds of files, not millions.
_MAX_PAGES = 1000


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    commit: str
    files: tuple[RepoFile, ...]


class HubClient:
    def __init__(
        self, session: aiohttp.ClientSession, settings: MirrorSettings, token: HubToken | None
    ) -> None:
        self._session = session
        self._settings = settings
        self._token = token
        self.endpoint = settings.hub_endpoint.rstrip("/")

    def _headers(self) -> dict[str, str]:
        return self._token.authorization_header() if self._token is not None else {}

    def file_url(self, repo_id: str, commit: str, path: str) -> str:
        return str(URL(self.endpoint) / repo_id / "resolve" / commit / path)

    async def resolve_revision(self, repo_id: str, revision: str) -> str:
        url = URL(f"{self.endpoint}/api/models/{repo_id}/revision/") / revision
        doc, _ = await self._get_json(str(url), repo_id, revision)
        sha = doc.get("sha") if isinstance(doc, dict) else None
        if not isinstance(sha, str) or not sha:
            raise HubError(f"{repo_id}@{revision}: the Hub's answer has no commit sha")
        return sha

    async def list_files(self, repo_id: str, commit: str) -> RepoListing:
        url: str | None = str(
            (URL(f"{self.endpoint}/api/models/{repo_id}/tree/") / commit).with_query(recursive="true")
        )
        files: list[RepoFile] = []
        pages = 0
        while url is not None:
            pages += 1
            if pages > _MAX_PAGES:
                raise HubError(f"{repo_id}: the file listing did not end after {_MAX_PAGES} pages")
            doc, next_url = await self._get_json(url, repo_id, commit)
            if not isinstance(doc, list):
                raise HubError(f"{repo_id}: the Hub's tree listing is not a list")
            files.extend(
                _parse_entry(repo_id, e) for e in doc if isinstance(e, dict) and e.get("type") == "file"
            )
            url = self._same_endpoint(next_url) if next_url else None
        return RepoListing(repo_id, commit, tuple(sorted(files)))

    async def read_small_file(self, repo_id: str, commit: str, path: str) -> bytes:
        url = self.file_url(repo_id, commit, path)
        resp_body = await self._request(url, repo_id, commit)
        if len(resp_body) > self._settings.max_index_bytes:
            raise HubError(f"{repo_id}/{path} is larger than {self._settings.max_index_bytes} bytes")
        return resp_body

    def _same_endpoint(self, next_url: str) -> str:
        """Pagination links may name the public Hub; keep talking to the configured endpoint."""
        parsed = URL(next_url)
        base = URL(self.endpoint)
        return str(parsed.with_scheme(base.scheme).with_host(base.host or "").with_port(base.explicit_port))

    async def _get_json(self, url: str, repo_id: str, revision: str) -> tuple[Any, str | None]:
        holder: list[str | None] = [None]
        body = await self._request(url, repo_id, revision, next_link=holder)
        try:
            return json.loads(body), holder[0]
        except ValueError:
            raise HubError(f"{safe_url(url)}: the Hub answered with something that is not JSON") from None

    async def _request(
        self,
        url: str,
        repo_id: str,
        revision: str,
        *,
        next_link: list[str | None] | None = None,
    ) -> bytes:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._settings.connect_timeout, sock_read=self._settings.read_timeout
        )
        problem = "no try made"
        try:
            async for attempt in retrying(self._settings, on=(_TryAgain, *_RETRYABLE)):
                with attempt:
                    return await self._get_once(url, repo_id, revision, timeout, next_link)
        except _TryAgain as exc:
            problem = str(exc)
        except _RETRYABLE as exc:
            problem = type(exc).__name__
        raise HubError(f"{safe_url(url)}: gave up after {self._settings.retries + 1} tries ({problem})")

    async def _get_once(
        self,
        url: str,
        repo_id: str,
        revision: str,
        client_timeout: aiohttp.ClientTimeout,
        next_link: list[str | None] | None,
    ) -> bytes:
        async with self._session.get(url, headers=self._headers(), timeout=client_timeout) as resp:
            if resp.status in _RETRYABLE_STATUS:
                raise _TryAgain(f"HTTP {resp.status}")
            if resp.status in (401, 403):
                hint = (
                    "the token was refused (does it have access to this gated or private repository?)"
                    if self._token is not None
                    else "set HF_TOKEN for a gated or private repository"
                )
                raise HubError(f"{repo_id}: HTTP {resp.status} from the Hub: {hint}")
            if resp.status == 404:
                raise HubError(
                    f"{repo_id} at revision {revision} was not found on {self.endpoint} "
                    "(check the repository id and --revision; a private one also needs HF_TOKEN)"
                )
            if resp.status != 200:
                raise HubError(f"{safe_url(url)}: HTTP {resp.status} from the Hub")
            if next_link is not None:
                nxt = resp.links.get("next")
                next_link[0] = str(nxt.get("url")) if nxt is not None and nxt.get("url") else None
            return await resp.read()


def _parse_entry(repo_id: str, entry: dict[str, Any]) -> RepoFile:
    path = entry.get("path")
    size = entry.get("size")
    if not isinstance(path, str) or not isinstance(size, int):
        raise HubError(f"{repo_id}: a tree entry has no path or size: {sorted(entry)}")
    sha256: Sha256Hex | None = None
    lfs = entry.get("lfs")
    if isinstance(lfs, dict):
        oid = lfs.get("oid")
        if isinstance(oid, str) and is_sha256(oid):
            sha256 = Sha256Hex(oid)
        lfs_size = lfs.get("size")
        if isinstance(lfs_size, int):
            size = lfs_size
    return RepoFile(path=path, size=size, sha256=sha256)
