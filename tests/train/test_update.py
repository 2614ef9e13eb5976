"""How policy_update combines per-mini-batch metrics over its optimizer steps."""

import pytest

from tandemrl.train.update import _MeanOf


def test_metrics_over_steps_average_shares_and_keep_maxima():
    over_steps = _MeanOf()
    over_steps.add({"kl": 0.25, "mismatch/logp_abs_mean": 0.1, "mismatch/logp_abs_max": 0.5})
    over_steps.add({"kl": 0.75, "mismatch/logp_abs_mean": 0.3, "mismatch/logp_abs_max": 0.25})
    assert over_steps.means() == pytest.approx({"kl": 0.5, "mismatch/logp_abs_mean": 0.2,
                                                "mismatch/logp_abs_max": 0.5})


# ------------------------------------------------------------------------ packed update == padded update

import random

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

import tandemrl.models.varlen_attention as varlen_attention
from tandemrl.config import TrainConfig
from tandemrl.models.varlen_attention import VARLEN, register_varlen_attention
from tandemrl.train.batch import build_batch
from tandemrl.train.logprobs import batch_logprobs, completion_logprobs
from tandemrl.train.packed_support import _VERDICT, ALWAYS_PACK
from tandemrl.train.update import policy_update
from tandemrl.types import Rollout

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
MAX_COMPLETION = 9
TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)


def _model(family: str = "qwen2", packed: bool = True, attn: str = "sdpa"):
    """TINY: 4 query heads share 2 kv heads (grouped-query attention, as Qwen2.5's 14 and 2)."""
    torch.manual_seed(0)
    config = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config}[family](**TINY)
    register_varlen_attention()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)
    if not packed:
        setattr(model, _VERDICT, False)  # what a model whose attention cannot take packed input gets
    else:
        setattr(model, ALWAYS_PACK, True)  # these rows are short: sdpa's cost rule alone would keep them padded
    return model


def _batch(seed: int = 0, rows: int = 10, empty_completion: bool = False):
    """Long-tailed completions, prompts of different lengths, fractional loss weights, rollout log-probs."""
    rng = random.Random(seed)
    rollouts = []
    for i in range(rows):
        prompt = [rng.randrange(1, 97) for _ in range(rng.randint(1, 6))]
        length = 0 if empty_completion and i == 3 else min(MAX_COMPLETION, int(rng.lognormvariate(1.0, 0.8)) + 1)
        completion = [rng.randrange(1, 97) for _ in range(length)]
        rollouts.append(Rollout(f"r{i}", prompt, completion, [-rng.uniform(0.5, 4.0) for _ in completion], "stop",
                                loss_weights=[rng.choice([1.0, 1.0, 0.2]) for _ in completion]))
    advantages = torch.tensor([rng.uniform(-1.5, 1.5) for _ in range(rows)])
    return build_batch(rollouts, advantages, pad_id=0, device=torch.device("cpu"))


def _update_delta(model, batch, **train) -> dict[str, torch.Tensor]:
    """The parameter change of one plain-SGD step (lr 1, no clipping): minus the accumulated gradient."""
    cfg = TrainConfig(lr=1.0, max_grad_norm=1e9, tis_cap=2.0, **train)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    result = policy_update(model, batch, optimizer, scheduler, cfg, 1.0, MAX_COMPLETION)
    assert result.optimizer_steps == 1
    return {n: p.detach() - before[n] for n, p in model.named_parameters()}


def _assert_same_deltas(a: dict, b: dict) -> None:
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-4, msg=name)


def test_dense_mask_attention_packs_only_where_it_is_cheaper():
    from tandemrl.train.packed_support import packed_is_cheaper

    model = _model(packed=False)
    delattr(model, _VERDICT)  # detect afresh: a transformers Qwen2 packs
    short = build_batch([Rollout(f"r{i}", [1, 2], [3, 4], [0.0, 0.0], "stop") for i in range(64)], torch.zeros(64),
                        pad_id=0, device=torch.device("cpu"))
    lengths = [60, 2, 2, 2]  # one long row: padding would compute 4 x 61^2, packing 67^2
    tail = build_batch([Rollout(f"r{i}", [1], [5] * n, [0.0] * n, "stop") for i, n in enumerate(lengths)],
                       torch.zeros(4), pad_id=0, device=torch.device("cpu"))
    assert not packed_is_cheaper(model, short)  # 64 equal rows: the packed [256 x 256] mask costs more
    assert packed_is_cheaper(model, tail)
    varlen = _model(attn=VARLEN)
    delattr(varlen, ALWAYS_PACK)
    assert packed_is_cheaper(varlen, short)  # no mask to build: varlen packs every micro-batch


