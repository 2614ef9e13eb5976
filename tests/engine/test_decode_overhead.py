"""The decode fast paths: batch-wide block appends, the decode plan, a null-runner engine, strided block tables.

CPU checks run everywhere; the Triton checks are skipped without CUDA."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest
import torch

from tandemrl.engine.kernels.paged_kv import DecodeMeta
from tandemrl.engine.model.attention import sdpa_decode
from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.model.decode_plan import build_decode_plan
from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import StepOutput, StepPlan
from tandemrl.engine.kernels.triton_attention import triton_decode_available, triton_paged_decode
from tandemrl.types import Request, SamplingParams
from tests.engine.test_model_runner import BLOCK, build, make_seq, prompts_of, _shrinking_decode

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _seq(seq_id: int, n_tokens: int) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(range(1, n_tokens + 1)), n_tokens, SamplingParams(max_tokens=64))


def test_try_append_all_takes_one_block_per_sequence_starting_one_or_nothing():
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    seqs = [_seq(0, 4), _seq(1, 5), _seq(2, 8)]
    for s in seqs:
        bm.allocate(s)
    assert bm.num_free_blocks == 1
    for s in seqs:
        s.append_token(9, -1.0)  # seq 0 and seq 2 now start a new block, seq 1 does not
    before = [list(s.block_table) for s in seqs]
    assert not bm.try_append_all(seqs)  # 2 needed, 1 free: nothing changes
    assert [s.block_table for s in seqs] == before and bm.num_free_blocks == 1
    bm.deallocate(seqs.pop(1))  # frees 2 blocks
    assert bm.try_append_all(seqs)
    assert [len(s.block_table) for s in seqs] == [2, 3] and bm.num_free_blocks == 1
    assert bm.try_append_all(seqs) and bm.num_free_blocks == 1  # no token appended: nothing needed


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_decode_available(torch.device("cuda")),
                    reason="the Triton decode kernel needs CUDA and triton")
def test_triton_decode_reads_column_major_block_tables():
    torch.manual_seed(5)
    dev = torch.device("cuda")
    nb, bs, B, H, kvh, D = 200, 16, 6, 8, 2, 64
    k_cache = torch.randn(nb, bs, kvh, D, device=dev)
    v_cache = torch.randn_like(k_cache)
    tables = torch.stack([torch.randperm(nb, device=dev)[:20] for _ in range(B)])
    strided = tables.t().contiguous().t()  # [B, W] with strides (1, B), as DecodeGraphs stages them
    assert strided.stride() == (1, B)
    ctx = torch.tensor([1, 16, 17, 100, 250, 320], device=dev)
    q = torch.randn(B, H, D, device=dev)
    ref = sdpa_decode(q, k_cache, v_cache, tables, ctx, 1 / math.sqrt(D), None)
    out = triton_paged_decode(q, k_cache, v_cache, strided, ctx, 1 / math.sqrt(D), None)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def _generate(runner: ModelRunner, seq: Sequence, new_tokens: int) -> None:
    for i in range(new_tokens):
        tokens, logprobs = runner.run([seq], i == 0)
        seq.append_token(tokens[0], logprobs[0])


def _block_state(bm: BlockManager) -> tuple:
    return list(bm._free), dict(bm._cached), list(bm.ref_count), list(bm._digest), list(bm._tokens)


def test_try_append_all_registers_and_takes_exactly_like_may_append_one_by_one():
    """The batched decode path (inlined block counts, skipped no-op registrations) against the per-sequence one,
    with twin sequences whose identical blocks race for the same digest."""
    managers = [BlockManager(num_blocks=40, block_size=4), BlockManager(num_blocks=40, block_size=4)]
    batches = []
    for bm in managers:
        prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [7] * 9, [8, 9]]
        seqs = [Sequence(i, f"r{i}", list(p), len(p), SamplingParams(max_tokens=64)) for i, p in enumerate(prompts)]
        for s in seqs:
            bm.allocate(s)
        batches.append(seqs)
    for burst in range(6):
        lookaheads = [1 + (burst + i) % 4 for i in range(4)]
        batched, single = batches
        assert managers[0].try_append_all(batched, lookaheads)
        for s, n in zip(single, lookaheads):
            managers[1].may_append(s, n)
        assert [s.block_table for s in batched] == [s.block_table for s in single]
        assert _block_state(managers[0]) == _block_state(managers[1])
        for seqs in batches:
            for i, (s, n) in enumerate(zip(seqs, lookaheads)):
                for j in range(n):
                    s.append_token(10 + (j if i < 2 else i), -1.0)  # the twins (0 and 1) sample the same tokens
    assert managers[0]._cached  # generated blocks were registered


def _reference_plan(seqs: list[Sequence], steps: list[int], bs: int, nb: int) -> dict[str, list]:
    width = max((s.num_tokens - 2 + k) // bs + 1 for s, k in zip(seqs, steps))
    tables = [[s.block_table[w] if w <= (s.num_tokens - 2 + k) // bs else nb for w in range(width)]
              for s, k in zip(seqs, steps)]
    positions, slots = [], []
    for j in range(max(steps)):
        pos = [min(s.num_tokens - 1 + j, s.num_tokens - 2 + k) for s, k in zip(seqs, steps)]
        positions.append(pos)
        slots.append([t[p // bs] * bs + p % bs if j < k else nb * bs for t, p, k in zip(tables, pos, steps)])
    return {"ids": [s.token_ids[-1] for s in seqs], "positions": positions, "slots": slots,
            "context_lens": [[p + 1 for p in row] for row in positions], "tables": tables}


def test_decode_plan_matches_a_per_row_reference():
    bs, nb = 4, 30
    seqs = [_seq(0, 1), _seq(1, 7), _seq(2, 12), _seq(3, 4)]
    steps = [3, 1, 4, 2]
    tables = [[5], [9, 2, 11], [0, 1, 3, 4], [20, 21, 22]]  # row 3 holds one block more than the burst needs
    for s, t in zip(seqs, tables):
        s.block_table = t
    plan = build_decode_plan(seqs, steps, bs, nb, max_model_len=64)
    got = {k: getattr(plan, k).tolist() for k in ("ids", "positions", "slots", "context_lens", "tables")}
    assert got == _reference_plan(seqs, steps, bs, nb)
    assert all(getattr(plan, k).dtype == np.int64 and getattr(plan, k).flags.writeable
               for k in ("ids", "positions", "slots", "context_lens", "tables"))
    assert plan.steps == steps


def test_decode_plan_names_the_sequence_with_a_short_table_or_a_bad_block():
    seqs = [_seq(0, 5), _seq(1, 5)]
    seqs[0].block_table = [0, 1]
    seqs[1].block_table = [2]  # 5 tokens + 1 step write position 4: needs 2 blocks of 4
    with pytest.raises(ValueError, match=r"sequence 1 has 5 tokens and 1 decode steps but only 1 blocks of 4"):
        build_decode_plan(seqs, [1, 1], 4, 10, 64)
    seqs[1].block_table = [2, 10]
    with pytest.raises(ValueError, match=r"sequence 1 has block ids outside \[0, 10\)"):
        build_decode_plan(seqs, [1, 1], 4, 10, 64)
    seqs[1].block_table = [2, 3, -1]  # beyond the burst's width: never read, so not an error
    assert build_decode_plan(seqs, [1, 1], 4, 10, 64).tables.tolist() == [[0, 1], [2, 3]]


class _NullRunner:
    """Samples token 5 with log-prob 0 at every step; builds the decode plan as the real runner does."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def free_kv_cache(self, keep_graphs: bool = False) -> None:
        pass

    def num_blocks_that_fit(self, block_size: int, gpu_memory_utilization: float) -> int:
        return 0

    def bytes_per_block(self) -> int:
        return 1024

    def weights_version(self) -> int:
        return 0

    pairs_tandem_forwards = False

    def launch(self, plan: StepPlan) -> _Done:
        if not plan.is_prefill:
            build_decode_plan(plan.seqs, plan.num_tokens, self.block_size, self.num_blocks, 4096)
        return _Done(StepOutput([[5] * k for k in plan.num_tokens], [[0.0] * k for k in plan.num_tokens]))


