"""Per-step aggregates of the rollouts' request stats."""

from __future__ import annotations

import pytest

from tandemrl.telemetry.request_stats import request_metrics
from tandemrl.types import RequestStats, Rollout


def rollout(stats: RequestStats, error: str | None = None) -> Rollout:
    return Rollout("r", [1], [2], [-1.0], "stop", error=error, stats=stats)


def test_request_metrics_average_the_rollouts_and_skip_errors():
    a = RequestStats(arrival_time=0.0, first_scheduled_time=0.5, first_token_time=1.0, finished_time=3.0,
                     prompt_tokens=10, generated_tokens=4, cached_prompt_tokens=8, peak_kv_blocks=2,
                     kv_block_bytes=2**20, preemptions=1)
    b = RequestStats(arrival_time=1.0, first_scheduled_time=1.0, first_token_time=2.0, finished_time=2.0,
                     prompt_tokens=30, generated_tokens=6, peak_kv_blocks=4, kv_block_bytes=2**20)
    for accepted in (4, 3, 0):  # three verify steps of 4, 4 and 2 proposals
        b.record_verify(2 if accepted == 0 else 4, accepted)
    assert b.acceptance_histogram == [1, 0, 0, 1, 1] and b.verify_steps == 3
    assert b.acceptance_rate == pytest.approx(0.7) and b.mean_accepted_length == pytest.approx(10 / 3)
    broken = RequestStats(arrival_time=0.0, finished_time=100.0, prompt_tokens=5)
    m = request_metrics([rollout(a), rollout(b), rollout(broken, error="empty prompt")])
    assert m["requests/queue_s/mean"] == pytest.approx(0.25)
    assert m["requests/ttft_s/mean"] == pytest.approx(1.0)
    assert m["requests/latency_s/mean"] == pytest.approx(2.0) and m["requests/latency_s/max"] == 3.0
    assert m["requests/generated_tokens/mean"] == 5.0
    assert m["requests/prefix_cache_hit_ratio"] == pytest.approx(8 / 40)
    assert m["requests/kv_peak_mb/mean"] == 3.0 and m["requests/kv_peak_mb/max"] == 4.0
    assert m["requests/preemptions"] == 1.0
    assert m["spec/acceptance_rate"] == pytest.approx(0.7) and m["spec/mean_accepted_length"] == pytest.approx(10 / 3)
    assert "spec/acceptance_rate" not in request_metrics([rollout(a)])
    assert request_metrics([rollout(broken, error="x")]) == {}
