"""Workload identities as the stand-ins pass them: a JWT Nomad signs and Consul verifies.

Owns: signing a task's claims (``nomad_namespace``, ``nomad_job_id``,
``nomad_allocation_id``, ``nomad_task``, ``aud``) into a compact JWT, and verifying one.
Real Nomad signs with its keyring (ES256 in 2.0.5's ``nomad setup consul`` config) and
Consul verifies against Nomad's JWKS URL; the stand-ins share one HMAC key instead
(HS256), handed to both by ``DevCluster``, which is all the trust a JWKS check gives here.

Must not: do I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_identity(claims: dict[str, Any], key: bytes) -> str:
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims, sort_keys=True).encode())
    signature = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


class IdentityInvalid(ValueError):
    """A bearer token the auth method refuses (Consul answers 403 with the reason)."""


def verify_identity(token: str, key: bytes, audience: str) -> dict[str, Any]:
    """The claims of a token signed with ``key`` for ``audience``; :class:`IdentityInvalid` otherwise."""
    parts = token.split(".")
    if len(parts) != 3:
        raise IdentityInvalid("failed to parse JWT")
    expected = hmac.new(key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    try:
        given = _unb64(parts[2])
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, json.JSONDecodeError) as exc:
        raise IdentityInvalid("failed to parse JWT") from exc
    if not hmac.compare_digest(expected, given):
        raise IdentityInvalid("failed to verify id token signature")
    if not isinstance(claims, dict):
        raise IdentityInvalid("failed to parse JWT claims")
    audiences = claims.get("aud")
    if audience not in (audiences if isinstance(audiences, list) else [audiences]):
        raise IdentityInvalid(
            "invalid audience (aud) claim: audience claim does not match any expected audience"
        )
    return claims
