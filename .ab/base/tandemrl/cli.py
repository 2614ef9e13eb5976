"""`tandemrl train | eval | make-tiny-model | plot`. Heavy imports (torch, transformers) are deferred per command."""

from __future__ import annotations

import argparse
import json
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
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="run GRPO (no arguments: the offline tiny-model demo)")
    _add_config_args(train)
    train.add_argument("--out", type=Path, help="run directory (default runs/<task>-<time>)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    train.set_defaults(command=_train)

    evaluate = commands.add_parser("eval", help="accuracy (greedy and pass@k) on the test split")
    _add_config_args(evaluate)
    evaluate.add_argument("--model", help="model name or path (a checkpoint dir works); overrides model.name_or_path")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(command=_eval)

    tiny = commands.add_parser("make-tiny-model", help="build the small offline Qwen2-architecture model")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--overwrite", action="store_true")
    tiny.set_defaults(command=_make_tiny_model)

    plot = commands.add_parser("plot", help="draw a run's curves to PNG files in DIR/plots")
    plot.add_argument("dir", type=Path)
    plot.set_defaults(command=_plot)
    return parser


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
    out_dir = args.out or (Path(cfg.log.out_dir) if cfg.log.out_dir else default_out_dir(cfg))
    summary = train(cfg, out_dir, resume=args.resume)
    initial, final = summary["initial"]["accuracy"], summary["final"]["accuracy"]
    print(f"accuracy {initial:.3f} -> {final:.3f}; run directory: {out_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tandemrl.config import load_config
    from tandemrl.train.evaluate import evaluate_config

    overrides = list(args.overrides) + ([f'model.name_or_path="{args.model}"'] if args.model else [])
    _quiet_transformers()
    result = evaluate_config(load_config(args.config, overrides))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        line = f"accuracy (greedy) {result.accuracy:.3f}, reward {result.reward:.3f}"
        if result.pass_at_k is not None:
            line += f", pass@{result.k} {result.pass_at_k:.3f}"
        print(f"{line} over {result.num_prompts} prompts")
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
    from tandemrl.train.checkpoint import CheckpointError
    from tandemrl.train.loop import TrainingError

    return isinstance(err, (ValueError, OSError, CheckpointError, TrainingError))


if __name__ == "__main__":
    sys.exit(main())
