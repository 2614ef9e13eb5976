"""python -m tandemrl.envs --trainer URL [--config FILE] [--set key=value ...]: one environment process."""

from __future__ import annotations

import argparse

from tandemrl.config import load_config
from tandemrl.envs.runner import run_environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandemrl.envs", description=__doc__)
    parser.add_argument("--trainer", required=True, help="the trainer's group receiver, e.g. http://127.0.0.1:8200")
    parser.add_argument("--config", default=None, help="the run's config (data, reward, rollout.server_url ...)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--name", default="env", help="this environment's name (in the trainer's samples)")
    parser.add_argument("--seed", type=int, default=0, help="its prompt order and sampling seeds")
    args = parser.parse_args(argv)
    report = run_environment(load_config(args.config, args.overrides), args.trainer, args.name, args.seed)
    print(f"environment {args.name}: {report.pushed} groups pushed, {report.refused} pushes refused (queue full)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
