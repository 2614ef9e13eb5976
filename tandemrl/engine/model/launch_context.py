"""What a launch reads of the runner (slots, samplers, KV geometry, acceptance rule), handed over instead of the
runner itself, so the launch code imports nothing back from it (no import circle through the runner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from tandemrl.engine.model.slot import ModelSlot
from tandemrl.engine.model.step_sampler import StepSampler
from tandemrl.models.tensor_parallel import is_shard
from tandemrl.engine.tandem import FROZEN


@dataclass(frozen=True)
class LaunchContext:
    """The runner as a launch sees it; rebuilt whenever the KV pools change (``num_blocks``)."""

    device: torch.device  # the runner's (the target's) device
    block_size: int
    num_blocks: int  # block ids the block manager owns; the scratch block is ``num_blocks``
    max_model_len: int
    slots: Mapping[str, ModelSlot]
    samplers: Mapping[torch.device, StepSampler]  # one per device a slot lives on
    acceptance: str  # the acceptance rule of speculative proposals, by name (acceptance.py)

    @property
    def sampler(self) -> StepSampler:
        """The sampler of the runner's device."""
        return self.samplers[self.device]

    def sampler_for(self, slot: ModelSlot) -> StepSampler:
        """The sampler of the slot's device (its rows' sampling columns and generator live there)."""
        return self.samplers[slot.device]

    @property
    def scratch_slot(self) -> int:
        """The first KV slot of the scratch block: dead rows write there."""
        return self.num_blocks * self.block_size

    @property
    def pairs_tandem_forwards(self) -> bool:
        """Whether a tandem burst runs in paired ticks (tandem_burst.py): both models on GPUs, the frozen one's
        forwards beside the hot one's, on its own stream of the runner's GPU or on its own GPU (``tandem.frozen_device
        = "cuda:1"``: the two devices work at once). Not for tensor-parallel shards: both models' all-reduces share
        one communicator, whose operations must not run side by side."""
        frozen = self.slots.get(FROZEN)
        return (self.device.type == "cuda" and frozen is not None and frozen.device.type == "cuda"
                and not is_shard(frozen.model))
