# Two commands on a fresh clone: `make serve` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser infra serve test test-fast lint gpu-check gpu-wheels clean

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

# On a CUDA machine: every Triton kernel checked against torch, then the engine's step as a GPU
# runs it, decode attention and SNAC measured (benchmarks/gpu_check.py, docs/benchmarks.md). It
# installs nothing: the Python given (one with a CUDA PyTorch and Triton) runs the script from
# the source tree, with the wheels of `make gpu-wheels` where the machine has no network. CI
# runs its CPU half (--cpu).
GPU_PY ?= python3
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py

# Here, with network: the wheels benchmarks/gpu_check.py needs beyond PyTorch and Triton, for a
# GPU machine's CPython $(GPU_PYTHON) on x86-64 Linux, into .gpu-wheels/ (under 64 MiB).
GPU_PYTHON ?= 3.12
gpu-wheels: install
	rm -rf .gpu-wheels
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --dest .gpu-wheels \
		--python-version $(GPU_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 \
		$$($(PY) benchmarks/gpu_check.py --requirements)
	du -sh .gpu-wheels

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
