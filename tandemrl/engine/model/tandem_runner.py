"""Runs a tandem burst (engine/tandem_burst.py) on the device: its forwards in order, with no host sync.

Each row's tokens live in one flat buffer on the device (token -1, then the burst's new ones). A forward gathers the
tokens it reads, runs its model over them as one decode step of a row per token (``_one_step``: CUDA graphs apply),
samples each served row's next token from the logits of its last one and writes it into the buffer; a hot forward
also scores every token it reads the successor of (the loss needs the hot model's log-prob of each kept token,
whoever wrote it). Every index is planned on the host and copied to the device once per burst. In paired ticks a
tick's frozen forward runs beside the hot one (``_Streams``), or on its own GPU.

The catch-ups leave both caches holding every token but each row's last, so the next burst reads only that one
(buffer column 0), fed on the device from the previous launch if still pending (pending.py).

A frozen model on another device (placement.py) gets the tokens it reads from the hot model's device, where the
buffers stay, and sends its samples back; its indices and sampling columns are staged on its own device.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.kernels.triton_sampler import fused_token_logprobs
from tandemrl.engine.model.decode_plan import DecodePlan, build_decode_plan
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import LastSamples, copy_to_device, link_pending, resolve_pending
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.slot import ModelSlot
from tandemrl.engine.step import DecodeStep
from tandemrl.engine.tandem_burst import TandemBurst


def launch_tandem_burst(context: LaunchContext, plan: DecodeStep, last: LastSamples | None) -> tuple[Tensor, Tensor]:
    """Run ``plan.tandem`` for ``plan.seqs`` on the runner's target (hot) and ``plan.proposer`` (frozen) slots; each
    row's last token, if pending, is fed from ``last`` (the previous launch's tokens) on the device. Returns the
    [B, K] tokens and log-probs, left on the hot model's device (no host sync)."""
    burst: TandemBurst = plan.tandem
    seqs = plan.seqs
    hot, frozen = context.slots[plan.slot], context.slots[plan.proposer]
    decode = build_decode_plan(seqs, plan.num_tokens, context.block_size, context.num_blocks, context.max_model_len)
    first = np.array([seq.num_tokens for seq in seqs], dtype=np.int64)  # position of token 0
    linked = link_pending(decode.ids, seqs, last)  # a pending last token: a reference into ``last``
    buffer = np.zeros((len(seqs), burst.width), dtype=np.int64)
    buffer[:, 0] = decode.ids
    tokens = copy_to_device(torch.from_numpy(buffer.reshape(-1)), hot.device)
    if linked:
        tokens = resolve_pending(tokens, last)  # only column 0 holds references; the rest is >= 0
    logprobs = torch.zeros(tokens.shape, dtype=torch.float32, device=hot.device)
    indices = _device_indices(burst, hot.device)
    far = indices if frozen.device == hot.device else _device_indices(burst, frozen.device)  # the frozen's side
    hot_sampler = context.sampler_for(hot)
    sample = hot_sampler.for_subsets(seqs)
    frozen_sample = sample if frozen.device == hot.device else context.sampler_for(frozen).for_subsets(seqs)
    temperature = hot_sampler.temperatures(seqs)
    fused_scores = hot_sampler.fused  # asked once, not per forward
    forward_of = {model: _staged_forwards(slot, burst, model, decode.tables, first, context.block_size)
                  for model, slot in ((True, hot), (False, frozen))}
    nth = {True: 0, False: 0}  # each model's forwards so far: the index of its next staged plan
    streams = _Streams.of(context, frozen)
    ahead: dict[int, Tensor] = {}  # a frozen forward's reads, sent to its device before the hot forward before it
    for f, (forward, index, far_index) in enumerate(zip(burst.forwards, indices, far)):
        with streams.beside(forward.beside):
            if not forward.hot:
                read = ahead.pop(f) if f in ahead else move(tokens[index["read"]], frozen.device)
                hidden = forward_of[False](nth[False], read)  # on the frozen device, as are its samples
                nth[False] += 1
                if forward.sample:
                    with frozen.on_device():
                        drawn, _ = frozen_sample(frozen.logits(hidden[far_index["last"]]), far_index["rows"])
                    tokens[index["write"]] = move(drawn, hot.device)
                continue
            if frozen.device != hot.device and _frozen_reads_past(burst, f):
                ahead[f + 1] = move(tokens[indices[f + 1]["read"]], frozen.device)
            hidden = forward_of[True](nth[True], tokens[index["read"]])
            nth[True] += 1
            logits = hot.logits(hidden)  # one lm_head to sample and score
            if forward.sample:
                tokens[index["write"]], _ = sample(logits[index["last"]], index["rows"])
            _score(logits, tokens, logprobs, index, temperature[index["row"]], fused_scores)  # after the sample
    # each row's new tokens on a [B, max new tokens] grid, a shorter row's last one repeated
    new = np.minimum(np.arange(burst.width - 1), burst.num_tokens[:, None] - 1)
    out = copy_to_device(torch.from_numpy(burst.column(np.arange(len(seqs))[:, None], new)), hot.device)
    return tokens[out], logprobs[out]


