# TierGate developer commands. `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-all lint typecheck unit install install-dev docs redis-server bench bench-prefix bench-slow-replica bench-overload bench-streams bench-classify bench-sim bench-llamacpp e2e stream-cut-table clean

$(UV):
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q "uv==$(UV_VERSION)"

# --compile-bytecode: the installed packages' .pyc files are written once, here. uv leaves them
# to the first import, which writes nothing where PYTHONDONTWRITEBYTECODE is set: then every
# process compiled litestar, pydantic, redis... again (importing gateway.composition took
# 2.0-2.5 s of CPU, 0.9-1.1 s with the .pyc; `tiergate serve` on a refused config 0.5-0.7 s,
# 0.25 s). `make test-all` starts hundreds of such processes. It costs about 17 s of CPU here,
# once. Measured with `/usr/bin/time -f "%e %U" .venv/bin/python -c "import gateway.composition"`
# (2026-12-07, 2-core machine under load).
# Runtime only (the gateway, the simulator, the openai client for the demo's example): what
# `make demo` needs. --inexact keeps the test tools of an earlier `make install-dev`.
$(VENV)/.runtime: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --inexact --no-default-groups --group demo --quiet --compile-bytecode
	touch $@

# Everything: test, lint, type-check and deployment-validation tools.
$(VENV)/.synced: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --all-groups --quiet --compile-bytecode
	touch $@ $(VENV)/.runtime

install: $(VENV)/.runtime

install-dev: $(VENV)/.synced

demo: install
	./scripts/demo.sh

redis-server:
	@command -v redis-server >/dev/null || ./scripts/install-system-deps.sh redis-server

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install-dev
	$(BIN)/mypy

# Two pytest workers (pytest-xdist): most tests wait on real processes and sockets, so two
# halve the wall time on the 2-core CI machine (855 s -> 413 s, 2026-12-03). The full suite
# runs four, handed out by work stealing (expensive modules first in each worker's chunk,
# tests/run_order.py): the cores were 80 % busy with two
# (many tests wait on processes and sockets). On this 2-core machine test-all took 874 s with
# two, 726 s with three, 669 s with four (2026-12-07, every test green; 92 % -> 96 % of both
# cores busy).
# `make test`: everything but the tests marked `slow` (process fleets, training, benchmarks,
# attack suites). `make test-all`: every test, as CI runs it (.ci/run, with CI=true, where a
# test that needs a missing ../shared fails instead of skipping).
# --tb=native: pytest's own traceback format parses the failing test's file with `ast`, which
# on CPython 3.11.7 can raise "SystemError: AST constructor recursion depth mismatch"; pytest
# then dies with INTERNALERROR and every test not yet run is lost (seen in a CI run here,
# 2026-12-07: one failure, about 360 tests never ran). Native tracebacks parse nothing.
PYTEST_TB = --tb=native
# The project's own modules (gateway, simulator, tests...) are compiled once and their .pyc
# kept (in __pycache__, ignored by git) even where PYTHONDONTWRITEBYTECODE is set (an empty
# value is unset for Python; the processes the tests start inherit it): otherwise each pytest
# worker recompiled and assertion-rewrote every test module (collection: 15.7 s of CPU, 4.8 s
# with the .pyc; `/usr/bin/time .venv/bin/pytest --collect-only -q`, 2026-12-07), and each
# gateway start its own modules (0.88 s -> 0.77 s of CPU to import what `serve` imports).
KEEP_PYC = PYTHONDONTWRITEBYTECODE=

test: install-dev redis-server lint typecheck
	$(KEEP_PYC) $(BIN)/pytest -q -n 2 $(PYTEST_TB) -m "not slow"

test-all: install-dev redis-server lint typecheck
	$(KEEP_PYC) $(BIN)/pytest -q -n 4 --dist worksteal $(PYTEST_TB) --durations=20

bench: install-dev
	$(BIN)/python bench/overhead/run.py

bench-prefix: install-dev
	$(BIN)/python bench/prefix/run.py

# One replica 3x slower: speed-aware replica choice on and off (docs/replicas.md)
bench-slow-replica: install-dev
	$(BIN)/python bench/slow_replica/run.py

# Issue 36: a batch flood, interactive tenants, a fast-tier brown-out; OVERLOAD_ARGS="--legs fair"
bench-overload: install-dev
	$(BIN)/python bench/overload/run.py $(OVERLOAD_ARGS)

# Issue 37: concurrent token streams through every proxy; STREAMS_ARGS="--ladder 100,1000" etc.
bench-streams: install-dev
	$(BIN)/python bench/streams/run.py $(STREAMS_ARGS)

bench-sim: install-dev
	./scripts/bench-sim.sh

bench-llamacpp: install-dev
	./scripts/e2e.sh --install-only
	./scripts/bench-llamacpp.sh

bench-classify: install-dev
	$(BIN)/python bench/classify/run.py

e2e: install-dev
	./scripts/e2e.sh

# Issue 24's table against real llama-cpp-python servers on their defaults (interrupt on).
stream-cut-table: install-dev
	TIERGATE_CUT_TABLE=bench/results/stream-cut-llamacpp.md ./scripts/e2e.sh -k test_stream_cut

docs: install
	$(BIN)/tiergate config docs --out docs/settings.md
	$(BIN)/tiergate config schema --out config/tiergate.schema.json

clean:
	rm -rf $(VENV) $(TOOLS) .demo .mypy_cache .ruff_cache .pytest_cache
