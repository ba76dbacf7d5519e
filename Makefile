# One Makefile for people and CI. Every target bootstraps what it needs into this folder:
# .tools (uv), .venv (the locked dependencies). State (the SQLite ledger, paid images, Prefect home,
# results) lives in .episodic, which only `make clean-state` removes (refused while it holds
# paid calls unless INCLUDING_PAID=1).
PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin
WEEK ?=
# Test processes (pytest-xdist). Each has its own Prefect test harness and test databases;
# two halve the suite's time on this project's 2-core CI machine.
TEST_WORKERS ?= 2

export UV_PYTHON := $(PYTHON)
export UV_PYTHON_DOWNLOADS := never
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: bootstrap demo test test-fast lint format bench reliability ui-check clean clean-state

bootstrap: $(VENV)/.synced

$(UV):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python 3.11+ is required")'
	@$(PYTHON) -m venv $(TOOLS)
	@$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Quiet: uv prints only errors (a failed sync still says why); `make demo` starts with its story.
$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	@$(UV) sync --frozen --compile-bytecode --quiet
	@touch $@

demo: bootstrap  ## the main job: the weekly flow on SQLite + fake provider (WEEK=2026-W32, UI=1 for --ui)
	@$(BIN)/episodic demo $(if $(WEEK),--week $(WEEK)) $(if $(UI),--ui)

test: bootstrap  ## the whole test suite (SQLite and the local PostgreSQL server), TEST_WORKERS processes
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30

test-fast: bootstrap  ## the edit loop: unit, integration and property tests on SQLite files, no servers (a few minutes)
	EPISODIC_TEST_NO_SERVERS=1 $(BIN)/pytest -n $(TEST_WORKERS) -m "not servers and not slow and not e2e" --durations=10 tests/unit tests/integration tests/property

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: bootstrap
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: bootstrap  ## benchmarks (never part of the tests)
	$(BIN)/python -m bench.allocate
	$(BIN)/python -m bench.batch
	$(BIN)/python -m bench.claims
	$(BIN)/python -m bench.dedup
	$(BIN)/python -m bench.ledger
	$(BIN)/python -m bench.recovery

# Not part of `make test`. Installs Debian's chromium and chromium-driver (apt, as root) when
# missing and the `ui` dependency group (selenium) into .venv, then checks the approval form
# in the real Prefect UI (the images; a rejection, then Retry; the titles and prompts; a decision
# on the command line resuming the run; a form answer refused after it); screenshots:
# .episodic/ui-check.
reliability: bootstrap  ## the fault suite (long: ~17 min); writes docs/reliability.md
	$(BIN)/python -m reliability

ui-check: bootstrap  ## the approval form in a real browser: images, titles, a rejection that stands a Retry, CLI decisions
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	$(UV) sync --frozen --compile-bytecode --group ui
	$(BIN)/python -m tests.ui.ui_check
	$(BIN)/python -m tests.ui.decision_check
	$(BIN)/python -m tests.ui.two_machines_check

clean:  ## build artefacts only: the environment, caches, dist/build; never the state (.episodic)
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache .hypothesis dist build
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

clean-state: bootstrap  ## the state folder (ledger, paid images): `episodic state remove`
	$(BIN)/episodic state remove --yes$(if $(INCLUDING_PAID), --including-paid)
