import random

import pytest
import torch

from tandemrl.backends import HFBackend, RolloutBackend
from tandemrl.types import Request, SamplingParams

PROMPT_LENS = [3, 7, 12, 1, 20]


def prompts(lens=PROMPT_LENS, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 128) for _ in range(n)] for n in lens]


def requests(prompt_list, **params):
    return [Request(f"r{i}", p, SamplingParams(**params)) for i, p in enumerate(prompt_list)]


def hf_greedy(model, prompt, max_new, eos=None):
    """Reference: Hugging Face generate on the single, unpadded prompt."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def full_logits(model, prompt, completion):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].double()
    return logits[len(prompt) - 1:len(prompt) + len(completion) - 1]


def test_is_a_rollout_backend_and_keeps_a_reference(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    assert isinstance(backend, RolloutBackend)
    assert backend.model is model
    backend.sleep()
    backend.wake()
    backend.close()
    with pytest.raises(RuntimeError):
        backend.generate(requests(prompts()))


@pytest.mark.parametrize("max_batch_size", [64, 2])
def test_greedy_matches_hf_generate_ignoring_eos(model, tokenizer, max_batch_size):
    backend = HFBackend(model, tokenizer, max_batch_size=max_batch_size)
    ps = prompts()
    out = backend.generate(requests(ps, temperature=0.0, max_tokens=24, ignore_eos=True), policy_version=7)
    assert [r.request_id for r in out] == [f"r{i}" for i in range(len(ps))]
    for p, r in zip(ps, out):
        assert r.completion_ids == hf_greedy(model, p, 24)
        assert r.finish_reason == "length" and r.policy_version == 7 and r.prompt_ids == p
        assert r.text == tokenizer.decode(r.completion_ids, skip_special_tokens=True)
        assert len(r.logprobs) == 24


def test_greedy_matches_hf_generate_with_eos(model, tokenizer):
    ps = prompts()
    backend = HFBackend(model, tokenizer, max_batch_size=3)
    free = backend.generate(requests(ps, temperature=0.0, max_tokens=24, ignore_eos=True))
    # the token found in the most rows' greedy output, so several rows end, at varied points
    eos = max({t for r in free for t in r.completion_ids}, key=lambda t: (sum(t in r.completion_ids for r in free), t))
    model.generation_config.eos_token_id = eos  # the backend reads generation_config and the tokenizer
    out = backend.generate(requests(ps, temperature=0.0, max_tokens=24))
    stopped = 0
    for p, r in zip(ps, out):
        ref = hf_greedy(model, p, 24, eos=[tokenizer.eos_token_id, eos])
        assert r.completion_ids == ref
        if r.finish_reason == "stop":
            stopped += 1
            assert r.completion_ids[-1] in (eos, tokenizer.eos_token_id)  # EOS stays in the completion
            assert len(r.logprobs) == len(r.completion_ids)
        else:
            assert r.finish_reason == "length" and len(r.completion_ids) == 24
    assert stopped >= 2
    # ignore_eos per row: mixed in one chunk
    mixed = requests(ps[:2], temperature=0.0, max_tokens=24)
    mixed[1] = Request("x", ps[1], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    out2 = backend.generate(mixed)
    assert out2[0].completion_ids == out[0].completion_ids
    assert out2[1].completion_ids == free[1].completion_ids


def test_mixed_max_tokens_per_row(model, tokenizer):
    ps = prompts()
    reqs = [Request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))
            for i, (p, m) in enumerate(zip(ps, [1, 5, 17, 9, 30]))]
    out = HFBackend(model, tokenizer).generate(reqs)
    for req, r in zip(reqs, out):
        assert r.completion_ids == hf_greedy(model, req.prompt_ids, req.params.max_tokens)
        assert r.finish_reason == "length"


def test_greedy_logprobs_are_raw_log_softmax(model, tokenizer):
    ps = prompts()
    out = HFBackend(model, tokenizer).generate(requests(ps, temperature=0.0, max_tokens=10, ignore_eos=True))
    for p, r in zip(ps, out):
        ref = full_logits(model, p, r.completion_ids).log_softmax(-1)
        got = torch.tensor(r.logprobs, dtype=torch.float64)
        assert torch.allclose(got, ref.gather(-1, torch.tensor(r.completion_ids)[:, None]).squeeze(-1), atol=1e-4)


def reference_logprobs(logits, tokens, temperature, top_k=0, top_p=1.0):
    x = logits / temperature
    if top_k:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1:
        sorted_x, idx = x.sort(-1, descending=True)
        probs = sorted_x.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[:, 0] = False
        x = x.scatter(-1, idx, sorted_x.masked_fill(drop, float("-inf")))
    return x.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 0, 1.0), (1.3, 5, 1.0),
                                                     (0.9, 0, 0.8), (1.1, 20, 0.9)])
def test_sampled_logprobs_match_full_forward(model, tokenizer, temperature, top_k, top_p):
    ps = prompts()
    out = HFBackend(model, tokenizer).generate(
        requests(ps, temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=16, ignore_eos=True, seed=11))
    for p, r in zip(ps, out):
        ref = reference_logprobs(full_logits(model, p, r.completion_ids), r.completion_ids, temperature,
                                 top_k, top_p)
        assert torch.isfinite(ref).all()
        assert torch.allclose(torch.tensor(r.logprobs, dtype=torch.float64), ref, atol=1e-4)


def first_stop_token(tokenizer, ids, stop):
    for n in range(1, len(ids) + 1):
        if any(s in tokenizer.decode(ids[:n], skip_special_tokens=True) for s in stop):
            return n
    return None


@pytest.mark.parametrize("interval", [1, 8])
def test_stop_strings_cut_ids_and_text(model, tokenizer, interval):
    backend = HFBackend(model, tokenizer, stop_check_interval=interval)
    ps = prompts()
    free = backend.generate(requests(ps, temperature=0.0, max_tokens=40, ignore_eos=True))
    reqs, expect = [], []
    for i, (p, r) in enumerate(zip(ps, free)):
        text = r.text
        stop = (text[10 + i:12 + i],) if i != 3 else ("\x00never",)  # row 3: a stop string that never occurs
        if i == 4:
            stop = (text[20:23], text[6:8])  # two stop strings: the earlier occurrence wins
        reqs.append(Request(f"s{i}", p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                                       stop=stop)))
        n = first_stop_token(tokenizer, r.completion_ids, stop)
        cut = min((text.find(s) for s in stop if s in text), default=None)
        expect.append((n, cut))
    out = backend.generate(reqs)
    for r_free, r, (n, cut) in zip(free, out, expect):
        if n is None:
            assert r.finish_reason == "length" and r.completion_ids == r_free.completion_ids
            assert r.text == r_free.text
        else:
            assert r.finish_reason == "stop"
            assert r.completion_ids == r_free.completion_ids[:n]
            assert r.logprobs == pytest.approx(r_free.logprobs[:n], abs=1e-5)
            assert r.text == r_free.text[:cut]
    assert sum(r.finish_reason == "stop" for r in out) >= 4


def test_stop_string_ends_decoding_early(model, tokenizer):
    backend = HFBackend(model, tokenizer, stop_check_interval=8)
    p = prompts()[:1]
    free = backend.generate(requests(p, temperature=0.0, max_tokens=100, ignore_eos=True))[0]
    stop = free.text[1:3]
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        r = backend.generate(requests(p, temperature=0.0, max_tokens=100, ignore_eos=True, stop=(stop,)))[0]
    finally:
        handle.remove()
    assert r.finish_reason == "stop" and len(r.completion_ids) <= 10
    assert len(calls) <= 1 + 16  # prefill + at most two check intervals, not 100 steps


def test_seeded_generation_is_reproducible(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    reqs = requests(prompts(), temperature=1.0, max_tokens=20, ignore_eos=True, seed=123)
    a, b = backend.generate(reqs), backend.generate(reqs)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    c = backend.generate(requests(prompts(), temperature=1.0, max_tokens=20, ignore_eos=True, seed=124))
    assert [r.completion_ids for r in a] != [r.completion_ids for r in c]


def test_in_place_weight_update_is_seen_without_any_call(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    ps = prompts()
    reqs = requests(ps, temperature=0.0, max_tokens=12, ignore_eos=True)
    before = [r.completion_ids for r in backend.generate(reqs)]
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(5)))
    after = [r.completion_ids for r in backend.generate(reqs)]
    assert after != before
    assert after == [hf_greedy(model, p, 12) for p in ps]


def test_dropout_is_off_while_sampling_and_modes_are_restored(make_model, tokenizer):
    model = make_model(attention_dropout=0.5)
    model.train()
    model.model.layers[0].eval()  # a submodule in its own mode must get that mode back
    backend = HFBackend(model, tokenizer)
    ps = prompts()
    out = backend.generate(requests(ps, temperature=0.0, max_tokens=12, ignore_eos=True))
    assert model.training and model.model.layers[1].training and not model.model.layers[0].training
    model.eval()
    assert [r.completion_ids for r in out] == [hf_greedy(model, p, 12) for p in ps]


def test_invalid_requests_get_error_rollouts_and_the_rest_run(model, tokenizer):
    ps = prompts()
    ok = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    reqs = [
        Request("ok0", ps[0], ok),
        Request("empty", [], ok),
        Request("zero", ps[1], SamplingParams(max_tokens=0)),
        Request("long", [5] * 200, SamplingParams(temperature=0.0, max_tokens=100)),
        Request("vocab", [5, 500], ok),
        Request("stop", ps[2], SamplingParams(stop=("",))),
        Request("temp", ps[2], SamplingParams(temperature=-1.0)),
        Request("ok1", ps[4], ok),
    ]
    out = HFBackend(model, tokenizer).generate(reqs, policy_version=3)
    assert [r.request_id for r in out] == [r.request_id for r in reqs]
    for r in out[1:-1]:
        assert r.finish_reason == "error" and r.error and r.completion_ids == [] and r.policy_version == 3
    assert "empty" in out[1].error and "max_tokens" in out[2].error
    assert "max_position_embeddings" in out[3].error and "500" in out[4].error
    for req, r in [(reqs[0], out[0]), (reqs[-1], out[-1])]:
        assert r.error is None and r.completion_ids == hf_greedy(model, req.prompt_ids, 8)
    assert HFBackend(model, tokenizer).generate([]) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_on_cuda_matches_hf_generate(model, tokenizer):
    model = model.cuda()
    ps = prompts()
    out = HFBackend(model, tokenizer).generate(requests(ps, temperature=0.0, max_tokens=24, ignore_eos=True))
    for p, r in zip(ps, out):
        ids = torch.tensor([p], device="cuda")
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                             eos_token_id=None, pad_token_id=0)
        assert r.completion_ids == ref[0, len(p):].tolist()
    seeded = requests(ps, temperature=1.0, top_p=0.9, max_tokens=16, ignore_eos=True, seed=5)
    backend = HFBackend(model, tokenizer)
    assert [r.completion_ids for r in backend.generate(seeded)] == [r.completion_ids for r in backend.generate(seeded)]
