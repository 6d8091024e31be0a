"""vLLM's automatic prefix caching, reduced to its bookkeeping.

There are no KV tensors to keep, only which blocks an earlier request computed,
so that vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total move
as a real vLLM's do and a router watching them sees the same hit rates.

A block is a run of --block-size token ids, identified as vLLM identifies it: by
a hash chained through the previous block's hash, so a block matches only when
everything before it matches too. The LoRA adapter is part of every block's
key: an adapter's KV values differ from the base model's for the same tokens.
"""

import collections
from collections.abc import Sequence

MAX_CACHED_BLOCKS = 4096  # a simulator, not a KV store: the oldest blocks go first


class PrefixCache:
    def __init__(self, *, block_size: int, capacity: int = MAX_CACHED_BLOCKS):
        self.block_size = block_size
        self.capacity = capacity
        self._blocks: collections.OrderedDict[int, None] = (
            collections.OrderedDict()
        )  # LRU order, oldest first

    def hit_tokens(self, token_ids: Sequence[int], lora: str | None) -> int:
        """How many leading tokens of a prompt are already cached.

        vLLM always computes the prompt's last token, whose logits it samples
        from, so the hit stops before it: a prompt of exactly n full blocks
        hits at most n-1 of them.
        """
        hits = 0
        for block_hash in self._hashes(token_ids[: max(0, len(token_ids) - 1)], lora):
            if block_hash not in self._blocks:
                break
            hits += self.block_size
        return hits

    def store(self, token_ids: Sequence[int], lora: str | None) -> None:
        """Remember the full blocks of computed tokens, the leading ones the newest.

        vLLM frees a request's blocks tail first, so under pressure a shared
        prefix outlives the tails that differ; inserting in reverse keeps
        block 0 the last to be evicted here too.
        """
        for block_hash in reversed(self._hashes(token_ids, lora)):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def _hashes(self, token_ids: Sequence[int], lora: str | None) -> list[int]:
        size = self.block_size
        hashes: list[int] = []
        parent: int | None = None
        for start in range(0, len(token_ids) - size + 1, size):
            parent = hash((parent, lora, tuple(token_ids[start : start + size])))
            hashes.append(parent)
        return hashes
