# Cacheon: `make run` sets up and runs the main job on the embedded examples; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHEON := $(VENV)/bin/cacheon
STAMP := $(VENV)/.cacheon-setup

.PHONY: setup run test lint clean

setup: $(STAMP)

# torch: the CPU build, pinned explicitly (an unpinned torch pulls a multi-GB CUDA build).
# triton: Triton bundles verify on CPU through TRITON_INTERPRET=1.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 triton==3.9.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: setup
	$(CACHEON) slots
	@echo; echo "== scan: a faithful bundle, then one that shells out (exit 2 expected)"
	$(CACHEON) scan examples/bundles/silu-triton
	$(CACHEON) scan examples/bundles/silu-scan-violation; test $$? -eq 2
	@echo; echo "== verify: faithful Triton silu_and_mul (NUMERICAL_PASS on CPU: no CUDA-graph proof here)"
	$(CACHEON) verify examples/bundles/silu-triton --dtype float32 --dtype bfloat16
	@echo; echo "== verify: faithful attention block (PASS)"
	$(CACHEON) verify examples/bundles/attention-torch
	@echo; echo "== verify: broken silu_and_mul that drops the SiLU (FAIL, exit 2 expected)"
	$(CACHEON) verify examples/bundles/silu-broken-no-silu; test $$? -eq 2

test: setup
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/pytest

lint: setup
	$(VENV)/bin/ruff check src tests scripts benchmarks

clean:
	rm -rf $(VENV) .sglang build *.egg-info
