"""A RolloutBackend over a Hugging Face causal LM: batched prefill + decode with a KV cache.

The backend holds a REFERENCE to the trainer's model: no copy, no state_dict clone, so an in-place update of
the parameters by the optimizer is what the next ``generate`` samples from. The KV cache (a DynamicCache)
lives only inside ``generate``.

Batching: valid requests run in chunks of ``max_batch_size``, in request order. A chunk is left-padded;
position ids are ``cumsum(mask) - 1``; after one prefill forward every row gets one token per decode step.
Finished rows are fed a masked pad token until the whole chunk is done. Whether all rows are done (a host
sync on GPU) and stop strings (a copy of the tokens to the host) are checked every ``stop_check_interval``
steps; stopping later than the stop string does not change the result, since the completion is cut back
afterwards (see ``tandemrl.backends.stopping`` for where a stop string cuts ids and text).

Seeding: when any request of a chunk carries a seed, the chunk samples with ONE ``torch.Generator`` on the
model's device seeded from the first seeded request of that chunk; same requests + same seed + same batch
size -> same rollouts. Per-request streams are not separated: the rows of a chunk share that generator.
Without seeds the global torch RNG is used.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from tandemrl.backends.sampler import sample_tokens
from tandemrl.backends.stopping import find_stop, tokens_to_keep, truncate_at_stop, validate_stop
from tandemrl.types import Request, Rollout, SamplingParams

# Per-row finish codes, kept on the device during decoding.
_RUNNING, _EOS, _LENGTH, _STOP = 0, 1, 2, 3


class HFBackend:
    """Samples rollouts from ``model`` (a Hugging Face causal LM) in place; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        device: torch.device | str | None = None,
        stop_check_interval: int = 8,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if stop_check_interval < 1:
            raise ValueError(f"stop_check_interval must be >= 1, got {stop_check_interval}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.stop_check_interval = stop_check_interval
        self._prefill_kwargs = _logits_to_keep_kwargs(model)
        self._closed = False

    # ------------------------------------------------------------------ protocol

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]:
        if self._closed:
            raise RuntimeError("HFBackend.generate called after close()")
        results: list[Rollout | None] = [None] * len(requests)
        valid: list[int] = []
        for i, req in enumerate(requests):
            err = self._validate(req)
            if err is None:
                valid.append(i)
            else:
                results[i] = Rollout(req.request_id, list(req.prompt_ids), [], [], "error",
                                     policy_version=policy_version, error=err)
        if valid:
            eos_ids = eos_token_ids(self.model, self.tokenizer)
            with sampling_mode(self.model), torch.inference_mode():
                for start in range(0, len(valid), self.max_batch_size):
                    idx = valid[start:start + self.max_batch_size]
                    chunk = [requests[i] for i in idx]
                    for i, rollout in zip(idx, self._run_chunk(chunk, eos_ids, policy_version)):
                        results[i] = rollout
        return results  # type: ignore[return-value]

    def sleep(self) -> None:
        """Nothing to free: the cache only lives inside generate() (its memory stays in PyTorch's allocator)."""

    def wake(self) -> None:
        """Nothing to restore: the next generate() allocates its cache."""

    def close(self) -> None:
        self._closed = True
        self.model = None  # type: ignore[assignment]  # drop the reference; the trainer owns the model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the allocator's cached blocks back to the device

    # ------------------------------------------------------------------ helpers

    def _decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _validate(self, req: Request) -> str | None:
        try:
            req.params.validate()
            stop = validate_stop(req.params.stop)
        except ValueError as exc:
            return str(exc)
        if len(req.prompt_ids) == 0:
            return "empty prompt"
        vocab = self.model.get_input_embeddings().num_embeddings
        try:
            bad = [t for t in req.prompt_ids if not 0 <= int(t) < vocab]
        except (TypeError, ValueError):
            return "prompt_ids must be integers"
        if bad:
            return f"prompt token ids out of range [0, {vocab}): {bad[:5]}"
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and len(req.prompt_ids) + req.params.max_tokens > limit:
            return (f"prompt ({len(req.prompt_ids)} tokens) + max_tokens ({req.params.max_tokens}) exceeds "
                    f"the model's max_position_embeddings ({limit})")
        if stop and self.tokenizer is None:
            return "stop strings need a tokenizer to decode the completion"
        return None

    def _run_chunk(self, reqs: list[Request], eos_ids: list[int], policy_version: int) -> list[Rollout]:
        pad = _pad_id(self.tokenizer, eos_ids)
        max_new = max(r.params.max_tokens for r in reqs)
        stops = [validate_stop(r.params.stop) for r in reqs]
        input_ids, mask, position_ids = _left_pad([r.prompt_ids for r in reqs], pad, max_new, self.device)
        rows = _RowParams.build([r.params for r in reqs], eos_ids, self.device)
        state = _DecodeState(len(reqs), max_new, pad, self.device)
        watch = _StopWatch(stops, self._decode) if any(stops) else None

        model, P = self.model, input_ids.shape[1]
        cache = _make_cache(model)
        out = model(input_ids=input_ids, attention_mask=mask[:, :P], position_ids=position_ids,
                    past_key_values=cache, use_cache=True, **self._prefill_kwargs)
        next_pos = position_ids[:, -1:] + 1
        for t in range(max_new):
            tok, lp = sample_tokens(out.logits[:, -1, :], rows.temperature, rows.top_p, rows.top_k,
                                    rows.generator, apply_filters=rows.apply_filters)
            tok, alive = state.record(t, tok, lp, rows)
            if t + 1 == max_new:
                break
            if (t + 1) % self.stop_check_interval == 0:
                if watch is not None:
                    watch.check(state, t + 1)
                if bool(state.finished.all()):  # our one host sync per interval, with the stop check
                    break
            mask[:, P + t] = alive.long()
            out = model(input_ids=tok.unsqueeze(-1), attention_mask=mask[:, :P + t + 1],
                        position_ids=next_pos, past_key_values=cache, use_cache=True)
            next_pos = next_pos + 1
        del cache, out
        return self._to_rollouts(reqs, stops, state, policy_version)

    def _to_rollouts(self, reqs: list[Request], stops: list[tuple[str, ...]], state: "_DecodeState",
                     policy_version: int) -> list[Rollout]:
        """Copy the chunk's results to the host once; cut at stop strings; decode the text."""
        host_tokens, host_lp = state.tokens.tolist(), state.logprobs.tolist()
        host_len, host_code = state.lengths.tolist(), state.code.tolist()
        rollouts = []
        for b, r in enumerate(reqs):
            n = host_len[b]
            ids, lps, reason = host_tokens[b][:n], host_lp[b][:n], host_code[b]
            if stops[b]:
                keep = tokens_to_keep(ids, self._decode, stops[b])
                if keep is not None:
                    ids, lps, reason = ids[:keep], lps[:keep], _STOP
            text, _ = truncate_at_stop(self._decode(ids), stops[b])
            finish = "length" if reason == _LENGTH else "stop"
            rollouts.append(Rollout(r.request_id, list(r.prompt_ids), ids, lps, finish, text=text,
                                    policy_version=policy_version))
        return rollouts


