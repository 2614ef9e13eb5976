"""Tasks: GSM8K loading, synthetic arithmetic, task dispatch, prompt formatting, prompt batching."""

from tandemrl.data.gsm8k import DatasetError, load_gsm8k
from tandemrl.data.iterator import PromptIterator
from tandemrl.data.synthetic import SYNTHETIC_TASKS, make_synthetic, synthetic_answers, synthetic_chance_accuracy
from tandemrl.data.tasks import TASK_NAMES, format_prompt, load_task, reward_columns

__all__ = [
    "DatasetError",
    "PromptIterator",
    "SYNTHETIC_TASKS",
    "TASK_NAMES",
    "format_prompt",
    "load_gsm8k",
    "load_task",
    "make_synthetic",
    "reward_columns",
    "synthetic_answers",
    "synthetic_chance_accuracy",
]
