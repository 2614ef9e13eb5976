"""LLMEngine with a fake model runner against a plain reference loop.

The fake runner keeps a paged "KV cache" whose value at token t is a function of the value at token t-1 READ
FROM THE CACHE and of token t, so a wrong block table, a block shared when it must not be, or a stale prefix
cache entry changes the sampled tokens. It also checks invariants on every call (see FakeRunner.run).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from tandemrl.engine.stopping import find_stop, truncate_at_stop
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine
from tandemrl.engine.step import StepOutput, StepPlan
from tandemrl.engine.sequence import PENDING_TOKEN, Sequence
from tandemrl.types import Request, Rollout, SamplingParams

BS = 4
VOCAB = 50
EOS = 0
MOD = 2_147_483_647
# id 0 is special; 1..26 one lower-case letter; 27..39 one upper-case letter; 40..49 two letters
TOKENS = ["<eos>"] + [chr(ord("a") + i) for i in range(26)] + [chr(ord("A") + i) for i in range(13)] + \
    ["xy", "yz", "zx", "qu", "ab", "ba", "ui", "io", "oo", "ee"]


def kv_value(prev: int, token: int, position: int) -> int:
    return (prev * 1_000_003 + token * 7919 + position + 1) % MOD


def next_token(value: int, seed: int | None) -> int:
    return (value * 48_271 + (seed or 0) * 104_729) % MOD % VOCAB


class FakeTokenizer:
    eos_token_id = EOS
    pad_token_id = EOS

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(TOKENS[i] for i in ids if not (skip_special_tokens and i == EOS))


class FakeRunner:
    """Computes a launch's tokens at once, but hands them out only through ``result()``, like the device: a
    sequence's pending placeholders must be fed from the previous launch's tokens, which only the runner knows."""

    def __init__(self, blocks_that_fit: int = 64) -> None:
        self.blocks_that_fit = blocks_that_fit
        self.kv: list[tuple[int, int] | None] | None = None  # slot -> (position, value)
        self.calls: list[tuple[bool, list[int], int]] = []  # (is_prefill, seq ids, live seqs)
        self.log: list[tuple[str, int]] = []  # ("launch" | "result", launch number), in order
        self.previous: dict[int, int] = {}  # seq_id -> last token of the previous launch ("on the device")
        self.live = lambda: []  # set by the test: the engine's running sequences

    def num_blocks_that_fit(self, block_size: int, gpu_memory_utilization: float) -> int:
        return self.blocks_that_fit

    def allocate_kv_cache(self, num_blocks: int) -> None:
        assert self.kv is None, "allocate_kv_cache twice"
        self.kv = [None] * (num_blocks * BS)

    def free_kv_cache(self, keep_graphs: bool = False) -> None:
        self.kv = None

    def bytes_per_block(self) -> int:
        return 1024

    def weights_version(self) -> int:
        return 0

    pairs_tandem_forwards = False

    def launch(self, plan: StepPlan) -> FakePending:
        seqs, steps, is_prefill = plan.seqs, plan.num_tokens, plan.is_prefill
        assert self.kv is not None, "launch() without a KV cache"
        assert seqs and len(steps) == len(seqs) and min(steps) >= 1
        live = list(self.live())
        check_block_tables(seqs, [s for s in live if s not in seqs], None if is_prefill else steps)
        self.calls.append((is_prefill, [s.seq_id for s in seqs], len(live)))
        number = len(self.calls)
        self.log.append(("launch", number))
        tokens = self._prefill(seqs) if is_prefill else self._decode(seqs, steps)
        self.previous = {s.seq_id: t[-1] for s, t in zip(seqs, tokens)}
        return FakePending(self.log, number, tokens)

    def _prefill(self, seqs: list[Sequence]) -> list[list[int]]:
        written: set[int] = set()
        tokens = []
        for seq in seqs:
            assert seq.num_pending == 0 and 0 <= seq.num_cached_tokens < seq.num_tokens
            assert seq.num_cached_tokens % BS == 0
            for t in range(seq.num_cached_tokens, seq.num_tokens):
                self._write(seq, t, seq.token_ids[t], written)
            tokens.append([next_token(self.read(seq, seq.num_tokens - 1), seq.params.seed)])
        return tokens

    def _decode(self, seqs: list[Sequence], steps: list[int]) -> list[list[int]]:
        """A burst: steps[i] tokens for sequence i, each fed back as the next input (the engine's sequences are
        not touched: the runner only returns tokens)."""
        written: set[int] = set()
        out = []
        for seq, k in zip(seqs, steps):
            tokens = list(seq.token_ids)
            if seq.num_pending:  # placeholders on the host; the last one's value comes from the previous launch
                assert tokens[-seq.num_pending:] == [PENDING_TOKEN] * seq.num_pending
                tokens[-1] = self.previous[seq.seq_id]
            for _ in range(k):
                t = len(tokens) - 1
                tokens.append(next_token(self._write(seq, t, tokens[t], written), seq.params.seed))
            out.append(tokens[seq.num_tokens:])
        return out

    def _write(self, seq: Sequence, t: int, token: int, written: set[int]) -> int:
        """Compute token t's KV value from token t-1's (read from the cache) into t's slot; returns it."""
        prev = self.read(seq, t - 1) if t else 0
        slot = self.slot(seq, t)
        assert slot not in written, f"slot {slot} written twice in one launch"
        written.add(slot)
        self.kv[slot] = (t, kv_value(prev, token, t))
        return self.kv[slot][1]

    @staticmethod
    def slot(seq: Sequence, t: int) -> int:
        return seq.block_table[t // BS] * BS + t % BS

    def read(self, seq: Sequence, t: int) -> int:
        entry = self.kv[self.slot(seq, t)]
        assert entry is not None and entry[0] == t, f"seq {seq.seq_id}: slot of token {t} holds {entry}"
        return entry[1]


@dataclass
class FakePending:
    log: list[tuple[str, int]]
    number: int
    tokens: list[list[int]]

    def result(self) -> StepOutput:
        self.log.append(("result", self.number))
        return StepOutput(self.tokens, [[-1.0] * len(t) for t in self.tokens])


def check_block_tables(batch: list[Sequence], idle: list[Sequence], steps: list[int] | None = None) -> None:
    """Each sequence of the step holds exactly the blocks its tokens need, including the positions its burst of
    ``steps`` writes (a running one outside the step may lack the block of its not yet computed last token); a
    block held by two sequences is a full block at the same index with the same tokens up to its end (a shared
    prefix)."""
    owner: dict[int, tuple[Sequence, int]] = {}
    lookahead = dict(zip((s.seq_id for s in batch), steps or [1] * len(batch)))
    for seq in batch + idle:
        written = seq.num_tokens - 1 + lookahead.get(seq.seq_id, 0)
        assert -(-written // BS) <= len(seq.block_table) <= -(-max(written, seq.num_tokens) // BS), \
            (seq.seq_id, seq.block_table)
        assert len(set(seq.block_table)) == len(seq.block_table)
        for i, block in enumerate(seq.block_table):
            if block in owner:
                other, j = owner[block]
                end = (i + 1) * BS
                assert i == j and end <= min(seq.num_tokens, other.num_tokens), (seq.seq_id, other.seq_id, i)
                assert seq.token_ids[:end] == other.token_ids[:end]
            else:
                owner[block] = (seq, i)


def reference(req: Request, eos_ids=(EOS,), tokenizer=FakeTokenizer()) -> tuple[list[int], str, str]:
    """(completion ids, finish reason, text) computed directly from the token ids, one token at a time."""
    p = req.params
    ids = list(req.prompt_ids)
    completion: list[int] = []
    while True:
        value = 0
        for t, tok in enumerate(ids):
            value = kv_value(value, tok, t)
        tok = next_token(value, p.seed)
        ids.append(tok)
        completion.append(tok)
        text = tokenizer.decode(completion, skip_special_tokens=True) if tokenizer else ""
        if tok in eos_ids and not p.ignore_eos:
            reason = "stop"
        elif p.stop and find_stop(text, p.stop) is not None:
            reason = "stop"
        elif len(completion) >= p.max_tokens:
            reason = "length"
        else:
            continue
        return completion, reason, truncate_at_stop(text, p.stop)[0]


@pytest.fixture(params=[True, False], ids=["async", "sync"])
def async_scheduling(request) -> bool:
    return request.param


def make_engine(eos_ids=(EOS,), tokenizer=None, blocks_that_fit=64, **cfg) -> tuple[LLMEngine, FakeRunner]:
    cfg.setdefault("num_blocks", 64)
    runner = FakeRunner(blocks_that_fit)
    engine = LLMEngine(runner, tokenizer if tokenizer is not None else FakeTokenizer(),
                       EngineConfig(block_size=BS, **cfg), list(eos_ids))
    runner.live = lambda: engine.scheduler.running
    return engine, runner


def req(rid, prompt, max_tokens=12, seed=None, **params) -> Request:
    params.setdefault("ignore_eos", True)
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, seed=seed, **params))


