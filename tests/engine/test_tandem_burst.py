"""The tandem burst planner: each model reads every token but the last exactly once, each token is sampled by the
model the plan names, and the models take turns in fewer forwards than two per position."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from tandemrl.engine.tandem_burst import plan_tandem_burst


def writers(rows: int, n: int, p: float, seed: int = 0) -> list[list[bool]]:
    rng = random.Random(seed)
    return [[rng.random() < p for _ in range(rng.randint(1, n))] for _ in range(rows)]


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 0.8, 0.97, 1.0])
def test_every_token_is_read_once_by_each_model_and_sampled_by_its_writer(p, paired):
    owners = writers(16, 40, p, seed=int(p * 100))
    burst = plan_tandem_burst(owners, 24, paired=paired)
    reads = {True: Counter(), False: Counter()}
    sampled = {}
    for forward in burst.forwards:
        reads[forward.hot].update(zip(forward.row.tolist(), forward.token.tolist()))
        assert forward.counts.sum() == len(forward.row) and (forward.counts >= 1).all()
        if forward.sample:
            for row, last in zip(forward.rows.tolist(), forward.token[forward.last].tolist()):
                assert (row, last + 1) not in sampled
                sampled[row, last + 1] = forward.hot
    for row, n in enumerate(burst.num_tokens.tolist()):
        assert 1 <= n <= len(owners[row])
        assert burst.owners[row] == owners[row][:n]
        assert [sampled[row, k] for k in range(n)] == owners[row][:n]
        for model in (True, False):  # tokens -1 .. n-2, each once
            assert sorted(k for (r, k), c in reads[model].items() if r == row for _ in range(c)) == list(range(-1, n - 1))


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_the_models_take_turns_in_fewer_forwards_than_two_per_position(p):
    rng = random.Random(1)
    owners = [[rng.random() < p for _ in range(64)] for _ in range(64)]
    burst = plan_tandem_burst(owners, 64)
    per_position = len(burst.forwards) / burst.num_tokens.mean()
    assert per_position < 1.7, per_position


def test_no_row_starves_behind_the_majority_and_a_row_moves_at_least_once():
    owners = [[True] * 8 for _ in range(63)] + [[False] * 8]
    burst = plan_tandem_burst(owners, 4)
    assert burst.num_tokens.min() >= 1
    assert plan_tandem_burst([[False], [True]], 0).num_tokens.tolist() == [1, 1]
    with pytest.raises(ValueError, match="at least one position"):
        plan_tandem_burst([[True], []], 4)
    assert np.array_equal(burst.column(np.array([1]), np.array([-1])), [burst.width])


@pytest.mark.parametrize("p", [0.3, 0.5, 0.8])
def test_paired_ticks_move_every_row_once_and_pair_the_models_over_other_rows(p):
    rng = random.Random(2)
    owners = [[rng.random() < p for _ in range(rng.randint(5, 20))] for _ in range(32)]
    burst = plan_tandem_burst(owners, 16, paired=True)
    assert burst.num_tokens.tolist() == [min(8, len(o)) for o in owners]  # 8 ticks: a position per row each
    sampling = [f for f in burst.forwards if f.sample]
    for before, forward in zip(sampling, sampling[1:]):
        if forward.beside:  # the frozen model beside the hot one, over the rows the hot one does not serve
            assert before.hot and not forward.hot and not set(before.rows) & set(forward.rows)
    assert sum(f.beside for f in sampling) >= 4
    assert not any(f.beside for f in burst.forwards if not f.sample)
