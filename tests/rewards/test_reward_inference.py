"""The inference-aware reward: task score minus serving costs plus speculative/cache bonuses, from RequestStats."""

import pytest

from tandemrl.config import ConfigError, load_config
from tandemrl.rewards.composite import CompositeReward, metrics
from tandemrl.rewards.inference import InferenceWeights, MissingTelemetryError, add_inference_terms
from tandemrl.types import RequestStats, Rollout

SEED_WEIGHTS = InferenceWeights(latency=0.001, tokens=0.001, kv_mb=0.01, accept=1.0, cache_reuse=0.5)
BLOCK = 2**20 // 4  # bytes per KV block: 4 blocks = 1 MB


def rollout(latency_s, tokens, peak_blocks, drafted, accepted, cached, prompt=8, block_bytes=BLOCK):
    stats = RequestStats(arrival_time=10.0, finished_time=10.0 + latency_s, prompt_tokens=prompt,
                         generated_tokens=tokens, cached_prompt_tokens=cached, peak_kv_blocks=peak_blocks,
                         kv_block_bytes=block_bytes, drafted_tokens=drafted, accepted_tokens=accepted)
    return Rollout("r", [1] * prompt, [2] * tokens, [0.0] * tokens, "stop", stats=stats)


def task_reward(values):
    return CompositeReward({"accuracy": (lambda prompts, completions, **k: list(values), 1.0)})


def test_the_composite_reward_equals_a_hand_computation():
    rollouts = [rollout(0.250, 20, 8, 10, 6, 4), rollout(1.0, 100, 2, 4, 1, 0)]
    task = task_reward([1.0, 0.0])(["p", "p"], ["a", "b"])
    result = add_inference_terms(task, rollouts, SEED_WEIGHTS)
    # 1 - 0.001*250 ms - 0.001*20 tokens - 0.01*2 MB + 1.0*0.6 + 0.5*(4/8)
    first = 1.0 - 0.25 - 0.02 - 0.02 + 0.6 + 0.25
    # 0 - 0.001*1000 - 0.001*100 - 0.01*0.5 MB + 1.0*0.25 + 0
    second = 0.0 - 1.0 - 0.1 - 0.005 + 0.25 + 0.0
    assert result.total == pytest.approx([first, second])
    assert result.components["inference/latency_ms"] == pytest.approx([250.0, 1000.0])
    assert result.components["inference/kv_mb"] == pytest.approx([2.0, 0.5])
    assert result.components["inference/accept_rate"] == pytest.approx([0.6, 0.25])
    assert result.components["accuracy"] == [1.0, 0.0]
    logged = metrics(result)
    for name in ("latency_ms", "generated_tokens", "kv_mb", "accept_rate", "cache_reuse"):
        assert f"reward/inference/{name}/mean" in logged


def test_zero_weights_are_plain_grpo():
    rollouts = [rollout(0.5, 7, 3, 0, 0, 0), rollout(0.1, 3, 1, 0, 0, 0, block_bytes=0)]  # no speculation, no KV
    task = task_reward([1.0, 0.0])(["p", "p"], ["a", "b"])
    result = add_inference_terms(task, rollouts, InferenceWeights())
    assert result.total == [1.0, 0.0] and list(result.components) == ["accuracy"]
    only_tokens = add_inference_terms(task, rollouts, InferenceWeights(tokens=0.1))
    assert list(only_tokens.components) == ["accuracy", "inference/generated_tokens"]
    assert only_tokens.total == pytest.approx([1.0 - 0.7, 0.0 - 0.3])


def test_a_failed_task_reward_stays_none():
    task = task_reward([None, 1.0])(["p", "p"], ["a", "b"])
    result = add_inference_terms(task, [rollout(0.1, 1, 1, 0, 0, 0)] * 2, InferenceWeights(tokens=0.5))
    assert result.total == [None, 0.5]


@pytest.mark.parametrize("weights, missing, block_bytes", [
    (InferenceWeights(accept=1.0), "reward.inference.accept", BLOCK),  # no draft model: nothing was drafted
    (InferenceWeights(kv_mb=0.01), "reward.inference.kv_mb", 0),  # a backend without paged KV blocks
    (InferenceWeights(cache_reuse=0.5), "reward.inference.cache_reuse", 0),
])
def test_a_weighted_term_without_telemetry_is_an_error_naming_it(weights, missing, block_bytes):
    task = task_reward([1.0])(["p"], ["a"])
    with pytest.raises(MissingTelemetryError, match=missing):
        add_inference_terms(task, [rollout(0.1, 1, 1, 0, 0, 0, block_bytes=block_bytes)], weights)


def test_a_missing_finish_time_is_an_error_for_the_latency_term():
    r = rollout(0.1, 1, 1, 0, 0, 0)
    r.stats.finished_time = None
    with pytest.raises(MissingTelemetryError, match="reward.inference.latency"):
        add_inference_terms(task_reward([1.0])(["p"], ["a"]), [r], InferenceWeights(latency=0.001))


@pytest.mark.parametrize("override, key", [
    ("reward.inference.accept=1.0", "reward.inference.accept"),
    ("reward.inference.kv_mb=0.01", "reward.inference.kv_mb"),
    ("reward.inference.cache_reuse=0.5", "reward.inference.cache_reuse"),
])
def test_the_config_refuses_a_term_its_setup_cannot_measure(override, key):
    backend = "rollout.backend=\"hf\"" if "accept" not in key else "rollout.backend=\"engine\""
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override, backend])


def test_the_seed_weights_are_accepted_with_speculation():
    cfg = load_config(None, ["reward.inference.latency=0.001", "reward.inference.tokens=0.001",
                             "reward.inference.kv_mb=0.01", "reward.inference.accept=1.0",
                             "reward.inference.cache_reuse=0.5", 'rollout.speculative.method="ngram"'])
    assert InferenceWeights.from_config(cfg.reward.inference) == SEED_WEIGHTS


def test_with_speculation_on_a_batch_that_drafted_nothing_has_acceptance_zero():
    # n-gram proposals need a match: a batch may draft nothing, which is a rate of 0, not missing telemetry
    from tandemrl.rewards.inference import InferenceReward

    task = task_reward([1.0])(["p"], ["a"])
    result = InferenceReward(InferenceWeights(accept=1.0), speculative=True)(task, [rollout(0.1, 1, 1, 0, 0, 0)])
    assert result.total == [1.0] and result.components["inference/accept_rate"] == [0.0]
    with pytest.raises(MissingTelemetryError, match="reward.inference.accept"):
        InferenceReward(InferenceWeights(accept=1.0), speculative=False)(task, [rollout(0.1, 1, 1, 4, 4, 0)])