@pytest.mark.parametrize("attn", ["sdpa", VARLEN])
@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_packed_logprobs_equal_padded_logprobs(family, attn):
    batch = _batch(seed=1)
    packed = completion_logprobs(_model(family, attn=attn), batch, 0.7, chunk_size=5)
    padded = completion_logprobs(_model(family, packed=False), batch, 0.7, chunk_size=5)
    real = batch.attention_mask[:, batch.prompt_width:].bool()
    torch.testing.assert_close(packed.logprobs[real], padded.logprobs[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.entropy[real], padded.entropy[real], atol=1e-5, rtol=1e-5)
    assert not packed.logprobs[~real].any()  # padding positions are 0, never garbage


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_packed_update_equals_padded_update(aggregation):
    batch = _batch(seed=2)
    batch.ref_logprobs = batch.rollout_logprobs - 0.1  # the KL term's path too
    packed = _update_delta(_model(), batch, aggregation=aggregation, kl_beta=0.1, micro_batch_size=4)
    padded = _update_delta(_model(packed=False), batch, aggregation=aggregation, kl_beta=0.1, micro_batch_size=4)
    _assert_same_deltas(packed, padded)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_the_varlen_packed_update_equals_the_padded_sdpa_update(aggregation, monkeypatch):
    """The update hands the rows' offsets to the varlen attention (it never reads them off the position ids)."""
    monkeypatch.setattr(varlen_attention, "sequences_from_positions", None)
    batch = _batch(seed=2)
    batch.ref_logprobs = batch.rollout_logprobs - 0.1
    varlen = _update_delta(_model(attn=VARLEN), batch, aggregation=aggregation, kl_beta=0.1,
                           max_tokens_per_micro_batch=20)
    padded = _update_delta(_model(packed=False), batch, aggregation=aggregation, kl_beta=0.1, micro_batch_size=4)
    _assert_same_deltas(varlen, padded)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_the_update_does_not_depend_on_the_packing(aggregation):
    """One micro-batch of everything == one row per micro-batch == any token budget == any row count."""
    batch = _batch(seed=3, rows=12)
    one = _update_delta(_model(), batch, aggregation=aggregation, max_tokens_per_micro_batch=10_000)
    for train in ({"max_tokens_per_micro_batch": 1}, {"max_tokens_per_micro_batch": 17},
                  {"max_tokens_per_micro_batch": 40}, {"micro_batch_size": 1}, {"micro_batch_size": 5}):
        _assert_same_deltas(one, _update_delta(_model(), batch, aggregation=aggregation, **train))


def test_mini_batches_and_epochs_with_fixed_old_logprobs_do_not_depend_on_the_packing():
    batch = _batch(seed=4, rows=8)
    batch.old_logprobs = batch_logprobs(_model(), batch, 1.0, TrainConfig(max_tokens_per_micro_batch=13))
    whole = completion_logprobs(_model(), batch, 1.0, chunk_size=1024).logprobs
    torch.testing.assert_close(batch.old_logprobs, whole, atol=1e-6, rtol=1e-5)
    runs = []
    for budget in (1, 25, 10_000):
        model = _model()
        cfg = TrainConfig(lr=1.0, max_grad_norm=1e9, mini_batches=2, epochs_per_batch=2,
                          max_tokens_per_micro_batch=budget)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        assert policy_update(model, batch, optimizer, scheduler, cfg, 1.0, MAX_COMPLETION).optimizer_steps == 4
        runs.append({n: p.detach().clone() for n, p in model.named_parameters()})
    _assert_same_deltas(runs[0], runs[1])
    _assert_same_deltas(runs[0], runs[2])


def test_a_micro_batch_of_empty_completions_still_backpropagates():
    batch = _batch(seed=5, rows=6, empty_completion=True)
    # budget 1: row 3 (no completion token) is a micro-batch of its own
    _assert_same_deltas(_update_delta(_model(), batch, max_tokens_per_micro_batch=1),
                        _update_delta(_model(), batch, max_tokens_per_micro_batch=10_000))


def test_fillers_for_other_ranks_leave_the_update_unchanged():
    """torchrun: a rank out of micro-batches runs fillers (zero loss weight) while any rank has one left."""
    batch = _batch(seed=6, rows=6)
    rounds: list[bool] = []

    def any_rank(flag: bool) -> bool:  # another rank has 3 more micro-batches than this one
        rounds.append(flag)
        return flag or sum(not f for f in rounds) <= 3

    plain = _update_delta(_model(), batch, max_tokens_per_micro_batch=20)
    model = _model()
    cfg = TrainConfig(lr=1.0, max_grad_norm=1e9, tis_cap=2.0, max_tokens_per_micro_batch=20)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    policy_update(model, batch, optimizer, scheduler, cfg, 1.0, MAX_COMPLETION, any_rank=any_rank)
    # 3 fillers, then every rank is done (4 rounds); then the ranks agree that no step is skipped (1 round)
    assert sum(not f for f in rounds) == 5
    _assert_same_deltas(plain, {n: p.detach() - before[n] for n, p in model.named_parameters()})


def test_metrics_kept_on_the_device_add_up_to_the_one_micro_batch_values():
    """Metrics accumulate as device tensors over micro-batches and are read once per step: twelve micro-batches
    report what one micro-batch of everything does (shares summed, the maximum a max), as plain floats."""
    batch = _batch(seed=6, rows=12)
    batch.ref_logprobs = batch.rollout_logprobs - 0.1
    runs = []
    for budget in (10_000, 1):
        cfg = TrainConfig(lr=1.0, max_grad_norm=1e9, tis_cap=2.0, kl_beta=0.1, max_tokens_per_micro_batch=budget)
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        runs.append(policy_update(model, batch, optimizer, scheduler, cfg, 1.0, MAX_COMPLETION).metrics)
    one, twelve = runs
    assert all(type(v) is float for v in twelve.values())
    assert {"loss", "entropy", "pg_loss", "kl", "mismatch/logp_abs_max", "tis/clip_frac"} <= one.keys()
    assert one["mismatch/logp_abs_max"] > one["mismatch/logp_abs_mean"] > 0
    assert twelve == pytest.approx(one, rel=1e-5, abs=1e-7)


def test_no_forward_of_a_dense_mask_model_computes_more_positions_than_the_budget():
    """Issue 39's OOM: sdpa keeps many short rows padded (their packed mask would cost more), and a padded forward
    computed rows x the whole batch's width, 2-3x the token budget once completions grew short and long-tailed.
    Every forward now computes at most max(budget, its one row): padding counts, and a micro-batch is as wide as its
    own rows."""
    rng = random.Random(7)
    lengths = [MAX_COMPLETION * 4] * 3 + [rng.randint(1, 6) for _ in range(120)]  # a few long rows, many short ones
    rollouts = [Rollout(f"r{i}", [rng.randrange(1, 97) for _ in range(rng.randint(2, 8))], [5] * n, [-1.0] * n,
                        "stop") for i, n in enumerate(lengths)]
    batch = build_batch(rollouts, torch.linspace(-1, 1, len(lengths)), pad_id=0, device=torch.device("cpu"))
    model = _model(packed=False)
    delattr(model, _VERDICT)  # a transformers Qwen2 with sdpa: packs where cheaper, else padded rows
    positions: list[tuple[int, int]] = []  # (positions the decoder computed on, rows)
    model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: positions.append((kwargs["input_ids"].numel(), int(kwargs["input_ids"].shape[0]))),
        with_kwargs=True)
    budget = 400
    cfg = TrainConfig(lr=1e-3, max_tokens_per_micro_batch=budget, mini_batches=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batch.old_logprobs = batch_logprobs(model, batch, 1.0, cfg)  # the fixed log-probs' forwards too
    policy_update(model, batch, optimizer, scheduler, cfg, 1.0, 4 * MAX_COMPLETION)
    assert len(positions) > 4
    assert all(computed <= budget or rows == 1 for computed, rows in positions), positions
