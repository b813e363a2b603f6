# `make export` and `make test` create .venv if needed and install the project into it.
# ORT=gpu swaps onnxruntime for onnxruntime-gpu 1.31.1 (the newest on PyPI) after the install (never both).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
ORT ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(ORT)
GPU_ORT := onnxruntime-gpu==1.31.1

.PHONY: venv export test lint bench native-build native-test clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip uninstall -y -q onnxruntime-gpu >/dev/null 2>&1 || true
	$(PY) -m pip install -q -e '.[dev]'
	@if [ "$(ORT)" = gpu ]; then $(PY) -m pip uninstall -y -q onnxruntime && $(PY) -m pip install -q $(GPU_ORT); fi
	@rm -f $(VENV)/.installed-* && touch $@

export: $(STAMP)
	$(VENV)/bin/mha export --out artifacts

# Benchmark gpt2-small (exports it first when its artifacts are missing).
bench: $(STAMP)
	@test -f artifacts/gpt2-small/manifest.json || $(VENV)/bin/mha export --preset gpt2-small --out artifacts
	$(VENV)/bin/mha bench --preset gpt2-small --artifacts artifacts --out artifacts/bench

test: lint native-test
	$(PY) -m pytest

# ruff, pinned in the dev extra, configured in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The non-Python runners, built from scratch into git-ignored folders, then checked on every preset; the C
# runner also as built with AddressSanitizer + UBSan (a memory error aborts it, failing the target).
NATIVE := runtime/native
PRESETS := seed gpt2-small

native-build: $(STAMP)
	rm -rf $(NATIVE)/c/build/mha_check $(NATIVE)/c/build/mha_check_asan $(NATIVE)/c/build/json_fuzz_asan $(NATIVE)/c/build/lib $(NATIVE)/node/node_modules $(NATIVE)/cpp-libtorch/build
	PYTHON=$(abspath $(PY)) $(NATIVE)/c/build.sh
	$(NATIVE)/node/build.sh
	PYTHON=$(abspath $(PY)) $(NATIVE)/cpp-libtorch/build.sh

artifacts/%/golden/cases.tsv: $(STAMP)
	$(VENV)/bin/mha export --preset $* --out artifacts

native-test: native-build $(PRESETS:%=artifacts/%/golden/cases.tsv)
	@set -eo pipefail; for p in $(PRESETS); do \
	  echo "== $$p: C (ONNX Runtime C API)"; $(NATIVE)/c/build/mha_check check artifacts/$$p | tail -1; \
	  echo "== $$p: C under AddressSanitizer + UBSan"; $(NATIVE)/c/build/mha_check_asan check artifacts/$$p | tail -1; \
	  echo "== $$p: Node.js (onnxruntime-node)"; node $(NATIVE)/node/cli.js check artifacts/$$p | tail -1; \
	  echo "== $$p: C++ (libtorch)"; $(NATIVE)/cpp-libtorch/build/mha_ts check artifacts/$$p | tail -1; \
	done
	@echo "== the manifest reader under AddressSanitizer + UBSan: truncations and random edits"
	$(NATIVE)/c/build/json_fuzz_asan artifacts/seed/manifest.json 5000
	@echo "== README embedding snippets on artifacts/seed"
	node $(NATIVE)/node/example.js artifacts/seed
	$(NATIVE)/c/build/example artifacts/seed/mha.onnx
	$(NATIVE)/cpp-libtorch/build/example artifacts/seed/mha.pt

clean:
	rm -rf artifacts/seed artifacts/gpt2-small artifacts/bench artifacts/.*staging* .pytest_cache
