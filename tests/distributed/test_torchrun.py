"""`torchrun -m tandemrl train` on the CPU (gloo): a rank dying ends the job, naming the rank, with the last
checkpoint intact; the run then resumes from it with another number of processes and the other strategy. A rank that
hangs ends the job within the heartbeat timeout. Two torchrun launches (`--nnodes 2`, one rendezvous) train LoRA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tandemrl.cli import main
from tandemrl.models.tiny import ensure_tiny_model
from tandemrl.telemetry.writers import read_metrics
from tandemrl.train.checkpoint import checkpoint_info, checkpoint_problem, find_latest
from tests.tests_support.ports import free_port

REPO = Path(__file__).resolve().parents[2]

# Rank 1 exits hard on its 4th reward call: the initial evaluation, steps 1 and 2, then step 3.
DYING_REWARD = '''
import os
CALLS = []
def die_on_rank1(prompts, completions, **columns):
    CALLS.append(1)
    if os.environ.get("RANK") == "1" and len(CALLS) == 4:
        os._exit(17)
    return [0.0] * len(completions)
'''


def torchrun_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def torchrun_command(processes: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",  # a free port, chosen by torchrun
            f"--nproc-per-node={processes}", "-m", "tandemrl", "train", *args]


def torchrun(workdir: Path, processes: int, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_command(processes, *args), cwd=workdir, env=torchrun_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_a_dying_rank_ends_the_job_and_the_run_resumes_with_one_process(tmp_path):
    (tmp_path / "dying_reward.py").write_text(DYING_REWARD)
    tiny = ensure_tiny_model(tmp_path / "tiny")
    settings = [f'model.tiny_dir="{tiny}"', "checkpoint.every_steps=1", "eval.limit=8", "eval.pass_k=0",
                "rollout.prompts_per_step=4", "rollout.group_size=4", "log.tensorboard=false",
                "distributed.timeout_s=60", 'reward.weights={accuracy=1.0, "dying_reward:die_on_rank1"=0.5}']
    overrides = [arg for setting in settings for arg in ("--set", setting)]

    died = torchrun(tmp_path, 2, "--out", "run", "--set", "train.max_steps=5", "--set", "distributed.strategy=shard",
                    *overrides)
    output = died.stdout + died.stderr
    assert died.returncode != 0, output[-3000:]
    root_cause = output.split("Root Cause")[-1]
    assert "rank      : 1" in root_cause and "exitcode  : 17" in root_cause, output[-3000:]

    checkpoints = tmp_path / "run" / "checkpoints"
    latest = find_latest(checkpoints)
    assert latest is not None and latest.name == "step-00000002"
    assert checkpoint_problem(latest) is None
    info = checkpoint_info(latest)
    assert info["model_format"] == "fsdp-dcp" and info["world_size"] == 2
    assert not list(checkpoints.glob("step-00000003*"))

    # the sharded job's DCP checkpoint loads into one replicated process: a one-rank job, in this process (what
    # torchrun sets for its one worker; a fresh launch would cost seconds of imports)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(free_port())}.items():
            patch.setenv(name, value)
        assert main(["train", "--out", "run", "--resume", "--set", "train.max_steps=3",
                     "--set", "distributed.strategy=replicate"]) == 0
        assert not torch.distributed.is_initialized()  # the job left its process group
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert all(row["time/weight_gather"] >= 0 for row in steps)
    assert json.loads((find_latest(checkpoints) / "trainer_state.json").read_text())["_checkpoint"]["world_size"] == 1


# Rank 1 freezes (SIGSTOP: alive to torchrun, silent to its peers) on its 4th reward call, inside step 3; it leaves
# its pid in frozen.pid.
FREEZING_REWARD = '''
import os, signal
CALLS = []
def freeze_on_rank1(prompts, completions, **columns):
    CALLS.append(1)
    if os.environ.get("RANK") == "1" and len(CALLS) == 4:
        with open("frozen.pid", "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return [0.0] * len(completions)
'''


def test_a_hanging_rank_ends_the_job_within_the_heartbeat_timeout(tmp_path):
    import time

    (tmp_path / "freezing_reward.py").write_text(FREEZING_REWARD)
    tiny = ensure_tiny_model(tmp_path / "tiny")
    settings = [f'model.tiny_dir="{tiny}"', "checkpoint.every_steps=1", "eval.limit=4", "eval.pass_k=0",
                "rollout.prompts_per_step=2", "rollout.group_size=2", "log.tensorboard=false", "train.max_steps=5",
                "distributed.timeout_s=600", "distributed.heartbeat_timeout_s=6",
                'reward.weights={accuracy=1.0, "freezing_reward:freeze_on_rank1"=0.5}']
    start = time.monotonic()
    job = subprocess.Popen(torchrun_command(2, "--out", "run", *[a for s in settings for a in ("--set", s)]),
                           cwd=tmp_path, env=torchrun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    watchdog = threading.Timer(150, os.killpg, (job.pid, signal.SIGKILL))  # the whole job, should it never end
    watchdog.start()
    lines = []
    for line in job.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if "has not beaten for" in line:  # rank 0 saw it and ends the job; torchrun's SIGTERM cannot reach a
            os.kill(int((tmp_path / "frozen.pid").read_text()), signal.SIGKILL)  # stopped process: it kills
            # it 30 s later (a fixed grace); done here at once, as it would be then
    seconds = time.monotonic() - start
    watchdog.cancel()
    output = "".join(lines)
    assert job.wait(timeout=60) != 0, output[-3000:]
    assert "[rank 0] tandemrl: rank 1 (" in output and "has not beaten for" in output, output[-3000:]
    assert seconds < 90, seconds  # far below distributed.timeout_s: the heartbeat, not the collective, ended it
    latest = find_latest(tmp_path / "run" / "checkpoints")
    assert latest is not None and latest.name == "step-00000002" and checkpoint_problem(latest) is None


def test_two_torchrun_launches_meet_in_one_rendezvous_and_train_lora(tmp_path):
    tiny = ensure_tiny_model(tmp_path / "tiny")
    port = free_port()  # for the rendezvous
    settings = [f'model.tiny_dir="{tiny}"', "eval.limit=4", "eval.pass_k=0", "rollout.prompts_per_step=2",
                "rollout.group_size=2", "log.tensorboard=false", "train.max_steps=2", "checkpoint.every_steps=1",
                "model.lora.enabled=true", "model.lora.rank=4", "train.lr=1e-2"]
    launch = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
              "--rdzv-id=two-nodes", "-m", "tandemrl", "train", "--out", "run",
              *[a for s in settings for a in ("--set", s)]]
    env = torchrun_env()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *launch], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2
    assert any("distributed.strategy -> replicate (LoRA" in o for o in outputs)
    latest = find_latest(tmp_path / "run" / "checkpoints")
    assert latest.name == "step-00000002" and checkpoint_info(latest)["world_size"] == 2
    assert (latest / "adapter_model.safetensors").is_file()  # rank 0 wrote the adapter in peft's layout


def test_a_tensor_parallel_engine_over_two_ranks_trains_from_the_fsdp_shards(tmp_path):
    """engine.tensor_parallel_size = 2: both ranks run one engine (sampled rollouts: their schedulers stay in step or
    the job hangs), each trains on half of them, and the engine's slices refresh from the FSDP2 shards each step."""
    tiny = ensure_tiny_model(tmp_path / "tiny")
    settings = [f'model.tiny_dir="{tiny}"', "eval.limit=4", "eval.pass_k=0", "rollout.prompts_per_step=2",
                "rollout.group_size=4", "log.tensorboard=false", "train.max_steps=2", "distributed.strategy=shard",
                "engine.tensor_parallel_size=2", "distributed.timeout_s=60", "train.lr=1e-2",
                "checkpoint.every_steps=2"]
    done = torchrun(tmp_path, 2, "--out", "run", *[a for s in settings for a in ("--set", s)])
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "engine.tensor_parallel_size = 2: 1 engine(s)" in done.stdout
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["time/weight_gather"] > 0 for row in steps)
    assert steps[-1]["policy_version"] == 2
    # the checkpoint's Hugging Face files hold the whole trained model, not rank 0's engine shard
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(find_latest(tmp_path / "run" / "checkpoints"))
    start = AutoModelForCausalLM.from_pretrained(tiny)
    assert saved.config.num_attention_heads == start.config.num_attention_heads
    assert saved.get_input_embeddings().weight.shape == start.get_input_embeddings().weight.shape
    assert not torch.equal(saved.model.layers[0].mlp.down_proj.weight, start.model.layers[0].mlp.down_proj.weight)
