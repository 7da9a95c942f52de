"""Prefix affinity as tables: the key a conversation keeps over its turns, the replica it
goes to from any router, a first turn going where the load is least, the share of
conversations that balances the rest, the load bound that spreads a hot prefix, and how
few keys move when replicas join or leave."""

from __future__ import annotations

import math

import pytest

from llmgw.core.routing import (
    AFFINITY_LOAD_FACTOR,
    AFFINITY_SHARE,
    Api,
    Candidate,
    RouteOutcome,
    affinity_key,
    choose_by_prefix,
    choose_endpoint,
    has_history,
    load_bound,
    rendezvous_order,
)

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 40}
FIRST = {"role": "user", "content": "Fix the failing test in tests/test_app.py"}


def idle(*names: str) -> list[Candidate]:
    return [Candidate(name, 0, True) for name in names]


def keys(count: int) -> list[str]:
    return [f"prefix:{index:08x}" for index in range(count)]


# --- the key ---------------------------------------------------------------------------------------


def test_a_conversation_keeps_its_key_as_it_grows() -> None:
    turn1 = {"messages": [SYSTEM, FIRST]}
    turn2 = {
        "messages": [
            SYSTEM,
            FIRST,
            {"role": "assistant", "content": "Running the tests."},
            {"role": "user", "content": "It still fails: see the traceback"},
        ]
    }
    assert affinity_key(Api.CHAT, turn1) == affinity_key(Api.CHAT, turn2) is not None


@pytest.mark.parametrize(
    ("other", "why"),
    [
        ({"messages": [SYSTEM, {"role": "user", "content": "Another task"}]}, "another first turn"),
        ({"messages": [{"role": "system", "content": "Other rules"}, FIRST]}, "another system prompt"),
        ({"messages": [FIRST]}, "no system prompt"),
    ],
)
def test_other_conversations_get_other_keys(other: dict[str, object], why: str) -> None:
    assert affinity_key(Api.CHAT, other) != affinity_key(Api.CHAT, {"messages": [SYSTEM, FIRST]}), why


@pytest.mark.parametrize(
    ("api", "body", "explicit"),
    [
        (Api.CHAT, {"messages": [SYSTEM, FIRST], "prompt_cache_key": "session-7"}, None),
        (Api.CHAT, {"messages": [FIRST], "prompt_cache_key": "session-7"}, None),
        (Api.MESSAGES, {"messages": [FIRST], "metadata": {"user_id": "session-7"}}, None),
        (Api.CHAT, {"messages": [SYSTEM, FIRST]}, "session-7"),  # a Responses request's own key
    ],
)
def test_the_clients_own_key_wins_over_the_content(
    api: Api, body: dict[str, object], explicit: str | None
) -> None:
    assert affinity_key(api, body, explicit) == affinity_key(Api.CHAT, {"messages": []}, "session-7")


def test_a_messages_request_reads_its_system_field() -> None:
    one = affinity_key(Api.MESSAGES, {"system": "Rules A", "messages": [FIRST]})
    other = affinity_key(Api.MESSAGES, {"system": "Rules B", "messages": [FIRST]})
    assert one is not None and other is not None and one != other


@pytest.mark.parametrize(
    ("api", "body"),
    [
        (Api.CHAT, {"messages": [SYSTEM]}),  # no user turn
        (Api.CHAT, {"messages": []}),
        (Api.CHAT, {"messages": "not a list"}),
        (Api.CHAT, {}),
        (Api.EMBEDDINGS, {"input": "text"}),
        (Api.COMPLETIONS, {"prompt": "text"}),
    ],
)
def test_no_key_without_a_conversation(api: Api, body: dict[str, object]) -> None:
    assert affinity_key(api, body) is None


def test_a_key_that_is_not_a_string_is_the_contents() -> None:
    body = {"messages": [SYSTEM, FIRST], "prompt_cache_key": 7}
    assert affinity_key(Api.CHAT, body) == affinity_key(Api.CHAT, {"messages": [SYSTEM, FIRST]})


