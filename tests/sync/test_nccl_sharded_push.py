"""nccl sync from an FSDP2-sharded trainer (2 ranks, gloo): every rank gathers the parameters one at a time in the
push's order, rank 0 sends the buckets, and the receiver gets the full weights."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tandemrl.models.tiny import ensure_tiny_model


def test_a_sharded_trainer_pushes_its_full_weights(tmp_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned processes import tests_support
        from tests_support.sharded_push_worker import run
        from tests_support.spawn import spawn_ranks

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        model_dir = ensure_tiny_model(tmp_path / "tiny")
        result = tmp_path / "result.json"
        spawn_ranks(run, (str(tmp_path / "store"), f"tcp://127.0.0.1:{port}", str(model_dir), 20_000, str(result)), 3,
                    tmp_path / "store")
    received = json.loads(result.read_text())
    assert received["tensors"] > 10 and received["max_diff"] == 0.0
