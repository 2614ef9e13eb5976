"""The model runner: hosts the model slots (slot.py), turns a step plan into forwards and samples its tokens.

``launch(plan)`` runs one step (step.py) on the plan's slot under inference mode with the model in eval mode and
returns before the device is done (pending.py): PREFILL in prefill.py, DECODE in decode_burst.py (or tandem_runner.py
for a tandem burst), VERIFY in rounds.py. ``run`` and ``decode`` are the same launches on the target slot, waited for
(benches and tests).

Block ids 0 .. num_blocks-1 belong to the block manager in every slot's pool; the scratch block is past them.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence as Seq

import torch
from torch import nn

from tandemrl.engine.config import EngineConfig
from tandemrl.engine.kernels.fused import fused_available
from tandemrl.engine.kernels.triton_attention import triton_decode_available
from tandemrl.engine.model.acceptance import acceptance_rule
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import LastSamples, PendingTokens
from tandemrl.engine.model.decode_burst import launch_decode_burst
from tandemrl.engine.model.placement import CPU_KV_BUDGET_BYTES, canonical, kv_budget  # noqa: F401 (tests)
from tandemrl.engine.model.prefill import launch_prefill
from tandemrl.engine.model.rounds import launch_rounds
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.model.step_sampler import StepSampler
from tandemrl.engine.model.tandem_runner import launch_tandem_burst
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import TARGET, DecodeStep, PrefillStep, StepPlan, VerifyStep


class ModelRunner:
    """Forwards + sampling over paged KV pools for Qwen2/Qwen3/Llama/Mistral models (maybe peft-wrapped).

    models: the trainer's model (the ``target`` slot), or slot name -> model; each used in place. device: where the
    models live (default: the target's). attention_backend: "auto" (Triton kernels on CUDA when available), "triton"
    or "sdpa". acceptance: the rule that checks speculative proposals, by name (acceptance.py; a benchmark registers
    and names its own).
    """

    def __init__(self, models: nn.Module | Mapping[str, nn.Module], config: EngineConfig | None = None,
                 device: torch.device | str | None = None, *, attention_backend: str = "auto",
                 acceptance: str = "rejection") -> None:
        config = config or EngineConfig()
        config.validate()
        models = dict(models) if isinstance(models, Mapping) else {TARGET: models}
        if TARGET not in models:
            raise ValueError(f"the runner needs a {TARGET!r} slot, got {sorted(models)}")
        self.device = canonical(device if device is not None else next(models[TARGET].parameters()).device)
        self.block_size = config.block_size
        self.use_triton, self.fused_kernels, self.enforce_eager = _kernels(config, attention_backend, self.device)
        self.slots = {name: self._slot(name, model, config, attention_backend) for name, model in models.items()}
        self.max_model_len = min(slot.max_model_len for slot in self.slots.values())
        sizes = {name: slot.spec.vocab_size for name, slot in self.slots.items()}
        if len(set(sizes.values())) > 1:  # slots exchange token ids
            raise ValueError(f"model slots must share a vocabulary; their sizes differ: {sizes}")
        # A sampler per device: a slot's rows sample on its device (their sampling columns and generator live there).
        self._samplers = {slot.device: StepSampler(slot.device, slot.fused_kernels) for slot in self.slots.values()}
        self.sampler = self._samplers[self.device]
        acceptance_rule(acceptance)  # ValueError now for an unknown name, not at the first verify step
        self.acceptance = acceptance
        self.num_blocks = 0
        self._last: LastSamples | None = None  # the latest launch's tokens: pending ones are fed from here
        self.context = self._launch_context()

    def _slot(self, name: str, model: nn.Module, config: EngineConfig, attention_backend: str) -> ModelSlot:
        """The target on the runner's device; another slot on its model's device (e.g. tandem's frozen model on
        another GPU or the CPU), with the kernels that device has."""
        device = self.device if name == TARGET else canonical(next(model.parameters()).device)
        # A capture stream per slot, made once: each stream costs a cuBLAS workspace for the life of the process
        # (32 MiB on an H100), and a graph keeps the workspace of the stream it was captured on. Two slots' graphs
        # replaying at once (tandem's paired ticks) must not share one: their GEMMs would race in it.
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        backend = attention_backend if device.type == self.device.type else "auto"
        use_triton, fused, eager = _kernels(config, backend, device)
        return ModelSlot(name, model, device, self.block_size, config.max_model_len, use_triton=use_triton,
                         fused_kernels=fused, enforce_eager=eager, warmup_stream=stream,
                         home=self.device, kv_cache_dtype=config.kv_cache_dtype)

    def _launch_context(self) -> LaunchContext:
        """What the verify, round and tandem launches read of this runner (launch_context.py)."""
        return LaunchContext(self.device, self.block_size, self.num_blocks, self.max_model_len, self.slots,
                             self._samplers, self.acceptance)

    @property
    def pairs_tandem_forwards(self) -> bool:
        """Whether a tandem burst runs in paired ticks (launch_context.py)."""
        return self.context.pairs_tandem_forwards

    @property
    def target(self) -> ModelSlot:
        return self.slots[TARGET]

    def weights_version(self) -> Hashable:
        """Changes whenever any slot's weights change (slot.py); the engine ties cached K/V to it."""
        return tuple(slot.weights_version() for slot in self.slots.values())

    def reset_rng(self) -> None:
        """Forget the seeded generators: the next seeded step starts its stream afresh (call at each new run)."""
        for sampler in self._samplers.values():
            sampler.reset()

    # ------------------------------------------------------------------ KV pools

    def bytes_per_block(self, block_size: int | None = None) -> int:
        """K and V of every layer of every slot for one block."""
        return sum(slot.bytes_per_block(block_size) for slot in self.slots.values())

    def num_blocks_that_fit(self, block_size: int, gpu_memory_utilization: float) -> int:
        """Blocks the pools may have: on each device what its budget (placement.kv_budget) holds of its slots'
        blocks, the smallest of these (every slot holds the same block ids)."""
        vocab = max(slot.spec.vocab_size for slot in self.slots.values())
        fits = []
        for device in {slot.device for slot in self.slots.values()}:
            per_block = sum(s.bytes_per_block(block_size) for s in self.slots.values() if s.device == device)
            fits.append(int(kv_budget(device, gpu_memory_utilization, vocab) // per_block))
        return max(0, min(fits) - 1)  # minus the scratch block

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate every slot's pool: `num_blocks` blocks plus the scratch block each."""
        self._last = None
        for slot in sorted(self.slots.values(), key=lambda slot: slot.parked_pool_address):
            slot.allocate(num_blocks)
        self.num_blocks = num_blocks
        self.context = self._launch_context()

    def free_kv_cache(self, keep_graphs: bool = False) -> None:
        """Drop the pools and the CUDA graphs (their buffers and pool). The memory goes back to PyTorch's caching
        allocator, where the trainer of this process reuses it; emptying that cache on every sleep would make the
        next update allocate from the device again (0.37 s of a 1.98 s GRPO step on an H100, 2026-11-22).
        ``keep_graphs`` (the engine's sleep): the graphs are parked and come back with the next
        ``allocate_kv_cache`` if the pools land at the same addresses and no parameter moved (slot.py)."""
        for slot in self.slots.values():
            slot.free(keep_graphs)
        self._last = None
        self.num_blocks = 0
        self.context = self._launch_context()

    # ------------------------------------------------------------------ one step

    def launch(self, plan: StepPlan) -> PendingTokens:
        """Start ``plan`` (see the module docstring) and return without waiting for the device. A sequence's pending
        tokens (sequence.py) must come from the previous launch: the last one is fed to this one on the device."""
        if not plan.seqs:
            raise ValueError("launch needs at least one sequence")
        if not self.num_blocks:
            raise RuntimeError("ModelRunner has no KV cache: call allocate_kv_cache(num_blocks) first")
        slot = self.slots.get(plan.slot)
        if slot is None:
            raise ValueError(f"no model slot {plan.slot!r}; the runner has {sorted(self.slots)}")
        with eval_mode(slot.modules), torch.inference_mode():
            if isinstance(plan, VerifyStep):
                pending = launch_rounds(self.context, slot, plan)
                self._last = None  # how many tokens a row keeps is known on the device only
                return pending
            if isinstance(plan, PrefillStep):  # one token per row, whoever wrote it
                pending, tokens = launch_prefill(self.context, slot, plan)
            else:  # a row returns exactly its planned tokens: the next launch may feed on them
                if plan.tandem is not None:
                    with eval_mode(self.slots[plan.proposer].modules):
                        tokens, logprobs = launch_tandem_burst(self.context, plan, self._last)
                else:
                    tokens, logprobs = launch_decode_burst(self.context, slot, plan, self._last)
                pending = PendingTokens(tokens, logprobs, plan.num_tokens)
            self._last = LastSamples.of(plan.seqs, plan.num_tokens, tokens)
            return pending

    def run(self, seqs: Seq[Sequence], is_prefill: bool) -> tuple[list[int], list[float]]:
        """One forward of the target for `seqs` and one sampled token per sequence, waited for."""
        if not seqs:
            return [], []
        step = PrefillStep if is_prefill else DecodeStep
        out = self.launch(step(list(seqs), [1] * len(seqs))).result()
        return [t[0] for t in out.token_ids], [lp[0] for lp in out.logprobs]

    def decode(self, seqs: Seq[Sequence], steps: Seq[int]) -> tuple[list[list[int]], list[list[float]]]:
        """A decode burst of the target, waited for: per sequence its tokens and their log-probs."""
        if not seqs:
            return [], []
        out = self.launch(DecodeStep(list(seqs), list(steps))).result()
        return out.token_ids, out.logprobs


def _kernels(config: EngineConfig, attention_backend: str, device: torch.device) -> tuple[bool, bool, bool]:
    """(Triton decode attention, the fused kernels, eager: no CUDA graphs) on ``device``."""
    if attention_backend not in ("auto", "triton", "sdpa"):
        raise ValueError(f"attention_backend must be 'auto', 'triton' or 'sdpa', got {attention_backend!r}")
    triton = triton_decode_available(device)
    if attention_backend == "triton" and not triton:
        raise ValueError(f"attention_backend='triton' needs the triton package and a CUDA device (got {device})")
    return (attention_backend != "sdpa" and triton, config.fused_kernels and fused_available(device),
            not config.cuda_graphs or device.type != "cuda")
