"""The simulated engine's prefix cache: which blocks of earlier prompts' KV it still holds.

Owns: the blocks (``block_size`` tokens each, chained hashes, as vLLM 0.34.0's
automatic prefix caching keys them: a block's hash covers its parent's, so a block
matches only after the same whole prefix), the capacity (``capacity_tokens`` of KV,
in whole blocks), least-recently-used eviction (vLLM's ``BlockPool`` reuses the
free cached blocks in LRU order, vllm/v1/core/block_pool.py), and the count of a
prompt's tokens served from cache: its longest run of leading full blocks held,
at most the prompt's length less one token (vLLM recomputes the last one for its
logits: ``get_computed_blocks``, vllm/v1/core/kv_cache_manager.py).

Simpler than vLLM on purpose: a running sequence's blocks are not pinned (they are
the most recently used, so eviction reaches them last), and a sequence's decoded
tokens are not cached (an agent's next turn resends the answer as its prompt, which
then caches it).

Must not: know time, HTTP or asyncio; the engine charges the prefill time.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM 0.34.0's default block size (``CacheConfig.DEFAULT_BLOCK_SIZE``, vllm/config/cache.py;
# its older releases used 16).
DEFAULT_BLOCK_SIZE = 64


@dataclass
class Prefill:
    """What admitting one prompt found: filled in as its sequence starts, read by its usage."""

    report: bool = False  # put cached_tokens in the usage (vLLM's --enable-prompt-tokens-details)
    cached_tokens: int = 0
    seconds: float = 0.0  # the simulated prefill of the uncached tokens


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens // block_size)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()  # least recently used first
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def admit(self, tokens: Sequence[str]) -> int:
        """The leading tokens of ``tokens`` read from cache; then every full block of
        ``tokens`` is cached (the most recently used), evicting the least recent past
        the capacity."""
        hashes = self._hashes(tokens)
        hits = 0
        for digest in hashes:
            if digest not in self._blocks:
                break
            hits += 1
        cached = min(hits * self.block_size, max(0, len(tokens) - 1) // self.block_size * self.block_size)
        for digest in hashes:
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        self.hit_tokens += cached
        self.prompt_tokens += len(tokens)
        return cached

    def _hashes(self, tokens: Sequence[str]) -> list[bytes]:
        hashes: list[bytes] = []
        parent = b""
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            block = "\x00".join(tokens[start : start + size]).encode("utf-8", "surrogatepass")
            parent = hashlib.blake2b(parent + block, digest_size=16).digest()
            hashes.append(parent)
        return hashes
