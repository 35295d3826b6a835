# Cacheon: `make run` sets up and runs the main job on the embedded examples; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHEON := $(VENV)/bin/cacheon
STAMP := $(VENV)/.cacheon-setup

.PHONY: setup engines run test test-fast lint docs docs-serve clean

setup: $(STAMP)

# torch: the CPU build, pinned explicitly (an unpinned torch pulls a multi-GB CUDA build).
# triton: Triton bundles verify on CPU through TRITON_INTERPRET=1.
# Then the real SGLang tiers: the pin (0.5.13.post1, --no-deps plus what its imports need and a
# named torchvision stand-in), every release of the KV-event interop matrix unpacked side by side
# under .sglang/, and the pinned Bittensor SDK in its own directory (.chain/).
# System packages first (bubblewrap for the verify sandbox; g++, ninja, OpenSSL headers for the engine tier).
$(STAMP): pyproject.toml Makefile scripts/install_sglang_pin.sh scripts/install_sglang_releases.sh scripts/install_chain_pin.sh scripts/install_system_packages.sh
	scripts/install_system_packages.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 triton==3.9.0
	$(PY) -m pip install -q -e '.[test,docs,otel]'
	VENV=$(VENV) scripts/install_sglang_pin.sh
	PYTHON=$(PY) scripts/install_sglang_releases.sh
	VENV=$(VENV) scripts/install_chain_pin.sh
	touch $(STAMP)

# One server venv per SGLang release that serves on this CPU (tests/engines): CPU torch, the release
# --no-deps plus its frozen import closure, named stand-ins. Idempotent: well under a second when current.
engines: setup
	$(PY) scripts/install_sglang_servers.py

run: setup
	$(CACHEON) slots
	@echo; echo "== scan: a faithful bundle, then one that shells out (exit 2 expected)"
	$(CACHEON) scan examples/bundles/silu-triton
	$(CACHEON) scan examples/bundles/silu-scan-violation; test $$? -eq 2
	@echo; echo "== verify: faithful Triton silu_and_mul (NUMERICAL_PASS on CPU: no CUDA-graph proof here)"
	$(CACHEON) verify examples/bundles/silu-triton --dtype float32 --dtype bfloat16 --timeout 600  # the interpreter at 8192 tokens
	@echo; echo "== verify: faithful attention block (PASS)"
	$(CACHEON) verify examples/bundles/attention-torch
	@echo; echo "== verify: broken silu_and_mul that drops the SiLU (FAIL, exit 2 expected)"
	$(CACHEON) verify examples/bundles/silu-broken-no-silu; test $$? -eq 2
	@echo; echo "== gateway demo: rr vs approx vs exact over SIMULATED SGLang workers (fake completions, real caches and KV events)"
	$(CACHEON) demo

# Two workers: most tests drive the real CLI and candidate child processes, which are CPU-bound.
# The real-server tier (tests/engines) stays on one worker, sharing its servers (tests/conftest.py).
test: lint engines
	$(VENV)/bin/pytest -n 2

# The inner loop: everything but the tests marked slow (real servers, CLI and candidate processes).
test-fast: setup
	$(VENV)/bin/pytest -n 2 -m "not slow"

# ruff; mypy (strict on the packages [[tool.mypy.overrides]] lists); the layering contract ([tool.importlinter]).
lint: setup
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml): generated reference pages, --strict so a broken link fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The same site served with live reload while editing: http://127.0.0.1:8000 (DOCS_ADDR to change).
DOCS_ADDR ?= 127.0.0.1:8000
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

clean:
	rm -rf $(VENV) .sglang .chain .engines .sglang-pin-ready build src/*.egg-info
