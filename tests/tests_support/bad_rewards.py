"""Reward functions that misbehave, for the tests of error reporting."""


def raises(prompts, completions, **columns):
    return [1 / 0 for _ in completions]


def always_nan(prompts, completions, **columns):
    return [float("nan") for _ in completions]


def nan_on_some(prompts, completions, **columns):
    return [float("nan") if i % 2 else 1.0 for i in range(len(completions))]


def constant(prompts, completions, **columns):
    return [0.5 for _ in completions]