def test_odd_content_still_hashes() -> None:
    # A client's strange parts (numbers, nulls, huge text; a lone surrogate, which the
    # door refuses before this) neither fail nor take long: the key reads a bounded prefix.
    huge = {"role": "user", "content": "x" * 1_000_000}
    assert affinity_key(Api.CHAT, {"messages": [None, 3, huge]}) is not None
    assert affinity_key(Api.CHAT, {"messages": [{"role": "user", "content": "\ud800"}]}) is not None


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        (Api.CHAT, {"messages": [SYSTEM, FIRST]}, False),  # a first turn
        (Api.CHAT, {"messages": [SYSTEM, FIRST, {"role": "assistant", "content": "Done."}, FIRST]}, True),
        (
            Api.MESSAGES,
            {"system": "Rules", "messages": [FIRST, {"role": "assistant", "content": "ok"}]},
            True,
        ),
        (Api.MESSAGES, {"system": "Rules", "messages": [FIRST]}, False),
        (Api.CHAT, {"messages": "not a list"}, False),
        (Api.CHAT, {}, False),
        (Api.COMPLETIONS, {"prompt": "assistant"}, False),
    ],
)
def test_history_is_an_earlier_answer_in_the_request(
    api: Api, body: dict[str, object], expected: bool
) -> None:
    assert has_history(api, body) is expected


# --- the choice ------------------------------------------------------------------------------------


def test_the_same_key_goes_to_the_same_replica_whatever_the_order_listed() -> None:
    names = [f"r{index}" for index in range(8)]
    for key in keys(50):
        first = choose_by_prefix(idle(*names), (), key, turn=0)
        again = choose_by_prefix(idle(*reversed(names)), (), key, turn=5)
        assert first == again
        assert first.outcome is RouteOutcome.AFFINITY
        assert first.key == rendezvous_order(key, names)[0]


def test_keys_spread_over_the_replicas() -> None:
    names = [f"r{index}" for index in range(4)]
    owners = [choose_by_prefix(idle(*names), (), key, turn=0).key for key in keys(4000)]
    for name in names:
        assert 0.2 < owners.count(name) / len(owners) < 0.3


def test_a_hot_key_spreads_past_the_bound_in_its_own_order() -> None:
    names = [f"r{index}" for index in range(4)]
    key = "prefix:hot"
    order = rendezvous_order(key, names)
    load = dict.fromkeys(names, 0)
    outcomes = []
    for _ in range(40):  # one router, 40 requests of one prefix outstanding at once
        choice = choose_by_prefix([Candidate(n, load[n], True) for n in names], (), key, turn=0)
        assert choice.key is not None
        load[choice.key] += 1
        outcomes.append(choice.outcome)
        mean = sum(load.values()) / len(names)
        assert max(load.values()) <= math.ceil(AFFINITY_LOAD_FACTOR * mean) + 1
    assert load[order[0]] == max(load.values())
    assert all(count > 0 for count in load.values())  # spread, not pinned
    assert outcomes[0] is RouteOutcome.AFFINITY
    assert RouteOutcome.OVERFLOW in outcomes


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        # The owner (``order[0]``) under the bound takes it; at the bound the next does.
        ((0, 0, 0), (0, RouteOutcome.AFFINITY)),
        ((1, 1, 1), (0, RouteOutcome.AFFINITY)),  # bound ceil(1.25 * 4 / 3) = 2
        ((2, 1, 1), (0, RouteOutcome.AFFINITY)),  # bound ceil(1.25 * 5 / 3) = 3: 2 + 1 fits
        ((3, 1, 1), (1, RouteOutcome.OVERFLOW)),  # bound ceil(1.25 * 6 / 3) = 3: 3 + 1 does not
        ((3, 3, 0), (2, RouteOutcome.OVERFLOW)),  # bound 3: both full, the third
    ],
)
def test_the_bound_by_table(loads: tuple[int, int, int], expected: tuple[int, RouteOutcome]) -> None:
    key = "prefix:table"
    order = rendezvous_order(key, ["a", "b", "c"])
    candidates = [Candidate(name, load, True) for name, load in zip(order, loads, strict=True)]
    choice = choose_by_prefix(candidates, (), key, turn=0)
    index, outcome = expected
    assert (choice.key, choice.outcome) == (order[index], outcome)


