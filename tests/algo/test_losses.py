import math

import pytest
import torch

from tandemrl.algo import (
    AGGREGATIONS, POLICY_LOSSES, BatchNorm, LossConfig, LossInputs, accumulate_metrics, grpo_loss, k3_kl,
    tis_weights,
)

D = torch.float64


def _t(xs):
    return torch.tensor(xs, dtype=D)


# ----------------------------------------------------------------------------------- aggregations

PER_TOKEN = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


def _agg(name, mask, norm=None, max_len=None):
    norm = norm or BatchNorm.from_masks([mask], max_len)
    return AGGREGATIONS.get(name)(PER_TOKEN, mask, norm).item()


def test_aggregations_binary_mask_by_hand():
    mask = _t([[1, 1, 1], [1, 1, 0]])
    assert _agg("token-mean", mask) == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)  # 3.0
    assert _agg("seq-mean-token-mean", mask) == pytest.approx((6 / 3 + 9 / 2) / 2)  # 3.25
    assert _agg("seq-mean-token-sum-norm", mask, max_len=4) == pytest.approx((6 / 4 + 9 / 4) / 2)  # 1.875


def test_aggregations_fractional_mask_by_hand():
    mask = _t([[1, 0.5, 0], [0.2, 1, 1]])  # total weight 3.7
    # weighted sums per sequence: 1 + 1 = 2 ; 0.8 + 5 + 6 = 11.8
    assert _agg("token-mean", mask) == pytest.approx(13.8 / 3.7)
    assert _agg("seq-mean-token-mean", mask) == pytest.approx((2 / 1.5 + 11.8 / 2.2) / 2)
    # max_len defaults to the mask width (3)
    assert _agg("seq-mean-token-sum-norm", mask) == pytest.approx((2 / 3 + 11.8 / 3) / 2)


def test_aggregations_use_the_minibatch_norm():
    mask = _t([[1, 1, 1], [1, 1, 0]])
    norm = BatchNorm(total_tokens=10.0, num_sequences=4, max_completion_length=4)
    assert _agg("token-mean", mask, norm) == pytest.approx(15 / 10)
    assert _agg("seq-mean-token-mean", mask, norm) == pytest.approx((2 + 4.5) / 4)
    assert _agg("seq-mean-token-sum-norm", mask, norm) == pytest.approx((6 / 4 + 9 / 4) / 4)


def test_batchnorm_from_masks():
    masks = [_t([[1, 1, 0], [0, 0, 0]]), _t([[0.2, 1, 1, 1]])]
    n = BatchNorm.from_masks(masks, max_len=16)
    assert n.total_tokens == pytest.approx(5.2)
    assert n.num_sequences == 2  # the all-zero padding row is not a sequence
    assert n.max_completion_length == 16
    assert BatchNorm.from_masks(masks).max_completion_length == 4


# ------------------------------------------------------------------------------------------ clipping


def test_clipping_both_sides_by_hand():
    # eps_low 0.2 -> band [0.8, 1.28] with eps_high 0.28
    #   A=+1 ratio 1.5 -> min(1.5, 1.28)  =  1.28 -> loss -1.28, clipped, grad 0
    #   A=+1 ratio 0.5 -> min(0.5, 0.8)   =  0.5  -> loss -0.5,  grad -ratio*A = -0.5
    #   A=-1 ratio 1.5 -> min(-1.5, -1.28) = -1.5 -> loss +1.5,  grad -ratio*A = +1.5
    #   A=-1 ratio 0.5 -> min(-0.5, -0.8) = -0.8  -> loss +0.8,  clipped, grad 0
    #   A=+2 ratio 1.1 -> in band         =  2.2  -> loss -2.2,  grad -2.2
    ratios = _t([1.5, 0.5, 1.5, 0.5, 1.1])
    old = _t([[-1.0]] * 5)
    logp = (old + ratios.log().unsqueeze(1)).requires_grad_(True)
    adv = _t([1.0, 1.0, -1.0, -1.0, 2.0])
    mask = torch.ones(5, 1, dtype=D)
    cfg = LossConfig(eps_low=0.2, eps_high=0.28)
    out = grpo_loss(LossInputs(logp, old, adv, mask), cfg, BatchNorm.from_masks([mask]))
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 + 1.5 + 0.8 - 2.2) / 5)
    out.loss.backward()
    torch.testing.assert_close(logp.grad, _t([[0.0], [-0.5], [1.5], [0.0], [-2.2]]) / 5)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5)
    assert out.metrics["ratio_mean"] == pytest.approx(5.1 / 5)
    assert out.metrics["pg_loss"] == pytest.approx(out.loss.item())
    assert out.metrics["kl"] == 0.0


