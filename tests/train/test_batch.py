"""build_batch: rollout data (loss weights, sampling log-probs, policy versions) reaches the training tensors."""

import random

import pytest
import torch

from tandemrl.train.batch import build_batch
from tandemrl.types import Rollout

CPU = torch.device("cpu")
PAD = 0


def _rollout(prompt, completion, logprobs, weights=(), version=0):
    return Rollout("r", list(prompt), list(completion), list(logprobs), "stop", policy_version=version,
                   loss_weights=list(weights))


def _batch(rollouts):
    return build_batch(rollouts, torch.zeros(len(rollouts)), PAD, CPU)


def test_loss_weights_and_logprobs_are_right_padded():
    batch = _batch([
        _rollout([5, 6], [7, 8, 9], [-0.5, -1.0, -2.0], weights=[1.0, 0.2, 0.0], version=3),
        _rollout([5], [4], [-0.25], version=1),  # no weights set: all 1.0
    ])
    torch.testing.assert_close(batch.loss_mask, torch.tensor([[1.0, 0.2, 0.0], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(batch.rollout_logprobs, torch.tensor([[-0.5, -1.0, -2.0], [-0.25, 0.0, 0.0]]))
    assert batch.policy_versions.dtype == torch.long and batch.policy_versions.tolist() == [3, 1]
    assert batch.completion_ids.tolist() == [[7, 8, 9], [4, PAD, PAD]]
    assert batch.policy_version_lag(5) == 4  # the oldest row was sampled by version 1


def test_rows_slice_the_new_fields():
    batch = _batch([_rollout([1], [2], [-0.1], version=0), _rollout([1], [3, 4], [-0.2, -0.3], [0.2, 1.0], 2)])
    row = batch.rows(torch.tensor([1]))
    assert row.policy_versions.tolist() == [2]
    torch.testing.assert_close(row.rollout_logprobs, torch.tensor([[-0.2, -0.3]]))
    torch.testing.assert_close(row.loss_mask, torch.tensor([[0.2, 1.0]]))


@pytest.mark.parametrize("logprobs", [[], [-0.1], [-0.1, -0.2, -0.3]])
def test_a_rollout_without_matching_logprobs_gives_none(logprobs):
    batch = _batch([_rollout([1], [2, 3], [-0.1, -0.2]), _rollout([1], [2, 3], logprobs)])
    assert batch.rollout_logprobs is None
    assert batch.rows(slice(0, 1)).rollout_logprobs is None


def test_empty_completion_with_empty_logprobs_still_counts_as_having_them():
    batch = _batch([_rollout([1], [], []), _rollout([1], [2], [-0.5])])
    torch.testing.assert_close(batch.rollout_logprobs, torch.tensor([[0.0], [-0.5]]))
    torch.testing.assert_close(batch.loss_mask, torch.tensor([[0.0], [1.0]]))


def test_loss_weights_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match="2 loss weights for 3 completion tokens"):
        _batch([_rollout([1], [2, 3, 4], [-0.1] * 3, weights=[1.0, 0.5])])


def _reference_rows(rollouts, pad):
    """build_batch's rows written out token by token, as the padding is defined (the vectorised copy must match)."""
    prompt_width = max(len(r.prompt_ids) for r in rollouts)
    width = max(1, max(len(r.completion_ids) for r in rollouts))
    rows, masks, weights, logprobs = [], [], [], []
    for r in rollouts:
        left, right = prompt_width - len(r.prompt_ids), width - len(r.completion_ids)
        rows.append([pad] * left + r.prompt_ids + r.completion_ids + [pad] * right)
        masks.append([0] * left + [1] * (len(r.prompt_ids) + len(r.completion_ids)) + [0] * right)
        weights.append(r.token_weights() + [0.0] * right)
        logprobs.append(r.logprobs + [0.0] * right)
    return rows, masks, weights, logprobs, width


def test_ragged_rows_are_padded_as_written_token_by_token():
    rng = random.Random(0)
    rollouts = []
    for i in range(40):
        n = rng.choice([0, 1, 2, rng.randrange(3, 60)])
        weights = [rng.choice([0.0, 0.3, 1.0]) for _ in range(n)] if i % 3 == 0 else []
        rollouts.append(_rollout([rng.randrange(1, 500) for _ in range(rng.randrange(1, 9))],
                                 [rng.randrange(1, 500) for _ in range(n)], [-rng.random() * 5 for _ in range(n)],
                                 weights, version=rng.randrange(4)))
    batch = build_batch(rollouts, torch.arange(40.0), 7, CPU)
    rows, masks, weights, logprobs, width = _reference_rows(rollouts, 7)
    assert batch.input_ids.tolist() == rows and batch.attention_mask.tolist() == masks
    assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.completion_ids.dtype == torch.long
    assert batch.completion_ids.tolist() == [row[batch.prompt_width:] for row in rows]
    assert batch.position_ids.tolist() == [[max(0, sum(m[:j + 1]) - 1) for j in range(len(m))] for m in masks]
    assert torch.equal(batch.loss_mask, torch.tensor(weights, dtype=torch.float32))
    assert torch.equal(batch.rollout_logprobs, torch.tensor(logprobs, dtype=torch.float32))
    assert batch.completion_ids.shape[1] == width and batch.advantages.tolist() == list(range(40))
