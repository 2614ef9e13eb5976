"""Global random-number-generator state: seed it, capture it, restore it (for exact resume).

Covers Python's `random`, NumPy's legacy global generator (`np.random.*`), torch's CPU generator and the
generator of every visible CUDA device (once CUDA is initialised). Generators owned by components (a `numpy.random.Generator`, a
`torch.Generator`) are theirs to save through their own `state_dict`.

The captured dict holds only ints, floats, strings, lists, tuples, None and tensors, so it can be written with
`torch.save` and read back with `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

_FORMAT = 1


def seed_everything(seed: int) -> None:
    """Seed Python `random`, NumPy's global generator, torch CPU and every CUDA device."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds all CUDA devices (lazily if CUDA is not initialised yet)


def capture_rng_state() -> dict[str, Any]:
    """Snapshot every global generator; `restore_rng_state` puts them back so the next draws repeat."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "format": _FORMAT,
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(kind),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    # Only once CUDA is initialised: before that its generators still hold their (lazily applied) seed, and
    # initialising CUDA here would cost a context per device and break forked children of such a process.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back a snapshot from `capture_rng_state`.

    CUDA states are restored device by device (lazily, so this does not initialise CUDA); if the number of
    visible devices differs from when the snapshot was taken, the common prefix is restored and a warning says
    so. A snapshot taken before CUDA was initialised holds no CUDA state and leaves the CUDA generators alone.
    """
    missing = [k for k in ("python", "numpy", "torch") if k not in state]
    if missing:
        raise ValueError(f"RNG state is missing {missing}; expected a dict from capture_rng_state()")
    random.setstate(_as_python_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["bit_generator"],
            np.asarray(np_state["keys"], dtype=np.uint32),
            int(np_state["pos"]),
            int(np_state["has_gauss"]),
            float(np_state["cached_gaussian"]),
        )
    )
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    cuda_states = list(state.get("cuda") or [])
    n_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda_states and len(cuda_states) != n_devices:
        warnings.warn(
            f"RNG state was captured with {len(cuda_states)} CUDA device(s) but {n_devices} are visible now; "
            f"restoring the first {min(len(cuda_states), n_devices)}",
            stacklevel=2,
        )
    for index, cuda_state in enumerate(cuda_states[:n_devices]):
        torch.cuda.set_rng_state(torch.as_tensor(cuda_state, dtype=torch.uint8).cpu(), index)


def _as_python_state(value: Any) -> tuple:
    """random.setstate wants (version, tuple_of_ints, gauss_next) with a tuple, not a list."""
    version, internal, gauss_next = value
    return (int(version), tuple(int(x) for x in internal), gauss_next)