def assert_matches_reference(requests: list[Request], rollouts: list[Rollout], eos_ids=(EOS,)) -> None:
    assert [r.request_id for r in rollouts] == [q.request_id for q in requests]
    for q, r in zip(requests, rollouts):
        ids, reason, text = reference(q, eos_ids)
        assert r.error is None, r.error
        assert (r.completion_ids, r.finish_reason, r.text) == (ids, reason, text), q.request_id
        assert r.logprobs == [-1.0] * len(ids) and r.prompt_ids == list(q.prompt_ids)


def prompt(n: int, base: int = 1) -> list[int]:
    return [(base + 3 * i) % (VOCAB - 1) + 1 for i in range(n)]


# ---------------------------------------------------------------------- correctness


def test_mixed_prompt_lengths_match_reference(async_scheduling):
    engine, runner = make_engine(async_scheduling=async_scheduling)
    requests = [req(f"r{n}", prompt(n, base=n), max_tokens=3 + n % 7, seed=n) for n in (1, 3, 4, 5, 8, 13, 17, 31)]
    out = engine.generate(requests, policy_version=3)
    assert_matches_reference(requests, out)
    assert all(r.policy_version == 3 for r in out)
    assert runner.calls[0][0] and len(runner.calls[0][1]) == len(requests)  # one prefill for all
    assert engine.block_manager.num_free_blocks == 64 and not engine.has_unfinished()


