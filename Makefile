# Two commands on a fresh clone: `make serve` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser infra serve test test-fast lint gpu-check clean

# torch goes in first and alone, pinned to the exact release, so pip takes the CPU build that
# lies on disk and no later requirement pulls a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The browser tests drive Debian's Chromium (headless) through Playwright.
browser:
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The cluster tests run real infrastructure (tests/support/): Debian's HAProxy (the front door,
# docs/scaling.md), Redis and coturn (a TURN server). Each program missing is installed.
infra:
	command -v haproxy >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null)
	command -v redis-server >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)
	command -v turnserver >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq coturn >/dev/null)

serve: install
	$(VENV)/bin/cadenza serve $(ARGS)

test: install lint browser infra
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check cadenza tests benchmarks
	$(VENV)/bin/ruff format --check cadenza tests benchmarks
	$(VENV)/bin/mypy cadenza
	$(VENV)/bin/mypy benchmarks
	$(VENV)/bin/lint-imports

# On a CUDA machine: compile and check every Triton kernel, measure decode-attention bandwidth
# and W8A16 against fp16 (docs/benchmarks.md). CI runs the interpreter half (--interpret).
gpu-check: install
	$(PY) -m pip install --quiet triton
	$(PY) benchmarks/gpu_kernels.py --json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