def test_clip_frac_is_mask_weighted():
    old = torch.zeros(2, 1, dtype=D)
    logp = _t([[math.log(1.5)], [0.0]])  # first clipped (A>0, ratio above band), second not
    mask = _t([[0.2], [1.0]])
    out = grpo_loss(LossInputs(logp, old, _t([1.0, 1.0]), mask), LossConfig(), BatchNorm.from_masks([mask]))
    assert out.metrics["clip_frac"] == pytest.approx(0.2 / 1.2)


def test_clip_ratio_low_and_high_by_hand():
    # TRL's clip_ratio/low_mean: r < 1-eps_low with A < 0; high_mean: r > 1+eps_high with A > 0. A ratio outside
    # the band whose advantage has the other sign is not clipped (the unclipped term is the minimum there).
    ratios = _t([0.5, 0.5, 0.5, 1.5, 1.5, 1.0])
    adv = _t([-1.0, -1.0, 1.0, 1.0, -1.0, 1.0])
    old = torch.zeros(6, 1, dtype=D)
    mask = _t([[1.0], [0.5], [1.0], [1.0], [1.0], [1.0]])
    out = grpo_loss(LossInputs(ratios.log().unsqueeze(1), old, adv, mask), LossConfig(eps_low=0.2, eps_high=0.28),
                    BatchNorm.from_masks([mask]))
    assert out.metrics["clip_ratio/low_mean"] == pytest.approx(1.5 / 5.5)
    assert out.metrics["clip_ratio/high_mean"] == pytest.approx(1.0 / 5.5)
    assert out.metrics["clip_frac"] == pytest.approx(2.5 / 5.5)


# ----------------------------------------------------------------------------------------------- KL


def test_k3_values():
    # d = ref - logp;  k3 = exp(d) - d - 1
    torch.testing.assert_close(k3_kl(_t([-1.0]), _t([-2.0])), _t([math.exp(-1) + 1 - 1]))  # d=-1: 0.3679
    torch.testing.assert_close(k3_kl(_t([-2.0]), _t([-1.0])), _t([math.e - 2]))  # d=+1: 0.7183
    torch.testing.assert_close(k3_kl(_t([-3.0]), _t([-3.0])), _t([0.0]))


def test_kl_term_in_loss_and_metric():
    logp = _t([[-1.0, -2.0, -5.0]]).requires_grad_(True)
    ref = _t([[-2.0, -1.0, 0.0]])
    mask = _t([[1.0, 1.0, 0.0]])  # third token masked out
    adv = _t([0.0])  # no policy-gradient term; ratio 1
    k = [math.exp(-1), math.e - 2]
    norm = BatchNorm.from_masks([mask])
    out = grpo_loss(LossInputs(logp, logp.detach(), adv, mask, ref), LossConfig(kl_beta=0.5), norm)
    assert out.metrics["kl"] == pytest.approx(sum(k) / 2)
    assert out.loss.item() == pytest.approx(0.5 * sum(k) / 2)
    out.loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp)
    torch.testing.assert_close(logp.grad, _t([[0.5 * (1 - math.exp(-1)) / 2, 0.5 * (1 - math.e) / 2, 0.0]]))
    # beta 0: the metric is still reported, the loss has no KL term
    out0 = grpo_loss(LossInputs(logp, logp.detach(), adv, mask, ref), LossConfig(kl_beta=0.0), norm)
    assert out0.metrics["kl"] == pytest.approx(sum(k) / 2)
    assert out0.loss.item() == 0.0


