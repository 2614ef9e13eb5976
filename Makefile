# `make run` trains the offline tiny-model demo; `make test` runs the test suite.
# Both create or update the virtual environment on first use.
VENV   ?= .venv
PYTHON ?= python3
# The CPU build of torch; on a GPU machine set TORCH="torch" (or keep the torch you have: TORCH="").
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.tandemrl-installed

.PHONY: run test bench-cpu clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH),$(PY) -m pip install -q "$(TORCH)")
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tandemrl train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
