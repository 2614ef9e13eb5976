"""The vLLM backend's parts that need no vLLM: clear errors, the probe's verdict, request mapping, the config.

Not marked `vllm`: these run in the main suite (`make test`), where vLLM is not installed.
"""

from __future__ import annotations

import math
import os
import sys
import types

import pytest
import torch

from tandemrl.backends.vllm import _compat
from tandemrl.backends.vllm.convert import Limits, request_error, sampling_params, to_rollout
from tandemrl.backends.vllm.errors import VLLMBackendError, WeightSyncError
from tandemrl.backends.vllm.probe import Probe
from tandemrl.config import ConfigError, load_config
from tandemrl.types import Request, RequestStats, SamplingParams


def test_missing_vllm_says_how_to_install(monkeypatch, model, tokenizer, tmp_path):
    from tandemrl.backends.vllm.backend import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` sees where it is not installed
    with pytest.raises(VLLMBackendError, match=r"needs vLLM, which is not installed.*pip install 'tandemrl\[vllm\]'"):
        VLLMBackend(model, tokenizer, tmp_path)


def test_an_old_vllm_names_the_supported_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.8.5"))
    with pytest.raises(VLLMBackendError, match=r"vLLM 0.8.5 is installed; .* supports vLLM >= 0.32 \(tested with 0.32.0\)"):
        _compat.import_vllm()


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0rc1", "1.0.0"])
def test_supported_versions_pass(version):
    _compat.check_version(version)


@pytest.mark.parametrize("version", ["0.31.9", "0.8.5", "not-a-version"])
def test_unsupported_versions_fail(version):
    with pytest.raises(VLLMBackendError, match=f"vLLM {version} is installed"):
        _compat.check_version(version)


def test_environment_selects_the_in_process_engine(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    _compat.prepare_environment()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(VLLMBackendError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1 is set"):
        _compat.prepare_environment()


def test_probe_is_fixed_and_its_tolerance_follows_the_dtype():
    a = Probe.build(100, 16, torch.float32)
    assert a == Probe.build(100, 16, torch.float32) and all(0 <= t < 100 for t in a.token_ids)
    assert a.tolerance == 2e-3 and Probe.build(100, 16, torch.bfloat16).tolerance == 0.2
    assert Probe.build(100, 16, torch.float32, tolerance=0.5).tolerance == 0.5
    with pytest.raises(ValueError, match="at least 2 tokens"):
        Probe.build(100, 1, torch.float32)


def test_probe_logprobs_are_the_models(model):
    probe = Probe.build(model.config.vocab_size, 12, torch.float32)
    ids = torch.tensor([probe.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]
    want = logits.log_softmax(-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(probe.trainer_logprobs(model)), want, atol=1e-6)


def test_probe_verdict():
    probe = Probe([1, 2, 3, 4], tolerance=1e-3)
    assert probe.check([-1.0, -2.0, -3.0], [-1.0, -2.0005, -3.0], 7) == pytest.approx(5e-4)
    with pytest.raises(WeightSyncError, match=r"policy version 7: .* token 2 is -2.100000, the trainer's -2.000000"):
        probe.check([-1.0, -2.0, -3.0], [-1.0, -2.1, -3.0], 7)
    with pytest.raises(WeightSyncError):
        probe.check([-1.0, -2.0, -3.0], [-1.0, math.nan, -3.0], 7)
    with pytest.raises(WeightSyncError, match="2 log-probs for 3 tokens"):
        probe.check([-1.0, -2.0, -3.0], [-1.0, -2.0], 7)


def test_request_errors():
    limits = Limits(vocab_size=50, max_model_len=20)
    ok = SamplingParams(max_tokens=4)
    assert request_error(Request("a", [1, 2], ok), limits) is None
    assert request_error(Request("a", [], ok), limits) == "empty prompt"
    assert "out of range [0, 50): [50]" in request_error(Request("a", [1, 50], ok), limits)
    assert "exceeds vLLM's max_model_len (20)" in request_error(Request("a", [1] * 17, ok), limits)
    assert request_error(Request("a", [1], SamplingParams(max_tokens=0)), limits) is not None


def test_sampling_params_offset_the_seed_per_request_and_stop_at_eos():
    fake = types.SimpleNamespace(SamplingParams=lambda **kw: kw)
    req = Request("a", [1], SamplingParams(max_tokens=4, temperature=0.5, top_k=5, seed=10, stop=("x",)))
    params = sampling_params(fake, req, eos_ids=[3, 4], index=2)
    assert params["seed"] == 12 and params["stop_token_ids"] == [3, 4] and params["stop"] == ["x"]
    assert (params["temperature"], params["top_k"], params["logprobs"]) == (0.5, 5, 0)
    unseeded = sampling_params(fake, Request("b", [1], SamplingParams(ignore_eos=True)), eos_ids=[3], index=1)
    assert unseeded["seed"] is None and unseeded["stop_token_ids"] is None and unseeded["stop"] is None


def fake_output(ids, logprobs, finish):
    steps = [{t: types.SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs)]
    completion = types.SimpleNamespace(token_ids=ids, logprobs=steps, finish_reason=finish)
    return types.SimpleNamespace(outputs=[completion], num_cached_tokens=16)


def test_outputs_become_rollouts():
    decode = lambda ids: "".join(chr(ord("a") + i) for i in ids)  # noqa: E731
    req = Request("r", [1, 2], SamplingParams(max_tokens=5, stop=("cd",)))
    rollout = to_rollout(req, fake_output([0, 2, 3], [-0.1, -0.2, -0.3], "stop"), decode, 4, RequestStats())
    assert (rollout.completion_ids, rollout.logprobs, rollout.finish_reason) == ([0, 2, 3], [-0.1, -0.2, -0.3], "stop")
    assert rollout.text == "a" and rollout.policy_version == 4
    assert (rollout.stats.prompt_tokens, rollout.stats.generated_tokens, rollout.stats.cached_prompt_tokens) == (2, 3, 16)
    aborted = to_rollout(req, fake_output([0], [-0.1], "abort"), decode, 4, RequestStats())
    assert aborted.finish_reason == "error" and "abort" in aborted.error


def test_config_takes_vllm_and_refuses_what_it_cannot_do():
    cfg = load_config(None, ['rollout.backend="vllm"', "rollout.vllm.probe_tokens=8"])
    assert cfg.rollout.backend == "vllm" and cfg.rollout.vllm.probe_tokens == 8
    with pytest.raises(ConfigError, match="does not take LoRA"):
        load_config(None, ['rollout.backend="vllm"', "model.lora.enabled=true"])
    with pytest.raises(ConfigError, match="tandem.enabled needs rollout.backend = 'engine'"):
        load_config(None, ['rollout.backend="vllm"', "tandem.enabled=true"])
    with pytest.raises(ConfigError, match="gpu_memory_utilisation"):
        load_config(None, ["rollout.vllm.gpu_memory_utilisation=0.5"])


def test_cli_prints_one_line_when_vllm_is_missing(monkeypatch, tmp_path, capsys):
    from tandemrl.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    code = main(["train", "--out", str(tmp_path / "run"), "--set", 'rollout.backend="vllm"',
                 "--set", f'model.tiny_dir="{tmp_path / "tiny"}"', "--set", "model.device=cpu",
                 "--set", "log.tensorboard=false"])
    assert code == 2
    assert "error: rollout.backend = 'vllm' needs vLLM, which is not installed" in capsys.readouterr().err
