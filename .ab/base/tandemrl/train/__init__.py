"""The training loop and its checkpoints: rollout -> reward -> advantage -> loss -> step -> sync."""
