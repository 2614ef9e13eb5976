"""Triton kernels of the engine (paged attention, sampler, fused norm/RoPE/activation, grouped projections, PDL)."""
