"""Where a profile's weights come from: a Hugging Face repository, a file URL, or the mirror.

Owns reading the ``source`` string into one of three kinds and the rules each
engine has for them. Local paths are refused: a catalog must not point an
engine at files on the node (``.bin`` checkpoints are pickles, and pickles run
code); weights reach nodes through a repository, a URL, or the verified mirror.
"""

from __future__ import annotations

import ipaddress
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
_URL = re.compile(r"^(?P<scheme>https?)://(?P<authority>[^\s/?#]+)(?P<path>[^\s?#]*)(?P<rest>[^\s]*)$")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
# Query parameters the Nomad client's artifact fetcher (go-getter) reads as options
# rather than sending them: archive unpacks the download (an archive's paths and
# links land in the task directory), checksum fetches a checksum file from another
# URL, filename renames the result. Older Nomad clients appended the job's own
# options (archive = "false") after the URL's, and go-getter reads the first.
_FETCHER_OPTIONS = frozenset({"archive", "checksum", "filename"})


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
        match = _URL.fullmatch(text)
        if match is None:
            scheme = text.split("://", 1)[0]
            raise SourceError(
                f"{scheme}:// sources are not supported; use https://, a repository id or mirror:NAME@VERSION"
            )
        _check_file_url(match)
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


def _check_file_url(match: re.Match[str]) -> None:
    """A file URL is fetched by the Nomad client as root on the node: it may name a file,
    not steer the fetcher or point at the node itself."""
    if "//" in match.group("path"):
        raise SourceError(
            "a file URL's path may not hold // (the artifact fetcher reads it as a subdirectory)"
        )
    query = match.group("rest").partition("#")[0].removeprefix("?")
    for pair in re.split(r"[&;]", query):
        name = _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), pair.partition("=")[0].replace("+", " "))
        if name.strip().lower() in _FETCHER_OPTIONS:
            raise SourceError(
                f"the query parameter {name.strip()!r} is an option of the node's artifact fetcher, "
                "not part of the file's address; remove it"
            )
    host = match.group("authority").rpartition("@")[2]
    host = host[1 : host.find("]")] if host.startswith("[") else host.partition(":")[0]
    if host.lower().rstrip(".") == "localhost" or host.lower().endswith(".localhost"):
        raise SourceError("a file URL may not name the node itself (localhost)")
    address = _ip_literal(host)
    if address is None:
        return
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
        raise SourceError(
            f"a file URL may not name {host} (the node itself, or a link-local address such as "
            "a cloud metadata service); publish the file through the mirror instead"
        )


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` spells, including the forms the C resolver also reads as IPv4
    (2852039166, 0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers: list[int] = []
    for part in parts:
        try:
            if part.lower().startswith("0x"):
                numbers.append(int(part[2:], 16))
            elif len(part) > 1 and part.startswith("0"):
                numbers.append(int(part, 8))
            else:
                numbers.append(int(part, 10) if part.isdigit() else -1)
        except ValueError:
            return None
    if any(n < 0 for n in numbers):
        return None
    *high, last = numbers
    if any(n > 255 for n in high) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, number in enumerate(high):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)
