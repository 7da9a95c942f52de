"""The sim's prefix cache as vLLM counts it: whole leading blocks, never the last token, LRU eviction."""

from __future__ import annotations

from llmgw.sim.prefix_cache import PrefixCache


def words(count: int, start: int = 0) -> list[str]:
    return [f"w{index}" for index in range(start, start + count)]


def test_a_repeated_prompt_reads_its_whole_blocks_but_the_last_token() -> None:
    cache = PrefixCache(capacity_tokens=1024, block_size=4)
    assert cache.admit(words(10)) == 0  # cold
    assert cache.admit(words(10)) == 8  # two full blocks; the partial third is not cached
    assert cache.admit(words(8)) == 4  # all 8 held, but the last token is recomputed: one block


def test_a_grown_conversation_reads_its_earlier_turns() -> None:
    cache = PrefixCache(capacity_tokens=1024, block_size=4)
    cache.admit(words(12))
    assert cache.admit(words(12) + words(9, start=100)) == 12


def test_a_block_matches_only_after_the_same_prefix() -> None:
    cache = PrefixCache(capacity_tokens=1024, block_size=4)
    cache.admit(words(8))
    assert cache.admit(["other", "w1", "w2", "w3", *words(4, start=4), "x"]) == 0


def test_least_recently_used_blocks_are_evicted_first() -> None:
    cache = PrefixCache(capacity_tokens=16, block_size=4)  # four blocks
    cache.admit(words(9))  # a: two blocks
    cache.admit(words(9, start=50))  # b: two blocks, full now
    assert cache.admit(words(9)) == 8  # a used again: b is the least recent
    cache.admit(words(9, start=90))  # c evicts b
    assert len(cache) == 4
    assert cache.admit(words(9, start=50)) == 0
    assert cache.hit_tokens == 8 and cache.prompt_tokens == 45


def test_no_capacity_caches_nothing() -> None:
    cache = PrefixCache(capacity_tokens=0, block_size=4)
    cache.admit(words(9))
    assert cache.admit(words(9)) == 0
