"""`torchrun -m tandemrl train` with rollout.backend = "server" on the CPU (gloo): two FSDP2-sharded ranks send their
shares of the prompts to one `tandemrl serve` (in this process), and after each update both gather the shards while
rank 0 pushes them (sync.kind = "nccl" over gloo). The served weights are then the run's last checkpoint's."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("openai")

from tandemrl.models.tiny import ensure_tiny_model  # noqa: E402
from tandemrl.telemetry.writers import read_metrics  # noqa: E402
from tandemrl.train.checkpoint import checkpoint_info, find_latest  # noqa: E402
from tests.distributed.test_torchrun import torchrun  # noqa: E402
from tests.serve.conftest import serve_config, start_server  # noqa: E402
from tests.tests_support.ports import free_port  # noqa: E402


def checksum_of(model_dir) -> str:
    from transformers import AutoModelForCausalLM

    from tandemrl.sync.checksum import weights_checksum
    from tandemrl.sync.nccl import named_weights

    return weights_checksum(named_weights(AutoModelForCausalLM.from_pretrained(str(model_dir))))


@pytest.mark.parametrize("kind", ["nccl", "checkpoint"])
def test_two_sharded_ranks_train_against_one_server_and_push_to_it(tmp_path, kind):
    tiny = ensure_tiny_model(tmp_path / "tiny")
    running = start_server(serve_config(tiny))
    try:
        settings = [f'model.name_or_path="{tiny}"', "rollout.backend=server", f'rollout.server_url="{running.url}"',
                    "rollout.server_retries=0", f"sync.kind={kind}", "distributed.strategy=shard",
                    "distributed.timeout_s=60", "rollout.prompts_per_step=4", "rollout.group_size=2",
                    "rollout.max_tokens=4", "train.max_steps=2", "train.lr=1e-2",
                    "train.weight_decay=0.5", "eval.limit=4", "eval.pass_k=0",
                    "checkpoint.every_steps=0", "log.tensorboard=false"]
        if kind == "nccl":  # gloo stands in for NCCL on the CPU; small buckets, so a push takes several
            settings += ["sync.nccl_backend=gloo", "sync.nccl_bucket_mb=0.05",
                         f'sync.nccl_init_method="tcp://127.0.0.1:{free_port()}"']
        done = torchrun(tmp_path, 2, "--out", "run", *[a for s in settings for a in ("--set", s)])
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert "distributed.strategy -> shard" in done.stdout
        steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in row]
        assert [row["policy_version"] for row in steps] == [1, 2]
        assert all(row["sync/mb"] > 0 and row["mismatch/policy_version_lag"] == 0 for row in steps)
        status = httpx.get(running.url + "/v1/weights", timeout=30).json()
        assert status["policy_version"] == 2 and status["last_push"]["kind"] == kind
        # the server computes with the trained weights: the last checkpoint's, gathered from both ranks' shards
        latest = find_latest(tmp_path / "run" / "checkpoints")
        assert checkpoint_info(latest)["world_size"] == 2
        served = httpx.get(running.url + "/v1/weights/checksum", timeout=30).json()["checksum"]
        assert served == checksum_of(latest) != checksum_of(tiny)
    finally:
        running.stop()
