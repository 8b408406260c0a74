# One-command entry points. Everything runs in ./.venv, created on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install kafka-jars demo dev test test-fast lint bench bench-scale crash clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the package with its dev tools

kafka-jars: $(STAMP)  ## fetch the test Kafka broker's jars now (tests otherwise fetch them on first use)
	$(BIN)/python -m tests.servers.kafka fetch-jars

demo: $(STAMP)  ## run the example payments pipeline end to end (local Spark, Delta under ./data)
	$(BIN)/python -m assets.demo

dev: $(STAMP)  ## open the Dagster UI on the example code location
	mkdir -p $(DAGSTER_HOME)
	test -f $(DAGSTER_HOME)/dagster.yaml || printf 'telemetry:\n  enabled: false\npython_logs:\n  managed_python_loggers:\n    - dagster_sideinputs\n' > $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml

test: $(STAMP)  ## run the whole test suite (real Spark, Delta, Dagster)
	$(BIN)/python -m pytest

test-fast: $(STAMP)  ## the suite without the slow tests
	$(BIN)/python -m pytest -m "not slow"

lint: $(STAMP)  ## formatting, lint and types
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)  ## the benchmarks (minutes; see bench/)
	$(BIN)/python bench/delta_io.py
	$(BIN)/python bench/operator.py
	$(BIN)/python bench/cluster.py

bench-scale: $(STAMP)  ## 50M main records, 10M side rows, growth curves (about an hour)
	$(BIN)/python bench/scale.py

crash: $(STAMP)  ## the crash harness: 20 trials of SIGKILLs at random points, rerun, compared; then kills followed by a side-input change
	$(BIN)/python bench/crash_harness.py --trials 20 --kill-at all
	$(BIN)/python bench/crash_harness.py --script short --trials 0 --side-change

clean:
	rm -rf data .dagster_home
