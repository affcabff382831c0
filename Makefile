# relakit — set-up, main job, tests. Every target creates .venv on first use.
# the interpreter .venv is made on: empty = tools/venv-python.sh picks (the distribution's
# optimised python3 when it has venv and headers, else python3 on PATH)
PY ?=
VENV := .venv
BIN := $(VENV)/bin
export NUMBA_CACHE_DIR := $(CURDIR)/.numba_cache
export NUMBA_NUM_THREADS ?= 1

.PHONY: setup system browser bytecode aot run test lint bench lab figures figures-only clean-cache clean FORCE

setup: system $(VENV)/.installed $(NUMBA_CACHE_DIR)/.warm aot bytecode $(VENV)/.chart-js

# prometheus and promtool (Debian's package `prometheus`): installed when missing, before any test runs
system:
	@bash tools/system-packages.sh

# chromium and chromedriver (Debian's `chromium`, `chromium-driver`) for tests/test_browser.py:
# installed when missing by `make test` only (notebooks and the lab do not need them)
browser:
	@bash tools/system-packages.sh --browser

# (re-)made only when missing or made on another interpreter than the one picked: .base then
# changes, and the packages are installed again
$(VENV)/.base: FORCE
	@bash tools/venv-python.sh $(VENV) $(PY)

FORCE:

$(VENV)/.installed: pyproject.toml $(VENV)/.base
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,notebooks,jupyter,distributed,lab,search]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (relakit)"
	touch $@

# the kernels runs use (plain, simple plain, mitigated and general; the control plane's policy step)
# compiled once into the shared cache (again after a kernel edit): tests,
# sweep workers and notebooks then load instead of compiling
$(NUMBA_CACHE_DIR)/.warm: $(VENV)/.installed relakit/sim/kernel.py relakit/sim/loops.py \
		relakit/sim/rng.py relakit/sim/latency_bins.py relakit/sim/cachename.py relakit/vocab.py \
		relakit/control/policy.py tools/warm_kernel_cache.py
	$(BIN)/python tools/warm_kernel_cache.py
	touch $@

# the plain and mitigated loops compiled ahead of time (relakit.sim.aot: such a run then never
# imports numba, ~0.9 s of every fresh process here); named by a digest of their sources, so an
# edit rebuilds (~42 s) and an unchanged tree checks in ~0.1 s. After the warm cache: it types the loops from it
aot: $(NUMBA_CACHE_DIR)/.warm
	$(BIN)/python tools/build_aot.py

# the notebooks' chart widget JavaScript, bundled by vl-convert once per set of versions (15-17 s;
# relakit.plots.offline_widget_js): a kernel then loads it instead of bundling at its first chart
$(VENV)/.chart-js: $(VENV)/.installed
	$(BIN)/python -c "from relakit.plots import offline_widget_js; offline_widget_js()"
	touch $@

# relakit's bytecode: this environment sets PYTHONDONTWRITEBYTECODE=1, so without it every fresh
# process (a test, a sweep worker, a notebook kernel) compiles relakit's modules from source,
# 0.1-0.2 s each time; Python still reads .pyc files, and passes over one older than its source.
# compileall rewrites only what changed.
bytecode: $(VENV)/.installed
	$(BIN)/python -m compileall -q relakit

# the flagship notebook, executed with papermill: its copy is the run's log, its figures land in figures/
run: setup
	mkdir -p out figures
	$(BIN)/papermill notebooks/04_policy.ipynb out/04_policy.ipynb --kernel python3 --cwd notebooks \
		-p out_dir ../out/04_policy -p figures_dir ../figures -p static_figures True
	cp figures/04_rela_ramp.png docs/dashboard.png  # the README's picture is what this draws
	@echo "executed notebook: out/04_policy.ipynb; figures: figures/04_*; docs/dashboard.png"

# the tests without a real-time bound on two workers (a file per worker: module fixtures
# stay whole), then the live lab's and the browser's alone, so their clocks are not
# starved; the notebooks a notebook per worker (nbval runs a notebook's cells in order)
test: setup browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not wallclock" tests
	$(BIN)/python -m pytest -q -m wallclock tests
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --nbval-lax -p no:cacheprovider notebooks

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python benchmarks/bench_kernel.py
	$(BIN)/python benchmarks/bench_mitigations.py
	$(BIN)/python benchmarks/bench_replay.py
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_stream_split.py
	$(BIN)/python benchmarks/bench_replications.py
	$(BIN)/python benchmarks/bench_search.py
	$(BIN)/python benchmarks/bench_rules.py
	$(BIN)/python benchmarks/bench_basin_map.py

# JupyterLab on loopback with the relakit kernel, rooted at the project (notebooks/, out/ and
# figures/ all reachable) and opening on notebooks/; installs nothing that setup has not.
# Extra JupyterLab arguments: make lab ARGS='--port=8890'. Root needs --allow-root.
lab: setup
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser --ServerApp.root_dir=$(CURDIR) \
		--LabApp.default_url=/lab/tree/notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(ARGS)

# `make figures`: the flagship ramp's standard views (RelA's policy, so the dashboard has its
# mode panel). `relakit figures --scenario` draws the run folder only when it is that
# scenario's run as the files are now (a digest of their content) with per-request
# records, and simulates it first otherwise; it says which. tests/test_plots.py runs
# figures-only with a short scenario and temporary folders.
FIGURES_SCENARIO ?= params/scenarios/rela-ramp.yaml
FIGURES_RUN ?= out/rela-ramp
FIGURES_OUT ?= figures

figures: setup
	@$(MAKE) --no-print-directory figures-only

figures-only:
	$(BIN)/relakit figures $(FIGURES_RUN) --scenario $(FIGURES_SCENARIO) --out $(FIGURES_OUT)

# numba's cache does not notice edits to functions imported from other files
clean-cache:
	rm -rf $(NUMBA_CACHE_DIR) relakit/sim/_aot

clean: clean-cache
	rm -rf $(VENV) out figures .pytest_cache .ruff_cache