@pytest.mark.parametrize("prompt_len", [21, 20])
def test_group_of_samples_computes_the_shared_prompt_once(prompt_len):
    engine, runner = make_engine()
    group = [req(f"g{j}", prompt(prompt_len), max_tokens=10, seed=j) for j in range(8)]
    out = engine.generate(group)
    assert_matches_reference(group, out)
    assert len({tuple(r.completion_ids) for r in out}) > 1  # the seeds make the samples differ
    shared = (prompt_len - 1) // BS * BS  # full blocks before the one holding the last prompt token
    stats = engine.stats()
    assert stats["prefill_tokens_requested"] == 8 * prompt_len
    assert stats["prefill_tokens_computed"] == 8 * prompt_len - 7 * shared
    assert len(runner.calls[0][1]) == 8


@pytest.mark.parametrize("caching", [True, False])
def test_tiny_pool_forces_preemption_and_outputs_still_match(caching, async_scheduling):
    engine, runner = make_engine(num_blocks=10, enable_prefix_caching=caching, async_scheduling=async_scheduling)
    requests = [req(f"p{i}", prompt(5 + i, base=i % 3), max_tokens=18, seed=i % 2) for i in range(7)]
    out = engine.generate(requests)
    assert_matches_reference(requests, out)
    assert engine.stats()["preemptions"] > 0
    assert engine.block_manager.num_free_blocks == 10


