"""The tensor-parallel engine's weights come from the FSDP2 shards slice by slice (gloo, CPU): after the first
refresh and after an update each rank's engine shard equals the one cut from the whole model, with one engine over
2 ranks and with 2 engines of 2 ranks over 4; and from replicated training's whole tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


LAYOUTS = [(4, 2), (2, 2)]  # (world, tp_size): 2 engines of 2 ranks over 4; 1 engine over 2


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tp_weights")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned ranks import tests_support
        from tests_support.tp_weights_worker import run_rank
        from tests_support.spawn import spawn_ranks

        spawn_ranks(run_rank, (LAYOUTS, str(root / "store"), str(root / "result.json")),
                    max(world for world, _ in LAYOUTS), root / "store")
    return json.loads((root / "result.json").read_text())


@pytest.mark.parametrize("world,tp_size", sorted(LAYOUTS))
def test_each_rank_receives_its_slices_from_the_shards(results, world, tp_size):
    for name, result in results[f"{world}-{tp_size}"].items():
        assert result["ranks"] == [{"mismatched": [], "stale": [], "replicated": []}] * world, name
        assert result["engine_params"] < 0.6 * result["whole_params"], name
        assert result["seconds"] >= 0