def test_load_bound() -> None:
    assert load_bound(0, 8) == 1
    assert load_bound(7, 8) == 2  # ceil(1.25 * 8 / 8)
    assert load_bound(15, 4) == 5  # ceil(1.25 * 16 / 4)
    assert load_bound(15, 4, factor=1.5) == 6


def test_no_key_is_least_outstanding() -> None:
    candidates = [Candidate("a", 3, True), Candidate("b", 1, True), Candidate("c", 2, True)]
    assert choose_by_prefix(candidates, (), None, turn=0) == choose_by_prefix(candidates, (), None, turn=0)
    choice = choose_by_prefix(candidates, (), None, turn=0)
    assert (choice.key, choice.outcome) == ("b", RouteOutcome.NO_KEY)


def test_a_first_turn_goes_where_the_load_is_least() -> None:
    # Nothing of a conversation is cached before its first answer: its owner has no more
    # of it than any replica, so the turn balances the load (one-off prompts route as
    # least outstanding does, ties round-robin by turn).
    key = "prefix:first"
    owner = rendezvous_order(key, ["a", "b", "c"])[0]
    busy = [Candidate(n, 2 if n == owner else 1, True) for n in ("a", "b", "c")]
    for turn in range(4):
        choice = choose_by_prefix(busy, (), key, turn, history=False)
        assert choice.key == choose_endpoint(busy, (), turn) != owner
        assert choice.outcome is RouteOutcome.NO_HISTORY
    assert choose_by_prefix([], (), key, 0, history=False) == choose_by_prefix([], (), None, 0)


@pytest.mark.parametrize(
    ("in_flight", "concurrent", "expected"),
    [
        # Four replicas, the owner first. A lone turn (none of its key in flight) stays
        # on its owner up to ceil(3 * (total + 1) / 4); a burst of its key spills at 1.25.
        ((4, 1, 1, 1), 0, 0),  # bound ceil(3 * 8 / 4) = 6
        ((6, 1, 1, 1), 0, 0),  # ceil(3 * 10 / 4) = 8: still its owner
        ((8, 0, 0, 0), 0, 1),  # ceil(3 * 9 / 4) = 7: 8 + 1 does not fit, the next in its order
        ((4, 1, 1, 1), 1, 1),  # a burst: ceil(1.25 * 8 / 4) = 3, the next
        ((1, 1, 1, 1), 1, 0),  # a burst under its bound: ceil(1.25 * 5 / 4) = 2
    ],
)
def test_a_lone_turn_gets_a_loose_bound_a_burst_the_tight_one(
    in_flight: tuple[int, int, int, int], concurrent: int, expected: int
) -> None:
    key = "prefix:lone"
    order = rendezvous_order(key, ["a", "b", "c", "d"])
    candidates = [Candidate(n, load, True) for n, load in zip(order, in_flight, strict=True)]
    choice = choose_by_prefix(candidates, (), key, 0, concurrent=concurrent)
    assert choice.key == order[expected]


def _share_of(key: str, replica: str) -> float:
    """Where ``key``'s threshold on ``replica`` lies between the share's ends, found by
    asking: the most conversations ``replica`` may hold with 8 the mean elsewhere."""
    names = ["x", "y", "z", "w"]
    order = rendezvous_order(key, names)
    assert order[0] == replica
    for held in range(0, 40):
        loads = [held, 8, 8, 8]
        candidates = [Candidate(n, 0, True, load=load) for n, load in zip(order, loads, strict=True)]
        if choose_by_prefix(candidates, (), key, 0, concurrent=0).key != replica:
            return held
    raise AssertionError("never given away")