@pytest.mark.parametrize("decode_steps", [1, 3])
def test_continuous_batching_admits_new_requests_as_others_finish(decode_steps, async_scheduling):
    engine, runner = make_engine(max_num_seqs=3, decode_steps=decode_steps, async_scheduling=async_scheduling)
    requests = [req(f"c{i}", prompt(3 + i, base=i), max_tokens=2 + 5 * (i % 3), seed=i) for i in range(9)]
    out = engine.generate(requests)
    assert_matches_reference(requests, out)
    assert max(n for _, _, n in runner.calls) <= 3
    joined = [live for prefill, ids, live in runner.calls if prefill and live > len(ids)]
    assert joined, "no request joined while others were running"


def test_abort_drops_a_request_and_frees_its_blocks(async_scheduling):
    engine, _ = make_engine(async_scheduling=async_scheduling)
    # max_tokens beyond prefill + one burst of the default decode_steps: a1 is still running when aborted
    requests = [req(f"a{i}", prompt(6, base=i), max_tokens=40, seed=i) for i in range(3)]
    for q in requests:
        assert engine.add_request(q) is None
    engine.step()
    engine.step()
    assert engine.abort("a1") and not engine.abort("a1") and not engine.abort("nope")
    done: list[Rollout] = []
    while engine.has_unfinished():
        done += engine.step()
    assert sorted(r.request_id for r in done) == ["a0", "a2"]
    assert_matches_reference([requests[0], requests[2]], sorted(done, key=lambda r: r.request_id))
    assert engine.block_manager.num_free_blocks == 64


def test_bad_requests_become_error_rollouts_and_the_rest_complete():
    engine, _ = make_engine(num_blocks=6, max_model_len=40)
    good = [req("ok1", prompt(5), max_tokens=6, seed=1), req("ok2", prompt(9), max_tokens=4, seed=2)]
    bad = {
        "empty": (req("empty", [], max_tokens=4), "empty prompt"),
        "zero": (Request("zero", prompt(3), SamplingParams(max_tokens=0)), "max_tokens"),
        "float": (Request("float", prompt(3), SamplingParams(max_tokens=2.5)), "max_tokens"),
        "temp": (Request("temp", prompt(3), SamplingParams(temperature=-1.0)), "temperature"),
        "stop": (Request("stop", prompt(3), SamplingParams(stop=("",))), "stop"),
        "stop2": (Request("stop2", prompt(3), SamplingParams(stop=(3,))), "stop"),
        "long": (req("long", prompt(30), max_tokens=20), "max_model_len"),
        "pool": (req("pool", prompt(20), max_tokens=10), "KV blocks"),
        "type": (Request("type", ["a", "b"], SamplingParams()), "integers"),
        "neg": (Request("neg", [3, -1], SamplingParams()), ">= 0"),
        "none": (Request("none", None, SamplingParams()), "list of integers"),
    }
    requests = [good[0]] + [q for q, _ in bad.values()] + [good[1]]
    out = engine.generate(requests)
    assert_matches_reference(good, [out[0], out[-1]])
    for r, (name, (q, message)) in zip(out[1:-1], bad.items()):
        assert r.request_id == name and r.finish_reason == "error" and message in r.error, (name, r.error)
        assert r.completion_ids == [] and r.logprobs == []
    assert engine.stats()["errors"] == len(bad)
    assert engine.add_request(req("empty", [])) == "empty prompt"
    assert [r.finish_reason for r in engine.step()] == ["error"]


def test_stop_strings_need_a_tokenizer():
    runner = FakeRunner()
    engine = LLMEngine(runner, None, EngineConfig(block_size=BS, num_blocks=16), [EOS])
    runner.live = lambda: engine.scheduler.running
    out = engine.generate([req("s", prompt(3), stop=("a",)), req("n", prompt(3), max_tokens=3)])
    assert out[0].finish_reason == "error" and "tokenizer" in out[0].error
    assert out[1].finish_reason == "length" and out[1].text == "" and len(out[1].completion_ids) == 3


