# `make export` and `make test` create .venv if needed and install the project into it.
# ORT=gpu installs onnxruntime-gpu in place of onnxruntime (never both in one environment).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
ORT ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(ORT)
OTHER_ORT := $(if $(filter gpu,$(ORT)),onnxruntime,onnxruntime-gpu)

.PHONY: venv export test bench native-build native-test clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip uninstall -y -q $(OTHER_ORT) >/dev/null 2>&1 || true
	$(PY) -m pip install -q -e '.[$(ORT),dev]'
	@rm -f $(VENV)/.installed-* && touch $@

export: $(STAMP)
	$(VENV)/bin/mha export --out artifacts

# Benchmark gpt2-small (exports it first when its artifacts are missing).
bench: $(STAMP)
	@test -f artifacts/gpt2-small/manifest.json || $(VENV)/bin/mha export --preset gpt2-small --out artifacts
	$(VENV)/bin/mha bench --preset gpt2-small --artifacts artifacts --out artifacts/bench

test: native-test
	$(PY) -m pytest

# The non-Python runners, built from scratch into git-ignored folders, then checked on every preset.
NATIVE := runtime/native
PRESETS := seed gpt2-small

native-build: $(STAMP)
	rm -rf $(NATIVE)/c/build/mha_check $(NATIVE)/c/build/lib $(NATIVE)/node/node_modules $(NATIVE)/cpp-libtorch/build
	PYTHON=$(abspath $(PY)) $(NATIVE)/c/build.sh
	$(NATIVE)/node/build.sh
	PYTHON=$(abspath $(PY)) $(NATIVE)/cpp-libtorch/build.sh

artifacts/%/golden/cases.tsv: $(STAMP)
	$(VENV)/bin/mha export --preset $* --out artifacts

native-test: native-build $(PRESETS:%=artifacts/%/golden/cases.tsv)
	@set -eo pipefail; for p in $(PRESETS); do \
	  echo "== $$p: C (ONNX Runtime C API)"; $(NATIVE)/c/build/mha_check check artifacts/$$p | tail -1; \
	  echo "== $$p: Node.js (onnxruntime-node)"; node $(NATIVE)/node/cli.js check artifacts/$$p | tail -1; \
	  echo "== $$p: C++ (libtorch)"; $(NATIVE)/cpp-libtorch/build/mha_ts check artifacts/$$p | tail -1; \
	done
	@echo "== README embedding snippets on artifacts/seed"
	node $(NATIVE)/node/example.js artifacts/seed
	$(NATIVE)/c/build/example artifacts/seed/mha.onnx
	$(NATIVE)/cpp-libtorch/build/example artifacts/seed/mha.pt

clean:
	rm -rf artifacts/seed artifacts/gpt2-small artifacts/bench artifacts/.*staging* .pytest_cache