def test_a_replica_over_its_share_gives_away_the_same_conversations_every_turn() -> None:
    names = ["x", "y", "z", "w"]
    sample = [k for k in keys(400) if rendezvous_order(k, names)[0] == "x"]
    given_at = {k: _share_of(k, "x") for k in sample}
    low, high = AFFINITY_SHARE
    # Each conversation's own threshold, between the share's ends: with 3 others holding
    # 8 each, "x" holding h, the mean with this one is (h + 24 + 1) / 4.
    for held in given_at.values():
        mean = (held + 24 + 1) / 4
        assert low * mean - 1 <= held <= high * mean + 1
    # The thresholds differ by key, so as the owner holds more, it gives away more of
    # them, the same ones first: those given away at h are given away at every h' > h.
    for held in range(8, 30):
        away = {k for k, at in given_at.items() if at <= held}
        more = {k for k, at in given_at.items() if at <= held + 1}
        assert away <= more
    counts = sorted(set(given_at.values()))
    assert len(counts) >= 4  # spread over several counts, not one cliff
    # And the choice is the same from any router that counts the same.
    for key in sample[:20]:
        held = given_at[key]
        order = rendezvous_order(key, names)
        loads = dict(zip(order, [held, 8, 8, 8], strict=True))
        one = choose_by_prefix(
            [Candidate(n, 0, True, load=loads[n]) for n in names], (), key, 0, concurrent=0
        )
        other = choose_by_prefix(
            [Candidate(n, 2, True, load=loads[n]) for n in reversed(names)], (), key, 5, concurrent=0
        )
        assert one == other and one.key == order[1] and one.outcome is RouteOutcome.OVERFLOW


def test_conversations_spread_evenly_when_each_takes_its_share() -> None:
    # 32 replicas, 256 conversations arriving one by one, each counted where it went:
    # rendezvous hashing alone puts 15 on some replica (1.9x the mean of 8); the share
    # keeps every replica within its upper end, and the busiest well under it.
    names = [f"engine-{index:02d}" for index in range(32)]
    held = dict.fromkeys(names, 0)
    alone = dict.fromkeys(names, 0)
    for key in keys(256):
        alone[rendezvous_order(key, names)[0]] += 1
        candidates = [Candidate(n, 0, True, load=held[n]) for n in names]
        choice = choose_by_prefix(candidates, (), key, 0, concurrent=0)
        assert choice.key is not None
        held[choice.key] += 1
    mean = 256 / 32
    assert max(alone.values()) == 15
    assert max(held.values()) <= math.ceil(AFFINITY_SHARE[1] * mean)
    assert max(held.values()) / mean <= 1.5


def test_unusable_avoided_and_suspect_endpoints_are_not_owners() -> None:
    key = "prefix:skip"
    order = rendezvous_order(key, ["a", "b", "c"])
    owner, second, third = order
    base = {n: Candidate(n, 0, True) for n in order}
    for changed in (
        Candidate(owner, 0, False),  # not passing, or draining
        Candidate(owner, 0, True, suspect=True),  # refused a connection a moment ago
    ):
        candidates = [changed if c.key == owner else c for c in base.values()]
        choice = choose_by_prefix(candidates, (), key, turn=0)
        # The owner among those that can take it, as if the first had left.
        assert (choice.key, choice.outcome) == (second, RouteOutcome.AFFINITY)
    # Tried and failed on this request: the next in the key's order, as if it had left.
    choice = choose_by_prefix(list(base.values()), {owner}, key, turn=0)
    assert choice.key == second
    assert choose_by_prefix(list(base.values()), {owner, second}, key, turn=0).key == third
    # Only suspects left: least outstanding takes one (fail open, as ``choose_endpoint``).
    suspects = [Candidate(n, 0, True, suspect=True) for n in order]
    assert choose_by_prefix(suspects, (), key, turn=0).outcome is RouteOutcome.NO_KEY
    assert choose_by_prefix(suspects, (), key, turn=0).key is not None
    assert choose_by_prefix([], (), key, turn=0).key is None