# ---------------------------------------------------------------------- finish reasons


def test_eos_length_and_ignore_eos(async_scheduling):
    base = req("x", prompt(7), max_tokens=30, seed=5)
    ids, _, _ = reference(base, eos_ids=())
    eos_id, k = ids[4], ids.index(ids[4])  # pretend the 5th sampled token is EOS
    engine, _ = make_engine(eos_ids=(eos_id,), async_scheduling=async_scheduling)
    stop_at_eos = req("eos", prompt(7), max_tokens=30, seed=5, ignore_eos=False)
    ignore = req("ign", prompt(7), max_tokens=30, seed=5, ignore_eos=True)
    short = req("len", prompt(7), max_tokens=3, seed=5, ignore_eos=False)
    out = engine.generate([stop_at_eos, ignore, short])
    assert out[0].finish_reason == "stop" and out[0].completion_ids == ids[:k + 1]
    assert out[1].finish_reason == "length" and out[1].completion_ids == ids
    assert out[2].finish_reason == "length" and len(out[2].completion_ids) == 3
    assert_matches_reference([stop_at_eos, ignore, short], out, eos_ids=(eos_id,))


def test_any_of_several_eos_ids_stops_a_sequence(async_scheduling):
    """A list of EOS ids (a generation_config may name several): each sequence stops at the first of them it
    samples, whichever that is."""
    bases = [req(f"r{seed}", prompt(7, base=seed), max_tokens=30, seed=seed, ignore_eos=False) for seed in (5, 6)]
    free = [reference(r, eos_ids=())[0] for r in bases]
    eos_ids = (free[0][3], free[1][6])
    engine, _ = make_engine(eos_ids=eos_ids, async_scheduling=async_scheduling)
    out = engine.generate(bases)
    assert_matches_reference(bases, out, eos_ids=eos_ids)
    assert all(r.finish_reason == "stop" and r.completion_ids[-1] in eos_ids for r in out)
    assert {r.completion_ids[-1] for r in out} == set(eos_ids)  # each id ended one of them


def test_stop_string_cuts_text_and_keeps_the_completing_token(async_scheduling):
    base = req("x", prompt(6, base=2), max_tokens=40, seed=9)
    ids, _, text = reference(base)
    stop = text[11:13]  # a two-character string from the middle of the completion
    engine, _ = make_engine(async_scheduling=async_scheduling)
    stopped = req("st", prompt(6, base=2), max_tokens=40, seed=9, stop=(stop, "@@"))
    as_str = Request("st2", prompt(6, base=2), SamplingParams(max_tokens=40, seed=9, stop=stop, ignore_eos=True))
    out = engine.generate([stopped, as_str])
    r = out[0]
    assert r.finish_reason == "stop" and r.text == text[:text.find(stop)]
    n = len(r.completion_ids)
    assert r.completion_ids == ids[:n] and stop in FakeTokenizer().decode(ids[:n], True)
    assert stop not in FakeTokenizer().decode(ids[:n - 1], True)
    assert (out[1].completion_ids, out[1].text) == (r.completion_ids, r.text)  # a bare str is one stop string
    assert_matches_reference([stopped], [r])


@pytest.mark.parametrize("fail_on_call", [0, 1])
def test_a_failed_step_can_be_retried(fail_on_call):
    engine, runner = make_engine()
    calls = []

    def flaky(method):
        def call(*args):
            calls.append(method.__name__)
            if len(calls) == fail_on_call + 1:
                raise MemoryError("out of memory")
            return method(*args)
        return call

    runner.launch = flaky(runner.launch)
    requests = [req(f"x{j}", prompt(10), max_tokens=5, seed=j) for j in range(3)]
    for q in requests:
        engine.add_request(q)
    done = engine.step() if fail_on_call else []
    with pytest.raises(MemoryError):
        engine.step()
    while engine.has_unfinished():
        done += engine.step()
    assert_matches_reference(requests, sorted(done, key=lambda r: r.request_id))
    assert engine.block_manager.num_free_blocks == 64


