# `make export` and `make test` create .venv if needed and install the project into it.
# ORT=gpu installs onnxruntime-gpu in place of onnxruntime (never both in one environment).
PYTHON ?= python3
VENV ?= .venv
ORT ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(ORT)
OTHER_ORT := $(if $(filter gpu,$(ORT)),onnxruntime,onnxruntime-gpu)

.PHONY: venv export test bench clean

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

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf artifacts/seed artifacts/gpt2-small artifacts/bench artifacts/.*staging* .pytest_cache
