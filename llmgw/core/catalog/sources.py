"""Where a profile's weights come from: a Hugging Face repository, a file URL, or the mirror.

Owns reading the ``source`` string into one of three kinds and the rules each
engine has for them. Local paths are refused: a catalog must not point an
engine at files on the node (``.bin`` checkpoints are pickles, and pickles run
code); weights reach nodes through a repository, a URL, or the verified mirror.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_PAGE = re.compile(
    r"^https?://(?:www\.)?huggingface\.co/"
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)"
    r"(?:/tree/[A-Za-z0-9._-]+)?/?$"
)
_MIRROR = re.compile(
    r"^mirror:(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})@(?P<version>[A-Za-z0-9][A-Za-z0-9._-]{0,63})$"
)
_URL = re.compile(r"^(?P<scheme>https?)://[^\s/?#]+[^\s]*$")


@dataclass(frozen=True, slots=True)
class RepositorySource:
    repo_id: str


@dataclass(frozen=True, slots=True)
class FileUrlSource:
    url: str

    @property
    def encrypted(self) -> bool:
        return self.url.startswith("https://")


@dataclass(frozen=True, slots=True)
class MirrorSource:
    name: str
    version: str

    def __str__(self) -> str:
        return f"mirror:{self.name}@{self.version}"


Source = RepositorySource | FileUrlSource | MirrorSource


class SourceError(ValueError):
    """The text is not a source llmgw can use; the message says what to write."""


def repository_id_of_page_url(text: str) -> str | None:
    """``https://huggingface.co/ORG/NAME[/tree/main]`` -> ``ORG/NAME``; None for anything else."""
    match = _HF_PAGE.match(text.strip())
    return match.group("repo") if match else None


def parse_source(text: str) -> Source:
    if text != text.strip() or not text:
        raise SourceError("a source may not be empty or have surrounding spaces")
    if text.startswith("mirror:"):
        match = _MIRROR.match(text)
        if not match:
            raise SourceError("a mirror source is written mirror:NAME@VERSION")
        return MirrorSource(match.group("name"), match.group("version"))
    if "://" in text:
        page_repo = repository_id_of_page_url(text)
        if page_repo is not None:
            raise SourceError(f"{text} is a repository page, not a file; write the repository id {page_repo}")
        if not _URL.match(text):
            scheme = text.split("://", 1)[0]
            raise SourceError(
                f"{scheme}:// sources are not supported; use https://, a repository id or mirror:NAME@VERSION"
            )
        return FileUrlSource(text)
    if text.startswith(("/", ".", "~")) or "\\" in text:
        raise SourceError(
            "local paths are not allowed: a catalog must not point an engine at files on the node; "
            "publish the weights through the mirror (llmgw mirror add) and write mirror:NAME@VERSION"
        )
    if _REPO_ID.match(text) and ".." not in text:
        return RepositorySource(text)
    raise SourceError(
        "expected a Hugging Face repository id (ORG/NAME), an https:// URL of a file, or mirror:NAME@VERSION"
    )
