"""Synthetic arithmetic tasks a tiny randomly-initialised, character-level model can learn with GRPO on a CPU.

Prompts are short raw text (no chat template) and answers are plain integers; the expected completion is the bare
answer (e.g. prompt ``"3+4="``, completion ``"7"``). Generation is deterministic for a (task, seed, split).

- ``add``:  ``"a+b="`` with single digits and a single-digit sum (a + b <= 9); 55 distinct prompts, answers 0..9.
- ``copy``: ``"copy d:"`` -> ``"d"`` for a digit d; the easiest task (10 prompts, answers 0..9).
- ``add2``: ``"a+b="`` with 0 <= a, b <= 99 and a two-digit sum (10..99); 4,995 prompts, 90 answers. Harder.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tandemrl.types import Sample


def _add(rng: random.Random) -> tuple[str, int]:
    total = rng.randint(0, 9)  # uniform over sums: always guessing one answer scores chance, no better
    a = rng.randint(0, total)
    return f"{a}+{total - a}=", total


def _copy(rng: random.Random) -> tuple[str, int]:
    d = rng.randint(0, 9)
    return f"copy {d}:", d


def _add2(rng: random.Random) -> tuple[str, int]:
    total = rng.randint(10, 99)  # uniform over sums, so every answer is equally likely
    a = rng.randint(0, total)
    return f"{a}+{total - a}=", total


_TASKS: dict[str, tuple[Callable[[random.Random], tuple[str, int]], range]] = {
    "add": (_add, range(0, 10)),
    "copy": (_copy, range(0, 10)),
    "add2": (_add2, range(10, 100)),
}

SYNTHETIC_TASKS: tuple[str, ...] = tuple(_TASKS)

# Every character a synthetic prompt or answer can contain (for building or checking a character tokenizer).
SYNTHETIC_ALPHABET = "0123456789+=:copy "


def _check_task(task: str) -> None:
    if task not in _TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; valid tasks: {', '.join(SYNTHETIC_TASKS)}")


def make_synthetic(task: str, n: int, seed: int, *, split: str = "train") -> list[Sample]:
    """``n`` samples of ``task``, drawn with replacement, deterministic for (task, n, seed, split).

    ``split`` only selects an independent random stream (the test split of a task uses another one); prompt
    spaces are small, so the same prompt can occur in several splits.
    """
    _check_task(task)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    draw, _ = _TASKS[task]
    rng = random.Random(f"tandemrl-synthetic:{task}:{split}:{seed}")
    samples = []
    for i in range(n):
        prompt, answer = draw(rng)
        samples.append(Sample(prompt=prompt, answer=str(answer), index=i))
    return samples


def synthetic_answers(task: str) -> list[str]:
    """The set of possible answers of ``task``, as strings."""
    _check_task(task)
    return [str(a) for a in _TASKS[task][1]]


def synthetic_chance_accuracy(task: str) -> float:
    """Accuracy of a uniform guess over the task's answer set (0.1 for one digit)."""
    return 1.0 / len(synthetic_answers(task))
