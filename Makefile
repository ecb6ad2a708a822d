# Everything a fresh machine with Python 3.11 needs: `make demo`, `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo dev test check proof style lint chromium tools bench bench-capacity bench-peers clean

# uv (from PyPI, into the venv) installs what pip would, from the same pins, in seconds, and
# compiles the bytecode as pip does (uv's default does not). Every process then loads Dagster
# from its .pyc files instead of compiling some 1,400 modules again: on a machine that sets
# PYTHONDONTWRITEBYTECODE, as these do, nothing else would ever write them (here `import
# dagster` took 0.75 s of CPU more without them, a Dagster code server 1.85 s more). The venv is
# made again when this recipe changes, not only the pins.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

# The project's own modules too (an editable install is not compiled; a file edited since is
# compiled again, in memory, by whatever imports it). Quiet but for a file that cannot compile,
# which it names.
install: $(STAMP)
	@$(BIN)/python -m compileall -q idempotent_jobs idempotent_jobs_tests testkit

demo: install
	$(BIN)/idempotent-jobs demo

# The Dagster UI and daemon on http://127.0.0.1:3000, wired to the ledger. Ctrl-C stops it.
dev: install
	$(BIN)/idempotent-jobs dev

# The whole suite (unit, ledger, dagster, system) on two processes (pytest-xdist), a test file per
# process at a time, dearest first (conftest.py's order; xdist's own reorder by test count is
# turned off); the harnesses run whole are `make proof`'s.
test: install lint chromium tools
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# The fast lane, on two processes: lint, and the unit tests (no database) and the ledger tests
# (a real PostgreSQL, no Dagster), but those marked slow. `make test` adds idempotent_jobs_tests/
# dagster (Dagster in process) and system (real processes, daemons, a browser, network hosts).
# mypy runs beside the tests (they wait on PostgreSQL as much as they use a core); either
# failing fails the check.
check: style
	typing=$$(mktemp); $(BIN)/mypy > $$typing 2>&1 & mypy=$$!; \
	$(BIN)/python -m pytest -q -n 2 -m "not slow" idempotent_jobs_tests/unit idempotent_jobs_tests/ledger; \
	tests=$$?; wait $$mypy; typed=$$?; cat $$typing; rm -f $$typing; \
	test $$tests -eq 0 && test $$typed -eq 0

# The whole harnesses, outside pytest, each with its seed and trial count said: chaos trials of
# every kind, again through PgBouncer, the shadow kind alone, and the cluster harness (six hosts in
# network namespaces). CI runs it after `make test`; scale it with CHAOS_TRIALS=200
# SHADOW_TRIALS=500 CLUSTER_TRIALS=20.
CHAOS_TRIALS ?= 26
SHADOW_TRIALS ?= 100
CLUSTER_TRIALS ?= 5
proof: install tools
	$(BIN)/python -m idempotent_jobs_tests.proof --chaos-trials $(CHAOS_TRIALS) \
		--shadow-trials $(SHADOW_TRIALS) --cluster-trials $(CLUSTER_TRIALS)

# The network tests' tools from Debian's packages, when missing: PgBouncer, faketime, iproute2 and
# gcc (the tests install them too; this says so up front).
tools: install
	$(BIN)/python -m testkit.system_tools

# The browser test drives Debian's Chromium (Playwright's own browser download is not used).
chromium:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# Ratios of what the ledger costs against baselines measured in the same run: the statements and
# the whole call, launched runs and backfills through Dagster, operators at a million runs.
bench: install
	$(BIN)/python benchmarks/bench_ledger.py
	$(BIN)/python benchmarks/bench_launched.py
	$(BIN)/python benchmarks/bench_operators.py
	$(BIN)/python benchmarks/bench_estimate.py
	$(BIN)/python benchmarks/bench_batch.py
	$(BIN)/python benchmarks/bench_capacity.py

# Runs per second by worker processes, directly and through PgBouncer; connections; bytes per
# run before and after retention (docs/deployment.md's capacity model).
bench-capacity: install
	$(BIN)/python benchmarks/bench_capacity.py

# The closest peer (DBOS Transact, the [bench] extra, part of dev) side by side.
bench-peers: install
	$(BIN)/python benchmarks/bench_peers.py

# ruff (rules and format) and the layer contracts (import-linter, in pyproject.toml: the core
# imports no Dagster); `lint` adds mypy --strict on the package, tests and benchmarks.
LINTED := idempotent_jobs idempotent_jobs_tests testkit benchmarks docs/examples
style: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports

lint: style
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
