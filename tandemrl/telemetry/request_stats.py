"""Per-step aggregates of the rollouts' RequestStats (what serving each request cost), for the metrics rows."""

from __future__ import annotations

from typing import Sequence

from tandemrl.types import Rollout


def request_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Means (and maxima where the tail matters) over the rollouts that ran (errors are left out).

    ``requests/prefix_cache_hit_ratio`` is over all prompt tokens of the step; the speculative-decoding rates appear
    once any request went through a verify step."""
    stats = [r.stats for r in rollouts if r.error is None]
    if not stats:
        return {}
    n = len(stats)
    prompt_tokens = sum(s.prompt_tokens for s in stats)
    metrics = {
        "requests/queue_s/mean": sum(s.queue_time for s in stats) / n,
        "requests/ttft_s/mean": sum(s.time_to_first_token for s in stats) / n,
        "requests/latency_s/mean": sum(s.latency for s in stats) / n,
        "requests/latency_s/max": max(s.latency for s in stats),
        "requests/generated_tokens/mean": sum(s.generated_tokens for s in stats) / n,
        "requests/prefix_cache_hit_ratio": sum(s.cached_prompt_tokens for s in stats) / max(prompt_tokens, 1),
        "requests/kv_peak_mb/mean": sum(s.peak_kv_mb for s in stats) / n,
        "requests/kv_peak_mb/max": max(s.peak_kv_mb for s in stats),
        "requests/preemptions": float(sum(s.preemptions for s in stats)),
    }
    drafted, steps = sum(s.drafted_tokens for s in stats), sum(s.verify_steps for s in stats)
    if drafted and steps:
        accepted = sum(s.accepted_tokens for s in stats)
        metrics["spec/acceptance_rate"] = accepted / drafted
        metrics["spec/mean_accepted_length"] = (accepted + steps) / steps  # tokens per verify step, bonus included
    return metrics
