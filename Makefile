# TierGate developer commands. `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck unit install redis-server bench bench-prefix bench-classify bench-sim bench-llamacpp e2e clean

$(UV):
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q "uv==$(UV_VERSION)"

$(VENV)/.synced: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --all-groups --quiet
	touch $@

install: $(VENV)/.synced

demo: install
	./scripts/demo.sh

redis-server:
	@command -v redis-server >/dev/null || ./scripts/install-system-deps.sh redis-server

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

test: install redis-server lint typecheck
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/overhead/run.py

bench-prefix: install
	$(BIN)/python bench/prefix/run.py

bench-sim: install
	./scripts/bench-sim.sh

bench-llamacpp: install
	./scripts/e2e.sh --install-only
	./scripts/bench-llamacpp.sh

bench-classify: install
	$(BIN)/python bench/classify/run.py

e2e: install
	./scripts/e2e.sh

clean:
	rm -rf $(VENV) $(TOOLS) .demo .mypy_cache .ruff_cache .pytest_cache
