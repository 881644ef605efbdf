# One entry point for a fresh machine: `make demo` (set up, run the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist workers: two halves the suite's time on a 2-core machine (CI's), the parallelism
# it is checked at; `make test TEST_WORKERS=auto` takes one per core
TEST_WORKERS ?= 2

.PHONY: setup demo prometheus test test-fast lint layers bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install rlalloc with its dev tools

demo: setup  ## compare the shipped policies with the baselines on the embedded default workload
	$(BIN)/rlalloc evaluate --out runs/demo --force

prometheus:  ## the real Prometheus server the actuator tests start (Debian's package)
	@command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

lint: setup
	$(BIN)/ruff check .

# import-linter reads the installed tree; the editable install maps folders it cannot walk,
# so the layer contract (.importlinter) is checked on a plain build of the package
layers: setup  ## the layer contract: no lower layer imports a higher one, no import cycles
	@rm -rf build/layers
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --target build/layers .
	cd build/layers && ../../$(BIN)/lint-imports ../../.importlinter

test: setup prometheus lint layers  ## the one gate: lint, layers, then every test (CI runs this)
	$(BIN)/pytest -q -n $(TEST_WORKERS)

test-fast: setup lint layers  ## the inner loop: the tests not marked expensive
	$(BIN)/pytest -q -n $(TEST_WORKERS) -m "not expensive"

bench: setup  ## the benchmarks whose figures are in the README (replacing an earlier run's)
	$(BIN)/rlalloc bench sim --out runs/bench/sim.json --force
	$(BIN)/rlalloc bench recovery --out runs/bench/recovery.json --force
	$(BIN)/rlalloc bench forecast --out runs/bench/forecast.json --force
	$(BIN)/rlalloc bench actuator --out runs/bench/actuator.json --force
	$(BIN)/rlalloc bench rollouts --out runs/bench/rollouts.json --force
