# Development and CI entry points.
#
#   make run     embedded PostgreSQL+pgvector and Valkey (unless DATABASE_URL / REDIS_URL
#                are set), migrate, load config/demo.yaml, bootstrap the demo operator,
#                then daphne + celery worker + celery beat under honcho (Ctrl-C stops them)
#   make test    lint gates, then pytest (PYTEST_ARGS="-k foo -x" to pass arguments)
#   make lint    ruff check, ruff format --check, lint-imports, mypy
#   make fmt     ruff format + ruff check --fix
#   make bench   python -m bench (BENCH_ARGS=...)
#   make down    stop the embedded PostgreSQL and Valkey (they outlive `make run`)
#   make clean   down, then delete .data/ (the embedded databases)
#
# The embedded servers keep running after `make run` / `make test` so the next start is
# instant; their data lives in .data/ and is reused. `make down` (or `make stop`) stops
# them.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules --no-print-directory

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8000
# Worker processes: the loop is I/O-bound but each step costs CPU, so one process per core.
WORKER_PROCESSES ?= 2
HOST ?= 127.0.0.1
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help venv .venv run test lint fmt bench up down stop status env clean

help:
	@sed -n '1,11s/^# \{0,1\}//p' Makefile

# ---------------------------------------------------------------- virtualenv
# Reinstalled only when pyproject.toml changes (or the stamp is missing).
$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); fi
	@echo "installing dependencies from pyproject.toml into $(VENV)"
	@if $(PY) -m pip install --disable-pip-version-check -q -e '.[dev]'; then \
		rm -rf agentplatform.egg-info; \
	else \
		echo "editable install failed; installing the listed dependencies instead"; \
		$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > $(VENV)/requirements.txt; \
		$(PY) -m pip install --disable-pip-version-check -q -r $(VENV)/requirements.txt; \
	fi
	@touch $@

venv .venv: $(STAMP)
	@:

# ---------------------------------------------------------------- run
run: $(STAMP)
	$(PY) -m devstack up
	$(PY) manage.py migrate --noinput
	$(PY) manage.py apply_config --no-url-check config/demo.yaml
	$(PY) manage.py bootstrap_demo
	@echo
	@echo "  admin       http://127.0.0.1:$(PORT)/admin/"
	@echo "  API docs    http://127.0.0.1:$(PORT)/api/v1/docs/"
	@echo "  playground  http://127.0.0.1:$(PORT)/playground/"
	@echo "  (Ctrl-C stops web, worker and beat; 'make down' stops PostgreSQL and Valkey)"
	@echo
	PORT=$(PORT) HOST=$(HOST) exec $(VENV)/bin/honcho start -f Procfile -c worker=$(WORKER_PROCESSES)

# ---------------------------------------------------------------- checks
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m devstack up
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) -m devstack up
	$(PY) -m bench $(BENCH_ARGS)

# Crash soak (not in CI): the random-kill test of tests/e2e/test_faults.py with 200 runs.
soak: $(STAMP)
	$(PY) -m devstack up
	FAULT_RUNS=$${FAULT_RUNS:-200} $(PY) -m pytest tests/e2e/test_faults.py -k random_points -q -s -p no:cacheprovider $(PYTEST_ARGS)

# ---------------------------------------------------------------- embedded stack
up: $(STAMP)
	$(PY) -m devstack up

status env: $(STAMP)
	@$(PY) -m devstack $@

down stop:
	@if [ -x $(PY) ]; then $(PY) -m devstack down; else echo "no $(VENV): nothing to stop"; fi

clean: down
	rm -rf .data
