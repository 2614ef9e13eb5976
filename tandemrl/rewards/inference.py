"""Serving cost as part of the reward: five terms read from each rollout's RequestStats.

    total = task score - latency*latency_ms - tokens*generated_tokens - kv_mb*peak KV MB
            + accept*acceptance rate + cache_reuse*prefix-cache hit ratio

KV memory is what the request actually held at its peak (KV blocks x bytes per block, from the engine's block
manager), not an estimate from the model's dimensions. Each term with a non-zero weight becomes a reward component
(logged as ``reward/inference/<term>/mean``); one whose telemetry is missing is an error that names the term. The raw
quantities are in the ``requests/*`` metrics and samples.jsonl whatever the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from tandemrl.rewards.composite import RewardResult
from tandemrl.types import RequestStats, Rollout


class MissingTelemetryError(ValueError):
    """A reward.inference weight is non-zero but the rollouts do not carry what its term is made of."""


@dataclass(frozen=True)
class InferenceWeights:
    """The five weights of ``reward.inference`` (all 0 = plain GRPO)."""

    latency: float = 0.0
    tokens: float = 0.0
    kv_mb: float = 0.0
    accept: float = 0.0
    cache_reuse: float = 0.0

    @classmethod
    def from_config(cls, section: object) -> InferenceWeights:
        return cls(**{f.name: float(getattr(section, f.name)) for f in fields(cls)})


@dataclass(frozen=True)
class _Term:
    name: str  # the component name in RewardResult and the metrics: reward/inference/<term>/mean
    sign: float  # -1 for a cost, +1 for a bonus
    value: Callable[[RequestStats], float]
    present: Callable[[Sequence[RequestStats]], bool]  # whether the batch carries this term's telemetry
    needs: str  # what is missing, for the error


def _all_have_kv(stats: Sequence[RequestStats]) -> bool:
    return all(s.kv_block_bytes > 0 for s in stats)  # only the paged engine knows the bytes of a KV block


# keyed by the weight's name in reward.inference
TERMS: dict[str, _Term] = {
    "latency": _Term("inference/latency_ms", -1.0, lambda s: 1000.0 * s.latency,
                     lambda st: all(s.finished_time is not None for s in st), "request finish times"),
    "tokens": _Term("inference/generated_tokens", -1.0, lambda s: float(s.generated_tokens),
                    lambda st: True, "generated token counts"),
    "kv_mb": _Term("inference/kv_mb", -1.0, lambda s: s.peak_kv_mb, _all_have_kv,
                   "KV blocks held per request (rollout.backend = 'engine')"),
    "accept": _Term("inference/accept_rate", 1.0, lambda s: s.acceptance_rate,
                    lambda st: any(s.drafted_tokens > 0 for s in st),
                    "speculative-decoding proposals (rollout.speculative.method): no request drafted a token"),
    "cache_reuse": _Term("inference/cache_reuse", 1.0, lambda s: s.cache_hit_ratio, _all_have_kv,
                         "prefix-cache hits per request (rollout.backend = 'engine')"),
}


def inference_terms(rollouts: Sequence[Rollout], weights: InferenceWeights,
                    speculative: bool | None = None) -> dict[str, list[float]]:
    """Raw (unweighted) value per rollout of each term with a non-zero weight, keyed by the weight's name.
    ``speculative``: whether the rollouts were decoded speculatively (then a batch in which nothing was drafted, e.g.
    no n-gram matched, has acceptance 0), None to judge from the rollouts (some request drafted a token)."""
    stats = [r.stats for r in rollouts]
    out: dict[str, list[float]] = {}
    for key, term in TERMS.items():
        weight = getattr(weights, key)
        if not weight:
            continue
        present = speculative if key == "accept" and speculative is not None else term.present(stats)
        if not present:
            raise MissingTelemetryError(
                f"reward.inference.{key} = {weight} but the rollouts carry no {term.needs}; "
                f"set reward.inference.{key} = 0 or turn that telemetry on")
        out[key] = [term.value(s) for s in stats]
    return out


def add_inference_terms(result: RewardResult, rollouts: Sequence[Rollout], weights: InferenceWeights,
                        speculative: bool | None = None) -> RewardResult:
    """``result`` with each weighted term as a component (``inference/<term>``, unweighted) and in the total (weight
    x value, with the term's sign). A total that was None (a failed task reward) stays None."""
    if len(rollouts) != len(result.total):
        raise ValueError(f"{len(rollouts)} rollouts for {len(result.total)} rewards")
    terms = inference_terms(rollouts, weights, speculative)
    total: list[float | None] = []
    for i, task_total in enumerate(result.total):
        if task_total is None:
            total.append(None)
            continue
        total.append(task_total + sum(TERMS[key].sign * getattr(weights, key) * values[i]
                                      for key, values in terms.items()))
    components = {**result.components, **{TERMS[key].name: list(values) for key, values in terms.items()}}
    return RewardResult(total, components, result.errors, result.first_traceback, result.nonfinite,
                        result.nonfinite_by)


@dataclass(frozen=True)
class InferenceReward:
    """The trainer's inference-aware reward: the weights and whether its rollouts are decoded speculatively."""

    weights: InferenceWeights
    speculative: bool | None = None

    def __call__(self, result: RewardResult, rollouts: Sequence[Rollout]) -> RewardResult:
        return add_inference_terms(result, rollouts, self.weights, self.speculative)
