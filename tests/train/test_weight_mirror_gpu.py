"""The async weight push on GPUs: the worker's copy gets the trainer's exact weights, and a push to another GPU does
not wait for the engine steps the worker has queued there (a GPU test by nature: streams)."""

import pytest
import torch
from torch import nn

from tandemrl.train.weight_mirror import WeightMirror

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams: a GPU test")


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to(device)


def _update(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.5).add_(0.25)  # on the trainer's stream, queued right before the push


@pytest.mark.parametrize("worker_index", [0, 1])
def test_a_push_lands_exactly_after_the_update(worker_index):
    if worker_index >= torch.cuda.device_count():
        pytest.skip("needs a second GPU")
    trainer = _model(torch.device("cuda:0"))
    mirror = WeightMirror.copy_of(trainer, torch.device(f"cuda:{worker_index}"), version=0)
    for version in (1, 2):
        _update(trainer)
        mirror.publish(version)
        assert mirror.apply() == version
        for mine, theirs in zip(trainer.parameters(), mirror.target.parameters(), strict=True):
            assert torch.equal(mine.detach().cpu(), theirs.cpu())


def test_a_push_to_another_gpu_waits_for_none_of_the_work_queued_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU")
    trainer = _model(torch.device("cuda:0"))
    worker = torch.device("cuda:1")
    mirror = WeightMirror.copy_of(trainer, worker, version=0)
    mirror.publish(1)  # the first push pays the one-time set-up (streams, events, peer access): not what is timed
    assert mirror.apply() == 1
    _update(trainer)
    with torch.cuda.device(worker):
        torch.cuda._sleep(4_000_000_000)  # the worker's engine steps (about 2 s), queued on its default stream
    push_s = mirror.publish(2)
    busy = not torch.cuda.current_stream(worker).query()
    # the push came back while the worker's queue still ran
    assert busy, f"the push took {push_s:.3f} s and the worker's queue had drained by then"
    assert mirror.apply() == 2  # the worker applies it between two of its steps
    for mine, theirs in zip(trainer.parameters(), mirror.target.parameters(), strict=True):
        assert torch.equal(mine.detach().cpu(), theirs.cpu())
