"""The prompts: where they come from (data) and how many rollouts each one gets (curriculum)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tandemrl.config.base import Section


class DataConfig(Section):
    """The prompts: your own dataset (`data.path`) or a built-in task (`data.task`)."""

    task: str | None = Field(None, description="a built-in task: `gsm8k` (GSM8K's rows, with its instruction and "
                             "`####` answers), `arith2`, `synthetic:add|copy|add2|peek`; unset: your own dataset at "
                             "`data.path` (both unset: `synthetic:add`, the offline demo)")
    path: str | None = Field(None, description="your dataset: a .jsonl / .json / .parquet / .csv file, a folder of "
                             "`<split>.jsonl`-style files or one saved by `datasets`, or a hub dataset id (the `data` "
                             "extra), relative to the working directory; a name that does not exist here is read "
                             "as a hub id unless it looks like a file (`train.jsonll`): then the error lists the "
                             "closest names; with "
                             "`data.task = \"gsm8k\"`: where GSM8K is (unset: the hub's `openai/gsm8k`)")
    test_path: str | None = Field(None, description="the test set, in any form `data.path` takes; unset: the "
                                  "`data.test_split` of a folder or hub dataset, else a held-out `data.test_fraction`")
    prompt_column: str = Field("prompt", min_length=1, description="the column holding the prompt: text, or a list "
                               "of chat messages `[{role, content}]` rendered with the tokenizer's chat template; "
                               "every other column reaches the reward functions by name, None in a row that lacks "
                               "it")
    subset: str | None = Field(None, description="a hub dataset's subset (its config name, e.g. `main`)")
    train_split: str = Field("train", description="the split trained on (folders, saved datasets, hub datasets)")
    test_split: str = Field("test", description="the split evaluated on, when the dataset has it")
    test_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="with no test set given: the fraction of the "
                                 "training rows held out as the test set (at least one row); the run says so")
    split_seed: int = Field(0, description="seed of the held-out split; apart from `train.seed` so that runs with "
                            "different seeds are scored on the same rows")
    train_limit: int | None = Field(None, ge=1, description="train on the first N rows only")
    max_prompt_tokens: int | None = Field(None, ge=1, description="the longest prompt allowed, in tokens; unset: "
                                          "the model's context less `rollout.max_tokens`")
    long_prompts: Literal["error", "skip"] = Field("error", description="a prompt over `data.max_prompt_tokens`: "
                                                   "`error` names its row and stops; `skip` leaves it out and "
                                                   "counts it")
    use_chat_template: bool = Field(False, description="render text prompts as a user message with the "
                                    "tokenizer's chat template (prompts given as messages always are)")
    system_prompt: str | None = Field(None, description="a system message before each prompt (chat template only)")

    @property
    def task_name(self) -> str:
        """The run's task: `task`, else `"dataset"` (your own, at `path`), else the offline demo."""
        from tandemrl.data.loading import task_name

        return task_name(self.task, self.path)

    @model_validator(mode="after")
    def _check_prompt_settings(self) -> DataConfig:
        if self.system_prompt is not None and not self.use_chat_template and self.path is None:
            raise ValueError("data.system_prompt needs data.use_chat_template = true (a system message only exists "
                             "in the chat template)")
        held_out = [key for key in ("test_fraction", "split_seed") if self.differs_from_default(key)]
        if self.test_path is not None and held_out:
            raise ValueError(f"data.{held_out[0]} has no effect with data.test_path set (nothing is held out): "
                             f"remove one of them")
        if self.task is not None and self.differs_from_default("prompt_column"):
            raise ValueError(f"data.prompt_column applies to your own dataset; data.task = {self.task!r} has its "
                             "own columns: unset one of them")
        return self


class CurriculumConfig(Section):
    """Adaptive curriculum: a per-sample reward EMA, KDE valleys split the samples into difficulty buckets after
    each epoch, harder buckets get more rollouts per prompt. Defaults are the inference_aware_grpo_training seed's."""

    enabled: bool = Field(False, description="spend more rollouts on the prompts the model gets wrong")
    ema_decay: float = Field(0.7, ge=0.0, lt=1.0, description="ema = decay*ema + (1-decay)*epoch mean")
    unseen_reward: float = Field(0.5, description="the EMA of a sample not yet rolled out, and its place on the "
                                 "normalised [0, 1] scale")
    normalize: Literal["minmax", "clip"] = Field("minmax", description="`minmax`: rescale the EMAs to [0, 1]; "
                                                 "`clip`: clamp them to [0, 1]")
    bandwidth: float | Literal["scott", "silverman"] = Field(
        "scott", description="scipy gaussian_kde's bw_method: `scott`, `silverman` or a factor of the data's std. "
        "The seed's code uses 0.05, which on a few hundred samples makes a wiggly density whose noise valleys "
        "split even a unimodal set")
    grid_points: int = Field(512, ge=3, description="points of the KDE grid over [0, 1]")
    min_bucket_fraction: float = Field(0.05, ge=0.0, lt=0.5, description="a valley leaving a smaller bucket is skipped")
    n_buckets: int = Field(3, ge=1, description="at most this many buckets (n_buckets - 1 valleys as boundaries)")
    base_rollouts: int = Field(4, ge=1, description="rollouts per prompt of the easiest bucket, before `alpha`")
    alpha: float = Field(1.5, ge=0.0, description="rollouts = max(1, round(base*(1 + alpha*(1 - bucket mean))))")
    min_samples: int = Field(8, ge=2, description="fewer samples than this: one bucket")

    @model_validator(mode="after")
    def _check_bandwidth(self) -> CurriculumConfig:
        if isinstance(self.bandwidth, float) and self.bandwidth <= 0:
            raise ValueError(f"curriculum.bandwidth must be > 0, 'scott' or 'silverman', got {self.bandwidth}")
        return self
