"""A paged KV cache of fixed block size, as vLLM's block manager keeps it.

A request holds ``ceil(tokens / block_size)`` blocks for the tokens in its cache; a
scheduler admits or grows a request only while blocks are free (vLLM:
vllm/core/block_manager.py, ``can_allocate`` / ``can_append_slots``; block size 16 by
default, vllm/config.py ``CacheConfig.block_size``).
"""

from __future__ import annotations

#: vLLM's default block size in tokens (vllm/config.py, CacheConfig)
BLOCK_SIZE = 16


class BlockManager:
    def __init__(self, blocks: int, block_size: int = BLOCK_SIZE) -> None:
        if blocks < 1 or block_size < 1:
            raise ValueError("a KV cache needs at least one block of at least one token")
        self.blocks = blocks
        self.block_size = block_size
        self.used = 0
        self.held: dict[int, int] = {}      # request id -> blocks

    def need(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def free(self) -> int:
        return self.blocks - self.used

    def extra(self, rid: int, tokens: int) -> int:
        """Blocks request ``rid`` needs beyond what it holds to cache ``tokens``."""
        return max(0, self.need(tokens) - self.held.get(rid, 0))

    def can_grow(self, rid: int, tokens: int) -> bool:
        return self.extra(rid, tokens) <= self.free

    def grow(self, rid: int, tokens: int) -> None:
        x = self.extra(rid, tokens)
        if x > self.free:
            raise RuntimeError("KV cache over capacity")
        self.held[rid] = self.held.get(rid, 0) + x
        self.used += x

    def release(self, rid: int) -> None:
        self.used -= self.held.pop(rid, 0)
