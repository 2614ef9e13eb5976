"""progress() and load(): what a streaming server reads between steps (tokens read back so far, queue, KV use)."""

from __future__ import annotations

import pytest

from tests.engine.test_engine_core import make_engine, prompt, req


def started(async_scheduling: bool, n: int) -> tuple:
    """An engine with ``n`` seeded requests added, and the requests."""
    engine, _ = make_engine(async_scheduling=async_scheduling, decode_steps=2)
    requests = [req(f"p{i}", prompt(5, base=i), max_tokens=9, seed=i) for i in range(n)]
    for q in requests:
        engine.add_request(q)
    return engine, requests


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_progress_is_a_prefix_of_the_final_completion(async_scheduling):
    engine, requests = started(async_scheduling, 2)
    load = engine.load()
    assert load["waiting"] == 2 and load["running"] == 0 and load["kv_blocks_used"] == 0
    seen: dict[str, list[list[int]]] = {q.request_id: [] for q in requests}
    done = {}
    while engine.has_unfinished():
        for r in engine.step():
            done[r.request_id] = r
        for request_id, ids, logprobs in engine.progress():
            assert len(ids) == len(logprobs) and -1 not in ids  # no pending placeholders
            seen[request_id].append(ids)
        if engine.has_unfinished() and engine.load()["running"]:
            assert engine.load()["kv_blocks_used"] > 0
    for request_id, snapshots in seen.items():
        final = done[request_id].completion_ids
        assert snapshots and all(final[:len(s)] == s for s in snapshots)
        assert [len(s) for s in snapshots] == sorted(len(s) for s in snapshots)  # it only grows
        assert any(0 < len(s) < len(final) for s in snapshots)  # tokens were visible before the end
    assert engine.progress() == [] and engine.load()["kv_blocks_used"] == 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_progress_since_what_was_sent_returns_only_the_new_tokens(async_scheduling):
    engine, requests = started(async_scheduling, 3)
    streamed: dict[str, tuple[list[int], list[float]]] = {q.request_id: ([], []) for q in requests}
    done = {}
    while engine.has_unfinished():
        for r in engine.step():
            done[r.request_id] = r
        whole = {request_id: (ids, lps) for request_id, ids, lps in engine.progress()}
        sent = {request_id: len(ids) for request_id, (ids, _) in streamed.items()}
        for request_id, new_ids, new_lps in engine.progress(sent):
            ids, lps = whole[request_id]  # the same tokens as the whole list's tail
            assert (new_ids, new_lps) == (ids[sent[request_id]:], lps[sent[request_id]:])
            streamed[request_id][0].extend(new_ids)
            streamed[request_id][1].extend(new_lps)
    for request_id, (ids, lps) in streamed.items():
        final = done[request_id]
        assert 0 < len(ids) and ids == final.completion_ids[:len(ids)] and lps == final.logprobs[:len(lps)]