@pytest.mark.parametrize("tis_cap", [0.0, 2.0])
def test_padding_garbage_does_not_leak(tis_cap):
    nan, inf = float("nan"), float("inf")
    logp = _t([[-1.0, nan, -inf, -1.0, -1.0]]).requires_grad_(True)
    old = _t([[-1.2, -inf, nan, -1.0, -1.0]])
    ref = _t([[-0.5, nan, inf, -1.0, -1.0]])
    rollout = _t([[-1.1, nan, inf, -inf, nan]])  # the last two: finite train log-probs, garbage from the engine
    mask = _t([[1.0, 0.0, 0.0, 0.0, 0.0]])
    for agg in AGGREGATIONS.names():
        logp.grad = None
        cfg = LossConfig(kl_beta=0.1, aggregation=agg, tis_cap=tis_cap)
        out = grpo_loss(LossInputs(logp, old, _t([1.0]), mask, ref, rollout), cfg, BatchNorm.from_masks([mask]))
        out.loss.backward()
        assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all(), agg
        assert all(math.isfinite(v) for v in out.metrics.values()), agg
        assert logp.grad[0, 1:].abs().sum() == 0
        assert out.metrics["mismatch/logp_abs_max"] == pytest.approx(0.1)  # only the one unmasked token


def test_config_validate():
    LossConfig().validate()
    LossConfig(tis_cap=2.0).validate()
    with pytest.raises(ValueError, match="valid choices"):
        LossConfig(aggregation="nope").validate()
    with pytest.raises(ValueError):
        LossConfig(eps_low=1.0).validate()
    with pytest.raises(ValueError, match="tis_cap"):
        LossConfig(tis_cap=-0.5).validate()


# --------------------------------------------------------- rollout log-probs: TIS and the mismatch

# logp_old - logp_rollout per token: 0.5, 0, -0.5, -1  ->  exp: 1.6487, 1, 0.6065, 0.3679
TIS_OLD = _t([[-1.0, -1.0, -1.0, -2.0]])
TIS_ROLLOUT = _t([[-1.5, -1.0, -0.5, -1.0]])


def test_tis_weights_by_hand():
    gap = TIS_OLD - TIS_ROLLOUT
    raw = [math.exp(0.5), 1.0, math.exp(-0.5), math.exp(-1.0)]
    torch.testing.assert_close(tis_weights(gap, 1.5), _t([[1.5, 1.0, raw[2], raw[3]]]))  # binds on the first only
    torch.testing.assert_close(tis_weights(gap, 2.0), _t([raw]))  # never binds
    torch.testing.assert_close(tis_weights(gap, 0.5), _t([[0.5, 0.5, 0.5, raw[3]]]))


def test_tis_scales_each_tokens_surrogate_and_gradient():
    # On-policy (ratio 1, inside the clip band), A = +1: per-token loss -w, d loss / d logp = -w * mask / total.
    logp = TIS_OLD.clone().requires_grad_(True)
    mask = _t([[1.0, 1.0, 0.2, 1.0]])  # total weight 3.2
    w = [1.5, 1.0, math.exp(-0.5), math.exp(-1.0)]
    cfg = LossConfig(tis_cap=1.5)
    out = grpo_loss(LossInputs(logp, TIS_OLD, _t([1.0]), mask, rollout_logprobs=TIS_ROLLOUT), cfg,
                    BatchNorm.from_masks([mask]))
    weighted = [wi * mi for wi, mi in zip(w, [1.0, 1.0, 0.2, 1.0])]
    assert out.loss.item() == pytest.approx(-sum(weighted) / 3.2)
    out.loss.backward()
    torch.testing.assert_close(logp.grad, _t([weighted]) * -1 / 3.2)
    assert out.metrics["tis/weight_mean"] == pytest.approx(sum(weighted) / 3.2)
    assert out.metrics["tis/clip_frac"] == pytest.approx(1 / 3.2)
    assert out.metrics["pg_loss"] == pytest.approx(out.loss.item())