@pytest.mark.parametrize("replicas", [3, 8, 32])
def test_a_replica_joining_takes_only_its_share(replicas: int) -> None:
    names = [f"engine-{index}" for index in range(replicas)]
    sample = keys(6000)
    before = {key: rendezvous_order(key, names)[0] for key in sample}
    joined = [*names, "engine-new"]
    after = {key: rendezvous_order(key, joined)[0] for key in sample}
    moved = [key for key in sample if before[key] != after[key]]
    assert all(after[key] == "engine-new" for key in moved)  # nothing moves between old replicas
    share = len(sample) / (replicas + 1)
    assert len(moved) <= share * 1.15  # the expected share, with sampling noise


@pytest.mark.parametrize("replicas", [3, 8, 32])
def test_a_replica_leaving_gives_away_only_its_own(replicas: int) -> None:
    names = [f"engine-{index}" for index in range(replicas)]
    sample = keys(6000)
    before = {key: rendezvous_order(key, names)[0] for key in sample}
    gone = names[replicas // 2]
    after = {key: rendezvous_order(key, [n for n in names if n != gone])[0] for key in sample}
    moved = {key for key in sample if before[key] != after[key]}
    assert moved == {key for key in sample if before[key] == gone}
    assert len(moved) <= len(sample) / replicas * 1.15
    # Each of its keys goes to its second choice: a router that had not seen it leave
    # (it avoids it after a failure) picks the same one.
    for key in moved:
        assert after[key] == rendezvous_order(key, names)[1]


def test_routers_with_their_own_loads_agree_while_under_the_bound() -> None:
    names = [f"r{index}" for index in range(8)]
    key = "prefix:shared"
    router_a = [Candidate(n, 0, True) for n in names]
    # Its own counts: one request on each but the last (bound ceil(1.25 * 8 / 8) = 2).
    router_b = [Candidate(n, 0 if index == 7 else 1, True) for index, n in enumerate(names)]
    assert choose_by_prefix(router_a, (), key, 0).key == choose_by_prefix(router_b, (), key, 3).key


@pytest.mark.parametrize("replicas", [8, 32])
def test_with_the_share_a_replica_joining_or_leaving_moves_few_conversations(replicas: int) -> None:
    # Eight conversations a replica, placed one by one with the share and counted where
    # they went; then a replica joins (or one leaves) and every conversation's next turn
    # is asked with the counts as they stand (its own left out, as a router counts it).
    # Only those the new replica takes, or the gone one held, move, and a few the share
    # rebalances: not a reshuffle. (Even with nothing changed, a round moves a few
    # conversations whose threshold its owner's count sits at: at most 3 in 100.)
    def turns(names: list[str], home: dict[str, str], sample: list[str]) -> dict[str, str]:
        held = dict.fromkeys(names, 0)
        for key in sample:
            if home.get(key) in held:
                held[home[key]] += 1
        after = dict(home)
        for key in sample:
            own = after.get(key)
            if own in held:
                held[own] -= 1
            candidates = [Candidate(n, 0, True, load=held[n]) for n in names]
            choice = choose_by_prefix(candidates, (), key, 0, concurrent=0)
            assert choice.key is not None
            after[key] = choice.key
            held[choice.key] += 1
        return after

    names = [f"engine-{index:02d}" for index in range(replicas)]
    sample = keys(replicas * 8)
    before = turns(names, turns(names, {}, sample), sample)
    again = turns(names, before, sample)
    churn = sum(before[k] != again[k] for k in sample)
    assert churn <= len(sample) * 0.03
    joined = turns([*names, "engine-new"], before, sample)
    moved = [k for k in sample if before[k] != joined[k]]
    assert sum(joined[k] == "engine-new" for k in moved) >= len(moved) / 2  # mostly to it
    assert len(moved) <= len(sample) / (replicas + 1) * 1.5 + 2 * churn + 2
    gone = names[replicas // 2]
    left = turns([n for n in names if n != gone], before, sample)
    moved = [k for k in sample if before[k] != left[k]]
    own = [k for k in sample if before[k] == gone]
    assert set(own) <= set(moved)  # every one it held finds a new home
    assert len(moved) <= len(own) * 1.25 + 2 * churn + 2
