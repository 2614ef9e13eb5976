"""`tandemrl train | eval | export | config | serve | make-tiny-model | plot`, a thin layer over the Python API. Heavy imports (torch, transformers) are deferred per command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # bare `tandemrl`: the commands, not an argparse complaint about a missing one
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.command(args)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - user-facing errors print one clear line, not a traceback
        if not _is_user_error(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandemrl", description="GRPO post-training with fast, observable rollouts")
    parser.add_argument("--version", action="version", version=f"tandemrl {_version()}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="run GRPO (no arguments: the offline tiny-model demo)")
    _add_config_args(train)
    train.add_argument("--out", type=Path, help="run directory (default runs/<task>-<time>)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    train.set_defaults(command=_train)

    evaluate = commands.add_parser("eval", help="score a run (or a model) on its test set: eval.metric, accuracy, "
                                                "reward, pass@k")
    evaluate.add_argument("run", nargs="?", type=Path, help="a run directory (its config and latest checkpoint) or a "
                                                            "checkpoint inside one")
    _add_config_args(evaluate)
    evaluate.add_argument("--model", help="model name or path; overrides model.name_or_path (a run directory here "
                                           "is the same as RUN)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(command=_eval)

    config = commands.add_parser("config", help="print the resolved config (defaults, files, overrides) as TOML")
    _add_config_args(config)
    config.set_defaults(command=_config)

    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (the engine behind it)")
    serve.add_argument("model", help="hub id, local directory, 'tiny' (overrides model.name_or_path), or a run "
                                     "directory / checkpoint (its config; LoRA merged)")
    _add_config_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed on start)")
    serve.add_argument("--served-model-name", help="the name clients ask for (default: MODEL)")
    serve.add_argument("--allow-ipc", action="store_true",
                       help="accept CUDA IPC weight handles (sync.kind = 'ipc'; they are pickles: trusted clients only)")
    serve.add_argument("--log-level", default="warning", help="uvicorn's log level")
    serve.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="skip the start-up warm-up (on CUDA: one batch per decode graph size, before listening)")
    serve.set_defaults(command=_serve)

    export = commands.add_parser("export", help="write a run's latest checkpoint as a Hugging Face model directory "
                                                "(LoRA merged)")
    export.add_argument("run", type=Path, help="a run directory, or a checkpoint inside one")
    export.add_argument("out", type=Path, help="the model directory to write (must not exist, or be empty)")
    export.set_defaults(command=_export)

    tiny = commands.add_parser("make-tiny-model", help="build the small offline Qwen2-architecture model")
    tiny.add_argument("dir", type=Path, help="the model directory to write (config, weights, tokenizer)")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    tiny.add_argument("--overwrite", action="store_true", help="replace DIR if it already holds files")
    tiny.set_defaults(command=_make_tiny_model)

    plot = commands.add_parser("plot", help="draw a run's curves to PNG files in DIR/plots")
    plot.add_argument("dir", type=Path, help="a run directory (reads its metrics.jsonl)")
    plot.set_defaults(command=_plot)
    return parser


def _version() -> str:
    """The installed distribution's version; the module attribute when running from a source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tandemrl")
    except PackageNotFoundError:
        import tandemrl

        return getattr(tandemrl, "__version__", "unknown")


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    # append, not store: a second --config used to replace the first silently
    parser.add_argument("--config", dest="configs", type=Path, action="append", default=[], metavar="FILE",
                        help="TOML config file; repeatable: files merge in order (a later file's keys win, section by "
                             "section), then --set on top")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")


