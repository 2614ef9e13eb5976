"""BlockManager: ref counts, the chained prefix cache, revival of freed blocks, eviction, collisions."""

from __future__ import annotations

import itertools

import pytest

from tandemrl.engine import block_manager as bm_module
from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.sequence import Sequence
from tandemrl.types import SamplingParams

BS = 4
_ids = itertools.count()


def seq(tokens: list[int]) -> Sequence:
    return Sequence(next(_ids), "r", list(tokens), len(tokens), SamplingParams(max_tokens=8))


def test_fresh_allocation_takes_one_block_per_started_block():
    bm = BlockManager(8, BS)
    s = seq(list(range(10)))  # 3 blocks, the last one partial
    assert bm.probe(s)[0] <= bm.num_free_blocks
    bm.allocate(s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert s.num_cached_tokens == 0
    assert bm.num_free_blocks == 5
    assert all(bm.ref_count[b] == 1 for b in s.block_table)
    assert (bm.prefill_tokens_requested, bm.prefill_tokens_computed) == (10, 10)


def test_same_prompt_shares_full_blocks_but_not_the_partial_one():
    bm = BlockManager(8, BS)
    a, b = seq(list(range(10))), seq(list(range(10)))
    bm.allocate(a)
    bm.allocate(b)  # same scheduling step: hits the blocks a registered at allocate time
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8
    assert [bm.ref_count[x] for x in a.block_table] == [2, 2, 1]
    assert bm.num_free_blocks == 4
    assert (bm.prefill_tokens_requested, bm.prefill_tokens_computed) == (20, 12)
    assert bm.cache_hit_blocks == 2


def test_prompt_of_whole_blocks_leaves_its_last_block_to_compute():
    bm = BlockManager(8, BS)
    a, b = seq(list(range(8))), seq(list(range(8)))
    bm.allocate(a)
    bm.allocate(b)
    assert b.num_cached_tokens == 4  # the block holding the last token is never taken from the cache
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_different_prefix_does_not_share_later_blocks():
    bm = BlockManager(8, BS)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = seq([0, 2, 3, 4, 5, 6, 7, 8, 9])  # same second block, different first: chained digests differ
    bm.allocate(a)
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)


def test_freed_block_is_revived_by_a_later_hit():
    bm = BlockManager(8, BS)
    a = seq(list(range(9)))
    bm.allocate(a)
    shared = a.block_table[:2]
    bm.deallocate(a)
    assert bm.num_free_blocks == 8 and a.block_table == []
    b = seq(list(range(9)) + [42])
    assert bm.probe(b) == (3, 8)  # two revived blocks and one fresh one leave the free list
    bm.allocate(b)
    assert b.block_table[:2] == shared and b.num_cached_tokens == 8
    assert bm.num_free_blocks == 5


def test_reused_block_loses_its_cache_entry():
    bm = BlockManager(3, BS)
    a = seq(list(range(9)))  # blocks: [0..3] [4..7] [8]
    bm.allocate(a)
    bm.deallocate(a)
    c = seq([100 + i for i in range(12)])  # needs all 3 blocks: overwrites the cached content
    bm.allocate(c)
    bm.deallocate(c)
    b = seq(list(range(9)))
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_eviction_prefers_blocks_that_cannot_be_revived():
    bm = BlockManager(4, BS)
    a = seq(list(range(9)))  # two full (cached) blocks and one partial
    bm.allocate(a)
    bm.deallocate(a)
    c = seq([77, 78])  # one block: must come from the never-cached free blocks
    bm.allocate(c)
    b = seq(list(range(9)))
    bm.allocate(b)
    assert b.num_cached_tokens == 8


def test_digest_collision_is_caught_by_comparing_tokens(monkeypatch):
    monkeypatch.setattr(bm_module, "block_digest", lambda parent, ids: b"same")
    bm = BlockManager(8, BS)
    a, b = seq([1, 2, 3, 4, 5]), seq([9, 9, 9, 9, 5])
    bm.allocate(a)
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)


def test_probe_counts_hits_on_blocks_in_use_as_free():
    bm = BlockManager(4, BS)
    a = seq(list(range(13)))  # 4 blocks: the whole pool
    bm.allocate(a)
    b = seq(list(range(12)) + [5])  # 3 shared blocks + 1 new: no free block left
    assert bm.probe(b)[0] > bm.num_free_blocks
    bm2 = BlockManager(5, BS)
    bm2.allocate(seq(list(range(13))))
    assert bm2.probe(b) == (1, 12) and bm2.num_free_blocks == 1


def test_may_append_allocates_when_a_token_starts_a_block_and_registers_the_full_one():
    bm = BlockManager(8, BS)
    s = seq([1, 2, 3])
    bm.allocate(s)
    s.append_token(4, -1.0)  # 4 tokens: still one block
    assert bm.can_append(s)
    bm.may_append(s)
    assert len(s.block_table) == 1
    s.append_token(5, -1.0)  # token 5 starts block 2; block 1 is full and computed
    bm.may_append(s)
    assert len(s.block_table) == 2
    other = seq([1, 2, 3, 4, 6])
    bm.allocate(other)
    assert other.num_cached_tokens == 4 and other.block_table[0] == s.block_table[0]


def test_block_whose_last_token_was_never_computed_is_not_cached():
    bm = BlockManager(8, BS)
    s = seq([1, 2, 3])
    bm.allocate(s)
    s.append_token(4, -1.0)  # fills the block, but token 4's K/V is computed only by the next step
    bm.may_append(s)
    bm.deallocate(s)  # preempted before that step
    other = seq([1, 2, 3, 4, 6])
    bm.allocate(other)
    assert other.num_cached_tokens == 0


def test_can_append_false_when_pool_is_full():
    bm = BlockManager(2, BS)
    s = seq(list(range(8)))
    bm.allocate(s)
    s.append_token(1, -1.0)
    assert not bm.can_append(s)
    with pytest.raises(RuntimeError, match="no free KV blocks"):
        bm.may_append(s)


def test_prefix_caching_disabled_shares_nothing():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a, b = seq(list(range(9))), seq(list(range(9)))
    bm.allocate(a)
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(a.block_table) & set(b.block_table)
    assert bm.prefill_tokens_computed == 18


def test_reset_frees_everything_and_forgets_the_cache():
    bm = BlockManager(8, BS)
    a = seq(list(range(9)))
    bm.allocate(a)
    bm.reset()
    assert bm.num_free_blocks == 8 and all(r == 0 for r in bm.ref_count)
    b = seq(list(range(9)))
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_digest_is_stable():
    assert bm_module.block_digest(b"", [1, 2, 3]) == bm_module.block_digest(b"", [1, 2, 3])
    assert bm_module.block_digest(b"", [1, 2, 3]) != bm_module.block_digest(b"x", [1, 2, 3])
    assert bm_module.block_digest(b"", [1, 2, 3]).hex() == bm_module.block_digest(b"", (1, 2, 3)).hex()
