"""Host and port as they appear in URLs and Host headers (an IPv6 address is
bracketed), and what kind of host a name is: an IP address or ``localhost``, a
loopback address, one a listener answers to (``is_allowed_host``: the DNS-rebinding
check the router without keys and the admin API share)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection

# A dotted-quad IPv4 address exactly as ``ipaddress.IPv4Address`` takes one (four ASCII
# decimal octets of 0-255, no leading zeros): the Host most requests to a router
# without keys carry, answered without ``ipaddress``'s slower parse (the rest goes to it).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")


def authority(host: str, port: int) -> str:
    """``host:port``, or ``[host]:port`` for an IPv6 address (RFC 3986)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_of(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://{authority(host, port)}"


def host_of_header(header: str) -> str | None:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port`` or a
    bare IPv6 address), or None when a bracket is left open."""
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else None
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_ip_or_localhost(host: str) -> bool:
    """An IP address or ``localhost``: a name a DNS-rebinding page cannot make its own."""
    if _DOTTED_QUAD.fullmatch(host) is not None or host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_allowed_host(host: str, allowed_names: Collection[str]) -> bool:
    """An IP address, ``localhost`` or one of ``allowed_names`` (lowercase): a page that
    reaches a listener by DNS rebinding sends its own name, which is none of these."""
    return is_ip_or_localhost(host) or host.lower() in allowed_names


def bad_host_name(name: str) -> bool:
    """Not a bare host name for an allowed-hosts list (a port, scheme, path or space in it)."""
    return not name or any(ch in name for ch in "/:@ \t") or name != name.strip(".")


def is_loopback(host: str) -> bool:
    """A listen address only this machine reaches (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
