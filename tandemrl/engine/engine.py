"""The engine's step loop: schedule -> launch the model -> postprocess, plus request intake and sleep/wake.

Asynchronous scheduling (``EngineConfig.async_scheduling``, on by default): a step schedules and launches the next
batch BEFORE it reads back the tokens of the batch launched by the step before, so the host's scheduling,
staging and postprocessing run while the device computes instead of between its steps. The scheduler counts
those tokens as pending placeholders (sequence.py); the runner feeds each one to the next batch on the device. A
sequence that the read-back tokens finish (EOS, a stop string) may have computed one batch more than it needed;
those tokens are dropped. Off (and always for speculative steps and tandem segments: ``__init__``), each step reads
its own tokens back before returning.

Policy versions: ``set_policy_version`` names the weights the runner holds from the next launched step on (call it
between two steps, after the weights changed in place); each step records the version it was launched under for the
tokens it samples, so running sequences continue under new weights with every token's version known
(``Rollout.version_runs``). Until it is called, a request's tokens carry the version it was added with.

Invalid requests never raise: each becomes a finished Rollout with ``finish_reason="error"`` and ``error``
set, returned by the next ``step()`` (or in place by ``generate``), so one bad request cannot stop a batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import time
from typing import Any, Callable, ContextManager, Hashable, Mapping, Protocol, Sequence as Seq

import torch

from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.scheduler import Scheduler
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.speculative import Speculation
from tandemrl.engine.step import StepOutput, StepPlan
from tandemrl.engine.stopping import truncate_at_stop, validate_stop
from tandemrl.engine.tandem import TandemRollouts
from tandemrl.types import Request, RequestStats, Rollout, SamplingParams


class PendingStep(Protocol):
    def result(self) -> StepOutput:
        """The launched step's output; waits for the device."""
        ...


class ModelRunnerProtocol(Protocol):
    """What the engine needs from the model side (model slots with their KV pools, forwards, sampling)."""

    def launch(self, plan: StepPlan) -> PendingStep:
        """Start ``plan`` (step.py); pending placeholders are the previous launch's tokens, fed on the device."""
        ...

    def allocate_kv_cache(self, num_blocks: int) -> None: ...

    def free_kv_cache(self, keep_graphs: bool = False) -> None: ...

    def num_blocks_that_fit(self, block_size: int, gpu_memory_utilization: float) -> int: ...

    def bytes_per_block(self) -> int: ...  # KV bytes of one block over every model slot

    def weights_version(self) -> Hashable: ...  # changes whenever the weights change (cached K/V is tied to it)

    @property
    def pairs_tandem_forwards(self) -> bool: ...  # tandem bursts in paired ticks (tandem_burst.py)


@dataclasses.dataclass
class _Launched:  # a step the runner has launched, its tokens not yet read back
    plan: StepPlan
    pending: PendingStep


