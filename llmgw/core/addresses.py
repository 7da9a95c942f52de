"""Host and port as they appear in URLs and Host headers: an IPv6 address is bracketed."""

from __future__ import annotations


def authority(host: str, port: int) -> str:
    """``host:port``, or ``[host]:port`` for an IPv6 address (RFC 3986)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_of(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://{authority(host, port)}"
