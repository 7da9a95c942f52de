"""Each replica's engine API key, derived from one cluster secret: no key is stored by llmgw.

Owns: the derivation (HMAC-SHA256 of the replica's Nomad job id under the secret the
control plane and the routers share, ``LLMGW_ENGINE_KEY_SECRET``), where a replica's
engine finds its key (the Nomad Variable ``nomad/jobs/<job id>``, which that job's
workload identity may read without any ACL policy and no other job may). How each
engine takes the key (never on its command line) is its ``KEY_INTAKE``
(llmgw.core.engines).

Why derive rather than store: the router needs the key of every replica it sends to.
Stored keys (in Consul KV, say) would need a writer, a reader per router, cleanup with
the replica and an answer for a router that sees a replica before its key; a derived
key needs only the secret and the job id the router already has from the service's
meta. Rotating the secret changes every key: the replicas must be re-created (see
ops/README.md).

Must not: do I/O or read a clock.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

# Where the control plane writes a replica's key, and the item's name.
VARIABLE_PREFIX = "nomad/jobs/"
KEY_ITEM = "engine_api_key"
KEY_PREFIX = "llmgw-engine-"
# A secret shorter than this is refused: the keys are only as hard to guess as it is.
MIN_SECRET_LENGTH = 32


class EngineKeySecretError(ValueError):
    """The cluster secret cannot be used; the message says what to set."""


def variable_path(job_id: str) -> str:
    """The Nomad Variable a replica's job reads its key from (its own implicit path)."""
    return f"{VARIABLE_PREFIX}{job_id}"


@dataclass(frozen=True, slots=True)
class EngineKeys:
    secret: str = field(repr=False)  # never printed

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_SECRET_LENGTH:
            raise EngineKeySecretError(
                f"LLMGW_ENGINE_KEY_SECRET must be at least {MIN_SECRET_LENGTH} characters "
                "(for example: openssl rand -hex 32)"
            )

    def for_replica(self, job_id: str) -> str:
        digest = hmac.new(self.secret.encode(), job_id.encode(), hashlib.sha256).hexdigest()
        return KEY_PREFIX + digest