def _left_pad(prompts: list[Sequence[int]], pad: int, max_new: int,
              device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """input_ids [B, P] left-padded; attention mask [B, P + max_new] (decode columns filled as they come);
    position ids [B, P] = cumsum(mask) - 1, clamped at 0 on the padding."""
    B, P = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, P), pad, dtype=torch.long)
    mask = torch.zeros((B, P + max_new), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        n = len(prompt)
        input_ids[b, P - n:] = torch.tensor([int(t) for t in prompt], dtype=torch.long)
        mask[b, P - n:P] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    position_ids = (mask[:, :P].cumsum(-1) - 1).clamp_min(0)
    return input_ids, mask, position_ids


@dataclass
class _RowParams:
    """Per-row sampling parameters as device tensors, plus the host-side facts the loop needs."""

    temperature: Tensor
    top_p: Tensor
    top_k: Tensor
    max_tokens: Tensor
    use_eos: Tensor
    eos: Tensor
    apply_filters: bool
    generator: torch.Generator | None

    @classmethod
    def build(cls, params: list[SamplingParams], eos_ids: list[int], dev: torch.device) -> "_RowParams":
        def col(values: list, dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        return cls(
            temperature=col([p.temperature for p in params], torch.float32),
            top_p=col([p.top_p for p in params], torch.float32),
            top_k=col([p.top_k for p in params], torch.long),
            max_tokens=col([p.max_tokens for p in params], torch.long),
            use_eos=col([not p.ignore_eos for p in params], torch.bool),
            eos=col(eos_ids, torch.long),
            apply_filters=any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in params),
            generator=_chunk_generator(params, dev),
        )


class _DecodeState:
    """Per-row outputs and finish state, all on the device (updated without host syncs)."""

    def __init__(self, B: int, max_new: int, pad: int, dev: torch.device) -> None:
        self.tokens = torch.full((B, max_new), pad, dtype=torch.long, device=dev)
        self.logprobs = torch.zeros((B, max_new), dtype=torch.float32, device=dev)
        self.lengths = torch.zeros(B, dtype=torch.long, device=dev)
        self.finished = torch.zeros(B, dtype=torch.bool, device=dev)
        self.code = torch.full((B,), _RUNNING, dtype=torch.long, device=dev)
        self.pad = torch.full((B,), pad, dtype=torch.long, device=dev)

    def record(self, t: int, tok: Tensor, lp: Tensor, rows: _RowParams) -> tuple[Tensor, Tensor]:
        """Store step t's tokens (pad for finished rows); end rows on EOS or max_tokens.
        Returns the tokens to feed next and which rows were still running at this step."""
        alive = ~self.finished
        tok = torch.where(alive, tok, self.pad)
        self.tokens[:, t] = tok
        self.logprobs[:, t] = lp
        self.lengths += alive.long()
        hit_eos = alive & rows.use_eos & torch.isin(tok, rows.eos)
        hit_len = alive & (self.lengths >= rows.max_tokens)
        self.code.masked_fill_(hit_len, _LENGTH).masked_fill_(hit_eos, _EOS)  # EOS as last token: "stop"
        self.finished |= hit_eos | hit_len
        return tok, alive


class _StopWatch:
    """Finds rows whose completion so far contains a stop string, decoding only a recent window of tokens.

    A hit in the window is confirmed on the full decoded prefix before the row is ended; a miss only delays
    the row's end (the final cut is computed on the whole completion either way).
    """

    def __init__(self, stops: list[tuple[str, ...]], decode: Callable[[Sequence[int]], str]) -> None:
        self.rows = [b for b, s in enumerate(stops) if s]
        self.stops = stops
        self.decode = decode
        self.checked = {b: 0 for b in self.rows}  # tokens of the row already searched
        self.window = {b: max(len(s) for s in stops[b]) + 8 for b in self.rows}

    def check(self, state: _DecodeState, upto: int) -> None:
        rows = [b for b in self.rows if self.checked[b] >= 0]
        if not rows:
            return
        sel = torch.tensor(rows, device=state.tokens.device)
        host_tokens = state.tokens[sel, :upto].tolist()
        host_len, host_fin = state.lengths[sel].tolist(), state.finished[sel].tolist()
        ended = []
        for b, ids, n, fin in zip(rows, host_tokens, host_len, host_fin):
            lo = max(0, self.checked[b] - self.window[b])
            self.checked[b] = -1 if fin else n
            if fin or find_stop(self.decode(ids[lo:n]), self.stops[b]) is None:
                continue
            if find_stop(self.decode(ids[:n]), self.stops[b]) is not None:
                ended.append(b)
                self.checked[b] = -1
        if ended:
            idx = torch.tensor(ended, device=state.tokens.device)
            state.finished[idx] = True
            state.code[idx] = _STOP


@contextlib.contextmanager
def sampling_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (dropout off) for the duration; then every submodule gets back its own previous mode."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _make_cache(model: nn.Module) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)  # transformers >= 4.56: per-layer types (sliding windows)
    except TypeError:
        return DynamicCache()


def _logits_to_keep_kwargs(model: nn.Module) -> dict[str, int]:
    """Ask the prefill for the last position's logits only, where the model's forward allows it."""
    try:
        names = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in names:
            return {name: 1}
    return {}


def eos_token_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    sources = [getattr(tokenizer, "eos_token_id", None),
               getattr(getattr(model, "generation_config", None), "eos_token_id", None)]
    for src in sources:
        for i in (src if isinstance(src, (list, tuple)) else [src]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def _pad_id(tokenizer: Any, eos_ids: list[int]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        return int(pad)
    return eos_ids[0] if eos_ids else 0


def _chunk_generator(params: list, device: torch.device) -> torch.Generator | None:
    seed = next((p.seed for p in params if p.seed is not None), None)
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(seed))
