"""The shape of an llmgw API key: how one is composed, and what may be shown of one.

A key is ``sk-llmgw-<key id>.<secret>``: the id lets a router find the record in
one lookup and compare the SHA-256 of the whole key in constant time; only that
digest is ever stored. The Consul adapter issues keys with it, the router reads
them with it: one format, here. Randomness comes in as bytes (the core draws none).
"""

from __future__ import annotations

import base64
import re

KEY_PREFIX = "sk-llmgw-"
# 64 random bits of id: unique among any number of keys an operator will issue.
ID_BYTES = 8
# 256 random bits of secret: the SHA-256 of the key is safe to store (no guessing, no tables).
SECRET_BYTES = 32

_PRESENTED = re.compile(r"^sk-llmgw-(k-[0-9a-f]{16})\.[A-Za-z0-9_-]{43}$")


def compose_key(id_bytes: bytes, secret_bytes: bytes) -> tuple[str, str]:
    """``(key id, key)`` from random bytes."""
    if len(id_bytes) != ID_BYTES or len(secret_bytes) != SECRET_BYTES:
        raise ValueError(f"a key needs {ID_BYTES} id bytes and {SECRET_BYTES} secret bytes")
    key_id = "k-" + id_bytes.hex()
    secret = base64.urlsafe_b64encode(secret_bytes).rstrip(b"=").decode("ascii")
    return key_id, f"{KEY_PREFIX}{key_id}.{secret}"


def key_id_of(presented: str) -> str | None:
    match = _PRESENTED.match(presented)
    return match.group(1) if match else None


def masked(presented: str) -> str:
    """What an error message or a log may show of a presented key."""
    key_id = key_id_of(presented)
    if key_id is not None:
        return f"{KEY_PREFIX}{key_id}.****"
    return f"{presented[:6]}****" if len(presented) > 12 else "****"
