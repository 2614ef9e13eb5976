"""The tensor-parallel engine's weights come from the FSDP2 shards slice by slice (gloo, CPU): after the first
refresh and after an update each rank's engine shard equals the one cut from the whole model, with one engine over
2 ranks and with 2 engines of 2 ranks over 4; and from replicated training's whole tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp


@pytest.mark.parametrize("world,tp_size", [(2, 2), (4, 2)])
def test_each_rank_receives_its_slices_from_the_shards(tmp_path, world, tp_size):
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned ranks import tests_support
        from tests_support.tp_weights_worker import run_rank

        mp.spawn(run_rank, args=(world, tp_size, str(tmp_path / "store"), str(tmp_path / "result.json")),
                 nprocs=world, join=True)
    results = json.loads((tmp_path / "result.json").read_text())
    for name, result in results.items():
        assert result["ranks"] == [{"mismatched": [], "stale": [], "replicated": []}] * world, name
        assert result["engine_params"] < 0.6 * result["whole_params"], name
        assert result["seconds"] >= 0