class LLMEngine:
    def __init__(self, runner: ModelRunnerProtocol, tokenizer: Any, config: EngineConfig,
                 eos_ids: Seq[int], clock: Callable[[], float] = time.perf_counter,
                 speculative: Speculation | None = None, tandem: TandemRollouts | None = None,
                 device: torch.device | None = None) -> None:
        """``device``: the runner's GPU, made current around each step, sleep and wake: kernels (Triton's too) launch
        on the current device's stream, and a thread that did not build the engine (an async rollout worker, the
        server's engine thread) starts with cuda:0 current."""
        config.validate()
        self._device = device if device is not None and device.type == "cuda" else None
        # speculative.py and tandem.py: built above the engine (SpeculativeConfig / TandemConfig.for_engine)
        self.speculative, self.tandem = speculative, tandem
        if tandem is not None and speculative is not None:
            raise ValueError("tandem rollouts and speculative decoding cannot be combined yet")
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        num_blocks = config.num_blocks
        if num_blocks is None:
            num_blocks = int(runner.num_blocks_that_fit(config.block_size, config.gpu_memory_utilization))
            if num_blocks < 1:
                raise ValueError(f"no room for a KV cache: the model runner fits {num_blocks} blocks of "
                                 f"{config.block_size} tokens at gpu_memory_utilization="
                                 f"{config.gpu_memory_utilization}; raise it or set num_blocks")
            if config.max_model_len is not None:  # a pool sized from memory never takes more than max_num_seqs
                # sequences of max_model_len hold at once: a tiny model on the CPU would zero 256 MiB on every wake
                num_blocks = min(num_blocks, config.max_num_seqs * -(-config.max_model_len // config.block_size))
        self.num_blocks = num_blocks
        runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        decode = self._decode if tokenizer is not None else None
        self.scheduler = Scheduler(config, self.block_manager, eos_ids, decode=decode, speculative=speculative,
                                   tandem=tandem, paired_tandem=tandem is not None and runner.pairs_tandem_forwards)
        # Speculative steps and tandem segments (boundary selectors) wait for their tokens: what a step kept decides
        # where the next one starts. Tandem bursts with writers drawn ahead return what they planned: no need.
        segments = self.tandem is not None and not self.tandem.drawn_ahead
        self._synchronous = not config.async_scheduling or speculative is not None or segments
        self._seq_ids = itertools.count()
        self._live: dict[int, Sequence] = {}  # seq_id -> unfinished sequence
        self._ready: list[tuple[int, Rollout]] = []  # (seq_id, rollout) not yet returned by a step
        self._in_flight: _Launched | None = None  # launched, its tokens not read back yet (async scheduling)
        self._asleep = False
        self._clock = clock
        self._block_bytes = runner.bytes_per_block()
        self._runner_weights = runner.weights_version()  # as of the last prefill schedule
        self.policy_version: int | None = None  # the weights' version (set_policy_version); None: each request's
        # called at the start of every step, before it schedules: where a rollout worker applies a weight push
        self.between_steps: Callable[[], None] | None = None
        self._counts = {"steps": 0, "prefill_steps": 0, "decode_steps": 0, "decode_tokens": 0, "errors": 0}

    # ------------------------------------------------------------------ requests

    def add_request(self, request: Request, policy_version: int = 0) -> str | None:
        """Queue ``request``; returns None, or the error message if it was rejected (see module doc)."""
        return self._add(request, policy_version)[1]

    def _add(self, request: Request, policy_version: int) -> tuple[int, str | None]:
        seq_id = next(self._seq_ids)
        error, prompt, params = _check_request(request)
        if error is None and self.speculative is not None and params.temperature > 0 and (params.top_k > 0
                                                                                     or params.top_p < 1):
            error = ("speculative decoding samples with temperature only (the rejection rule): top_k and top_p are "
                     "not supported; unset them or turn rollout.speculative off")
        stats = RequestStats(arrival_time=self._clock(), prompt_tokens=len(prompt), kv_block_bytes=self._block_bytes)
        if error is None:
            seq = Sequence(seq_id, str(request.request_id), list(prompt), len(prompt), params,
                           policy_version=policy_version, stats=stats)
            if self.tandem is not None and request.tandem:
                self.scheduler.owner_streams[seq] = self.tandem.owner_stream(seq.request_id, params.seed)
            try:
                self.scheduler.add(seq)
            except ValueError as exc:
                error = str(exc)
            else:
                self._live[seq_id] = seq
                return seq_id, None
        self._counts["errors"] += 1
        rollout = Rollout(str(request.request_id), list(prompt), [], [], "error",
                          policy_version=policy_version, error=error, stats=stats)
        self._ready.append((seq_id, rollout))
        return seq_id, error

    def abort(self, request_id: str) -> bool:
        """Stop generating ``request_id`` (every sequence with that id) and free its blocks; no rollout
        comes back for it. Returns False if no unfinished request has that id."""
        seq_ids = {i for i, r in self._ready if r.request_id == request_id}
        seq_ids |= {s.seq_id for s in self._live.values() if s.request_id == request_id}
        self._drop(seq_ids)
        return bool(seq_ids)

    def progress(self, sent: Mapping[str, int] | None = None) -> list[tuple[str, list[int], list[float]]]:
        """(request_id, completion ids, their log-probs) read back so far, for every unfinished sequence: what a
        streaming server sends before the rollout finishes (pending placeholders are left out). ``sent``: how many
        of a request's completion tokens the caller has already; only those after them come back (a streaming
        server's step then copies its new tokens, not every sequence's whole completion)."""
        out = []
        for seq in self._live.values():
            known = seq.num_known_tokens - seq.num_prompt_tokens
            start = min(sent.get(seq.request_id, 0), known) if sent is not None else 0
            first = seq.num_prompt_tokens + start
            out.append((seq.request_id, seq.token_ids[first:first + known - start], seq.logprobs[start:known]))
        return out

    def load(self) -> dict[str, int]:
        """Waiting and running sequences, and KV blocks in use (a server's metrics)."""
        return {"waiting": len(self.scheduler.waiting), "running": len(self.scheduler.running),
                "kv_blocks_used": self.num_blocks - self.block_manager.num_free_blocks, "kv_blocks": self.num_blocks}

    def has_unfinished(self) -> bool:
        return bool(self._ready) or self.scheduler.has_unfinished() or self._in_flight is not None

    # ------------------------------------------------------------------ stepping

    def step(self) -> list[Rollout]:
        """One engine step; returns the rollouts that finished in it (and pending error rollouts)."""
        return [r for _, r in self._step()]

    def _on_device(self) -> ContextManager:
        return torch.cuda.device(self._device) if self._device is not None else contextlib.nullcontext()

    def _step(self) -> list[tuple[int, Rollout]]:
        with self._on_device():
            if self._asleep:
                raise RuntimeError("the engine is asleep (its KV cache is freed); call wake() first")
            if self.between_steps is not None:
                self.between_steps()
            out, self._ready = self._ready, []
            try:
                # A prefill may look up cached blocks: after the weights changed in place (the runner's version
                # moved), none computed with the old ones may serve a new prompt (block_manager.py).
                if self.scheduler.waiting and (current := self.runner.weights_version()) != self._runner_weights:
                    self._runner_weights = current
                    self.invalidate_prefix_cache()
                plan = self.scheduler.schedule(in_flight=self._in_flight is not None)
                launched = self._launch(plan) if plan else None
                if launched is None and self._in_flight is None and self.scheduler.has_unfinished():
                    raise RuntimeError("scheduler made no progress with requests waiting")  # add() rules this out
                previous, self._in_flight = self._in_flight, launched
                if previous is not None:
                    out += self._complete(previous)
                if self._synchronous:
                    self._drain(out)
            except BaseException:
                self._ready = out + self._ready  # still to be returned
                raise
            return out

    def _launch(self, plan: StepPlan) -> _Launched:
        try:
            pending = self.runner.launch(plan)
        except BaseException:
            if plan.is_prefill:  # nothing was computed
                self.scheduler.requeue(plan.seqs)
            raise  # a failed decode launch leaves its sequences as they were: the same step can run again
        version = self.policy_version
        for seq, n in zip(plan.seqs, plan.num_tokens):
            seq.add_pending(n, seq.policy_version if version is None else version)
        self._counts["steps"] += 1
        if plan.is_prefill:
            self._counts["prefill_steps"] += 1
            now = self._clock()
            for seq in plan.seqs:  # a first prefill's stats: when it left the queue, what the prefix cache served
                if seq.stats.first_scheduled_time is None:
                    seq.stats.first_scheduled_time = now
                    seq.stats.cached_prompt_tokens = min(seq.num_cached_tokens, seq.num_prompt_tokens)
        else:  # decode tokens computed, including those after a stop inside a burst
            self._counts["decode_steps"] += max(plan.num_tokens)
            self._counts["decode_tokens"] += sum(plan.num_tokens)
        return _Launched(plan, pending)

    def _complete(self, launched: _Launched) -> list[tuple[int, Rollout]]:
        """Read a launched step's tokens back and postprocess them; the rollouts of the sequences it finished. If
        the read fails, every step in flight is abandoned (its sequences are as before it was launched)."""
        try:
            output = launched.pending.result()
        except BaseException:
            for step in (launched, self._in_flight):
                if step is not None:
                    self._abandon(step)
            self._in_flight = None
            raise
        finished = self.scheduler.postprocess(launched.plan, output, self._clock())
        for seq in finished:
            self._live.pop(seq.seq_id, None)
        return [(seq.seq_id, self._to_rollout(seq)) for seq in finished]

    def _abandon(self, launched: _Launched) -> None:
        seqs = [s for s in launched.plan.seqs if not s.is_finished]
        for seq in seqs:
            seq.drop_pending()
            self.block_manager.release_reserved(seq)
        if launched.plan.is_prefill:
            self.scheduler.requeue(seqs)

    def _drain(self, out: list[tuple[int, Rollout]]) -> None:
        """Read back the step in flight, if any, adding the rollouts it finishes to ``out``."""
        launched, self._in_flight = self._in_flight, None
        if launched is not None:
            out += self._complete(launched)

    def generate(self, requests: Seq[Request], policy_version: int = 0) -> list[Rollout]:
        """Run ``requests`` to completion; one rollout per request, in request order.

        Rollouts of other requests that finish meanwhile stay queued for a later ``step()``. If a step
        raises, this call's requests are dropped from the engine before the error propagates.
        """
        index = {self._add(req, policy_version)[0]: i for i, req in enumerate(requests)}
        results: list[Rollout | None] = [None] * len(requests)
        others: list[tuple[int, Rollout]] = []
        try:
            while index:  # this call's sequences still to finish
                for seq_id, rollout in self._step():
                    if seq_id in index:
                        results[index.pop(seq_id)] = rollout
                    else:
                        others.append((seq_id, rollout))
            if not self.scheduler.has_unfinished():  # what is still in flight computes nothing anyone waits for
                self._drain(others)
        except BaseException:
            self._drop(set(index))  # the unfinished ones
            raise
        finally:
            self._ready.extend(others)
        return results  # type: ignore[return-value]

    def _drop(self, seq_ids: set[int]) -> None:
        """Forget these sequences, finished or not."""
        self._ready = [(i, r) for i, r in self._ready if i not in seq_ids]
        for seq_id in seq_ids & self._live.keys():
            self.scheduler.abort(self._live.pop(seq_id))

    # ------------------------------------------------------------------ weights

    def set_policy_version(self, version: int) -> None:
        """The weights changed in place (between two steps) and are now ``version``: steps launched from now on
        sample under it, a step in flight keeps the version it was launched with; new prompts reuse no block cached
        under the old weights (running sequences keep theirs)."""
        if version != self.policy_version:
            self.policy_version = version
            self.invalidate_prefix_cache()

    def invalidate_prefix_cache(self) -> None:
        """New prompts reuse no cached block computed so far (call it after a weight change the runner cannot see,
        e.g. a write through ``param.data``)."""
        self.block_manager.set_weights_version(self.block_manager.weights_version + 1)

    # ------------------------------------------------------------------ memory

    def sleep(self) -> None:
        """Free the KV cache (running sequences go back to waiting and are recomputed after wake())."""
        if self._asleep:
            return
        with self._on_device():
            self._drain(self._ready)
            self.scheduler.preempt_all()
            self.runner.free_kv_cache(keep_graphs=True)
        self.block_manager.reset()
        self._asleep = True

    def wake(self) -> None:
        if not self._asleep:
            return
        with self._on_device():
            self.runner.allocate_kv_cache(self.num_blocks)
        self._asleep = False

    @property
    def is_asleep(self) -> bool:
        return self._asleep

    def stats(self) -> dict[str, float]:
        bm = self.block_manager
        requested, computed = bm.prefill_tokens_requested, bm.prefill_tokens_computed
        return {
            **self._counts,
            "prefill_tokens_requested": requested,
            "prefill_tokens_computed": computed,
            "prefix_cache_saved_fraction": (requested - computed) / requested if requested else 0.0,
            "prefix_cache_hit_blocks": bm.cache_hit_blocks,
            "prefix_cache_queried_blocks": bm.cache_queried_blocks,
            "preemptions": self.scheduler.num_preemptions,
            "num_blocks": self.num_blocks,
            "free_blocks": bm.num_free_blocks,
        }

    # ------------------------------------------------------------------ helpers

    def _decode(self, ids: Seq[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _to_rollout(self, seq: Sequence) -> Rollout:
        completion = seq.completion_ids
        text = ""
        if self.tokenizer is not None:
            text, _ = truncate_at_stop(self._decode(completion), seq.params.stop)
        runs = [run for run in seq.version_runs if run[0] < len(completion)]  # a stop may cut the last ones
        return Rollout(seq.request_id, seq.token_ids[:seq.num_prompt_tokens], completion, list(seq.logprobs),
                       seq.finish_reason or "stop", text=text,
                       policy_version=runs[0][1] if runs else seq.policy_version, stats=seq.stats,
                       token_sources=list(self.scheduler.token_sources.get(seq, ())),
                       version_runs=runs if len(runs) > 1 else [])


def _check_request(request: Request) -> tuple[str | None, list[int], SamplingParams]:
    """(error message or None, the prompt as plain ints, the params with ``stop`` as a tuple).

    Out-of-vocabulary ids are the runner's business.
    """
    params = request.params
    try:
        prompt = list(map(operator.index, request.prompt_ids))
    except TypeError:
        return f"prompt_ids must be a list of integers, got {repr(request.prompt_ids)[:80]}", [], params
    if not prompt:
        return "empty prompt", prompt, params
    if min(prompt) < 0:
        return f"prompt token ids must be >= 0, got {min(prompt)}", prompt, params
    if isinstance(params.max_tokens, bool) or not isinstance(params.max_tokens, int):
        return f"max_tokens must be an integer, got {params.max_tokens!r}", prompt, params
    try:
        params = dataclasses.replace(params, stop=validate_stop(params.stop))  # a bare str is one stop string
        params.validate()
    except (ValueError, TypeError) as exc:
        return str(exc), prompt, params
    return None, prompt, params
