import json

import pytest

from tandemrl.data.iterator import PromptIterator, epoch_progress
from tandemrl.types import Sample


def samples(n):
    return [Sample(prompt=f"p{i}", answer=str(i), index=i) for i in range(n)]


def ids(batch):
    return [s.index for s in batch]


def test_epochs_cover_samples_and_wrap():
    it = PromptIterator(samples(10), batch_size=3, seed=0)
    assert it.batches_per_epoch == 3
    epoch0 = [ids(it.next_batch()) for _ in range(3)]
    flat = sum(epoch0, [])
    assert len(set(flat)) == 9 and it.epoch == 0
    nxt = it.next_batch()
    assert it.epoch == 1 and len(set(ids(nxt))) == 3
    assert it.batches_served == 4


def test_every_sample_seen_over_epochs():
    it = PromptIterator(samples(10), batch_size=4, seed=1)
    seen = set()
    for _ in range(20):
        seen.update(ids(it.next_batch()))
    assert seen == set(range(10))


def test_deterministic_per_seed_and_no_shuffle():
    a = [ids(PromptIterator(samples(20), 5, seed=7).next_batch())]
    b = [ids(PromptIterator(samples(20), 5, seed=7).next_batch())]
    c = [ids(PromptIterator(samples(20), 5, seed=8).next_batch())]
    assert a == b and a != c
    it = PromptIterator(samples(6), 3, seed=0, shuffle=False)
    assert [ids(it.next_batch()) for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    it = PromptIterator(samples(30), 30, seed=0)
    assert ids(it.next_batch()) != list(range(30))  # shuffled
    assert ids(it.next_batch()) != ids(PromptIterator(samples(30), 30, seed=0).next_batch())  # new order per epoch


@pytest.mark.parametrize("consumed", [0, 1, 3, 4, 7, 11])
def test_resume_is_exact(consumed):
    data = samples(13)
    it = PromptIterator(data, batch_size=4, seed=5)
    for _ in range(consumed):
        it.next_batch()
    state = json.loads(json.dumps(it.state_dict()))  # checkpoints store it as plain data
    expected = [ids(it.next_batch()) for _ in range(10)]

    resumed = PromptIterator(data, batch_size=4, seed=5)
    resumed.load_state_dict(state)
    assert resumed.epoch == state["epoch"]
    assert [ids(resumed.next_batch()) for _ in range(10)] == expected
    assert resumed.epoch == it.epoch and resumed.batches_served == it.batches_served


def test_resume_mismatch_errors():
    it = PromptIterator(samples(10), 2, seed=0)
    state = it.state_dict()
    with pytest.raises(ValueError, match="batch_size does not match"):
        PromptIterator(samples(10), 5, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="seed does not match"):
        PromptIterator(samples(10), 2, seed=1).load_state_dict(state)
    other = samples(10)
    other[3] = Sample(prompt="changed", answer="3", index=3)
    with pytest.raises(ValueError, match="prompts differ"):
        PromptIterator(other, 2, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        PromptIterator(samples(10), 2, seed=0).load_state_dict({})


def test_constructor_errors():
    with pytest.raises(ValueError, match="empty"):
        PromptIterator([], 1, seed=0)
    with pytest.raises(ValueError, match="larger than the number of samples"):
        PromptIterator(samples(3), 4, seed=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        PromptIterator(samples(3), 0, seed=0)


def test_progress_counts_epochs_served_so_far_and_survives_a_resume():
    it = PromptIterator(samples(10), batch_size=3, seed=0)  # 3 batches an epoch, one sample left over
    seen = [it.progress]
    for _ in range(4):
        it.next_batch()
        seen.append(it.progress)
    assert seen == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 1 + 1 / 3])
    state = it.state_dict()
    assert epoch_progress(state["epoch"], state["position"], state["batch_size"], state["num_samples"]) == it.progress
