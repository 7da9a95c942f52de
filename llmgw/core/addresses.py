"""Host and port as they appear in URLs and Host headers (an IPv6 address is
bracketed), and what kind of host a name is: an IP address or ``localhost``, a
loopback address."""

from __future__ import annotations

import ipaddress


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
    if host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """A listen address only this machine reaches (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
