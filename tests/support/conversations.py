"""Conversations for tests of routing: one a given replica owns, and many distinct ones.

The router sends a conversation's requests to the replica that owns its prefix
(``routing.choose_by_prefix``), so a test that needs its request to try one replica
first (a broken one) sends a conversation that replica owns, computed with the
router's own functions; a test of which replicas serve sends distinct conversations.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

from llmgw.core.routing import Api, affinity_key, rendezvous_order

# Distinct conversations spread like keys over n replicas: a replica is missed by all
# of 24 with probability (1 - 1/n) ** 24, under 1e-7 for two replicas.
PROBES = 24


def conversation(index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"hello there, conversation {index}"}]


def owned_by(target: str, service_ids: Collection[str]) -> list[dict[str, str]]:
    """A conversation whose prefix the endpoint ``target`` (a service id) owns among
    ``service_ids``, past its first turn (a first turn goes where the load is least):
    with loads even, its requests try ``target`` first."""
    for index in itertools.count():
        messages = conversation(index)
        key = affinity_key(Api.CHAT, {"messages": messages})
        assert key is not None
        if rendezvous_order(key, service_ids)[0] == target:
            return [
                *messages,
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Go on."},
            ]
    raise AssertionError("unreachable")
