"""The tokens a stand-in knows: each secret's identity and its merged ACL.

Owns: issuing tokens (a random SecretID and AccessorID in Nomad's and Consul's UUID
form, from ``secrets``), adding one whose secret a caller chose (the management token
of ``StandInConfig.acl_token``), and resolving a request's secret. A secret no token
has resolves to None (Nomad: "ACL token not found"; Consul: "ACL not found"); the empty
secret is the anonymous token, which the stand-ins give no policy.

Must not: decide what a token may do (its ACL value does) or know HTTP.
"""

from __future__ import annotations

import hmac
import secrets
import uuid
from dataclasses import dataclass
from typing import Generic, TypeVar

A = TypeVar("A")


def new_secret() -> str:
    """A random UUID, the form of Nomad's and Consul's SecretIDs and AccessorIDs."""
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))


@dataclass(frozen=True)
class Identity(Generic[A]):
    name: str  # who holds it: a component of llmgw ("control-plane"), "management", a task
    accessor: str
    acl: A


@dataclass(frozen=True)
class Denial:
    """One request a stand-in refused or answered filtered: who (the token's name, or
    "anonymous"), and what it lacked. Kept for tests: a missing rule shows here as it
    shows in a deployment's logs as a 403 (or as fewer results)."""

    who: str
    request: str
    lacked: str


class TokenBook(Generic[A]):
    """``secret -> Identity``; lookups compare every secret in constant time."""

    def __init__(self) -> None:
        self._tokens: list[tuple[str, Identity[A]]] = []
        self.denials: list[Denial] = []

    def deny(self, who: str, request: str, lacked: str) -> None:
        self.denials.append(Denial(who, request, lacked))
        del self.denials[:-1000]  # a bounded record

    def add(self, secret: str, name: str, acl: A, accessor: str | None = None) -> Identity[A]:
        identity = Identity(name, accessor or new_secret(), acl)
        self._tokens = [(s, i) for s, i in self._tokens if s != secret] + [(secret, identity)]
        return identity

    def issue(self, name: str, acl: A, accessor: str | None = None) -> str:
        secret = new_secret()
        self.add(secret, name, acl, accessor)
        return secret

    def resolve(self, secret: str) -> Identity[A] | None:
        found = None
        for known, identity in self._tokens:
            if hmac.compare_digest(known.encode(), secret.encode()):
                found = identity
        return found

    def names(self) -> list[str]:
        return [identity.name for _, identity in self._tokens]
