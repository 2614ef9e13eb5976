"""The engine's step loop: schedule -> launch the model -> postprocess, plus request intake and sleep/wake.

Asynchronous scheduling (``EngineConfig.async_scheduling``, on by default): a step schedules and launches the next
batch BEFORE it reads back the tokens of the batch launched by the step before, so the host's scheduling,
staging and postprocessing run while the device computes instead of between its steps. The scheduler counts
those tokens as pending placeholders (sequence.py); the runner feeds each one to the next batch on the device. A
sequence that the read-back tokens finish (EOS, a stop string) may have computed one batch more than it needed;
those tokens are dropped. Off: each step reads its own tokens back before returning.

Invalid requests never raise: each becomes a finished Rollout with ``finish_reason="error"`` and ``error``
set, returned by the next ``step()`` (or in place by ``generate``), so one bad request cannot stop a batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any, Protocol, Sequence as Seq

from tandemrl.backends.stopping import truncate_at_stop, validate_stop
from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.scheduler import ScheduledBatch, Scheduler
from tandemrl.engine.sequence import Sequence
from tandemrl.types import Request, Rollout, SamplingParams


class PendingTokens(Protocol):
    """A launched step's sampled tokens, on their way to the host."""

    def result(self) -> tuple[list[list[int]], list[list[float]]]:
        """Per sequence of the step: its tokens and their log-probs (waits for the device)."""
        ...


class ModelRunnerProtocol(Protocol):
    """What the engine needs from the model side (KV cache owner, forward, sampling)."""

    def launch(self, seqs: list[Sequence], steps: list[int], is_prefill: bool) -> PendingTokens:
        """Start a prefill (one token per sequence) or a decode burst (``steps[i]`` tokens for sequence i). A
        sequence's pending placeholders stand for tokens of the runner's previous launch, fed on the device."""
        ...

    def allocate_kv_cache(self, num_blocks: int) -> None: ...

    def free_kv_cache(self) -> None: ...

    def num_blocks_that_fit(self, block_size: int, gpu_memory_utilization: float) -> int: ...


@dataclasses.dataclass
class _Launched:
    """A step the runner has launched, its tokens not yet read back."""

    batch: ScheduledBatch
    pending: PendingTokens


