"""Multi-GPU / multi-node training under torchrun: process group, FSDP2 sharding, the engine's full-weight replica,
prompt and metric splitting across ranks, torch.distributed.checkpoint (DCP) checkpoints.

A run is distributed when torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) is set; a plain
`tandemrl train` never imports torch.distributed machinery beyond this check.
"""
