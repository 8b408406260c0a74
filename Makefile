# One-command entry points. Everything runs in ./.venv, created on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
# The demo's and the UI's run processes each start a JVM: they map a class archive of
# its class path (docs/JVM_PACKAGES.md; opt-in, off in a user's own processes).
export DSI_JVM_ARCHIVE ?= on
# How long a transaction waits for its customer's profile (30 minutes in the example's
# code). One value for the demo's runs and for the code location `make dev` serves, so
# the UI declares what the demo's runs did: `make dev DSI_PROFILE_TIMEOUT_MINUTES=30`.
# (Theirs only: the tests keep the code's 30 minutes.)
demo demo-kafka dev: export DSI_PROFILE_TIMEOUT_MINUTES ?= 1

# Airflow 3 (the `airflow` extra) in its own venv: a real `pip install '.[airflow,connect]'`
# into a fresh environment (what a user does whose tasks attach to a Spark Connect server,
# as the tests' do), which runs Airflow for tests/test_airflow.py; ./.venv, the dev venv,
# stays without Airflow (the core is tested there without it).
AIRFLOW_VENV := .venv-airflow
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed

.PHONY: install airflow airflow-dev jars kafka-jars demo demo-kafka dev test test-fast test-extended test-engines lint bench bench-scale crash clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(AIRFLOW_STAMP): pyproject.toml
	test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet ".[airflow,connect]"
	touch $(AIRFLOW_STAMP)

airflow: $(AIRFLOW_STAMP)  ## create .venv-airflow: the package with its airflow and connect extras (Airflow 3)

airflow-dev: airflow  ## open the Airflow UI (standalone, SQLite) on the example DAG, assets/airflow_dags
	mkdir -p .airflow_home
	PATH=$(CURDIR)/$(AIRFLOW_VENV)/bin:$$PATH PYTHONPATH=$(CURDIR) AIRFLOW_HOME=$(CURDIR)/.airflow_home \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/assets/airflow_dags AIRFLOW__CORE__LOAD_EXAMPLES=False \
	$(AIRFLOW_VENV)/bin/airflow standalone

install: $(STAMP) jars  ## create .venv, install the package with its dev tools, fetch the JVM jars

kafka-jars: $(STAMP)  ## fetch the test Kafka broker's jars now (tests otherwise fetch them on first use)
	$(BIN)/python -m tests.servers.kafka fetch-jars

# Spark resolves spark.jars.packages (Delta, Kafka, avro, S3A) into the Ivy cache
# (~/.ivy2.5.2) when a JVM starts; resolving them here once lets every later start, tests
# and CI included, read the cache only, and fails here, clearly, when Maven Central is
# unreachable. A file check when they are cached (docs/JVM_PACKAGES.md).
jars: $(STAMP)  ## resolve the JVM packages once into the Ivy cache
	$(BIN)/python -m dagster_sideinputs.core.spark.jars fetch

demo: install  ## run the example pipeline end to end (wipes ./data and ./.dagster_home; VERBOSE=1 shows logs)
	$(BIN)/python -m assets.demo $(if $(VERBOSE),--verbose)

demo-kafka: install kafka-jars  ## the same pipeline with its transactions in Kafka (starts a local broker)
	$(BIN)/python -m assets.demo --kafka $(if $(VERBOSE),--verbose)

# `make dev` starts a local Spark Connect server with Delta loaded once
# (dagster_sideinputs.core.spark.connect_server; its log: data/connect-server.log), and the
# code location's runs attach to it (DSI_SPARK_REMOTE, read by resources/): a run opens a
# session in seconds instead of starting a JVM. `make dev SPARK=embedded`: every run
# starts its own Spark, as `make demo` does.
SPARK ?= connect
CONNECT_PORT ?= 15002
# dg warns when the project's .venv is not the active one; it is, for these commands.
DG_ENV := VIRTUAL_ENV=$(abspath $(VENV))

dev: install  ## open the Dagster UI on the example code location (`dg dev`; SPARK=embedded: no Connect server)
	mkdir -p $(DAGSTER_HOME) data
	test -f $(DAGSTER_HOME)/dagster.yaml || printf 'telemetry:\n  enabled: false\npython_logs:\n  managed_python_loggers:\n    - dagster_sideinputs\n' > $(DAGSTER_HOME)/dagster.yaml
ifeq ($(SPARK),connect)
	$(DG_ENV) $(BIN)/python -m dagster_sideinputs.core.spark.connect_server --port $(CONNECT_PORT) --log data/connect-server.log --export DSI_SPARK_REMOTE -- $(BIN)/dg dev
else
	$(DG_ENV) $(BIN)/dg dev
endif

# Two pytest-xdist workers, each with its own Spark session, a module's tests in one worker
# (--dist loadfile: its fixtures start once). Measured in fresh-clone runs of .ci/run on
# 2 cores: 56 minutes of pytest in two workers against 73 in one (docs/testing.md).
# WORKERS=0: one process.
WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

test: install airflow  ## run the whole test suite (real Spark, Delta, Dagster, Airflow)
	$(PYTEST)

test-extended: install  ## the long end-to-end runs the default suite leaves out (docs/testing.md)
	DSI_TEST_CODEGEN=1 $(PYTEST) -m extended

test-engines: install  ## the core tests with every test under both Delta engines (the full matrix)
	DSI_BOTH_ENGINES=1 $(PYTEST) tests/core

test-fast: install  ## the inner loop (under 5 minutes): the semantics, the Delta reader and writer, every test without Spark; no server
	$(PYTEST) -m fast

lint: $(STAMP)  ## formatting, lint and types
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --explicit-package-bases bench/*.py  # (bench/operator.py: not the stdlib's)

bench: $(STAMP)  ## the benchmarks (minutes; see bench/)
	$(BIN)/python bench/delta_io.py
	$(BIN)/python bench/operator.py
	$(BIN)/python bench/cluster.py

bench-scale: $(STAMP)  ## 50M main records, 10M side rows, growth curves (about an hour)
	$(BIN)/python bench/scale.py

crash: $(STAMP)  ## the crash harness: SIGKILLs at random points and at every kill point, rerun, compared (delta-spark: 20 trials, the bridge: 10); then kills followed by a side-input change
	$(BIN)/python bench/crash_harness.py --trials 20 --kill-at all --engine delta-spark
	$(BIN)/python bench/crash_harness.py --trials 10 --kill-at all --engine delta-rs
	$(BIN)/python bench/crash_harness.py --script short --trials 0 --side-change

clean:
	rm -rf data .dagster_home .airflow_home