def test_async_scheduling_launches_the_next_step_before_reading_the_last_one(async_scheduling):
    engine, runner = make_engine(async_scheduling=async_scheduling, decode_steps=3)
    requests = [req(f"o{i}", prompt(5 + i), max_tokens=11, seed=i) for i in range(3)]
    assert_matches_reference(requests, engine.generate(requests))
    order = {event: i for i, event in enumerate(runner.log)}
    launches = len(runner.calls)
    assert launches >= 4 and all(("result", n) in order for n in range(1, launches + 1))
    if async_scheduling:  # launch n+1 goes out before the tokens of launch n are read
        assert all(order[("launch", n + 1)] < order[("result", n)] for n in range(1, launches))
    else:
        assert all(order[("result", n)] < order[("launch", n + 1)] for n in range(1, launches))


def break_reads(runner: FakeRunner):
    """From now on every launch's read-back fails ("device lost"); returns the runner's own launch, to restore."""
    launch = runner.launch

    def broken_read(*args):
        pending = launch(*args)
        pending.result = lambda: (_ for _ in ()).throw(RuntimeError("device lost"))
        return pending

    runner.launch = broken_read
    return launch


def test_a_failed_read_back_abandons_the_steps_in_flight_and_they_run_again():
    engine, runner = make_engine(decode_steps=2)
    requests = [req(f"f{i}", prompt(6 + i), max_tokens=9, seed=i) for i in range(3)]
    for q in requests:
        engine.add_request(q)
    done = engine.step() + engine.step()  # a prefill read back, a decode burst in flight
    launch = break_reads(runner)
    done += engine.step()  # launches a burst that cannot be read, reads the good one before it
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()  # launches another, then fails to read the one before: both are abandoned
    assert all(s.num_pending == 0 for s in engine.scheduler.running)
    runner.launch = launch
    while engine.has_unfinished():
        done += engine.step()
    assert_matches_reference(requests, sorted(done, key=lambda r: r.request_id))
    assert engine.block_manager.num_free_blocks == 64


def test_sleep_reads_back_the_step_in_flight_first():
    engine, runner = make_engine(decode_steps=2)
    requests = [req(f"z{i}", prompt(5 + i), max_tokens=2, seed=i) for i in range(2)]
    for q in requests:
        engine.add_request(q)
    done = engine.step() + engine.step()  # the prefill read back; a burst that finishes both is in flight
    assert not done and runner.log[-2:] == [("launch", 2), ("result", 1)]
    engine.sleep()
    assert runner.log[-1] == ("result", 2) and not engine.scheduler.has_unfinished()
    engine.wake()
    done += engine.step()
    assert_matches_reference(requests, sorted(done, key=lambda r: r.request_id))


def test_generate_that_fails_leaves_a_clean_engine():
    engine, runner = make_engine()
    engine.add_request(req("bad-outside", []))  # an error rollout waiting for step()
    launch = runner.launch
    runner.launch = lambda *args: (_ for _ in ()).throw(RuntimeError("device lost"))
    with pytest.raises(RuntimeError, match="device lost"):
        engine.generate([req("a", prompt(6)), req("b", prompt(7))])
    assert engine.block_manager.num_free_blocks == 64 and not engine.scheduler.has_unfinished()
    runner.launch = launch
    assert [r.request_id for r in engine.step()] == ["bad-outside"]
    requests = [req("a", prompt(6)), req("b", prompt(7))]
    assert_matches_reference(requests, engine.generate(requests))


# ---------------------------------------------------------------------- memory and config


def test_sleep_wake_round_trip():
    engine, runner = make_engine()
    requests = [req(f"s{i}", prompt(9), max_tokens=6, seed=i) for i in range(4)]
    first = engine.generate(requests)
    engine.sleep()
    assert runner.kv is None and engine.is_asleep
    with pytest.raises(RuntimeError, match="asleep"):
        engine.step()
    engine.wake()
    before = engine.stats()
    second = engine.generate(requests)
    assert [r.completion_ids for r in first] == [r.completion_ids for r in second]
    after = engine.stats()
    shared = (9 - 1) // BS * BS  # the cache was forgotten on sleep: the first sample computes everything
    assert after["prefill_tokens_computed"] - before["prefill_tokens_computed"] == 4 * 9 - 3 * shared


