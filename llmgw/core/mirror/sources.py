"""What ``llmgw mirror add`` may be given: a Hugging Face repository id, or URLs of files.

Owns the classification of the user's source arguments and the refusals that
come with it (a repository *page* URL is refused with the id to write instead).
Must not fetch anything: URLs are split by hand because ``urllib`` is off-limits
to the core, and nothing here needs more than scheme, host and path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.core.mirror.manifest import Sha256Hex, is_sha256

# Hosts that serve the Hugging Face Hub's pages; the configured endpoint's host is added by the caller.
HUB_HOSTS: frozenset[str] = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})

_REPO_SEGMENT = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_REPO_SEGMENT}/)?{_REPO_SEGMENT}")
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<host>[^/?#]+)(?P<path>[^?#]*)(?:\?(?P<query>[^#]*))?(?:#(?P<fragment>.*))?"
)
# Hub paths that are web pages, not files or API calls.
_PAGE_KINDS = frozenset({"tree", "blob", "commits", "commit", "discussions", "files"})


class SourceError(ValueError):
    """Sources that cannot be mirrored; the message says what to write instead."""


@dataclass(frozen=True)
class HubRepo:
    """A Hugging Face model repository, by id (``org/name``)."""

    repo_id: str

    def describe(self) -> str:
        return f"hf:{self.repo_id}"


@dataclass(frozen=True)
class FileUrl:
    """One file at an http(s) URL; ``sha256`` when the user pinned it with ``#sha256=HEX``."""

    url: str
    filename: str
    sha256: Sha256Hex | None = None

    def describe(self) -> str:
        """The URL without query or fragment: a presigned URL's signature never reaches a manifest."""
        return _strip_query(self.url)


Source = HubRepo | FileUrl


@dataclass(frozen=True)
class SplitUrl:
    scheme: str
    host: str
    path: str
    query: str
    fragment: str


def split_url(text: str) -> SplitUrl | None:
    match = _URL.fullmatch(text)
    if match is None:
        return None
    return SplitUrl(
        scheme=match["scheme"].lower(),
        host=match["host"].lower().rpartition("@")[2],
        path=match["path"],
        query=match["query"] or "",
        fragment=match["fragment"] or "",
    )


def _strip_query(url: str) -> str:
    return url.split("#", 1)[0].split("?", 1)[0]


def _host_only(host: str) -> str:
    return host.split(":", 1)[0] if not host.startswith("[") else host


def is_repo_id(text: str) -> bool:
    return _REPO_ID.fullmatch(text) is not None and "--" not in text and ".." not in text


def parse_source(text: str, hub_hosts: frozenset[str] = HUB_HOSTS) -> Source:
    """Classify one argument. ``hub_hosts``: hosts (``host`` or ``host:port``) whose page URLs are refused."""
    url = split_url(text)
    if url is None:
        if is_repo_id(text):
            return HubRepo(text)
        raise SourceError(
            f"{text!r} is neither a Hugging Face repository id (ORG/NAME) nor an http(s) URL of a file"
        )
    if url.scheme not in ("http", "https"):
        raise SourceError(f"{_strip_query(text)!r}: only http and https URLs can be mirrored")
    segments = [s for s in url.path.split("/") if s]
    # An entry with a port (a configured endpoint) matches that port only; one without, any port.
    if url.host in hub_hosts or _host_only(url.host) in hub_hosts:
        _refuse_hub_page(text, segments)
    if not segments:
        raise SourceError(f"{_strip_query(text)!r} names no file: give the URL of a file")
    sha256 = None
    if url.fragment.startswith("sha256="):
        pinned = url.fragment.removeprefix("sha256=").lower()
        if not is_sha256(pinned):
            raise SourceError(f"{_strip_query(text)!r}: #sha256= must be 64 hex digits")
        sha256 = Sha256Hex(pinned)
    return FileUrl(url=text.split("#", 1)[0], filename=segments[-1], sha256=sha256)


def _refuse_hub_page(text: str, segments: list[str]) -> None:
    """Hub URLs other than ``/ORG/NAME/resolve/REV/FILE`` are pages: refuse with the id to use."""
    if len(segments) >= 5 and segments[2] == "resolve":
        return  # a file download URL: fine
    if segments and segments[0] in ("datasets", "spaces"):
        raise SourceError(f"{_strip_query(text)!r} is not a model repository: only models can be mirrored")
    if len(segments) >= 2 and is_repo_id(f"{segments[0]}/{segments[1]}"):
        repo_id = f"{segments[0]}/{segments[1]}"
        hint = f"write the repository id {repo_id}"
        if len(segments) >= 4 and segments[2] in _PAGE_KINDS:
            revision = segments[3]
            if segments[2] == "blob" and len(segments) >= 5:
                path = "/".join(segments[4:])
                hint += f" with --revision {revision} --file {path}"
            elif revision != "main":
                hint += f" with --revision {revision}"
        raise SourceError(f"{_strip_query(text)!r} is a repository page, not a source: {hint}")
    if len(segments) == 1 and is_repo_id(segments[0]):
        repo_id = segments[0]
        raise SourceError(
            f"{_strip_query(text)!r} is a repository page, not a source: write the repository id {repo_id}"
        )
    raise SourceError(f"{_strip_query(text)!r} is a Hugging Face page, not a file or a repository id")


def parse_sources(texts: Sequence[str], hub_hosts: frozenset[str] = HUB_HOSTS) -> tuple[Source, ...]:
    """One repository id, or one or more file URLs; never a mix, never a repeat."""
    if not texts:
        raise SourceError("give a Hugging Face repository id (ORG/NAME) or one or more file URLs")
    sources = tuple(parse_source(t, hub_hosts) for t in texts)
    repos = [s for s in sources if isinstance(s, HubRepo)]
    if repos and len(sources) > 1:
        raise SourceError(
            "give one repository id, or one or more file URLs, not both; "
            "to take one file of a repository use --file"
        )
    names = [s.filename for s in sources if isinstance(s, FileUrl)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SourceError(f"two URLs end in the same file name: {', '.join(duplicates)}")
    return sources