class LLMEngine:
    def __init__(self, runner: ModelRunnerProtocol, tokenizer: Any, config: EngineConfig,
                 eos_ids: Seq[int]) -> None:
        config.validate()
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
        self.num_blocks = num_blocks
        runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        decode = self._decode if tokenizer is not None else None
        self.scheduler = Scheduler(config, self.block_manager, eos_ids, decode=decode)
        self._seq_ids = itertools.count()
        self._live: dict[int, Sequence] = {}  # seq_id -> unfinished sequence
        self._ready: list[tuple[int, Rollout]] = []  # (seq_id, rollout) not yet returned by a step
        self._in_flight: _Launched | None = None  # launched, its tokens not read back yet (async scheduling)
        self._asleep = False
        self._counts = {"steps": 0, "prefill_steps": 0, "decode_steps": 0, "decode_tokens": 0,
                        "errors": 0}

    # ------------------------------------------------------------------ requests

    def add_request(self, request: Request, policy_version: int = 0) -> str | None:
        """Queue ``request``; returns None, or the error message if it was rejected (see module doc)."""
        return self._add(request, policy_version)[1]

    def _add(self, request: Request, policy_version: int) -> tuple[int, str | None]:
        seq_id = next(self._seq_ids)
        error, prompt, params = _check_request(request)
        if error is None:
            seq = Sequence(seq_id, str(request.request_id), list(prompt), len(prompt), params,
                           policy_version=policy_version)
            try:
                self.scheduler.add(seq)
            except ValueError as exc:
                error = str(exc)
            else:
                self._live[seq_id] = seq
                return seq_id, None
        self._counts["errors"] += 1
        rollout = Rollout(str(request.request_id), list(prompt), [], [], "error",
                          policy_version=policy_version, error=error)
        self._ready.append((seq_id, rollout))
        return seq_id, error

    def abort(self, request_id: str) -> bool:
        """Stop generating ``request_id`` (every sequence with that id) and free its blocks; no rollout
        comes back for it. Returns False if no unfinished request has that id."""
        found = any(r.request_id == request_id for _, r in self._ready)
        self._ready = [(i, r) for i, r in self._ready if r.request_id != request_id]
        for seq in [s for s in self._live.values() if s.request_id == request_id]:
            del self._live[seq.seq_id]
            self.scheduler.abort(seq)
            found = True
        return found

    def has_unfinished(self) -> bool:
        return bool(self._ready) or self.scheduler.has_unfinished() or self._in_flight is not None

    # ------------------------------------------------------------------ stepping

    def step(self) -> list[Rollout]:
        """One engine step; returns the rollouts that finished in it (and pending error rollouts)."""
        return [r for _, r in self._step()]

    def _step(self) -> list[tuple[int, Rollout]]:
        if self._asleep:
            raise RuntimeError("the engine is asleep (its KV cache is freed); call wake() first")
        out, self._ready = self._ready, []
        try:
            batch = self.scheduler.schedule(in_flight=self._in_flight is not None)
            launched = self._launch(batch) if batch.seqs else None
            if launched is None and self._in_flight is None and self.scheduler.has_unfinished():
                raise RuntimeError("scheduler made no progress with requests waiting")  # add() rules this out
            previous, self._in_flight = self._in_flight, launched
            if previous is not None:
                out += self._complete(previous)
            if not self.config.async_scheduling:
                self._drain(out)
        except BaseException:
            self._ready = out + self._ready  # still to be returned
            raise
        return out

    def _launch(self, batch: ScheduledBatch) -> _Launched:
        try:
            pending = self.runner.launch(batch.seqs, batch.steps, batch.is_prefill)
        except BaseException:
            if batch.is_prefill:  # nothing was computed: requeue the batch and unpublish what it registered
                self.block_manager.forget_cached_blocks()
                self.scheduler.requeue(batch.seqs)
            raise  # a failed decode launch leaves its sequences as they were: the same step can run again
        for seq, steps in zip(batch.seqs, batch.steps):
            seq.add_pending(steps)
        self._count_step(batch.steps, batch.is_prefill)
        return _Launched(batch, pending)

    def _complete(self, launched: _Launched) -> list[tuple[int, Rollout]]:
        """Read a launched step's tokens back and postprocess them; the rollouts of the sequences it finished. If
        the read fails, every step in flight is abandoned (its sequences are as before it was launched)."""
        try:
            token_ids, logprobs = launched.pending.result()
        except BaseException:
            for step in (launched, self._in_flight):
                if step is not None:
                    self._abandon(step)
            self._in_flight = None
            raise
        finished = self.scheduler.postprocess_steps(launched.batch.seqs, token_ids, logprobs)
        out = []
        for seq in finished:
            self._live.pop(seq.seq_id, None)
            out.append((seq.seq_id, self._to_rollout(seq)))
        return out

    def _abandon(self, launched: _Launched) -> None:
        seqs = [s for s in launched.batch.seqs if not s.is_finished]
        for seq in seqs:
            seq.drop_pending()
            self.block_manager.release_reserved(seq)
        if launched.batch.is_prefill:
            self.block_manager.forget_cached_blocks()
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
        remaining = len(requests)
        try:
            while remaining:
                for seq_id, rollout in self._step():
                    if seq_id in index:
                        results[index[seq_id]] = rollout
                        remaining -= 1
                    else:
                        others.append((seq_id, rollout))
            if not self.scheduler.has_unfinished():  # what is still in flight computes nothing anyone waits for
                self._drain(others)
        except BaseException:
            self._drop(set(index))
            raise
        finally:
            self._ready.extend(others)
        return results  # type: ignore[return-value]

    def _drop(self, seq_ids: set[int]) -> None:
        """Forget these sequences, finished or not."""
        self._ready = [(i, r) for i, r in self._ready if i not in seq_ids]
        for seq_id in seq_ids & self._live.keys():
            self.scheduler.abort(self._live.pop(seq_id))

    # ------------------------------------------------------------------ memory

    def sleep(self) -> None:
        """Free the KV cache (running sequences go back to waiting and are recomputed after wake())."""
        if self._asleep:
            return
        self._drain(self._ready)
        self.scheduler.preempt_all()
        self.runner.free_kv_cache()
        self.block_manager.reset()
        self._asleep = True

    def wake(self) -> None:
        if not self._asleep:
            return
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

    def _count_step(self, steps: list[int], is_prefill: bool) -> None:
        self._counts["steps"] += 1
        if is_prefill:
            self._counts["prefill_steps"] += 1
        else:  # decode tokens computed, including those after a stop inside a burst
            self._counts["decode_steps"] += max(steps)
            self._counts["decode_tokens"] += sum(steps)

    def _decode(self, ids: Seq[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _to_rollout(self, seq: Sequence) -> Rollout:
        completion = seq.completion_ids
        text = ""
        if self.tokenizer is not None:
            text, _ = truncate_at_stop(self._decode(completion), seq.params.stop)
        return Rollout(seq.request_id, seq.token_ids[:seq.num_prompt_tokens], completion, list(seq.logprobs),
                       seq.finish_reason or "stop", text=text, policy_version=seq.policy_version)


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