def _frozen_reads_past(burst: TandemBurst, f: int) -> bool:
    """Whether forward f + 1 is the frozen model's and reads no token hot forward f writes (a paired tick's: it
    serves other rows; a catch-up's: it reads no row's last token). On another device its reads are then gathered
    and sent before f is launched: behind f on the hot GPU's stream, the frozen GPU would wait for f."""
    forwards = burst.forwards
    if f + 1 == len(forwards) or forwards[f + 1].hot:
        return False
    hot, frozen = forwards[f], forwards[f + 1]
    if not hot.sample:
        return True
    written = burst.column(hot.rows, hot.token[hot.last] + 1)
    return not np.isin(burst.column(frozen.row, frozen.token), written).any()


class _Streams:
    """A forward marked ``beside`` (paired ticks) runs on the frozen slot's stream, at once with the forward before
    it (the hot model's, over other rows): it starts when everything before that forward is done, and the main
    stream waits for it before going on. Each slot's graphs hold their own cuBLAS workspace (runner.py), and what
    the side stream allocates is freed to it alone (PyTorch's caching allocator keys blocks by stream). Without
    paired ticks (off CUDA), or with the models on two GPUs (each device runs its own forwards), everything is
    issued in order."""

    def __init__(self, main: torch.cuda.Stream | None, side: torch.cuda.Stream | None) -> None:
        self.main, self.side = main, side
        self.start: torch.cuda.Event | None = None  # recorded before each main-stream forward

    @classmethod
    def of(cls, context: LaunchContext, frozen: ModelSlot) -> _Streams:
        if not context.pairs_tandem_forwards or frozen.device != context.device:
            return cls(None, None)
        return cls(torch.cuda.current_stream(context.device), frozen.warmup_stream)

    @contextlib.contextmanager
    def beside(self, beside: bool) -> Iterator[None]:
        if self.main is None:
            yield
        elif beside and self.start is not None:
            self.side.wait_event(self.start)
            with torch.cuda.stream(self.side):
                yield
            self.main.wait_stream(self.side)  # the next forward reads what this one wrote
        else:
            self.start = self.main.record_event()
            yield


def _score(logits: Tensor, tokens: Tensor, logprobs: Tensor, index: dict[str, Tensor], temperature: Tensor,
           fused: bool) -> None:
    """The hot model's log-prob of the token after each one it read (greedy rows: of the raw logits). ``fused``:
    from one read of the logits (the sampler's first pass), not float32 copies of them and a logsumexp."""
    following = index["next"]
    if fused:
        logprobs[following] = fused_token_logprobs(logits, tokens[following], temperature)
        return
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))[:, None]
    scaled = logits.float() / scale
    chosen = scaled.gather(-1, tokens[following][:, None]).squeeze(-1)
    logprobs[following] = chosen - torch.logsumexp(scaled, dim=-1)  # log_softmax at one column, one pass fewer


def _staged_forwards(slot: ModelSlot, burst: TandemBurst, hot: bool, tables: np.ndarray, first: np.ndarray,
                     block_size: int):
    """The slot's forwards of the burst, in order, staged at once: (its f-th forward, input ids) -> hidden."""
    plans = [_one_step(tables, f.row, first[f.row] + f.token, block_size) for f in burst.forwards if f.hot == hot]
    return slot.decode_forwards(plans) if plans else None


def _one_step(tables: np.ndarray, rows: np.ndarray, positions: np.ndarray, block_size: int) -> DecodePlan:
    """A decode step of a row per token read (token ``i`` of row ``rows[i]`` at ``positions[i]``)."""
    row_tables = np.ascontiguousarray(tables[rows])
    blocks = row_tables[np.arange(len(rows)), positions // block_size]
    slots = blocks * block_size + positions % block_size
    return DecodePlan(np.zeros(len(rows), dtype=np.int64), positions[None], slots[None], positions[None] + 1,
                      row_tables, [1] * len(rows), row_of=rows)


def _device_indices(burst: TandemBurst, device: torch.device) -> list[dict[str, Tensor]]:
    """Per forward, its flat buffer indices on the device (one copy for the whole burst): ``read`` (tokens it reads),
    ``next`` (their successors), ``write`` (where each row's sample goes), ``last`` (the index of each row's last
    token among those read), ``rows`` (the batch row of each sample), ``row`` (the batch row of each token read)."""
    parts = [part for forward in burst.forwards for part in (
        burst.column(forward.row, forward.token), burst.column(forward.row, forward.token + 1),
        burst.column(forward.rows, forward.token[forward.last] + 1), forward.last, forward.rows, forward.row)]
    flat = copy_to_device(torch.from_numpy(np.concatenate(parts).astype(np.int64)), device)
    pieces = iter(flat.split([len(p) for p in parts]))
    return [{name: next(pieces) for name in _INDEX_NAMES} for _ in burst.forwards]


_INDEX_NAMES = ("read", "next", "write", "last", "rows", "row")  # a forward's parts, in ``_device_indices``' order