class _Done(NamedTuple):
    output: StepOutput

    def result(self) -> StepOutput:
        return self.output


def test_null_runner_bursts_fill_to_max_tokens_and_publish_generated_blocks():
    """The burst fast paths end to end: every completion runs to max_tokens, and the blocks decode bursts
    completed serve a later prompt that continues one of them."""
    config = EngineConfig(block_size=4, num_blocks=200, decode_steps=8, max_num_seqs=8)
    engine = LLMEngine(_NullRunner(4), None, config, eos_ids=[2])
    params = SamplingParams(max_tokens=21, ignore_eos=True)
    out = engine.generate([Request(f"r{i}", [10 + i] * 6, params) for i in range(8)])
    assert [len(r.completion_ids) for r in out] == [21] * 8 and {r.finish_reason for r in out} == {"length"}
    assert all(r.completion_ids == [5] * 21 and r.logprobs == [0.0] * 21 for r in out)
    assert engine.stats()["decode_tokens"] == 8 * 20  # the prefill samples the first token
    follow_up = Request("again", out[0].prompt_ids + out[0].completion_ids, SamplingParams(max_tokens=1))
    engine.generate([follow_up])
    # 27 tokens, blocks of 4: blocks 0..5 hold computed K/V (the last token's is never computed); those the
    # bursts filled were registered by later decode schedules or, the last ones, when the sequence finished
    assert engine.stats()["prefix_cache_hit_blocks"] == 6
