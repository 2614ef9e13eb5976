"""``trainer_state``: where training stands, as TRL passes it to reward functions (``kwargs["trainer_state"]``) so
that a reward can change over training (e.g. a format bonus that fades out)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardTrainerState:
    """The fields of transformers' ``TrainerState`` that a reward function can use, under the same names.

    Frozen: a reward function cannot move the run. In training, ``global_step`` is the number of steps done before
    the batch being scored (0 for the first batch, as in TRL); in an evaluation it is the step of the checkpoint
    evaluated (0 for a model that was not trained)."""

    global_step: int = 0
    max_steps: int = 0  # train.max_steps
    epoch: float = 0.0  # passes over the train set so far, fractional (1.5: half way through the second)
