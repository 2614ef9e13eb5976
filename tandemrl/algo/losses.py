"""GRPO-family policy losses with gradient-accumulation-exact normalisation.

Normalisers (token counts, sequence counts) are taken over the whole MINI-BATCH, i.e. all micro-batches
that feed one optimizer step, and passed in as a :class:`BatchNorm`. Each micro-batch's loss is then its
exact share of the mini-batch loss: call ``backward()`` on every micro-batch's ``loss`` as is (do NOT divide
by the number of accumulation steps) and the accumulated gradient equals that of one big batch.

Metrics follow the same rule: every value in ``LossOutput.metrics`` is this micro-batch's share of the
mini-batch value, so the mini-batch metric is the plain SUM of the values over its micro-batches (with a
single micro-batch, the values are already the batch values). Token-level metrics (clip_frac, kl,
ratio_mean) are mask-weighted means over the mini-batch's tokens; pg_loss uses the configured aggregation.
The one exception are maxima, named ``*_max``: each is this micro-batch's maximum, and the mini-batch value
is their MAX (:func:`accumulate_metrics` applies both rules).

The mask is a per-token WEIGHT (1 for completion tokens, 0 for prompt/padding, possibly fractional, e.g.
0.2 for tokens written by a frozen model), not a boolean. Positions with weight 0 never affect the loss,
the gradient or the metrics, even if their log-probs are inf/NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandemrl.algo.registry import Registry

# ----------------------------------------------------------------------------------------------- data


@dataclass
class LossInputs:
    logprobs: Tensor  # [B,T] log-prob of each taken token under the current policy (requires grad)
    old_logprobs: Tensor  # [B,T] same under the sampling policy (detached)
    advantages: Tensor  # [B] one advantage per sequence
    mask: Tensor  # [B,T] float loss weight per token (0 for prompt/padding)
    ref_logprobs: Tensor | None = None  # [B,T] same under the frozen reference policy, for the KL term
    rollout_logprobs: Tensor | None = None  # [B,T] same as the rollout engine reported it, for TIS and metrics


@dataclass
class LossConfig:
    eps_low: float = 0.2  # ratio is clipped to [1 - eps_low, 1 + eps_high] (DAPO-style decoupled clip)
    eps_high: float = 0.2
    kl_beta: float = 0.0  # weight of the k3 KL penalty to the reference policy
    aggregation: str = "token-mean"  # a name in AGGREGATIONS
    max_completion_length: int | None = None  # Dr.GRPO normaliser for "seq-mean-token-sum-norm"
    tis_cap: float = 0.0  # truncated importance sampling: weight min(exp(old - rollout), tis_cap); 0 = off
    tis_mode: str = "truncate"  # "truncate": min(w, cap); "mask": w inside [1/cap, cap], 0 outside (a name in TIS_MODES)

    def validate(self) -> None:
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        AGGREGATIONS.get(self.aggregation)  # raises with the list of valid choices
        if self.max_completion_length is not None and self.max_completion_length <= 0:
            raise ValueError(f"max_completion_length must be > 0, got {self.max_completion_length}")
        if self.tis_cap < 0:
            raise ValueError(f"tis_cap must be >= 0 (0 = off), got {self.tis_cap}")
        if self.tis_mode not in TIS_MODES:
            raise ValueError(f"tis_mode must be one of {', '.join(TIS_MODES)}, got {self.tis_mode!r}")


@dataclass
class BatchNorm:
    """Normalisers over a whole mini-batch (all micro-batches of one optimizer step)."""

    total_tokens: float  # sum of the mask weights over the mini-batch
    num_sequences: int  # sequences with positive total mask weight in the mini-batch
    max_completion_length: int  # Dr.GRPO constant normaliser

    @classmethod
    def from_masks(cls, masks: Sequence[Tensor], max_len: int | None = None) -> BatchNorm:
        """Build from the [B_i, T_i] masks of every micro-batch of one optimizer step.

        Sequences whose mask is all zero (e.g. rows that only pad a micro-batch) are not counted.
        ``max_len`` defaults to the widest mask; pass the generation budget (max_tokens) for Dr.GRPO.
        """
        if len(masks) == 0:
            raise ValueError("from_masks needs at least one mask")
        total = 0.0
        seqs = 0
        width = 0
        for m in masks:
            if m.dim() != 2:
                raise ValueError(f"masks must be [B,T], got shape {tuple(m.shape)}")
            m = m.detach()
            total += float(m.sum())
            seqs += int((m.sum(dim=1) > 0).sum())
            width = max(width, int(m.shape[1]))
        return cls(total_tokens=total, num_sequences=seqs, max_completion_length=int(max_len or width))


@dataclass
class LossOutput:
    loss: Tensor  # scalar, differentiable; this micro-batch's share of the mini-batch loss
    # Shares too: SUM them over micro-batches (*_max: MAX). Detached 0-dim tensors, so a micro-batch costs no
    # host sync: the update reads them once per optimizer step.
    metrics: dict[str, Tensor] = field(default_factory=dict)


def is_maximum(key: str) -> bool:
    """Metrics named ``*_max`` are maxima, not shares: they combine by max over micro-batches and steps."""
    return key.endswith("_max")


def accumulate_metrics(total: dict[str, Any], part: dict[str, Any]) -> None:
    """Fold one micro-batch's metrics into its mini-batch's, in place: shares add up, maxima take the max.
    Values are floats or 0-dim tensors (tensors stay on their device: no host sync)."""
    for key, value in part.items():
        if key not in total:
            total[key] = value
        elif is_maximum(key):
            both_tensors = isinstance(total[key], Tensor) and isinstance(value, Tensor)
            total[key] = torch.maximum(total[key], value) if both_tensors else max(total[key], value)
        else:
            total[key] = total[key] + value


# ---------------------------------------------------------------------------------------- aggregation

AGGREGATIONS: Registry = Registry("loss aggregation")


def _nz(x: float) -> float:
    """Guard a normaliser against 0 (an all-masked mini-batch gives a loss of 0, not NaN)."""
    return x if x > 0 else 1.0


@AGGREGATIONS.register("token-mean")
def token_mean(per_token: Tensor, mask: Tensor, norm: BatchNorm) -> Tensor:
    """sum(mask * loss) / total mask weight of the mini-batch (DAPO)."""
    return (per_token * mask).sum() / _nz(norm.total_tokens)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(per_token: Tensor, mask: Tensor, norm: BatchNorm) -> Tensor:
    """Mask-weighted mean over each sequence's tokens, summed over sequences / num_sequences (GRPO)."""
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=torch.finfo(mask.dtype).tiny)
    return per_seq.sum() / _nz(norm.num_sequences)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(per_token: Tensor, mask: Tensor, norm: BatchNorm) -> Tensor:
    """Each sequence's weighted token sum / max_completion_length, summed / num_sequences (Dr.GRPO)."""
    per_seq = (per_token * mask).sum(dim=1) / _nz(norm.max_completion_length)
    return per_seq.sum() / _nz(norm.num_sequences)


