"""Scoring a trained model outside training: `tandemrl eval RUN_DIR`, `Trainer.evaluate()`, and the model loading
that `serve` and `export` share (a run's checkpoint, LoRA adapters included).

A run directory brings its own config (task, data, chat template, model, LoRA setup): what is scored is what was
trained, on the run's own test set.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from tandemrl.backends.factory import make_backend
from tandemrl.config import Config, load_config
from tandemrl.data.iterator import epoch_progress
from tandemrl.data.loading import load_data
from tandemrl.models.load import resolve_device
from tandemrl.rewards.state import RewardTrainerState
from tandemrl.rollout.setup import build_agent
from tandemrl.train.checkpoint import TRAINER_STATE, find_latest
from tandemrl.train.evaluate import EvalResult, evaluate
from tandemrl.train.inputs import RunInputs, fitting_prompts, has_answer, run_reward
from tandemrl.train.metric import resolve_metric
from tandemrl.train.rollouts import prompt_encoder
from tandemrl.train.setup import load_policy, model_context
from tandemrl.train.weights_io import prepare_model_load, read_json

CONFIG_FILE = "config.toml"


def find_run(path: Path) -> tuple[Path, Path | None] | None:
    """(run directory, checkpoint to load) for a run directory or a checkpoint inside one; None for other paths.
    A run directory without a complete checkpoint gives (run, None)."""
    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        return path, find_latest(path / "checkpoints")
    for run in list(path.parents)[:3]:  # checkpoints/step-N or checkpoints/best/step-N
        if (run / CONFIG_FILE).is_file() and (run / "checkpoints") in (path.parent, path.parent.parent):
            return run, path
    return None


def run_config(run: Path, overrides: list[str] | None = None) -> Config:
    return load_config(run / CONFIG_FILE, overrides)


def load_trained(cfg: Config, checkpoint: Path | None, device: torch.device,
                 inputs: RunInputs | None = None) -> tuple[nn.Module, object]:
    """The run's model with ``checkpoint``'s weights (None: the starting model): full weights load as a model
    directory; a LoRA adapter goes onto the run's base model (``cfg.model``)."""
    if checkpoint is not None and not (checkpoint / "adapter_model.safetensors").is_file():
        plain = cfg.model.model_copy(update={"name_or_path": str(checkpoint)})
        plain.lora = plain.lora.model_copy(update={"enabled": False})
        return load_policy(plain, device)
    model, tokenizer = load_policy(cfg.model, device, inputs)
    if checkpoint is not None:
        if not cfg.model.lora.enabled:
            raise ValueError(f"{checkpoint} holds a LoRA adapter but the run's config has model.lora.enabled = false")
        prepare_model_load(checkpoint, model)()
    return model, tokenizer


def evaluate_config(cfg: Config, inputs: RunInputs | None = None, source: Path | None = None) -> EvalResult:
    """Score ``cfg``'s model (or the checkpoint ``source`` names: a run directory or a checkpoint) on its test set."""
    inputs = inputs or RunInputs()
    found = find_run(source) if source is not None else None
    checkpoint = found[1] if found is not None else None
    device = resolve_device(cfg.model.device)
    data = load_data(cfg.data, cfg.train.seed, cfg.eval.limit, inputs.train_dataset, inputs.eval_dataset)
    reward = run_reward(cfg, inputs)
    metric = resolve_metric(cfg.eval.metric, reward, has_answer(data.test))
    model, tokenizer = load_trained(cfg, checkpoint, device, inputs)
    model.eval()
    backend = make_backend(cfg, model, tokenizer, device)
    agent = build_agent(cfg, backend, tokenizer, inputs.tools)
    encoder = prompt_encoder(cfg, tokenizer, agent, context=model_context(model))
    samples, _ = fitting_prompts(encoder, data.test, cfg.data.long_prompts)
    result = evaluate(backend, encoder, samples, reward, cfg, policy_version=0, agent=agent, metric=metric,
                      trainer_state=checkpoint_trainer_state(cfg, checkpoint))
    for line in [*result.reward_problems(), *([result.first_traceback] if result.first_traceback else [])]:
        print(line, file=sys.stderr)  # stdout may be --json; the counts are in the result too
    return result


def checkpoint_trainer_state(cfg: Config, checkpoint: Path | None) -> RewardTrainerState:
    """What the rewards get as ``trainer_state`` when ``checkpoint`` is evaluated: its step and epoch as its
    trainer_state.json saved them (None, a model not trained: step 0)."""
    if checkpoint is None:
        return RewardTrainerState(global_step=0, max_steps=cfg.train.max_steps, epoch=0.0)
    saved = read_json(checkpoint / TRAINER_STATE)
    if "step" not in saved:
        raise ValueError(f"{checkpoint / TRAINER_STATE} has no 'step': it was not written by tandemrl train")
    data = saved.get("data") or {}  # the prompt iterator's state_dict: where the next batch would have started
    keys = ("epoch", "position", "batch_size", "num_samples")
    if not all(k in data for k in keys):
        raise ValueError(f"{checkpoint / TRAINER_STATE} does not say where training was in the data "
                         f"(its 'data' lacks {', '.join(k for k in keys if k not in data)})")
    epoch = epoch_progress(*(int(data[k]) for k in keys))
    return RewardTrainerState(global_step=int(saved["step"]), max_steps=cfg.train.max_steps, epoch=epoch)


def load_merged(cfg: Config, checkpoint: Path | None, device: torch.device) -> tuple[nn.Module, object]:
    """The run's model with ``checkpoint``'s weights as one plain model: a LoRA adapter merged into its base (for
    serving and export, which want a plain model)."""
    model, tokenizer = load_trained(cfg, checkpoint, device)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model, tokenizer


def export_run(source: Path, out: Path) -> Path:
    """`tandemrl export`: the run's latest checkpoint (or the checkpoint ``source`` names) as a Hugging Face model
    directory at ``out``, LoRA merged; written beside ``out`` and renamed, so a failure leaves nothing half-written."""
    found = find_run(source)
    if found is None:
        raise FileNotFoundError(f"{source} is not a run directory (no {CONFIG_FILE}) or a checkpoint inside one")
    run, checkpoint = found
    if checkpoint is None:
        raise FileNotFoundError(f"{run} has no complete checkpoint under {run / 'checkpoints'}")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose another output directory")
    cfg = run_config(run, ['model.device="cpu"'])
    model, tokenizer = load_merged(cfg, checkpoint, torch.device("cpu"))
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)  # type: ignore[attr-defined]
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return checkpoint
