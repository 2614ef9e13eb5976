"""Model execution: the runner over the trainer's modules, the forward, attention metadata, CUDA graphs, sampling."""
