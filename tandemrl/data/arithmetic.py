"""`arith2`: two-digit arithmetic for instruct models ("What is 47 * 23?", answer 1081), meant for the chat template.

Operands are 10..99 and the operation is +, - or * (24,300 distinct problems; differences can be negative). The
reward reads the last number of the completion (`accuracy`), so "47 * 23 = 1081" scores.

The held-out set is fixed: the first `HELD_OUT_SIZE` problems of one seed-independent shuffle of all problems, so
runs with different seeds are scored on the same problems; `limit` takes a prefix of it. The train split is every
other problem, in an order drawn from the run's seed: no test problem is ever trained on.
"""

from __future__ import annotations

import itertools
import operator
import random
from collections.abc import Callable

from tandemrl.types import Sample

OPERATIONS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
OPERANDS = range(10, 100)
HELD_OUT_SIZE = 1000
SPLITS = ("train", "test")
_ORDER_SEED = "tandemrl-arith2-held-out"

Problem = tuple[int, str, int]


def arith2_prompt(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def _all_problems() -> list[Problem]:
    problems = [(a, op, b) for op, a, b in itertools.product(OPERATIONS, OPERANDS, OPERANDS)]
    random.Random(_ORDER_SEED).shuffle(problems)
    return problems


def make_arith2(split: str, limit: int | None, seed: int) -> list[Sample]:
    """``limit`` problems of ``split`` (default: the whole held-out set for test, every other problem for train)."""
    if split not in SPLITS:
        raise ValueError(f"task 'arith2' has splits {', '.join(SPLITS)}; got {split!r}")
    problems = _all_problems()
    if split == "test":
        if limit is not None and limit > HELD_OUT_SIZE:
            raise ValueError(f"task 'arith2' holds out {HELD_OUT_SIZE} test problems; eval.limit = {limit} asks "
                             "for more")
        chosen = problems[:HELD_OUT_SIZE]
    else:
        chosen = problems[HELD_OUT_SIZE:]
        random.Random(f"tandemrl-arith2-train:{seed}").shuffle(chosen)
    return [_sample(problem, i) for i, problem in enumerate(chosen[:limit])]


def _sample(problem: Problem, index: int) -> Sample:
    a, op, b = problem
    answer = OPERATIONS[op](a, b)
    return Sample(prompt=arith2_prompt(a, op, b), answer=str(answer), index=index, columns={"operation": op})
