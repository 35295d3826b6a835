# Cacheon: `make run` sets up and runs the main job on the embedded examples; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CACHEON := $(VENV)/bin/cacheon
STAMP := $(VENV)/.cacheon-setup
TIERS := $(VENV)/.cacheon-tiers
DEMO_RELEASE := 0.5.13.post1

.PHONY: setup tiers engines run test test-fast lint docs docs-serve clean

setup: $(STAMP)

# What `make run` needs, and no more. System packages first (bubblewrap for the verify sandbox; g++,
# ninja, OpenSSL headers for the engine tier; chromium for the dashboard's browser test).
# torch: the CPU build, pinned explicitly (an unpinned torch pulls a multi-GB CUDA build).
# triton: Triton bundles verify on CPU through TRITON_INTERPRET=1.
# The demo's simulated workers publish KV events with one release's own code, unpacked under .sglang/.
# pip runs without -q: its download and install lines are the progress of the first run.
$(STAMP): pyproject.toml Makefile scripts/install_sglang_releases.sh scripts/install_system_packages.sh
	@echo "== setup 1/4: system packages"
	scripts/install_system_packages.sh
	@echo "== setup 2/4: $(VENV) with CPU torch 2.13.0 and triton 3.9.0 (the largest download, once)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip
	$(PY) -m pip install --disable-pip-version-check torch==2.13.0 triton==3.9.0
	@echo "== setup 3/4: cacheon and its test, docs and tracing extras"
	$(PY) -m pip install --disable-pip-version-check -e '.[test,docs,otel]'
	@echo "== setup 4/4: SGLang $(DEMO_RELEASE)'s KV-event publisher for the demo"
	PYTHON=$(PY) scripts/install_sglang_releases.sh $(DEMO_RELEASE)
	touch $(STAMP)

# What the tests need beyond that (make test, make test-fast): the real SGLang tiers, the pin
# (0.5.13.post1, --no-deps plus what its imports need and a named torchvision stand-in), every release
# of the KV-event interop matrix unpacked side by side under .sglang/, and the pinned Bittensor SDK in
# its own directory (.chain/).
tiers: $(TIERS)

$(TIERS): $(STAMP) scripts/install_sglang_pin.sh scripts/install_sglang_releases.sh scripts/install_chain_pin.sh
	@echo "== tiers 1/3: the pinned SGLang in $(VENV)"
	VENV=$(VENV) scripts/install_sglang_pin.sh
	@echo "== tiers 2/3: every SGLang release of the KV-event interop matrix under .sglang/"
	PYTHON=$(PY) scripts/install_sglang_releases.sh
	@echo "== tiers 3/3: the pinned Bittensor SDK under .chain/"
	VENV=$(VENV) scripts/install_chain_pin.sh
	touch $(TIERS)

# One server venv per SGLang release that serves on this CPU (tests/engines): CPU torch, the release
# --no-deps plus its frozen import closure, named stand-ins. Idempotent: well under a second when current.
# Then Gemma 4's real tokenizer and chat template (from the llama-cpp-python sdist), converted by the
# 0.5.23 venv's transformers, for the chat-rendering tests (tests/engines/test_real_chat.py).
ENGINES_DIR ?= $(or $(CACHEON_ENGINES_DIR),.engines)
engines: tiers
	$(PY) scripts/install_sglang_servers.py
	$(ENGINES_DIR)/0.5.23/bin/python -W ignore scripts/make_real_vocab.py --out $(or $(CACHEON_VOCAB_DIR),$(ENGINES_DIR)/vocab)

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
	$(VENV)/bin/pytest -n 2 --durations=25  # the slowest 25 in every run: the suite has a time budget

# The inner loop: everything but the tests marked slow (real servers, CLI and candidate processes).
test-fast: tiers
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
