"""The model runner: hosts the model slots (slot.py), turns a step plan into forwards and samples its tokens.

``launch(plan)`` runs one step (step.py) on the plan's slot under inference mode with the model in eval mode and
returns before the device is done (pending.py):
- PREFILL: packed uncached tokens through every slot, logits of each row's last one from the plan's slot, one
  sampled token per row;
- DECODE: a burst of steps (decode_plan.py), each step's sampled tokens the next step's input on the device, so the
  burst syncs with the host once, when its tokens are read back; on CUDA it replays CUDA graphs per batch bucket;
  a tandem burst (tandem_runner.py) runs the hot and the frozen slot in turns or in paired ticks (two streams), as
  planned on the host, its first input fed from the previous launch like a plain burst's;
- VERIFY: each row's proposals, then the target over the row's last token and its proposals in one decode step of
  a row per token (CUDA graphs apply), then rejection sampling (rejection.py); nothing waits for the device. The
  ``draft`` slot's proposals run ``plan.rounds`` such rounds back to back on the device (draft_rounds.py); proposals
  known on the host (n-gram) and tandem segments run one (verify_runner.py).
``run`` and ``decode`` are the same launches on the target slot, waited for (benches and tests).

Block ids 0 .. num_blocks-1 belong to the block manager in every slot's pool; the scratch block is past them.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence as Seq

import torch
from torch import Tensor, nn

from tandemrl.engine.config import EngineConfig
from tandemrl.engine.kernels.fused import fused_available
from tandemrl.engine.kernels.triton_attention import triton_decode_available
from tandemrl.engine.kernels.paged_kv import PrefillMeta
from tandemrl.engine.model.attention import build_prefill_meta
from tandemrl.engine.model.decode_plan import build_decode_plan
from tandemrl.engine.model.draft_rounds import launch_draft_rounds
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import LastSamples, PendingTokens, copy_to_device, link_pending, resolve_pending
from tandemrl.engine.model.placement import CPU_KV_BUDGET_BYTES, canonical, kv_budget, move  # noqa: F401 (tests)
from tandemrl.engine.model.rejection import RejectionResult, rejection_sample
from tandemrl.engine.model.sampler import sample_with_probs
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.model.step_sampler import StepSampler
from tandemrl.engine.model.tandem_runner import launch_tandem_burst
from tandemrl.engine.model.verify_runner import keep_forced, launch_verify
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import TARGET, StepKind, StepPlan


class ModelRunner:
    """Forwards + sampling over paged KV pools for Qwen2/Qwen3/Llama/Mistral models (maybe peft-wrapped).

    models: the trainer's model (the ``target`` slot), or slot name -> model; each used in place. config: the
    engine's config, read whole (block_size, max_model_len, cuda_graphs, fused_kernels). device: where the models
    live (default: the target's embedding's device). attention_backend: "auto" (Triton kernels on CUDA when
    available), "triton" or "sdpa". fused_kernels: the Triton kernels of kernels/ (RMSNorm + residual add, RoPE
    with the K/V store, SiLU product, grouped q/k/v and gate/up, the one-read sampler) on CUDA when Triton is
    importable; CPU keeps torch ops.
    """

    def __init__(self, models: nn.Module | Mapping[str, nn.Module], config: EngineConfig | None = None,
                 device: torch.device | str | None = None, *, attention_backend: str = "auto") -> None:
        config = config or EngineConfig()
        config.validate()
        models = dict(models) if isinstance(models, Mapping) else {TARGET: models}
        if TARGET not in models:
            raise ValueError(f"the runner needs a {TARGET!r} slot, got {sorted(models)}")
        self.device = canonical(device if device is not None else next(models[TARGET].parameters()).device)
        self.block_size = config.block_size
        self.enforce_eager = not config.cuda_graphs or self.device.type != "cuda"
        self.use_triton = _pick_backend(attention_backend, self.device)
        self.fused_kernels = config.fused_kernels and fused_available(self.device)
        self.slots = {name: self._slot(name, model, config, attention_backend) for name, model in models.items()}
        self.max_model_len = min(slot.max_model_len for slot in self.slots.values())
        _check_vocabularies(self.slots)
        self.sampler = StepSampler(self.device, self.fused_kernels)
        # A slot on another device samples there (its rows' sampling columns and generator live there).
        self._samplers = {self.device: self.sampler}
        for slot in self.slots.values():
            self._samplers.setdefault(slot.device, StepSampler(slot.device, slot.fused_kernels))
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
        if device == self.device:
            use_triton, fused, eager = self.use_triton, self.fused_kernels, self.enforce_eager
        else:
            use_triton = _pick_backend(attention_backend if device.type == self.device.type else "auto", device)
            fused = config.fused_kernels and fused_available(device)
            eager = not config.cuda_graphs or device.type != "cuda"
        return ModelSlot(name, model, device, self.block_size, config.max_model_len, use_triton=use_triton,
                         fused_kernels=fused, enforce_eager=eager, warmup_stream=stream,
                         home=self.device)

    def _launch_context(self) -> LaunchContext:
        """What the verify, round and tandem launches read of this runner (launch_context.py)."""
        return LaunchContext(self.device, self.block_size, self.num_blocks, self.max_model_len, self.slots,
                             self._samplers, self.accept)

    @property
    def pairs_tandem_forwards(self) -> bool:
        """Whether a tandem burst runs in paired ticks (launch_context.py)."""
        return self.context.pairs_tandem_forwards

    def sampler_for(self, slot: ModelSlot) -> StepSampler:
        """The sampler of the slot's device (the runner's own ``sampler`` on the runner's device)."""
        return self._samplers[slot.device]

    @property
    def target(self) -> ModelSlot:
        return self.slots[TARGET]

    @property
    def spec(self):  # the target's DecoderSpec (benches)
        return self.target.spec

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
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        vocab = max(slot.spec.vocab_size for slot in self.slots.values())
        fits = []
        for device in {slot.device for slot in self.slots.values()}:
            per_block = sum(s.bytes_per_block(block_size) for s in self.slots.values() if s.device == device)
            fits.append(int(kv_budget(device, gpu_memory_utilization, vocab) // per_block))
        return max(0, min(fits) - 1)  # minus the scratch block

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate every slot's pool: `num_blocks` blocks plus the scratch block each."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
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
            if plan.kind is StepKind.VERIFY:
                rounds = plan.feed is None and plan.forced is None  # the draft proposes, on the device
                pending = (launch_draft_rounds if rounds else launch_verify)(self.context, slot, plan)
                self._last = None  # how many tokens a row keeps is known on the device only
                return pending
            if plan.kind is StepKind.PREFILL:
                hidden = self._prefill(slot, plan.seqs)
                if plan.forced is not None:  # tandem: some rows' first token is the frozen model's
                    result, own = self._first_tokens(slot, plan, hidden)
                    # one token per row, whoever wrote it: the next burst may be launched before it is read back
                    self._last = LastSamples.of(plan.seqs, plan.num_tokens, result.tokens)
                    return PendingTokens(result.tokens, result.logprobs, plan.num_tokens, accepted=result.num_accepted,
                                         own=own)
                tokens, logprobs = self.sampler.for_rows(plan.seqs)(slot.logits(hidden[slot.name]))
                tokens, logprobs = tokens[:, None], logprobs[:, None]
            elif plan.tandem is not None:  # a row returns exactly its planned tokens: the next launch may feed on them
                with eval_mode(self.slots[plan.proposer].modules):
                    tokens, logprobs = launch_tandem_burst(self.context, plan, self._last)
            else:
                tokens, logprobs = self._decode_burst(slot, plan.seqs, plan.num_tokens)
            self._last = LastSamples.of(plan.seqs, plan.num_tokens, tokens)
            return PendingTokens(tokens, logprobs, plan.num_tokens)

    def run(self, seqs: Seq[Sequence], is_prefill: bool) -> tuple[list[int], list[float]]:
        """One forward of the target for `seqs` and one sampled token per sequence, waited for."""
        if not seqs:
            return [], []
        kind = StepKind.PREFILL if is_prefill else StepKind.DECODE
        out = self.launch(StepPlan(kind, list(seqs), [1] * len(seqs))).result()
        return [t[0] for t in out.token_ids], [lp[0] for lp in out.logprobs]

    def decode(self, seqs: Seq[Sequence], steps: Seq[int]) -> tuple[list[list[int]], list[list[float]]]:
        """A decode burst of the target, waited for: per sequence its tokens and their log-probs."""
        if not seqs:
            return [], []
        out = self.launch(StepPlan(StepKind.DECODE, list(seqs), list(steps))).result()
        return out.token_ids, out.logprobs

    def _decode_burst(self, slot: ModelSlot, seqs: Seq[Sequence], steps: Seq[int]) -> tuple[Tensor, Tensor]:
        """[B, K] tokens and log-probs of a burst, left on the device (no host sync)."""
        plan = build_decode_plan(seqs, steps, self.block_size, self.num_blocks, self.max_model_len)
        linked = link_pending(plan.ids, seqs, self._last)
        run_step, staged_ids = slot.decode_steps(plan)
        tokens = resolve_pending(staged_ids, self._last) if linked else None
        sample = self.sampler.for_rows(seqs)
        all_tokens, all_logprobs = [], []
        for j in range(plan.num_steps):
            tokens, logprobs = sample(slot.logits(run_step(j, tokens)))
            all_tokens.append(tokens)  # stacked once after the loop: no extra launches per step
            all_logprobs.append(logprobs)
        return torch.stack(all_tokens, 1), torch.stack(all_logprobs, 1)

    def _prefill(self, slot: ModelSlot, seqs: Seq[Sequence]) -> dict[str, Tensor]:
        """Every slot ingests the rows' uncached tokens (each model's cache holds every token of the sequence, whoever
        samples from it); per slot, the hidden states of each row's last token."""
        ids: list[int] = []
        query_lens, context_lens = [], []
        for seq in seqs:
            self._check(seq)
            # A fully cached sequence still recomputes its last token: we need that position's logits.
            start = min(seq.num_cached_tokens, seq.num_tokens - 1)
            ids += seq.token_ids[start:]
            query_lens.append(seq.num_tokens - start)
            context_lens.append(seq.num_tokens)
        tables = self._pad_tables([seq.block_table[:-(-seq.num_tokens // self.block_size)] for seq in seqs])
        host_ids = torch.tensor(ids, dtype=torch.long)
        inputs: dict[tuple[torch.device, bool], tuple[Tensor, PrefillMeta]] = {}  # staged once per device
        hidden = {}
        for name, other in self.slots.items():
            key = (other.device, other.use_triton)
            if key not in inputs:
                inputs[key] = (copy_to_device(host_ids, other.device),
                               build_prefill_meta(query_lens, context_lens, tables, self.block_size, other.device,
                                                  use_triton=other.use_triton))
            input_ids, meta = inputs[key]
            with eval_mode(other.modules):
                hidden[name] = other.forward(input_ids, meta, rows=meta.last_rows)
        return hidden

    def _first_tokens(self, slot: ModelSlot, plan: StepPlan,
                      hidden: dict[str, Tensor]) -> tuple[RejectionResult, tuple[Tensor, Tensor]]:
        """A tandem prefill: each row's first token from the model that owns its position (``forced`` 1: the
        proposer), with the target's log-prob of it."""
        proposer = self.slots[plan.proposer]
        sampler = self.sampler_for(proposer)  # on the proposer's device: only its tokens cross
        with proposer.on_device():
            frozen, _ = sample_with_probs(proposer.logits(hidden[plan.proposer]), sampler.temperatures(plan.seqs),
                                          sampler.generator(plan.seqs))
        frozen = move(frozen, self.device)
        target_logits = slot.logits(hidden[slot.name])[:, None]
        return keep_forced(self.context, target_logits, frozen[:, None], plan.forced, plan.seqs)

    def accept(self, logits: Tensor, probs: Tensor, tokens: Tensor, num_draft: Tensor, temperature: Tensor,
               generator: torch.Generator | None, greedy_only: bool) -> RejectionResult:
        """Which proposals a verify step keeps: the standard rejection rule (rejection.py) at the rows' target
        temperatures [B]. (bench/speculative.py overrides it to fix the acceptance rate; nothing else may.)"""
        return rejection_sample(logits, probs, tokens, num_draft, temperature, generator, greedy_only=greedy_only)

    def _pad_tables(self, tables: list[list[int]]) -> Tensor:
        """[S, W] long on the host, rows padded with the scratch block (a valid id nobody owns)."""
        width = max(len(t) for t in tables)
        pad = self.num_blocks
        return torch.tensor([t + [pad] * (width - len(t)) for t in tables], dtype=torch.long)

    def _check(self, seq: Sequence) -> None:
        """Clear errors for what would otherwise be an out-of-bounds write on the device."""
        n, bs = seq.num_tokens, self.block_size
        if n == 0:
            raise ValueError(f"sequence {seq.seq_id} has no tokens")
        if seq.num_pending:
            raise RuntimeError(f"sequence {seq.seq_id} cannot be prefilled with {seq.num_pending} tokens pending")
        if n > self.max_model_len:
            raise ValueError(f"sequence {seq.seq_id} has {n} tokens, more than max_model_len {self.max_model_len}")
        if len(seq.block_table) * bs < n:
            raise ValueError(f"sequence {seq.seq_id} has {n} tokens but {len(seq.block_table)} blocks of {bs}")
        if any(not 0 <= b < self.num_blocks for b in seq.block_table):
            raise ValueError(f"sequence {seq.seq_id} has block ids outside [0, {self.num_blocks}): {seq.block_table}")


def _check_vocabularies(slots: Mapping[str, ModelSlot]) -> None:
    """Slots exchange token ids: their vocabularies must be the same size."""
    sizes = {name: slot.spec.vocab_size for name, slot in slots.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"model slots must share a vocabulary; their sizes differ: {sizes}")


def _pick_backend(name: str, device: torch.device) -> bool:
    """Whether decode uses the Triton kernel."""
    if name == "auto":
        return triton_decode_available(device)
    if name == "triton":
        if not triton_decode_available(device):
            raise ValueError(f"attention_backend='triton' needs the triton package and a CUDA device (got {device})")
        return True
    if name == "sdpa":
        return False
    raise ValueError(f"attention_backend must be 'auto', 'triton' or 'sdpa', got {name!r}")
