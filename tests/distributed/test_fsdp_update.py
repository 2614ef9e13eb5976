"""2 processes (gloo, FSDP2 on the CPU) give the loss and the parameter update of 1 process on the same batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tandemrl.models.tiny import ensure_tiny_model


@pytest.mark.parametrize("aggregation", ["token-mean"])
def test_two_ranks_match_one_process(tmp_path, monkeypatch, aggregation):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned ranks import tests_support
    from tests_support.fsdp_update_worker import run_rank

    model_dir = ensure_tiny_model(tmp_path / "tiny")
    result_file = tmp_path / "result.json"
    mp.spawn(run_rank, args=(2, str(tmp_path / "store"), str(model_dir), str(result_file), aggregation),
             nprocs=2, join=True)
    result = json.loads(result_file.read_text())
    ref, sharded = result["reference"], result["sharded"]
    assert result["update_size"] > 1e-3  # the step moved the weights, so matching it means something
    assert result["param_diff"] < 1e-5, result
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "ratio_mean", "mismatch/logp_abs_mean"):
        assert sharded[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert sharded["mismatch/logp_abs_max"] == pytest.approx(ref["mismatch/logp_abs_max"], rel=1e-6)
    assert result["gather_s"] >= 0
