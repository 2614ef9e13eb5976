"""build_batch: rollout data (loss weights, sampling log-probs, policy versions) reaches the training tensors."""

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
