"""Micro-batches by token budget: every row once, no micro-batch over max(budget, its longest row); packing and
the padded fallback's notice; the config's two ways of sizing micro-batches."""

import random
import warnings

import pytest
import torch
from torch import nn

from tandemrl.config import ConfigError, load_config
from tandemrl.train.batch import build_batch
from tandemrl.train.micro_batches import MicroBatchLimits, micro_batches, plan_micro_batches
from tandemrl.models.varlen_kernel import VarlenAttentionError
from tandemrl.train.packed_support import packs_sequences
from tandemrl.train.packing import pack, padded_tokens
from tandemrl.types import Rollout


def _lognormal_lengths(rows: int, seed: int, cap: int = 4096) -> list[int]:
    rng = random.Random(seed)
    return [min(cap, int(rng.lognormvariate(6.4, 1.0))) + rng.randint(20, 200) for _ in range(rows)]


@pytest.mark.parametrize("budget", [1, 512, 2048, 8192, 100_000])
@pytest.mark.parametrize("seed", range(4))
def test_token_budget_holds_and_every_row_is_packed_once(budget, seed):
    lengths = _lognormal_lengths(256, seed)
    plan = plan_micro_batches(lengths, MicroBatchLimits(max_tokens=budget))
    assert sorted(r for rows in plan for r in rows) == list(range(len(lengths)))
    for rows in plan:
        tokens = sum(lengths[r] for r in rows)
        assert tokens <= max(budget, max(lengths[r] for r in rows))
        if tokens > budget:
            assert len(rows) == 1  # only a row longer than the budget exceeds it, alone


def test_memory_stays_flat_as_the_tail_grows():
    """The largest micro-batch is bounded by max(budget, longest row) whatever the tail; the count grows instead."""
    budget = 8192
    for cap in (512, 1024, 2048, 4096, 8192):
        lengths = _lognormal_lengths(256, seed=0, cap=cap)
        plan = plan_micro_batches(lengths, MicroBatchLimits(max_tokens=budget))
        assert max(sum(lengths[r] for r in rows) for rows in plan) <= max(budget, max(lengths))


def test_first_fit_decreasing_fills_micro_batches_and_row_counts_keep_order():
    assert plan_micro_batches([5, 3, 8, 2, 2], MicroBatchLimits(max_tokens=10)) == [[2, 3], [0, 1, 4]]
    assert plan_micro_batches([12, 1], MicroBatchLimits(max_tokens=10)) == [[0], [1]]
    assert plan_micro_batches([5, 3, 8, 2, 2], MicroBatchLimits(max_tokens=10, max_rows=2)) == [[0, 1], [2, 3], [4]]


def test_packing_drops_the_padding_and_restarts_positions():
    rollouts = [Rollout("a", [5, 6], [7, 8, 9], [-1.0] * 3, "stop"), Rollout("b", [4], [3], [-1.0], "stop")]
    batch = build_batch(rollouts, torch.zeros(2), pad_id=0, device=torch.device("cpu"))
    packed = pack(batch)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    assert packed.source.tolist() == [1, 2, 3, 5]  # the state before each completion token
    assert packed.targets.tolist() == [7, 8, 9, 3]
    lengths = batch.sequence_lengths().tolist()
    assert lengths == [5, 2] and padded_tokens(lengths, [[0, 1]]) == 10 and padded_tokens(lengths, [[0], [1]]) == 7


def test_fillers_carry_no_loss_weight():
    rollouts = [Rollout(str(i), [1, 2], [3] * (i + 1), [], "stop") for i in range(3)]
    batch = build_batch(rollouts, torch.zeros(3), pad_id=0, device=torch.device("cpu"))
    calls = iter([True, True, True, False])
    parts = list(micro_batches(batch, MicroBatchLimits(max_tokens=100), any_rank=lambda more: next(calls)))
    assert [p.is_filler for p in parts] == [False, True, True]
    assert parts[0].rows.tolist() == [0, 1, 2] and not parts[1].batch.loss_mask.any()


class _RemoteCodeLM(nn.Module):
    """A causal LM from outside transformers: nothing says its attention confines packed sequences."""

    def __init__(self, attn_implementation: str = "eager"):
        super().__init__()
        self.decoder, self.embed = nn.Identity(), nn.Embedding(4, 2)
        self.config = type("Config", (), {"_attn_implementation": attn_implementation})()

    def get_decoder(self):
        return self.decoder

    def get_input_embeddings(self):
        return self.embed


def test_a_model_that_cannot_take_packed_input_falls_back_and_says_so_once():
    model = _RemoteCodeLM()
    with pytest.warns(UserWarning, match="runs on padded rows"):
        assert not packs_sequences(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not packs_sequences(model)


def test_varlen_attention_is_refused_for_a_model_that_cannot_take_packed_input():
    with pytest.raises(VarlenAttentionError, match="model.attn_implementation = 'varlen'.*_RemoteCodeLM"):
        packs_sequences(_RemoteCodeLM("varlen"))


def test_micro_batch_size_and_token_budget_are_one_or_the_other():
    assert load_config(None, []).train.micro_batch_size is None
    assert load_config(None, ["train.micro_batch_size=4"]).train.micro_batch_size == 4
    with pytest.raises(ConfigError, match="set one of them"):
        load_config(None, ["train.micro_batch_size=4", "train.max_tokens_per_micro_batch=2048"])
    # a run's config.toml writes the default budget beside a micro_batch_size: that is not 'both set'
    assert load_config(None, ["train.micro_batch_size=4", "train.max_tokens_per_micro_batch=16384"])


@pytest.mark.parametrize("seed", range(4))
def test_padded_budget_bounds_rows_times_the_widest_prompt_plus_the_widest_completion(seed):
    """Where a forward may run on padded rows, the budget holds for the positions it computes, not the tokens."""
    rng = random.Random(seed)
    prompts = [rng.randint(20, 200) for _ in range(128)]
    lengths = [p + (512 if rng.random() < 0.15 else rng.randint(1, 250)) for p in prompts]
    budget = 4096
    plan = plan_micro_batches(lengths, MicroBatchLimits(max_tokens=budget, padded=True), prompts)
    assert sorted(r for rows in plan for r in rows) == list(range(len(lengths)))
    for rows in plan:
        width = max(prompts[r] for r in rows) + max(lengths[r] - prompts[r] for r in rows)
        assert len(rows) * width <= budget or len(rows) == 1


def test_a_micro_batch_keeps_only_its_own_columns():
    rollouts = [Rollout("a", [5, 6, 7], [8], [-1.0], "stop"), Rollout("b", [4], [3, 2, 1, 9], [-1.0] * 4, "stop"),
                Rollout("c", [4, 4], [3], [-1.0], "stop")]
    batch = build_batch(rollouts, torch.zeros(3), pad_id=0, device=torch.device("cpu"))
    batch.old_logprobs = batch.rollout_logprobs - 1.0
    parts = list(micro_batches(batch, MicroBatchLimits(max_tokens=8, padded=True)))
    assert [p.rows.tolist() for p in parts] == [[1], [0, 2]]
    long_row, short_rows = parts[0].batch, parts[1].batch
    assert long_row.input_ids.tolist() == [[4, 3, 2, 1, 9]] and long_row.prompt_width == 1
    assert short_rows.input_ids.tolist() == [[5, 6, 7, 8], [0, 4, 4, 3]] and short_rows.prompt_width == 3
    assert short_rows.position_ids.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]
    assert short_rows.completion_ids.tolist() == [[8], [3]] and short_rows.old_logprobs.tolist() == [[-2.0], [-2.0]]
