"""Reward functions that misbehave, for the tests of error reporting."""


def raises(prompts, completions, **columns):
    return [1 / 0 for _ in completions]
