# relakit — set-up, main job, tests. Every target creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export NUMBA_CACHE_DIR := $(CURDIR)/.numba_cache
export NUMBA_NUM_THREADS ?= 1

.PHONY: setup run test lint bench clean-cache clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

run: setup
	$(BIN)/relakit simulate params/scenarios/mmc-demo.yaml --out out/mmc-demo --figure figures/mmc-demo.png

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python benchmarks/bench_kernel.py
	$(BIN)/python benchmarks/bench_replay.py

# numba's cache does not notice edits to functions imported from other files
clean-cache:
	rm -rf $(NUMBA_CACHE_DIR)

clean: clean-cache
	rm -rf $(VENV) out figures .pytest_cache .ruff_cache
