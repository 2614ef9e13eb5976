"""KDE bucketing: the valleys of the reward density split the samples; degenerate sets give one bucket."""

import numpy as np
import pytest

from tandemrl.curriculum.buckets import assign, find_boundaries, normalize


def kde_buckets(values, n_buckets=3, bandwidth="scott", min_fraction=0.05):
    return find_boundaries(normalize(np.asarray(values), "minmax"), n_buckets, bandwidth, 512, 8, min_fraction)


@pytest.mark.parametrize("seed", range(4))
def test_a_bimodal_set_splits_between_its_modes(seed):
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.normal(0.2, 0.05, 200), rng.normal(0.8, 0.05, 100)])
    cut = kde_buckets(values)
    assert cut.method == "kde" and len(cut.boundaries) == 1
    assert cut.boundaries[0] == pytest.approx(0.5, abs=0.08)  # normalised: the gap is halfway
    index = assign(normalize(values, "minmax"), cut.boundaries)
    assert (index[:200] == 0).all() and (index[200:] == 1).all()  # every sample in its own mode's bucket


@pytest.mark.parametrize("seed", range(4))
def test_a_trimodal_set_gets_three_buckets_with_the_right_members(seed):
    rng = np.random.default_rng(seed)
    modes = [rng.normal(m, 0.04, n) for m, n in ((0.15, 120), (0.5, 150), (0.85, 90))]
    values = np.concatenate(modes)
    cut = kde_buckets(values)
    assert len(cut.boundaries) == 2
    norm = normalize(values, "minmax")
    gaps = [(norm[:120].max() + norm[120:270].min()) / 2, (norm[120:270].max() + norm[270:].min()) / 2]
    assert cut.boundaries == pytest.approx(gaps, abs=0.08)
    assert np.bincount(assign(norm, cut.boundaries)).tolist() == [120, 150, 90]


def test_more_modes_than_buckets_keeps_the_emptiest_valleys():
    # four tight modes; the emptiest gap (the widest) comes first
    values = np.concatenate([np.full(50, 0.0), np.full(50, 0.1), np.full(50, 0.7), np.full(50, 1.0)])
    values = values + np.random.default_rng(0).normal(0, 0.01, values.size)
    cut = kde_buckets(values, n_buckets=2, bandwidth=0.05)
    assert len(cut.boundaries) == 1 and 0.15 < cut.boundaries[0] < 0.65


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [40, 300, 2000])
def test_a_unimodal_set_is_one_bucket(seed, n):
    values = np.random.default_rng(seed).normal(0.5, 0.1, n)
    cut = kde_buckets(values)
    assert cut.boundaries == [] and cut.n_buckets == 1


def test_the_seeds_narrow_bandwidth_splits_noise_unless_small_buckets_are_refused():
    values = np.random.default_rng(0).normal(0.5, 0.1, 300)
    assert kde_buckets(values, bandwidth=0.05, min_fraction=0.0).boundaries  # tail/noise valleys
    kept = kde_buckets(values, bandwidth=0.05, min_fraction=0.05).boundaries
    assert np.bincount(assign(normalize(values, "minmax"), kept)).min() >= 15  # 5 % of 300


@pytest.mark.parametrize("values, reason", [
    ([0.3] * 50, "all rewards equal"),
    ([0.1, 0.9, 0.5], "too few samples"),
    (np.linspace(0, 1, 100), "no valley"),
])
def test_degenerate_sets_fall_back_to_one_bucket(values, reason):
    cut = kde_buckets(values)
    assert cut.boundaries == [] and reason in cut.method


def test_normalize_minmax_and_clip():
    assert normalize(np.array([2.0, 4.0, 3.0]), "minmax").tolist() == [0.0, 1.0, 0.5]
    assert normalize(np.array([-0.5, 0.4, 1.7]), "clip").tolist() == [0.0, 0.4, 1.0]
    assert normalize(np.array([7.0, 7.0]), "minmax").tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="curriculum.normalize"):
        normalize(np.array([1.0]), "zscore")


def test_assign_puts_low_rewards_in_bucket_zero():
    assert assign(np.array([0.1, 0.4, 0.6, 0.95]), [0.3, 0.7]).tolist() == [0, 1, 1, 2]
