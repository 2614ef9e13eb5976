"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, reference counts, and a prefix cache.

A FULL block is named by a digest chained from its parent block's digest and its own token ids, so sequences with
the same leading blocks share the same physical blocks (GRPO's N samples of a prompt compute it once). The cache map
``digest -> block`` points only at blocks whose K/V is (or, within the current step, will be) written for exactly
that content:
- ``allocate`` registers a sequence's full blocks at once, so samples scheduled after it in the same prefill step
  hit them (the runner writes a layer's K/V for all tokens before attending);
- decode registers a block at the first decode schedule after all its tokens' K/V were computed (earlier could
  publish a block whose owner is preempted before computing it); blocks reserved ahead (``lookahead``) or holding
  tokens still pending on the device are never registered before they fill.
A freed block keeps its digest and can be revived by a later hit until it is handed out again; free blocks go out
oldest-freed first, those without a digest (never revivable) before all.

Cached K/V belongs to the weights that computed it: every digest chain starts from a root named by the weights
version (``set_weights_version``) and the sequence's policy version, so after the weights change no new sequence
can hit a block computed with the old ones.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

from tandemrl.engine.sequence import Sequence


def block_digest(parent: bytes, token_ids: list[int]) -> bytes:
    """Stable 128-bit digest of a block's content and everything before it."""
    payload = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return hashlib.blake2b(parent + payload, digest_size=16).digest()


class BlockManager:
    """Hands out KV blocks to sequences; see the module docstring for the prefix-cache rules."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefill_tokens_requested = 0  # tokens prefill steps had to cover
        self.prefill_tokens_computed = 0  # of those, tokens not served by the prefix cache
        self.cache_hit_blocks = 0
        self.cache_queried_blocks = 0
        self.weights_version = 0
        self.reset()

    def reset(self) -> None:
        """Forget every allocation and cached digest (the KV memory is gone or stale); counters stay."""
        self.ref_count = [0] * self.num_blocks
        self._digest: list[bytes | None] = [None] * self.num_blocks  # chain digest of a full block
        self._tokens: list[tuple[int, ...] | None] = [None] * self.num_blocks  # to verify a hit
        self._cached: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.num_blocks))
        # seq_id -> (root, digests of its full blocks so far); the root is fixed when the sequence is allocated
        self._digest_memo: dict[int, tuple[bytes, list[bytes]]] = {}

    def set_weights_version(self, version: int) -> None:
        """From now on, sequences allocated share cached blocks only with others allocated under ``version``."""
        if version != self.weights_version:
            self.weights_version = version
            self._cached.clear()  # nothing cached so far can serve the new weights

    def forget_cached_blocks(self) -> None:
        """Stop offering any block to later hits (e.g. after a failed step left registered blocks unwritten)."""
        self._cached.clear()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    # ------------------------------------------------------------------ prefill

    def probe(self, seq: Sequence) -> tuple[int, int]:
        """(free blocks that allocating ``seq`` would take, tokens the prefix cache would serve)."""
        _, hits, new_blocks = self._plan(seq)
        return new_blocks, len(hits) * self.block_size

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` blocks for all its tokens, reusing leading cached blocks; register its full blocks."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        digests, hits, new_blocks = self._plan(seq)
        if new_blocks > len(self._free):
            raise RuntimeError(f"sequence {seq.seq_id} needs {new_blocks} free blocks, "
                               f"{len(self._free)} left (probe first)")
        for block in hits:
            self._free.pop(block, None)  # a revived block leaves the free list
            self.ref_count[block] += 1
            seq.block_table.append(block)
        for i in range(len(hits), seq.num_blocks(self.block_size)):
            block = self._take_free_block()
            seq.block_table.append(block)
            if i < len(digests):
                self._register(block, digests[i], self._block_tokens(seq, i))
        seq.num_cached_tokens = len(hits) * self.block_size
        _note_blocks(seq)
        self.prefill_tokens_requested += seq.num_tokens
        self.prefill_tokens_computed += seq.num_tokens - seq.num_cached_tokens
        self.cache_hit_blocks += len(hits)
        if self.enable_prefix_caching:
            self.cache_queried_blocks += (seq.num_tokens - 1) // self.block_size

    def register_finished(self, seq: Sequence) -> None:
        """Register the full blocks a finished ``seq`` computed since its last decode schedule (before it frees
        them), so a prompt that continues it (the next turn of a conversation) hits all of them."""
        if self.enable_prefix_caching and seq.block_table and _cacheable_tokens(seq) >= self.block_size:
            self._register_computed_blocks(seq)

    def deallocate(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; a block nobody holds goes back to the free list, keeping its digest."""
        self._release(seq.block_table)
        seq.block_table.clear()
        seq.num_cached_tokens = 0
        seq.stats.kv_blocks = 0
        self._digest_memo.pop(seq.seq_id, None)

    def release_reserved(self, seq: Sequence) -> None:
        """Release the blocks ``seq`` holds past its tokens (reserved for decode steps that were abandoned)."""
        keep = seq.num_blocks(self.block_size)
        self._release(seq.block_table[keep:])
        del seq.block_table[keep:]
        seq.stats.kv_blocks = len(seq.block_table)

    def _release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):  # the tail first, so eviction keeps shared prefixes longest
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self._free[block] = None
                if self._digest[block] is None or self._cached.get(self._digest[block]) != block:
                    self._free.move_to_end(block, last=False)  # nothing to revive: reuse it first

    # ------------------------------------------------------------------ decode

    def can_append(self, seq: Sequence, lookahead: int = 1) -> bool:
        """Whether ``seq`` can get the blocks its next ``lookahead`` decode steps write to."""
        return self._blocks_missing(seq, lookahead) <= len(self._free)

    def may_append(self, seq: Sequence, lookahead: int = 1) -> None:
        """Before decoding: give ``seq`` the blocks its next ``lookahead`` steps write to (positions
        num_tokens - 1 .. num_tokens - 2 + lookahead), and register its blocks that are now fully computed."""
        self._append(seq, self._blocks_missing(seq, lookahead))

    def try_append_all(self, seqs: list[Sequence], lookaheads: list[int] | None = None) -> bool:
        """``may_append`` for every sequence of a decode batch if the free blocks cover them all; False, changing
        nothing, if they do not."""
        lookaheads = lookaheads or [1] * len(seqs)
        missing = [self._blocks_missing(s, n) for s, n in zip(seqs, lookaheads)]
        if sum(missing) > len(self._free):
            return False
        for seq, m in zip(seqs, missing):  # one sequence at a time: a block it takes may drop a digest just cached
            self._append(seq, m)
        return True

    def _append(self, seq: Sequence, missing: int) -> None:
        table = seq.block_table
        computed = _cacheable_tokens(seq) // self.block_size  # a pending placeholder cannot be hashed
        # Most steps complete no block: the newest computed one is registered already, nothing to do.
        if self.enable_prefix_caching and computed and (
                computed > len(table) or self._digest[table[computed - 1]] is None):
            self._register_computed_blocks(seq)
        if missing:
            table.extend(self._take_free_block() for _ in range(missing))
            _note_blocks(seq)

    # ------------------------------------------------------------------ helpers

    def _blocks_missing(self, seq: Sequence, lookahead: int = 1) -> int:
        """Blocks to add so that positions up to num_tokens - 2 + lookahead have a slot."""
        needed = (len(seq.token_ids) - 1 + lookahead + self.block_size - 1) // self.block_size
        return max(0, needed - len(seq.block_table))

    def _register_computed_blocks(self, seq: Sequence) -> None:
        """Register the full blocks whose K/V is computed (tokens before the last one), newest unregistered
        first back to the last registered one: O(1) per step in steady state."""
        table = seq.block_table
        computed = min(_cacheable_tokens(seq) // self.block_size, len(table))
        first = computed
        while first > 0 and self._digest[table[first - 1]] is None:
            first -= 1
        digests = self._full_block_digests(seq, computed)
        for i in range(first, computed):
            self._register(table[i], digests[i], self._block_tokens(seq, i))

    def _block_tokens(self, seq: Sequence, i: int) -> list[int]:
        return seq.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def _full_block_digests(self, seq: Sequence, count: int | None = None) -> list[bytes]:
        """Digests of (at least) the first ``count`` full blocks of ``seq`` (default: all), memoised per sequence:
        its tokens only grow while it holds blocks."""
        root, digests = self._digest_memo.setdefault(seq.seq_id, (self._root(seq), []))
        if count is None:
            count = len(seq.token_ids) // self.block_size
        for i in range(len(digests), count):
            digests.append(block_digest(digests[-1] if digests else root, self._block_tokens(seq, i)))
        return digests

    def _root(self, seq: Sequence) -> bytes:
        """Parent digest of the first block of ``seq`` allocated now: the weights and policy versions."""
        return struct.pack("<qq", self.weights_version, seq.policy_version)

    def _plan(self, seq: Sequence) -> tuple[list[bytes], list[int], int]:
        """What allocating ``seq`` (holding no blocks) would do: (its full blocks' digests, the physical blocks of its
        leading cache hits in order, the blocks that must come off the free list: fresh ones plus revived hits)."""
        n_blocks = seq.num_blocks(self.block_size)
        if not self.enable_prefix_caching:
            return [], [], n_blocks
        memo = self._digest_memo.get(seq.seq_id)
        if memo is not None and memo[0] != self._root(seq):  # probed under older weights
            del self._digest_memo[seq.seq_id]
        digests = self._full_block_digests(seq)
        # The block holding the last token is never looked up: prefill must compute at least that token,
        # and it must not write into a block other sequences share.
        lookable = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        revived = 0
        for i in range(lookable):
            block = self._cached.get(digests[i])
            if block is None or self._tokens[block] != tuple(self._block_tokens(seq, i)):
                break  # a miss (or a digest collision) ends the shared prefix
            hits.append(block)
            revived += self.ref_count[block] == 0
        return digests, hits, n_blocks - len(hits) + revived

    def _take_free_block(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV blocks left (the scheduler should have preempted)")
        block, _ = self._free.popitem(last=False)
        digest = self._digest[block]
        if digest is not None and self._cached.get(digest) == block:
            del self._cached[digest]  # its old content is about to be overwritten
        self._digest[block] = None
        self._tokens[block] = None
        self.ref_count[block] = 1
        return block

    def _register(self, block: int, digest: bytes, token_ids: tuple[int, ...] | list[int]) -> None:
        """Name ``block`` by ``digest``; the cache map keeps an existing block of the same content."""
        self._digest[block] = digest
        self._tokens[block] = tuple(token_ids)
        self._cached.setdefault(digest, block)


def _note_blocks(seq: Sequence) -> None:
    """Keep the sequence's stats of KV blocks held (now and peak) up to date."""
    stats = seq.stats
    stats.kv_blocks = held = len(seq.block_table)
    if held > stats.peak_kv_blocks:
        stats.peak_kv_blocks = held


def _cacheable_tokens(seq: Sequence) -> int:
    """Leading tokens whose K/V is computed in every model slot: all but the last known one (a pending
    placeholder cannot be hashed), and none past ``seq.kv_complete_tokens``."""
    computed = seq.num_known_tokens - 1
    return computed if seq.kv_complete_tokens is None else min(computed, seq.kv_complete_tokens)
