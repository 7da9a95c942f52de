"""The conversations a router counts on each replica (``HeldConversations``, the load
``routing.choose_by_prefix`` balances them by): where each went last, for a minute after
its last turn, its own request left out."""

from __future__ import annotations

from llmgw.core.routing import CONVERSATION_SECONDS
from llmgw.gateway.book import HeldConversations


def test_a_conversation_counts_where_it_went_last_and_not_for_itself() -> None:
    held = HeldConversations()
    held.record("m", "k1", "a", now=0.0)
    held.record("m", "k2", "a", now=1.0)
    held.record("m", "k3", "b", now=2.0)
    assert [held.load("m", "k9", e) for e in ("a", "b", "c")] == [2, 1, 0]
    # Its own turn is left out where it is held: a replica does not give a conversation
    # away for holding that very conversation.
    assert [held.load("m", "k1", e) for e in ("a", "b")] == [1, 1]
    held.record("m", "k1", "b", now=3.0)  # it moved: counted on its new replica only
    assert [held.load("m", "k9", e) for e in ("a", "b")] == [1, 2]
    assert held.load("m", "k1", "b") == 1
    assert held.load("other-model", "k9", "a") == 0  # per model
    assert len(held) == 3


def test_a_conversation_stops_counting_a_while_after_its_last_turn() -> None:
    held = HeldConversations()
    held.record("m", "old", "a", now=0.0)
    held.record("m", "paused", "a", now=10.0)
    held.record("m", "old", "a", now=20.0)  # its next turn: seen again
    held.expire(now=10.0 + CONVERSATION_SECONDS - 1)
    assert held.load("m", "new", "a") == 2
    held.expire(now=10.0 + CONVERSATION_SECONDS + 1)  # "paused" has not come back
    assert held.load("m", "new", "a") == 1
    held.expire(now=20.0 + CONVERSATION_SECONDS + 1)
    assert held.load("m", "new", "a") == 0 and len(held) == 0


def test_the_oldest_go_first_past_the_limit() -> None:
    held = HeldConversations(limit=2)
    for index, endpoint in enumerate(("a", "b", "c")):
        held.record("m", f"k{index}", endpoint, now=float(index))
    held.expire(now=3.0)
    assert len(held) == 2
    assert [held.load("m", "new", e) for e in ("a", "b", "c")] == [0, 1, 1]
