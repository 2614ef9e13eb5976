"""A RolloutBackend over a running vLLM OpenAI server (rollout.vllm.mode = "server"), through its HTTP API only.

The server runs on its own (``python -m vllm.entrypoints.openai.api_server``, possibly on another host, in an
environment with its own torch); this process never imports vLLM. Rollouts go through ``/v1/completions`` with
token-id prompts (``n`` samples per GRPO group, the sampled tokens' log-probs, ``return_token_ids``). Whenever
``generate`` is asked for a policy version the server does not hold yet (and on the first call):

1. generation is paused (``/pause?mode=wait``: requests of other clients finish first);
2. the weights go in through ``/collective_rpc``: disk, vLLM's own ``reload_weights`` from a safetensors file
   (``transfer.py``); http, the worker extension's ``tandemrl_load_encoded_weights`` with the bytes inline;
3. the prefix cache is emptied (its K/V came from the old weights) and generation resumes;
4. the probe: the server's prompt log-probs of the fixed probe sequence must equal the trainer's (``probe.py``),
   or the run stops; then the server's weight version is set to ``tandemrl-<policy version>``, and every batch
   checks it afterwards (another client pushing weights in between is caught).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import httpx
from torch import nn

from tandemrl.backends.hf_backend import eos_token_ids
from tandemrl.backends.vllm import _compat
from tandemrl.backends.vllm.client import ServerClient
from tandemrl.backends.vllm.convert import Limits, choice_to_rollout, completion_body, request_error
from tandemrl.backends.vllm.errors import WeightSyncError
from tandemrl.backends.vllm.probe import Probe
from tandemrl.backends.vllm.transfer import encode_weights, write_weights
from tandemrl.config import VLLMConfig
from tandemrl.types import Request, RequestStats, Rollout


class VLLMServerBackend:
    """RolloutBackend (generate / sleep / wake / close) over a vLLM server; see the module docstring."""

    def __init__(self, model: nn.Module, tokenizer: Any, settings: VLLMConfig,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.client = ServerClient(settings.url or "", settings.timeout_s, transport=transport,
                                   async_transport=async_transport)
        started = time.perf_counter()
        self.info = self.client.handshake()
        _compat.check_version(self.info.version)
        self.startup_s = time.perf_counter() - started
        self.model, self.tokenizer = model, tokenizer
        vocab = min(model.get_input_embeddings().num_embeddings, len(tokenizer))
        lengths = [n for n in (settings.max_model_len, self.info.max_model_len) if n]  # the server's may be smaller
        self.limits = Limits(vocab, min(lengths) if lengths else int(model.config.max_position_embeddings))
        dtype = next(model.parameters()).dtype
        self.probe = Probe.build(vocab, settings.probe_tokens, dtype, settings.probe_tolerance)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self._own_dir = settings.weight_transfer == "disk" and settings.weights_dir is None
        self.weights_dir: Path | None = None  # disk: where the pushed weights go (the server reads them there)
        if settings.weight_transfer == "disk":
            self.weights_dir = Path(settings.weights_dir or tempfile.mkdtemp(prefix="tandemrl-vllm-weights-")).resolve()
        self.synced_version: int | None = None  # None: the server holds whatever it started with, never checked
        self.last_update_s = self.last_load_s = self.last_probe_s = 0.0
        self.last_probe_diff = float("nan")
        self._closed = False

    # ------------------------------------------------------------------ protocol

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]:
        if self._closed:
            raise RuntimeError("VLLMServerBackend.generate called after close()")
        if policy_version != self.synced_version:
            self.update_weights(policy_version)
        results: list[Rollout | None] = [None] * len(requests)
        groups: list[list[int]] = []
        for i, req in enumerate(requests):
            error = request_error(req, self.limits)
            if error is not None:
                results[i] = Rollout(req.request_id, list(req.prompt_ids), [], [], "error",
                                     policy_version=policy_version, error=error)
            elif groups and groups[-1][-1] == i - 1 and _same(requests[groups[-1][0]], req):
                groups[-1].append(i)  # a GRPO group: one HTTP request with n samples
            else:
                groups.append([i])
        arrival = time.perf_counter()
        bodies = [completion_body(self.info.model, requests[g[0]], self.eos_ids, g[0], len(g)) for g in groups]
        responses = self.client.completions(bodies) if bodies else []
        finished = time.perf_counter()
        for group, response in zip(groups, responses):
            for j, i in enumerate(group):
                results[i] = self._rollout(requests[i], response, j, policy_version, arrival, finished)
        if bodies:
            self._check_version_tag(policy_version)
        return results  # type: ignore[return-value]

    def sleep(self) -> None:
        """The server's memory is its own."""

    def wake(self) -> None:
        if self._closed:
            raise RuntimeError("VLLMServerBackend.wake called after close()")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.client.close()
        if self._own_dir and self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
        self.model = None  # type: ignore[assignment]  # the trainer owns the model

    # ------------------------------------------------------------------ weights

    def update_weights(self, policy_version: int) -> float:
        """Push the trainer's weights into the server, empty its prefix cache, check the probe. Seconds taken."""
        started = time.perf_counter()
        self.client.post("/pause", params={"mode": "wait"})
        try:
            self.push_weights()
            self.client.post("/reset_prefix_cache")  # cached K/V were computed with the old weights
        finally:
            self.client.post("/resume")
        loaded = time.perf_counter()
        self.last_probe_diff = self.check_weights(policy_version)
        self.client.post("/update_weight_version", {"new_version": version_tag(policy_version)})
        self.synced_version = policy_version
        self.last_load_s, self.last_probe_s = loaded - started, time.perf_counter() - loaded
        self.last_update_s = self.last_load_s + self.last_probe_s
        return self.last_update_s

    def push_weights(self) -> None:
        state = self.model.state_dict()
        if self.settings.weight_transfer == "http":
            self.client.collective_rpc("tandemrl_load_encoded_weights", args=[encode_weights(state)])
        else:
            assert self.weights_dir is not None
            write_weights(state, self.weights_dir)
            self.client.collective_rpc("reload_weights", kwargs={"weights_path": str(self.weights_dir)})

    def check_weights(self, policy_version: int) -> float:
        """The server's raw log-probs of the probe against the trainer's; raises WeightSyncError past the tolerance."""
        body = {"model": self.info.model, "prompt": self.probe.token_ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0}
        choice = self.client.post("/v1/completions", body)["choices"][0]
        try:
            steps = choice["prompt_logprobs"][1:]
            got = [float(step[str(token)]["logprob"]) for step, token in zip(steps, self.probe.token_ids[1:])]
        except (KeyError, TypeError) as exc:
            raise WeightSyncError(f"the vLLM server at {self.client.url} returned no prompt log-probs for the weight "
                                  f"probe ({type(exc).__name__}: {exc}); the update cannot be checked") from exc
        return self.probe.check(self.probe.trainer_logprobs(self.model), got, policy_version)

    # ------------------------------------------------------------------ helpers

    def _rollout(self, req: Request, response: dict[str, Any] | str, j: int, policy_version: int,
                 arrival: float, finished: float) -> Rollout:
        if isinstance(response, str):
            return Rollout(req.request_id, list(req.prompt_ids), [], [], "error", policy_version=policy_version,
                           error=f"the vLLM server refused the request: {response}")
        choice = next((c for c in response.get("choices", []) if c.get("index") == j), None)
        if choice is None:
            return Rollout(req.request_id, list(req.prompt_ids), [], [], "error", policy_version=policy_version,
                           error=f"the vLLM server's response has no choice {j}")
        stats = RequestStats(arrival, arrival, None, finished)
        return choice_to_rollout(req, choice, self._decode, policy_version, stats)

    def _check_version_tag(self, policy_version: int) -> None:
        held = self.client.get("/weight_info").get("weight_version")
        if held != version_tag(policy_version):
            raise WeightSyncError(
                f"the vLLM server at {self.client.url} changed weights during the batch: its weight version is "
                f"{held!r}, this trainer set {version_tag(policy_version)!r}. Does another trainer push to it? "
                "Rollouts from these weights would be stale, so the run stops here")

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def version_tag(policy_version: int) -> str:
    return f"tandemrl-{policy_version}"


def _same(a: Request, b: Request) -> bool:
    """Samples of one group; vLLM refuses n > 1 with greedy sampling, so greedy requests go alone."""
    return a.params.temperature > 0 and list(a.prompt_ids) == list(b.prompt_ids) and a.params == b.params