def _quiet_transformers() -> None:
    """Our own progress display replaces transformers' per-file loading bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _train(args: argparse.Namespace) -> int:
    from tandemrl.api import Trainer
    from tandemrl.config import load_config

    configs = args.configs
    if args.resume:  # checked with --config too: a directory without config.toml never held a run
        run_config = _run_to_resume(args.out)
        configs = configs or [run_config]
    cfg = load_config(configs, args.overrides)
    _quiet_transformers()
    from tandemrl.distributed.env import launched_by_torchrun

    torchrun = launched_by_torchrun()
    if torchrun and args.out is None and cfg.log.out_dir is None:
        raise ValueError("under torchrun pass --out DIR (or log.out_dir): every rank must name the same run directory")
    trainer = Trainer(config=cfg, out_dir=args.out)
    summary = trainer.train(resume=args.resume)
    if summary.get("already_finished"):  # --resume of a finished run: train said so in one line (exit 0)
        return 0
    initial, final = summary["initial"]["score"], summary["final"]["score"]
    if not torchrun or os.environ.get("RANK") == "0":
        print(f"{summary['metric']} {initial:.3f} -> {final:.3f}; run directory: {trainer.out_dir}")
    return 0


def _run_to_resume(out: Path | None) -> Path:
    """The config.toml of the run in ``out``; an error naming the directory (not a --config) when there is none."""
    if out is None:
        raise ValueError("--resume needs --out DIR: the run directory to continue")
    config = out / "config.toml"
    if not config.is_file():
        why = "no such directory" if not out.exists() else "no config.toml there"
        raise FileNotFoundError(f"--resume: {out} holds no run to resume ({why}); to start a new run there, "
                                "drop --resume")
    return config


def _eval(args: argparse.Namespace) -> int:
    from tandemrl.config import load_config
    from tandemrl.train.eval_run import evaluate_config, find_run, run_config

    target = args.run or (Path(args.model) if args.model and find_run(Path(args.model)) else None)
    found = find_run(target) if target is not None else None
    if target is not None and found is None:
        raise FileNotFoundError(f"{target} is not a run directory (no config.toml) or a checkpoint inside one")
    if found is not None:
        if args.configs:
            raise ValueError("eval RUN uses the run's own config.toml; drop --config (use --set to change a key)")
        run, checkpoint = found
        if checkpoint is None:
            raise FileNotFoundError(f"run directory {run} has no complete checkpoint under {run / 'checkpoints'}")
        cfg = run_config(run, args.overrides)
        what = f"run {run}, checkpoint {checkpoint.name}"
    else:
        overrides = list(args.overrides) + ([f'model.name_or_path="{args.model}"'] if args.model else [])
        cfg = load_config(args.configs, overrides)
        # Say what is scored: without --model it is the config's default, easy to mistake for a trained run.
        name = cfg.model.name_or_path
        what = f"model {name} ({cfg.model.tiny_dir})" if name == "tiny" else f"model {name}"
    out = sys.stderr if args.json else sys.stdout
    print(f"scoring {what} on task {cfg.data.task_name}", file=out, flush=True)
    _quiet_transformers()
    result = evaluate_config(cfg, source=target)
    if args.json:
        print(json.dumps({**result.to_dict(), "task": cfg.data.task_name}))
    else:
        parts = [f"{result.metric} {result.score:.3f}"]
        if result.accuracy is not None and result.metric != "accuracy":
            parts.append(f"accuracy (greedy) {result.accuracy:.3f}")
        if result.metric != "reward":  # a reward no test prompt got is missing, not 0
            parts.append(f"reward {result.reward:.3f}" if result.reward is not None else "reward missing")
        if result.pass_at_k is not None:
            parts.append(f"pass@{result.k} {result.pass_at_k:.3f}")
        print(f"{', '.join(parts)} over {result.num_prompts} samples of task {cfg.data.task_name}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from tandemrl.train.eval_run import export_run

    _quiet_transformers()
    checkpoint = export_run(args.run, args.out)
    print(f"wrote {args.out} (from {checkpoint}; load it with AutoModelForCausalLM.from_pretrained)")
    return 0


def _config(args: argparse.Namespace) -> int:
    from tandemrl.config import config_to_toml, load_config

    # Same resolution as train/eval, so what prints is what a run would use.
    print(config_to_toml(load_config(args.configs, args.overrides)), end="")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tandemrl.config import load_config
    from tandemrl.serve.server import ServeOptions, serve

    from tandemrl.train.eval_run import find_run, run_config

    found = find_run(Path(args.model))
    if found is not None:  # a run (its config; LoRA merged) or a checkpoint inside one
        if args.configs:
            raise ValueError("serve RUN uses the run's own config.toml; drop --config (use --set to change a key)")
        cfg = run_config(found[0], args.overrides)
    else:
        cfg = load_config(args.configs, list(args.overrides) + [f'model.name_or_path="{args.model}"'])
    _quiet_transformers()
    serve(cfg, ServeOptions(args.host, args.port, args.served_model_name or (args.model if found else None),
                            args.log_level, args.allow_ipc, args.warmup), checkpoint=found[1] if found else None)
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from tandemrl.models.tiny import make_tiny_model

    print(make_tiny_model(args.dir, seed=args.seed, overwrite=args.overwrite))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from tandemrl.telemetry.plot import plot_run

    for path in plot_run(args.dir):
        print(path)
    return 0


def _is_user_error(err: Exception) -> bool:
    """Errors caused by input (config, data, paths, disk) print as one line; programming errors keep the traceback."""
    from tandemrl.backends.vllm.errors import WeightSyncError
    from tandemrl.train.checkpoint import CheckpointError
    from tandemrl.train.evaluate import EvaluationError
    from tandemrl.train.loop import TrainingError

    return isinstance(err, (ValueError, OSError, CheckpointError, TrainingError, EvaluationError, WeightSyncError))


if __name__ == "__main__":
    sys.exit(main())