# -------------------------------------------------------------------------------------------- losses

POLICY_LOSSES: Registry = Registry("policy loss")


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(policy || ref): exp(ref - logp) - (ref - logp) - 1 (always >= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


TIS_MODES = ("truncate", "mask")


def tis_weights(rollout_gap: Tensor, cap: float, mode: str = "truncate") -> Tensor:
    """Importance sampling weight per token from w = exp(logp_old - logp_rollout), detached.

    ``truncate``: min(w, cap), as verl's ``tis_imp_ratio_cap`` and TRL's ``vllm_importance_sampling_cap``.
    ``mask``: w where 1/cap <= w <= cap, else 0 (the token leaves the loss; verl's ``rollout_is`` mask mode,
    IcePop): a token the rollout weights (kernels, precision, or a stale policy version) sampled far from what the
    trainer computes teaches nothing reliable either way. ``rollout_gap`` is logp_old - logp_rollout, already 0
    where masked.
    """
    w = torch.exp(rollout_gap.detach())
    if mode == "mask":
        return torch.where(_outside(w, cap), torch.zeros_like(w), w)
    return w.clamp(max=cap)


def _outside(w: Tensor, cap: float) -> Tensor:
    """Where the mask mode drops a token: w outside [1/cap, cap]."""
    return (w > cap) | (w * cap < 1.0)


def rollout_metrics(rollout_gap: Tensor, mask: Tensor, norm: BatchNorm, tis_cap: float,
                    tis_mode: str = "truncate") -> dict[str, Tensor]:
    """How far the trainer's log-probs are from the rollout engine's, and what TIS did about it.

      mismatch/logp_abs_mean  mask-weighted mean of |logp_old - logp_rollout| (a share: sum over micro-batches)
      mismatch/logp_abs_max   the largest |logp_old - logp_rollout| over tokens with weight > 0 (a maximum)
      tis/weight_mean         mask-weighted mean of the TIS weight (only when tis_cap > 0)
      tis/clip_frac           mask-weighted fraction of tokens where the cap binds (truncate) or that are masked
                              out (mask) (only when tis_cap > 0)
    """
    tok = _nz(norm.total_tokens)
    gap = rollout_gap.detach().abs()  # 0 where masked, so the max is over tokens with weight > 0
    metrics = {
        "mismatch/logp_abs_mean": (gap * mask).sum() / tok,
        "mismatch/logp_abs_max": gap.max(),
    }
    if tis_cap > 0:
        w = torch.exp(rollout_gap.detach())
        capped = _outside(w, tis_cap) if tis_mode == "mask" else w > tis_cap
        metrics["tis/weight_mean"] = (tis_weights(rollout_gap, tis_cap, tis_mode) * mask).sum() / tok
        metrics["tis/clip_frac"] = (capped.to(mask.dtype) * mask).sum() / tok
    return metrics


@POLICY_LOSSES.register("grpo")
def grpo_loss(inputs: LossInputs, cfg: LossConfig, norm: BatchNorm) -> LossOutput:
    """Clipped surrogate -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A) + kl_beta * k3 KL, aggregated per cfg.

    Metrics (each a share of the mini-batch value; sum over micro-batches):
      pg_loss    the aggregated surrogate alone (without the KL term)
      clip_frac  mask-weighted fraction of tokens where the clip is active, i.e. the clipped term is the
                 minimum and the gradient is cut: (r > 1+eps_high and A > 0) or (r < 1-eps_low and A < 0)
      clip_ratio/low_mean   the same fraction for the lower side alone (r < 1-eps_low and A < 0), TRL's name
      clip_ratio/high_mean  the upper side alone (r > 1+eps_high and A > 0); low + high = clip_frac
      ratio_mean mask-weighted mean of r = exp(logp - old_logp)
      kl         mask-weighted mean of k3 over the tokens (0 when ref_logprobs is None; reported even
                 when kl_beta is 0)
      mismatch/*, tis/*  see :func:`rollout_metrics` (only when rollout_logprobs is given)

    With tis_cap > 0 each token's surrogate is multiplied by its :func:`tis_weights` (cfg.tis_mode; rollout_logprobs
    is then required); the KL term is not.
    """
    logp, mask = inputs.logprobs, inputs.mask
    if logp.dim() != 2 or logp.shape != mask.shape or logp.shape != inputs.old_logprobs.shape:
        raise ValueError(
            f"logprobs, old_logprobs and mask must share a [B,T] shape, got {tuple(logp.shape)}, "
            f"{tuple(inputs.old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if inputs.advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={logp.shape[0]}, got {tuple(inputs.advantages.shape)}")
    agg = AGGREGATIONS.get(cfg.aggregation)
    mask = mask.to(logp.dtype)
    active = mask > 0
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)

    # Zero the log-ratio where the mask is 0 BEFORE exp, so padding garbage (inf/NaN) cannot leak into
    # the loss or, via 0 * NaN, into the gradient.
    old = inputs.old_logprobs.detach().to(logp.dtype)
    log_ratio = torch.where(active, logp - old, zero)
    ratio = torch.exp(log_ratio)
    adv = inputs.advantages.detach().to(logp.dtype).unsqueeze(1)
    clipped = torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    per_token_pg = -torch.minimum(ratio * adv, clipped * adv)
    rollout_gap = _rollout_gap(inputs.rollout_logprobs, old, active)
    if cfg.tis_cap > 0:
        if rollout_gap is None:
            raise ValueError("tis_cap > 0 needs rollout_logprobs: the sampling log-prob of every completion token")
        per_token_pg = per_token_pg * tis_weights(rollout_gap, cfg.tis_cap, cfg.tis_mode)
    pg_loss = agg(per_token_pg, mask, norm)
    loss = pg_loss

    kl_metric = zero.detach()
    tok = _nz(norm.total_tokens)
    if inputs.ref_logprobs is not None:
        d = torch.where(active, inputs.ref_logprobs.detach().to(logp.dtype) - logp, zero)
        per_token_kl = torch.exp(d) - d - 1  # k3_kl, written on the sanitised difference
        if cfg.kl_beta > 0:
            loss = loss + cfg.kl_beta * agg(per_token_kl, mask, norm)
        kl_metric = (per_token_kl.detach() * mask).sum() / tok

    with torch.no_grad():
        low = (ratio < 1.0 - cfg.eps_low) & (adv < 0)
        high = (ratio > 1.0 + cfg.eps_high) & (adv > 0)
        metrics = {
            "pg_loss": pg_loss.detach(),
            "clip_frac": ((low | high).to(mask.dtype) * mask).sum() / tok,
            "clip_ratio/low_mean": (low.to(mask.dtype) * mask).sum() / tok,
            "clip_ratio/high_mean": (high.to(mask.dtype) * mask).sum() / tok,
            "ratio_mean": (ratio * mask).sum() / tok,
            "kl": kl_metric,
        }
        if rollout_gap is not None:
            metrics.update(rollout_metrics(rollout_gap, mask, norm, cfg.tis_cap, cfg.tis_mode))
    return LossOutput(loss=loss, metrics=metrics)


def _rollout_gap(rollout_logprobs: Tensor | None, old: Tensor, active: Tensor) -> Tensor | None:
    """logp_old - logp_rollout per token, 0 where masked (engine garbage there never reaches exp); None without."""
    if rollout_logprobs is None:
        return None
    if rollout_logprobs.shape != old.shape:
        raise ValueError(f"rollout_logprobs must be [B,T]={tuple(old.shape)}, got {tuple(rollout_logprobs.shape)}")
    zero = torch.zeros((), dtype=old.dtype, device=old.device)
    return torch.where(active, old - rollout_logprobs.detach().to(old.dtype), zero)
