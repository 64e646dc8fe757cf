"""A paged KV cache of fixed block size, as vLLM's block manager keeps it, with sliding-
window layers freeing the blocks that left their window (vLLM's hybrid KV cache manager).

Full attention only (the default): a request holds ``ceil(tokens / block_size)`` blocks
for the tokens in its cache; a scheduler admits or grows a request only while blocks are
free (vLLM: vllm/core/block_manager.py, ``can_allocate`` / ``can_append_slots``; block
size 16 by default, vllm/config.py ``CacheConfig.block_size``).

Sliding-window layers (vLLM's hybrid KV cache manager, vllm-project/vllm 002f349):

- :func:`kv_groups`: layers are grouped by attention type, every group of the same number
  of layers (the fewest of any type; a type with more is split, its last group padded),
  and all groups share one pool of blocks, a block being one group's ``block_size``
  tokens (vllm/v1/core/kv_cache_utils.py ``_get_kv_cache_config_uniform_page_size``;
  ``num_blocks = available_memory // page_size // group_size``). One type: one group of
  every layer, the full-attention cache above.
- A full-attention group holds ``ceil(tokens / block_size)`` blocks. A sliding-window
  group of window ``W`` first frees the blocks wholly before token
  ``computed - W + 1`` (``computed``: the tokens already in the cache when the step is
  scheduled), then allocates up to ``ceil(tokens / block_size)``
  (vllm/v1/core/single_type_kv_cache_manager.py ``SlidingWindowManager.
  remove_skipped_blocks``; it runs before ``get_num_blocks_to_allocate`` in
  vllm/v1/core/kv_cache_manager.py ``allocate_slots``, vllm-project/vllm 003df29):
  ``ceil(tokens / bs) - max(0, (computed - W + 1) // bs)`` blocks, the last ``W`` tokens
  plus the partial block. A prompt prefilled in one step holds all its blocks for that
  step (nothing is computed yet); a decode at context ``c`` holds ``W / bs`` or
  ``W / bs + 1`` blocks once ``c > W`` (block-aligned ``W``).

``computed`` is what the schedulers' calls imply: ``grow(rid, tokens)`` is called with the
request's cached tokens plus the step's new ones, so it is the lesser of the tokens of the
previous ``grow`` and ``tokens - 1`` (a decode reserved ahead, :class:`moesim.traffic.disagg.
DecodeOnly`, grows by one token per step below its reservation).
"""

from __future__ import annotations

#: vLLM's default block size in tokens (vllm/config.py, CacheConfig)
BLOCK_SIZE = 16


def kv_groups(layer_windows: list[int]) -> tuple[tuple[int, ...], int]:
    """(each KV cache group's window, 0 for full attention; layers per group) of a model
    whose layer ``i`` has window ``layer_windows[i]`` (0: full), grouped as vLLM does:
    by type in order of first appearance, ``group_size`` the fewest layers of any type."""
    count: dict[int, int] = {}
    for w in layer_windows:
        count[w] = count.get(w, 0) + 1
    if not count:
        raise ValueError("a KV cache needs at least one layer")
    size = min(count.values())
    return tuple(w for w, n in count.items() for _ in range(-(-n // size))), size


class BlockManager:
    """``blocks`` blocks of ``block_size`` tokens shared by the KV cache groups
    ``windows`` (one entry per group: 0 full attention, W a sliding window of W tokens).
    ``held[rid]``: the blocks request ``rid`` holds over all groups. ``tokens``: the pool
    in tokens of every layer (default ``blocks · block_size``, one group of all layers)."""

    def __init__(self, blocks: int, block_size: int = BLOCK_SIZE,
                 windows: tuple[int, ...] = (0,), tokens: int | None = None) -> None:
        if blocks < 1 or block_size < 1:
            raise ValueError("a KV cache needs at least one block of at least one token")
        if not windows or any(w < 0 for w in windows):
            raise ValueError("KV cache groups need windows >= 0 (0: full attention)")
        self.blocks = blocks
        self.block_size = block_size
        self.windows = tuple(int(w) for w in windows)
        self.windowed = any(self.windows)
        self.tokens = blocks * block_size if tokens is None else tokens
        self.used = 0
        self.held: dict[int, int] = {}      # request id -> blocks
        self._at: dict[int, tuple[int, int]] = {}   # rid -> (tokens grown to, computed)

    def need(self, tokens: int) -> int:
        """Blocks of ``tokens`` tokens with every group holding all of them (an upper
        bound on what one request ever holds: a prompt prefilled in one step does)."""
        return len(self.windows) * -(-tokens // self.block_size)

    @property
    def free(self) -> int:
        return self.blocks - self.used

    def _after(self, rid: int, tokens: int) -> tuple[int, int]:
        """(blocks ``rid`` holds once grown to ``tokens``, its computed tokens then):
        each windowed group first frees the blocks before ``computed - W + 1``, then
        every group allocates up to ``tokens`` (vLLM: skip, then allocate)."""
        bs = self.block_size
        n = -(-tokens // bs)
        if not self.windowed:
            return max(n, self.held.get(rid, 0)), 0
        prev, done = self._at.get(rid, (0, 0))
        n = max(n, -(-prev // bs))
        done = max(done, min(prev, tokens - 1))
        total = 0
        for w in self.windows:
            total += n - max(0, min(n, (done - w + 1) // bs)) if w else n
        return total, done

    def extra(self, rid: int, tokens: int) -> int:
        """Blocks request ``rid`` needs beyond what it holds to cache ``tokens`` (after
        its windowed groups free the blocks that left the window)."""
        return self._after(rid, tokens)[0] - self.held.get(rid, 0)

    def can_grow(self, rid: int, tokens: int) -> bool:
        return self.extra(rid, tokens) <= self.free

    def grow(self, rid: int, tokens: int) -> None:
        total, done = self._after(rid, tokens)
        x = total - self.held.get(rid, 0)
        if x > self.free:
            raise RuntimeError("KV cache over capacity")
        self.held[rid] = total
        self.used += x
        if self.windowed:
            prev = self._at.get(rid, (0, 0))[0]
            self._at[rid] = (max(prev, tokens), done)

    def release(self, rid: int) -> None:
        self.used -= self.held.pop(rid, 0)
        self._at.pop(rid, None)
