"""Where a profile's weights come from: a Hugging Face repository, a file URL, or the mirror.

Owns reading the ``source`` string into one of three kinds and the rules each
engine has for them. Local paths are refused: a catalog must not point an
engine at files on the node (``.bin`` checkpoints are pickles, and pickles run
code); weights reach nodes through a repository, a URL, or the verified mirror.

A file URL is fetched by the Nomad client as root on the node, from inside the
cluster's network, so the address it names is checked in two steps:

- ``parse_source`` refuses, always, what no catalog may name: the node itself
  (``localhost``, loopback, the unspecified address), link-local and multicast
  addresses, and the cloud metadata services (``169.254.169.254`` and the
  addresses and names in ``METADATA_ADDRESSES`` and ``METADATA_HOSTS``);
- ``source_address_refusal`` refuses every other address that is not global
  (private ranges, carrier-grade NAT, unique-local IPv6, reserved and
  documentation ranges: ``NON_GLOBAL_NETWORKS``) unless it is in a network the
  operator allows (``LLMGW_SOURCE_ALLOWED_NETWORKS``, for a private file server).
  It depends on a runtime setting, so the catalog's doors and the renderer ask it
  (``llmgw.core.catalog.allowlists``), not every load.

An address is judged in the form the node would connect to: IPv4 written as IPv6
(``::ffff:a.b.c.d``, ``::a.b.c.d``, ``::ffff:0:a.b.c.d``), NAT64 (``64:ff9b::/96``)
and 6to4 (``2002::/16``) are judged by the IPv4 address they carry, and the
integer spellings the C resolver reads as IPv4 (``2852039166``, ``0xa9fea9fe``,
``0251.0376.0251.0376``, ``169.254.43518``, a trailing dot) are read as it reads
them. Host names are not resolved (the core does no I/O, and the name would be
resolved again, maybe differently, by the node's fetcher): see the render DESIGN
note for what that leaves to the cluster's network.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

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

# Cloud instance metadata services outside link-local (which is refused whole): AWS's
# IPv6 endpoint (IMDS, Nitro instances), Google Compute Engine's IPv6 endpoint, Alibaba
# Cloud's ECS metadata. Refused even inside a network the operator allows.
METADATA_ADDRESSES: frozenset[IpAddress] = frozenset(
    ipaddress.ip_address(a) for a in ("fd00:ec2::254", "fd20:ce::254", "100.100.100.200")
)
# Names the metadata services answer to inside their clouds (Google's, and its short form).
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})

# Special-purpose ranges that are not globally reachable (the IANA IPv4 and IPv6
# Special-Purpose Address Registries), written out so the answer does not change with
# the Python version's ``is_global``; anything else ``is_global`` calls non-global is
# refused too. Loopback, link-local, multicast and unspecified are refused before.
NON_GLOBAL_NETWORKS: tuple[IpNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # carrier-grade NAT (shared address space); Alibaba's metadata
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "240.0.0.0/4",  # reserved, and the broadcast address
        "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo among them)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
        "5f00::/16",  # segment routing SIDs
        "fc00::/7",  # unique-local; AWS's and Google's IPv6 metadata
        "fec0::/10",  # site-local (deprecated)
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


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
        if not text.isascii() or not text.isprintable():
            # Its parts go into jobs, logs and messages; and a URL is ASCII (RFC 3986).
            raise SourceError(
                "a URL is written in printable ASCII: percent-encode other characters "
                "and write an international host name in its xn-- form"
            )
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
    host = _host_of(match.group("authority"))
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        raise SourceError("a file URL may not name the node itself (localhost)")
    if name in METADATA_HOSTS:
        raise SourceError(
            f"a file URL may not name {host}, a cloud metadata service; publish the file through the mirror"
        )
    address = _ip_literal(host)
    if address is None:
        return
    address = connected_address(address)
    if address in METADATA_ADDRESSES:
        raise SourceError(
            f"a file URL may not name {host} ({address} is a cloud metadata service); "
            "publish the file through the mirror instead"
        )
    if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
        raise SourceError(
            f"a file URL may not name {host} (the node itself, or a link-local address such as "
            "a cloud metadata service); publish the file through the mirror instead"
        )


def _host_of(authority: str) -> str:
    """The host of ``[userinfo@]host[:port]``, without the brackets of an IPv6 address."""
    host = authority.rpartition("@")[2]
    return host[1 : host.find("]")] if host.startswith("[") else host.partition(":")[0]


def connected_address(address: IpAddress) -> IpAddress:
    """The address a connection to ``address`` reaches, as far as its spelling says: the
    IPv4 address inside IPv4-mapped, -compatible and -translated IPv6 (``::/64`` but
    ``::`` and ``::1``), NAT64 (``64:ff9b::/96``) and 6to4 (``2002::/16``) addresses."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    value = int(address)
    if value >> 64 == 0 and value > 1:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address in _NAT64:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    # Without its zone (fd00:ec2::254%eth0 is the same address on one interface).
    return ipaddress.IPv6Address(value)


def parse_allowed_networks(text: str) -> tuple[IpNetwork, ...]:
    """``LLMGW_SOURCE_ALLOWED_NETWORKS``: comma-separated networks (``10.20.0.0/16``,
    ``fd12:3456::/48``) or single addresses; ValueError naming an entry that is neither."""
    networks: list[IpNetwork] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError as exc:
            raise ValueError(
                f"{entry!r} is not a network (write it as ADDRESS/PREFIX with no host bits, "
                f"e.g. 10.20.0.0/16, or one address): {exc}"
            ) from None
    return tuple(networks)


def source_address_refusal(source: FileUrlSource, allowed: Sequence[IpNetwork]) -> str | None:
    """Why the node may not fetch ``source`` on this cluster (its address is not global and
    not in a network the operator allows), or None. Names are not resolved (see above)."""
    match = _URL.fullmatch(source.url)
    if match is None:  # pragma: no cover - a FileUrlSource comes from parse_source
        return f"{source.url!r} is not a file URL"
    host = _host_of(match.group("authority"))
    literal = _ip_literal(host)
    if literal is None:
        return None
    address = connected_address(literal)
    if any(address.version == network.version and address in network for network in allowed):
        return None
    special = next((n for n in NON_GLOBAL_NETWORKS if address.version == n.version and address in n), None)
    if special is None and address.is_global:
        return None
    spelt = "" if host == str(address) else f"{address}: "
    within = f"in {special}, " if special is not None else ""
    shown = ", ".join(str(n) for n in allowed) or "none"
    return (
        f"a file URL may not name {host} ({spelt}{within}not a global address) unless its "
        f"network is one this cluster allows ({shown}); publish the file through the mirror, "
        "or ask the operator to add the file server's network to LLMGW_SOURCE_ALLOWED_NETWORKS"
    )


def _ip_literal(host: str) -> IpAddress | None:
    """The address ``host`` spells, including the forms the C resolver also reads as IPv4
    (2852039166, 0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518, a trailing dot)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]  # an absolute name: "169.254.169.254." is looked up as the address
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
