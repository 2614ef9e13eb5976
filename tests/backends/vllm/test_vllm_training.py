"""A short GRPO run on the tiny model gives the same metrics with rollout.backend = "vllm" (colocated, and a vLLM
server in server mode) as with our engine.

The two backends draw from different random streams, so sampled rollouts differ: what must agree is what does not
depend on the draws (the greedy evaluation before training, the trainer-vs-rollout log-prob gap) and, within a
tolerance, how the run learns. Marked `vllm` (run by `make test-vllm`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tandemrl.config import load_config
from tandemrl.train.loop import train

pytestmark = pytest.mark.vllm

STEPS = 60
# The pace below was measured at this rate (the demo's default until train.lr became 5e-4): pinned, so the test
# compares the backends, not the default.
LR = 1e-3


def run(backend: str, model_dir: Path, out: Path, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = load_config(None, [f'model.name_or_path="{model_dir}"', "model.device=cpu", "log.tensorboard=false",
                             f"train.max_steps={STEPS}", f"train.lr={LR}", "eval.limit=64", "eval.pass_k=0",
                             "checkpoint.every_steps=0", f'rollout.backend="{backend}"', *overrides])
    summary = train(cfg, out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, [r for r in rows if "loss" in r]


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows)


@pytest.fixture(scope="module")
def engine_run(tiny64_dir, tmp_path_factory) -> tuple[dict, list[dict]]:
    return run("engine", tiny64_dir, tmp_path_factory.mktemp("engine-run"))


def assert_matches_engine(run_: tuple[dict, list[dict]], engine_run_: tuple[dict, list[dict]]) -> None:
    (vllm_summary, vllm), (engine_summary, engine) = run_, engine_run_
    assert len(vllm) == len(engine) == STEPS
    assert [r["policy_version"] for r in vllm] == list(range(1, STEPS + 1))
    # greedy evaluation before any update: the same tokens, so the same scores
    assert vllm_summary["initial"] == engine_summary["initial"]
    # every step's rollout log-probs are the trainer's: each weight update landed
    assert max(r["mismatch/logp_abs_max"] for r in vllm) < 1e-4
    # both learn, at about the same pace (measured: accuracy over steps 31-60 ~0.08-0.10 for both, entropy falls
    # from ~4.5 to ~3.4-3.7); the tolerances are wide enough for the two random streams, and a run whose vLLM
    # kept stale weights would keep the first steps' entropy and accuracy
    for rows in (engine, vllm):
        assert mean(rows[:10], "entropy") - mean(rows[-10:], "entropy") > 0.4
    assert abs(mean(vllm[30:], "accuracy") - mean(engine[30:], "accuracy")) < 0.08
    assert abs(mean(vllm[-10:], "entropy") - mean(engine[-10:], "entropy")) < 0.6
    assert abs(mean(vllm, "response_length/mean") - mean(engine, "response_length/mean")) < 0.3


def test_a_short_run_matches_our_engine(tiny64_dir, tmp_path, engine_run):
    assert_matches_engine(run("vllm", tiny64_dir, tmp_path / "vllm"), engine_run)


def test_a_short_run_in_server_mode_matches_our_engine(tiny64_dir, vllm_server, tmp_path, engine_run):
    """The same with rollout.vllm.mode = "server": a vLLM OpenAI server, weights pushed over HTTP (disk)."""
    server = run("vllm", tiny64_dir, tmp_path / "server", 'rollout.vllm.mode="server"',
                 f'rollout.vllm.url="{vllm_server}"')
    assert_matches_engine(server, engine_run)


def test_an_update_that_does_not_land_stops_the_run(tiny64_dir, tmp_path, monkeypatch, capsys):
    """A worker that drops the weights (as a plain load_weights on CPU may, silently): the first step's update
    is not in vLLM, the probe sees it before the second rollout, and the CLI prints one line."""
    from tandemrl.backends.vllm.extension import TandemrlWorkerExtension
    from tandemrl.cli import main

    monkeypatch.setattr(TandemrlWorkerExtension, "tandemrl_load_weights", lambda self, named_tensors: 0)
    code = main(["train", "--out", str(tmp_path / "run"), "--set", f'model.name_or_path="{tiny64_dir}"',
                 "--set", "model.device=cpu", "--set", "log.tensorboard=false", "--set", "train.max_steps=3",
                 "--set", "eval.limit=8", "--set", "eval.pass_k=0", "--set", 'rollout.backend="vllm"'])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: vLLM does not hold the trainer's weights of policy version 1" in err, err[-2000:]