def test_sleep_with_requests_in_flight_recomputes_them_after_wake():
    engine, runner = make_engine()
    requests = [req(f"f{i}", prompt(5 + i), max_tokens=9, seed=i) for i in range(3)]
    for q in requests:
        engine.add_request(q)
    done = engine.step() + engine.step() + engine.step()
    engine.sleep()
    engine.sleep()  # idempotent
    engine.wake()
    while engine.has_unfinished():
        done += engine.step()
    assert_matches_reference(requests, sorted(done, key=lambda r: r.request_id))


def test_num_blocks_comes_from_the_runner_when_not_set():
    engine, _ = make_engine(num_blocks=None, blocks_that_fit=17)
    assert engine.num_blocks == 17 and engine.stats()["num_blocks"] == 17
    with pytest.raises(ValueError, match="no room for a KV cache"):
        make_engine(num_blocks=None, blocks_that_fit=0)


@pytest.mark.parametrize("field, value", [("block_size", 0), ("num_blocks", 0), ("gpu_memory_utilization", 0.0),
                                          ("gpu_memory_utilization", 1.5), ("max_num_seqs", 0),
                                          ("max_num_batched_tokens", 8), ("max_model_len", 0),
                                          ("cuda_graphs", "yes")])
def test_config_validation_names_the_field(field, value):
    kwargs = {"max_num_seqs": 16, field: value}
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs).validate()
    EngineConfig(max_num_seqs=16).validate()


def test_generate_keeps_rollouts_of_other_requests_for_step():
    engine, _ = make_engine()
    engine.add_request(req("outside", prompt(4), max_tokens=3))
    out = engine.generate([req("inside", prompt(4, base=7), max_tokens=8)])
    assert [r.request_id for r in out] == ["inside"]
    rest = []
    while engine.has_unfinished():
        rest += engine.step()
    assert [r.request_id for r in rest] == ["outside"]


# ---------------------------------------------------------------------- backend wiring


@dataclass
class _Cfg:
    max_position_embeddings: int = 64


class _TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Cfg()
        self.proj = nn.Linear(2, 2)


def test_engine_backend_wires_the_runner(monkeypatch):
    from tandemrl.backends.base import RolloutBackend
    from tandemrl.backends.engine_backend import EngineBackend

    made = []

    def fake_runner(model, config, device):
        assert config.block_size == BS and config.max_model_len == 64 and isinstance(device, torch.device)
        made.append(FakeRunner(blocks_that_fit=32))
        return made[-1]

    monkeypatch.setitem(sys.modules, "tandemrl.engine.model.runner", types.SimpleNamespace(ModelRunner=fake_runner))
    model = _TinyModel().train()
    backend = EngineBackend(model, FakeTokenizer(), EngineConfig(block_size=BS))
    assert isinstance(backend, RolloutBackend)
    assert backend.engine.config.max_model_len == 64 and backend.engine.num_blocks == 32
    made[0].live = lambda: backend.engine.scheduler.running
    requests = [req("b0", prompt(5), max_tokens=5, seed=0, ignore_eos=False), req("b1", prompt(60), max_tokens=10)]
    out = backend.generate(requests, policy_version=7)
    assert_matches_reference(requests[:1], out[:1])
    assert out[1].finish_reason == "error" and "max_model_len" in out[1].error
    assert model.training  # eval mode only while generating
    backend.sleep()
    assert made[0].kv is None
    with pytest.raises(RuntimeError, match="wake"):
        backend.generate(requests)
    backend.wake()
    assert backend.generate(requests[:1])[0].completion_ids == out[0].completion_ids
    backend.close()
    with pytest.raises(RuntimeError, match="close"):
        backend.generate(requests)
