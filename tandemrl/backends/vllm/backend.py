"""A RolloutBackend over a colocated ``vllm.LLM``, driven through vLLM's public API only.

vLLM holds its own copy of the weights. Whenever ``generate`` is asked for a policy version vLLM does not hold
yet (and on the first call), the trainer's current weights go to vLLM's worker through ``collective_rpc`` and the
worker extension (``extension.py``), the prefix cache is emptied (its K/V came from the old weights), and the
probe (``probe.py``) checks that vLLM's log-probs now equal the trainer's; a mismatch stops the run.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from tandemrl.backends.hf_backend import eos_token_ids
from tandemrl.backends.vllm import _compat
from tandemrl.backends.vllm.convert import Limits, request_error, sampling_params, to_rollout
from tandemrl.backends.vllm.errors import VLLMBackendError
from tandemrl.backends.vllm.extension import EXTENSION
from tandemrl.backends.vllm.probe import Probe
from tandemrl.config import VLLMConfig
from tandemrl.types import Request, RequestStats, Rollout


class VLLMBackend:
    """RolloutBackend (generate / sleep / wake / close) backed by ``vllm.LLM``; see the module docstring."""

    def __init__(self, model: nn.Module, tokenizer: Any, model_path: str | Path, settings: VLLMConfig | None = None,
                 seed: int = 0) -> None:
        settings = settings or VLLMConfig()
        _compat.prepare_environment()
        self._vllm = _compat.import_vllm()
        check_architecture(model, self._vllm.__version__)
        self.model, self.tokenizer = model, tokenizer
        dtype = next(model.parameters()).dtype
        max_len = settings.max_model_len or getattr(model.config, "max_position_embeddings", None)
        self.sleep_mode = _compat.sleep_mode_available()
        started = time.perf_counter()
        self.llm = self._vllm.LLM(
            model=str(model_path), dtype=str(dtype).removeprefix("torch."), seed=seed, max_model_len=max_len,
            enforce_eager=settings.enforce_eager, gpu_memory_utilization=settings.gpu_memory_utilization,
            enable_prefix_caching=settings.enable_prefix_caching, enable_sleep_mode=self.sleep_mode,
            worker_extension_cls=EXTENSION, **_compat.kv_cache_kwargs(settings.cpu_kvcache_gib),
            logprobs_mode="processed_logprobs",  # after temperature and top-k/top-p, as our engine reports them
        )
        self.startup_s = time.perf_counter() - started
        vocab = min(model.get_input_embeddings().num_embeddings, len(tokenizer))
        self.limits = Limits(vocab, int(max_len or self.llm.llm_engine.model_config.max_model_len))
        self.probe = Probe.build(vocab, settings.probe_tokens, dtype, settings.probe_tolerance)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.synced_version: int | None = None  # None: vLLM holds the checkpoint it loaded, never checked
        self.last_update_s = self.last_load_s = self.last_probe_s = 0.0
        self.last_probe_diff = float("nan")
        self._asleep = self._closed = False

    # ------------------------------------------------------------------ protocol

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]:
        if self._closed:
            raise RuntimeError("VLLMBackend.generate called after close()")
        if self._asleep:
            raise RuntimeError("VLLMBackend.generate called while asleep; call wake() first")
        if policy_version != self.synced_version:
            self.update_weights(policy_version)
        results: list[Rollout | None] = [None] * len(requests)
        runnable = []
        for i, req in enumerate(requests):
            error = request_error(req, self.limits)
            if error is None:
                runnable.append(i)
            else:
                results[i] = Rollout(req.request_id, list(req.prompt_ids), [], [], "error",
                                     policy_version=policy_version, error=error)
        if runnable:
            arrival = time.perf_counter()
            prompts = [{"prompt_token_ids": [int(t) for t in requests[i].prompt_ids]} for i in runnable]
            params = [sampling_params(self._vllm, requests[i], self.eos_ids, i) for i in runnable]
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            finished = time.perf_counter()
            for i, output in zip(runnable, outputs):
                stats = RequestStats(arrival, arrival, None, finished)
                results[i] = to_rollout(requests[i], output, self._decode, policy_version, stats)
        return results  # type: ignore[return-value]

    def sleep(self) -> None:
        """Release vLLM's KV cache (weights kept in host memory) where the platform has sleep mode (CUDA)."""
        if self.sleep_mode and not self._asleep and not self._closed:
            self.llm.sleep(level=1)
        self._asleep = not self._closed

    def wake(self) -> None:
        if self._closed:
            raise RuntimeError("VLLMBackend.wake called after close()")
        if self.sleep_mode and self._asleep:
            self.llm.wake_up()
        self._asleep = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.llm = None  # type: ignore[assignment]  # vLLM's in-process engine goes with its last reference
        self.model = None  # type: ignore[assignment]  # the trainer owns the model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ weights

    def update_weights(self, policy_version: int) -> float:
        """Send the trainer's weights to vLLM, empty its prefix cache, check the probe. Returns seconds taken."""
        started = time.perf_counter()
        named = [(name, tensor.detach()) for name, tensor in self.model.state_dict().items()]
        self.llm.collective_rpc("tandemrl_load_weights", args=(named,))  # in-process: tensors by reference
        self.llm.reset_prefix_cache()  # cached K/V were computed with the old weights
        loaded = time.perf_counter()
        self.last_probe_diff = self.check_weights(policy_version)
        self.synced_version = policy_version
        self.last_load_s, self.last_probe_s = loaded - started, time.perf_counter() - loaded
        self.last_update_s = self.last_load_s + self.last_probe_s
        return self.last_update_s

    def check_weights(self, policy_version: int) -> float:
        """vLLM's raw log-probs of the probe against the trainer's; raises WeightSyncError past the tolerance."""
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        output = self.llm.generate([{"prompt_token_ids": self.probe.token_ids}], params, use_tqdm=False)[0]
        got = [float(step[token].logprob) for step, token in zip(output.prompt_logprobs[1:], self.probe.token_ids[1:])]
        return self.probe.check(self.probe.trainer_logprobs(self.model), got, policy_version)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def check_architecture(model: nn.Module, vllm_version: str) -> None:
    """A clear error for a model vLLM has no implementation of (before vLLM tries to load it)."""
    archs = list(getattr(model.config, "architectures", None) or [type(model).__name__])
    supported = _compat.supported_architectures()
    if not any(arch in supported for arch in archs):
        raise VLLMBackendError(
            f"vLLM {vllm_version} has no implementation of {', '.join(archs)}; "
            f"use rollout.backend = 'engine' or 'hf' for this model (vLLM supports {len(supported)} architectures, "
            "e.g. Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM, MistralForCausalLM)")
