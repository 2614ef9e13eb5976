import pytest

from tandemrl.curriculum.allocation import bucket_labels, rollouts_for_bucket


@pytest.mark.parametrize("mean, expected", [
    (0.0, 10),   # 4 * (1 + 1.5 * 1)   = 10
    (0.5, 7),    # 4 * (1 + 1.5 * 0.5) = 7
    (1.0, 4),    # 4 * (1 + 0)         = 4
    (0.2, 9),    # 4 * (1 + 1.2)       = 8.8 -> 9
    (0.75, 6),   # 4 * 1.375           = 5.5 -> 6 (halves to even)
    (0.25, 8),   # 4 * 2.125           = 8.5 -> 8 (halves to even, as Python's round)
])
def test_seed_allocation_by_hand(mean, expected):
    assert rollouts_for_bucket(mean, base=4, alpha=1.5) == expected


def test_at_least_one_rollout():
    assert rollouts_for_bucket(1.0, base=1, alpha=0.0) == 1
    assert rollouts_for_bucket(3.0, base=2, alpha=1.0) == 1  # a mean above 1 (clip mode cannot, minmax cannot) floors at 1
    with pytest.raises(ValueError, match="base_rollouts"):
        rollouts_for_bucket(0.5, base=0, alpha=1.0)


def test_labels_go_from_hard_to_easy():
    assert bucket_labels(1) == ["all"]
    assert bucket_labels(3) == ["hard", "medium", "easy"]
    assert bucket_labels(4) == ["hard", "medium-1", "medium-2", "easy"]
