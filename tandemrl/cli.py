"""`tandemrl train | eval | config | serve | make-tiny-model | plot`. Heavy imports (torch, transformers) are deferred per command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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

    evaluate = commands.add_parser("eval", help="accuracy (greedy and pass@k) on the test split")
    _add_config_args(evaluate)
    evaluate.add_argument("--model", help="model name or path (a checkpoint dir works; a run directory scores its "
                                           "latest checkpoint); overrides model.name_or_path")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(command=_eval)

    config = commands.add_parser("config", help="print the resolved config (defaults, file, overrides) as TOML")
    _add_config_args(config)
    config.set_defaults(command=_config)

    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (the engine behind it)")
    serve.add_argument("model", help="hub id, local directory or 'tiny' (overrides model.name_or_path)")
    _add_config_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed on start)")
    serve.add_argument("--served-model-name", help="the name clients ask for (default: MODEL)")
    serve.add_argument("--allow-ipc", action="store_true",
                       help="accept CUDA IPC weight handles (sync.kind = 'ipc'; they are pickles: trusted clients only)")
    serve.add_argument("--log-level", default="warning", help="uvicorn's log level")
    serve.set_defaults(command=_serve)

    tiny = commands.add_parser("make-tiny-model", help="build the small offline Qwen2-architecture model")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--overwrite", action="store_true")
    tiny.set_defaults(command=_make_tiny_model)

    plot = commands.add_parser("plot", help="draw a run's curves to PNG files in DIR/plots")
    plot.add_argument("dir", type=Path)
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
    parser.add_argument("--config", type=Path, help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")


def _quiet_transformers() -> None:
    """Our own progress display replaces transformers' per-file loading bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _train(args: argparse.Namespace) -> int:
    from tandemrl.config import load_config
    from tandemrl.train.loop import train
    from tandemrl.train.setup import default_out_dir

    config_path = args.config
    if args.resume:
        if args.out is None:
            raise ValueError("--resume needs --out DIR: the run directory to continue")
        config_path = config_path or args.out / "config.toml"
    cfg = load_config(config_path, args.overrides)
    _quiet_transformers()
    from tandemrl.distributed.env import launched_by_torchrun

    torchrun = launched_by_torchrun()
    if torchrun and args.out is None and cfg.log.out_dir is None:
        raise ValueError("under torchrun pass --out DIR (or log.out_dir): every rank must name the same run directory")
    out_dir = args.out or (Path(cfg.log.out_dir) if cfg.log.out_dir else default_out_dir(cfg))
    summary = train(cfg, out_dir, resume=args.resume)
    initial, final = summary["initial"]["accuracy"], summary["final"]["accuracy"]
    if not torchrun or os.environ.get("RANK") == "0":
        print(f"accuracy {initial:.3f} -> {final:.3f}; run directory: {out_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tandemrl.config import load_config
    from tandemrl.train.evaluate import evaluate_config

    model = resolve_eval_model(args.model) if args.model else None
    overrides = list(args.overrides) + ([f'model.name_or_path="{model}"'] if model else [])
    cfg = load_config(args.config, overrides)
    # Say what is scored: without --model it is the config's default, easy to mistake for a trained run.
    name = cfg.model.name_or_path
    shown = f"{name} ({cfg.model.tiny_dir})" if name == "tiny" else name
    print(f"scoring model: {shown}", file=sys.stderr if args.json else sys.stdout, flush=True)
    _quiet_transformers()
    result = evaluate_config(cfg)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        line = f"accuracy (greedy) {result.accuracy:.3f}, reward {result.reward:.3f}"
        if result.pass_at_k is not None:
            line += f", pass@{result.k} {result.pass_at_k:.3f}"
        print(f"{line} over {result.num_prompts} prompts")
    return 0


def _config(args: argparse.Namespace) -> int:
    from tandemrl.config import config_to_toml, load_config

    # Same resolution as train/eval, so what prints is what a run would use.
    print(config_to_toml(load_config(args.config, args.overrides)), end="")
    return 0


def resolve_eval_model(model: str) -> str:
    """`eval --model`: a run directory (it has `checkpoints/`) becomes its latest complete checkpoint; any
    other name or path passes through unchanged."""
    path = Path(model)
    checkpoints = path / "checkpoints"
    if not checkpoints.is_dir():
        return model
    from tandemrl.train.checkpoint import find_latest

    latest = find_latest(checkpoints)
    if latest is None:
        raise FileNotFoundError(f"run directory {path} has no complete checkpoint under {checkpoints}")
    return str(latest)


def _serve(args: argparse.Namespace) -> int:
    from tandemrl.config import load_config
    from tandemrl.serve.server import ServeOptions, serve

    cfg = load_config(args.config, list(args.overrides) + [f'model.name_or_path="{args.model}"'])
    _quiet_transformers()
    serve(cfg, ServeOptions(args.host, args.port, args.served_model_name, args.log_level, args.allow_ipc))
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
    from tandemrl.train.loop import TrainingError

    return isinstance(err, (ValueError, OSError, CheckpointError, TrainingError, WeightSyncError))


if __name__ == "__main__":
    sys.exit(main())