def test_tis_mask_mode_keeps_weights_inside_the_band_and_drops_the_rest():
    gap = TIS_OLD - TIS_ROLLOUT  # w = 1.6487, 1, 0.6065, 0.3679
    raw = [math.exp(0.5), 1.0, math.exp(-0.5), math.exp(-1.0)]
    # cap 1.5: band [0.667, 1.5] keeps only w = 1; cap 2.0: band [0.5, 2] drops only 0.3679
    torch.testing.assert_close(tis_weights(gap, 1.5, "mask"), _t([[0.0, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(tis_weights(gap, 2.0, "mask"), _t([[raw[0], 1.0, raw[2], 0.0]]))
    logp = TIS_OLD.clone().requires_grad_(True)
    mask = _t([[1.0, 1.0, 0.2, 1.0]])
    out = grpo_loss(LossInputs(logp, TIS_OLD, _t([1.0]), mask, rollout_logprobs=TIS_ROLLOUT),
                    LossConfig(tis_cap=2.0, tis_mode="mask"), BatchNorm.from_masks([mask]))
    out.loss.backward()
    torch.testing.assert_close(logp.grad, _t([[raw[0], 1.0, raw[2] * 0.2, 0.0]]) * -1 / 3.2)  # the masked token: 0
    assert out.metrics["tis/clip_frac"] == pytest.approx(1 / 3.2)  # the one masked token's weight share
    with pytest.raises(ValueError, match="tis_mode"):
        LossConfig(tis_cap=2.0, tis_mode="clip").validate()


def test_tis_off_gives_exactly_the_loss_without_rollout_logprobs():
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(3, 5, generator=g, dtype=D) * 3
    logp0 = old + 0.3 * torch.randn(3, 5, generator=g, dtype=D)
    rollout = old + 0.5 * torch.randn(3, 5, generator=g, dtype=D)
    adv, mask = torch.randn(3, generator=g, dtype=D), (torch.rand(3, 5, generator=g) > 0.3).to(D)
    norm = BatchNorm.from_masks([mask])
    results = []
    for rollout_logprobs, cap in ((None, 0.0), (rollout, 0.0), (rollout, 2.0)):
        logp = logp0.clone().requires_grad_(True)
        out = grpo_loss(LossInputs(logp, old, adv, mask, None, rollout_logprobs), LossConfig(tis_cap=cap), norm)
        out.loss.backward()
        results.append((out.loss.detach(), logp.grad, out.metrics))
    (plain, plain_grad, plain_m), (off, off_grad, off_m), (on, _, on_m) = results
    assert torch.equal(plain, off) and torch.equal(plain_grad, off_grad)
    assert not torch.equal(plain, on)  # the comparison can tell TIS on from off
    assert {k: off_m[k] for k in plain_m} == plain_m
    assert set(off_m) - set(plain_m) == {"mismatch/logp_abs_mean", "mismatch/logp_abs_max"}
    assert set(on_m) - set(off_m) == {"tis/weight_mean", "tis/clip_frac"}


def test_tis_without_rollout_logprobs_is_refused():
    mask = torch.ones(1, 4, dtype=D)
    with pytest.raises(ValueError, match="tis_cap > 0 needs rollout_logprobs"):
        grpo_loss(LossInputs(TIS_OLD, TIS_OLD, _t([1.0]), mask), LossConfig(tis_cap=2.0), BatchNorm.from_masks([mask]))


def test_mismatch_metrics_by_hand_and_over_micro_batches():
    old = _t([[-1.0, -2.0, -3.0], [-0.5, -4.0, float("nan")]])
    rollout = _t([[-1.5, -2.0, -1.0], [-0.5, -3.0, 0.0]])
    mask = _t([[1.0, 0.5, 0.0], [1.0, 1.0, 0.0]])  # the masked |gap| of 2.0 (and the NaN) must not count
    norm = BatchNorm.from_masks([mask])  # total weight 3.5

    def metrics(rows):
        inputs = LossInputs(old[rows], old[rows], _t([1.0, -1.0])[rows], mask[rows], rollout_logprobs=rollout[rows])
        return grpo_loss(inputs, LossConfig(), norm).metrics

    whole = metrics(slice(0, 2))
    assert whole["mismatch/logp_abs_mean"] == pytest.approx((0.5 * 1 + 0 * 0.5 + 0 * 1 + 1.0 * 1) / 3.5)
    assert whole["mismatch/logp_abs_max"] == pytest.approx(1.0)
    split: dict[str, torch.Tensor] = {}
    for row in (slice(1, 2), slice(0, 1)):  # shares add up; the maximum is the max, not the sum (1.0 + 0.5)
        accumulate_metrics(split, metrics(row))
    assert {k: float(v) for k, v in split.items()} == pytest.approx({k: float(v) for k, v in whole.items()})


# ----------------------------------------------------------- THE INVARIANT: accumulation is exact

V, H, B, T = 11, 5, 8, 7
LENGTHS = [7, 3, 5, 1, 6, 2, 7, 4]


def _setup():
    g = torch.Generator().manual_seed(1234)
    feats = torch.randn(B, T, H, generator=g, dtype=D)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=D)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    mask[1, 0] = 0.2  # a fractional weight (token written by a frozen model)
    mask[4, 2:4] = 0.2
    adv = torch.randn(B, generator=g, dtype=D)
    old_noise = 0.3 * torch.randn(B, T, generator=g, dtype=D)  # old policy differs -> some clipping
    ref_noise = 0.3 * torch.randn(B, T, generator=g, dtype=D)
    rollout_noise = 0.3 * torch.randn(B, T, generator=g, dtype=D)  # the engine differs -> the TIS cap binds
    return feats, tokens, mask, adv, old_noise, ref_noise, rollout_noise


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(H, V, dtype=D)


def _logprobs(model, feats, tokens):
    return torch.log_softmax(model(feats), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _run(micro_batches, aggregation, tis_cap=0.0):
    """One optimizer step over the mini-batch split as given; returns (grads, params after AdamW, metrics)."""
    feats, tokens, mask, adv, old_noise, ref_noise, rollout_noise = _setup()
    model = _model()
    with torch.no_grad():
        base = _logprobs(model, feats, tokens)
    old, ref, rollout = base + old_noise, base + ref_noise, base + old_noise + rollout_noise
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    cfg = LossConfig(eps_low=0.2, eps_high=0.28, kl_beta=0.05, aggregation=aggregation, max_completion_length=10,
                     tis_cap=tis_cap)
    # each micro-batch is trimmed to its own longest sequence, as a real trainer pads per micro-batch
    slices = []
    for idx in micro_batches:
        w = max(LENGTHS[i] for i in idx)
        slices.append((idx, w))
    norm = BatchNorm.from_masks([mask[idx, :w] for idx, w in slices], cfg.max_completion_length)
    opt.zero_grad()
    metrics: dict[str, torch.Tensor] = {}
    for idx, w in slices:
        lp = _logprobs(model, feats[idx, :w], tokens[idx, :w])
        inp = LossInputs(lp, old[idx, :w], adv[idx], mask[idx, :w], ref[idx, :w], rollout[idx, :w])
        out = POLICY_LOSSES.get("grpo")(inp, cfg, norm)
        out.loss.backward()
        accumulate_metrics(metrics, out.metrics)
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return grads, [p.detach().clone() for p in model.parameters()], {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("tis_cap", [0.0, 1.2])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grad_accumulation_is_exact(aggregation, tis_cap):
    g1, p1, m1 = _run([list(range(B))], aggregation, tis_cap)
    g8, p8, m8 = _run([[i] for i in range(B)], aggregation, tis_cap)
    g2, p2, m2 = _run([[0, 5, 2], [7, 1, 3, 4], [6]], aggregation, tis_cap)
    for a, b, c in zip(g1, g8, g2):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        torch.testing.assert_close(a, c, atol=1e-6, rtol=0)
    for a, b, c in zip(p1, p8, p2):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        torch.testing.assert_close(a, c, atol=1e-6, rtol=0)
    tis = {"tis/weight_mean", "tis/clip_frac"} if tis_cap else set()
    assert m1.keys() == {"pg_loss", "clip_frac", "clip_ratio/low_mean", "clip_ratio/high_mean", "kl", "ratio_mean",
                         "mismatch/logp_abs_mean", "mismatch/logp_abs_max"} | tis
    assert 0 < m1["clip_frac"] < 1 and m1["kl"] > 0 and m1["mismatch/logp_abs_max"] > m1["mismatch/logp_abs_mean"]
    if tis_cap:
        assert 0 < m1["tis/clip_frac"] < 1
    for k in m1:
        assert m8[k] == pytest.approx(m1[k], abs=1e-9), k
        assert m2[k] == pytest.approx(m1[k], abs=1e-9), k
