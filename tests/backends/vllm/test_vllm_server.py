"""Server mode against a real vLLM OpenAI server (`python -m vllm.entrypoints.openai.api_server`, started once for
the session on 127.0.0.1): the same rollouts as our engine, weight updates that land, and updates that do not
land caught by the probe (a 60-step run in server mode against our engine: test_vllm_training.py). Marked `vllm`:
run by `make test-vllm`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tandemrl.backends.vllm.errors import WeightSyncError
from tandemrl.backends.vllm.server import VLLMServerBackend
from tandemrl.config import VLLMConfig
from tandemrl.types import SamplingParams
from tests.backends.vllm.test_vllm_backend import (
    assert_bad_requests_fail_alone,
    assert_logprobs_are_the_trainers,
    assert_same_rollouts,
    assert_seeded_group_differs_and_repeats,
    assert_weight_update_lands,
    perturbed,
    requests,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def versions() -> Iterator[int]:
    return itertools.count(2000)


@pytest.fixture(scope="module", params=["disk", "http"])
def server_backend(request, vllm_server, trainer_model, tokenizer) -> Iterator[VLLMServerBackend]:
    backend = VLLMServerBackend(trainer_model, tokenizer,
                                VLLMConfig(mode="server", url=vllm_server, weight_transfer=request.param))
    yield backend
    backend.close()


def test_greedy_tokens_and_logprobs_equal_our_engine(server_backend, engine_backend, tokenizer, versions):
    version = next(versions)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    got = server_backend.generate(requests(tokenizer, params), version)
    assert_same_rollouts(got, engine_backend.generate(requests(tokenizer, params), version))
    assert all(len(r.completion_ids) == 24 and r.finish_reason == "length" for r in got)
    assert all(r.policy_version == version for r in got)
    assert server_backend.synced_version == version and server_backend.last_probe_diff < 1e-4


def test_sampled_logprobs_are_the_trainers_at_the_temperature(server_backend, trainer_model, tokenizer, versions):
    """Needs the server's --logprobs-mode processed_logprobs (README): log softmax(logits / T) at each token."""
    assert_logprobs_are_the_trainers(server_backend, trainer_model, tokenizer, next(versions))


def test_a_seeded_group_has_distinct_samples_and_repeats_exactly(server_backend, tokenizer, versions):
    version = next(versions)
    assert_seeded_group_differs_and_repeats(server_backend, tokenizer, version)  # one HTTP request with n = 6
    greedy = requests(tokenizer, SamplingParams(max_tokens=4, temperature=0.0), prompts=["3+4="] * 3)
    rollouts = server_backend.generate(greedy, version)  # vLLM refuses n > 1 at temperature 0: sent one by one
    assert all(r.error is None for r in rollouts) and len({tuple(r.completion_ids) for r in rollouts}) == 1


def test_weight_update_lands_and_the_prefix_cache_is_not_reused(server_backend, engine_backend, trainer_model,
                                                                tokenizer, versions):
    assert_weight_update_lands(server_backend, engine_backend, trainer_model, tokenizer, versions)


def test_stale_weights_are_caught(server_backend, trainer_model, versions):
    server_backend.update_weights(next(versions))
    with perturbed(trainer_model, 0.01, seed=2):  # the trainer moved on; the server was not told
        with pytest.raises(WeightSyncError, match="does not hold the trainer's weights of policy version 7"):
            server_backend.check_weights(7)


def test_an_update_the_server_drops_silently_is_caught(server_backend, trainer_model, monkeypatch, versions):
    """The push 'succeeds' (HTTP 200) but nothing changes in the server: the probe stops the run."""
    monkeypatch.setattr(server_backend, "push_weights", lambda: None)
    with perturbed(trainer_model, 0.05, seed=3):
        with pytest.raises(WeightSyncError, match="log-prob of token"):
            server_backend.update_weights(next(versions))
    monkeypatch.undo()
    server_backend.update_weights(next(versions))  # the proper push repairs it


def test_a_checkpoint_without_the_tied_lm_head_is_caught(vllm_server, trainer_model, tokenizer, monkeypatch, versions):
    """vLLM 0.32's in-place reload keeps a tied LM head at the old embedding when the file has no lm_head.weight
    (reload answers 200): half an update, which the probe catches. transfer.py writes every entry for this."""
    import tandemrl.backends.vllm.server as server

    def without_head(state, directory: Path):
        return real_write({k: v for k, v in state.items() if k != "lm_head.weight"}, directory)

    real_write = server.write_weights
    backend = VLLMServerBackend(trainer_model, tokenizer, VLLMConfig(mode="server", url=vllm_server))
    try:
        monkeypatch.setattr(server, "write_weights", without_head)
        with perturbed(trainer_model, 0.05, seed=4):
            with pytest.raises(WeightSyncError, match="does not hold the trainer's weights"):
                backend.update_weights(next(versions))
        monkeypatch.undo()
        backend.update_weights(next(versions))
    finally:
        backend.close()


def test_another_client_changing_the_weights_version_is_caught(server_backend, vllm_server, tokenizer, versions):
    version = next(versions)
    server_backend.update_weights(version)
    httpx.post(f"{vllm_server}/update_weight_version", json={"new_version": "someone-else"}).raise_for_status()
    with pytest.raises(WeightSyncError, match="its weight version is 'someone-else'"):
        server_backend.generate(requests(tokenizer, SamplingParams(max_tokens=2)), version)
    server_backend.update_weights(version)


def test_bad_requests_fail_alone(server_backend, tokenizer, versions):
    assert_bad_requests_fail_alone(server_backend, tokenizer, next(versions))


def test_an_update_that_does_not_land_stops_the_run(tiny64_dir, vllm_server, tmp_path, monkeypatch, capsys):
    from tandemrl.cli import main

    real_push = VLLMServerBackend.push_weights

    def first_push_only(self: VLLMServerBackend) -> None:  # later pushes "succeed" and change nothing
        if self.synced_version is None:
            real_push(self)

    monkeypatch.setattr(VLLMServerBackend, "push_weights", first_push_only)
    code = main(["train", "--out", str(tmp_path / "run"), "--set", f'model.name_or_path="{tiny64_dir}"',
                 "--set", "model.device=cpu", "--set", "log.tensorboard=false", "--set", "train.max_steps=3",
                 "--set", "eval.limit=8", "--set", "eval.pass_k=0", "--set", 'rollout.backend="vllm"',
                 "--set", 'rollout.vllm.mode="server"', "--set", f'rollout.vllm.url="{vllm_server}"'])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: vLLM does not hold the trainer's weights of policy version 1" in err, err[-2000:]
