"""The check that a weight update landed: vLLM's log-probs of a fixed probe sequence against the trainer's.

After every update the backend asks vLLM for the prompt log-probs of one fixed token sequence (raw: temperature
1, no filters) and compares them with the trainer model's own forward over the same tokens. Stale or partly
loaded weights move these log-probs far more than the numerical noise between two implementations allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from tandemrl.backends.hf_backend import sampling_mode
from tandemrl.backends.vllm.errors import WeightSyncError

# Largest |log-prob difference| two correct implementations show on the probe, by the weights' dtype.
DEFAULT_TOLERANCE = {torch.float32: 2e-3, torch.float16: 5e-2, torch.bfloat16: 2e-1}


@dataclass(frozen=True)
class Probe:
    token_ids: list[int]
    tolerance: float

    @classmethod
    def build(cls, vocab_size: int, length: int, dtype: torch.dtype, tolerance: float | None = None,
              seed: int = 0) -> "Probe":
        """A fixed pseudo-random sequence over the vocabulary (the same for a given seed and vocabulary)."""
        if length < 2:
            raise ValueError(f"the weight probe needs at least 2 tokens, got {length}")
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        return cls(ids, tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(dtype, 2e-1))

    def trainer_logprobs(self, model: nn.Module) -> list[float]:
        """log p(token i | tokens < i) for i >= 1 under the trainer's model, raw (temperature 1)."""
        device = next(model.parameters()).device
        ids = torch.tensor([self.token_ids], device=device)
        with sampling_mode(model), torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        logprobs = logits.log_softmax(-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        return logprobs.tolist()

    def check(self, expected: list[float], got: list[float], policy_version: int) -> float:
        """The largest difference; raises WeightSyncError when it is above the tolerance."""
        if len(got) != len(expected):
            raise WeightSyncError(f"the weight probe returned {len(got)} log-probs for {len(expected)} tokens")
        diffs = [abs(a - b) if math.isfinite(a - b) else math.inf for a, b in zip(expected, got)]  # NaN: worst
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        if diffs[worst] > self.tolerance:
            raise WeightSyncError(
                f"vLLM does not hold the trainer's weights of policy version {policy_version}: on the fixed probe "
                f"sequence its log-prob of token {worst + 1} is {got[worst]:.6f}, the trainer's {expected[worst]:.6f} "
                f"(|difference| {diffs[worst]:.3g} > tolerance {self.tolerance:g}; set rollout.vllm.probe_tolerance "
                "to change it). Rollouts from these weights would be stale, so the run stops here")
        return diffs[worst]
