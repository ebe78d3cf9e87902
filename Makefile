# Two entry points for a fresh machine (see README.md):
#   make demo  -- builds .venv, then runs the main job on the embedded GlyphDataset
#   make test  -- builds .venv, then runs the test suite
#   make docs  -- builds the Sphinx site into docs/_build/html (nitpicky: every cross-reference
#                 must resolve; warnings are errors)
#   make wheel -- builds dist/pml_rank_plugins-<version>-py3-none-any.whl in an isolated build
#                 environment (needs only $(PYTHON) with pip: no .venv, no torch; README "Install")
#   make test-fast -- the test suite without the tests marked slow
#   make gpu-wheels -- downloads into .device-wheels/ the wheels a bare GPU machine (a torch image,
#                 Python 3.12, no network) needs: scripts/gpu_check.sh installs them (docs/reliability.md)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The data root: the shipped Omniglot configs read $(PML_RANK_DATA)/omniglot/*.zip, from any
# folder. In this repository that is ../shared/data; `make test PML_RANK_DATA=/data` (or the
# environment variable) points elsewhere. The demo's GlyphDataset is generated and needs no data.
PML_RANK_DATA ?= $(abspath ../shared/data)
export PML_RANK_DATA

.PHONY: demo test test-fast docs wheel lint format clean gpu-wheels

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/pml-rank compare configs/default.yaml --seeds 3 --jobs 2 --out runs/default

# --dist loadfile: each test module runs on one worker, so a module-scoped fixture (the docs
# site, the gpu_check report, a finished comparison, a killed tune) is built once. Not loadgroup:
# pytest-xdist 3.8 applies xdist_group by rewriting item._nodeid, which pytest 9.2 no longer
# reads (node ids live in item._id), so under pytest 9.2 loadgroup groups nothing.
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -q

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -q -m "not slow"

docs: $(STAMP)
	$(PY) -m sphinx -n -W -b html docs docs/_build/html

# pip builds the wheel in a fresh isolated environment holding only the build backend
# (setuptools, from pyproject's [build-system]); --no-deps: the runtime dependencies (torch, ...)
# are neither installed nor downloaded.
wheel:
	$(PYTHON) -m pip wheel --no-deps -w dist .

# PyPI only, --no-deps, for GPU_PYTHON (default 3.12, the device image's) manylinux x86_64
GPU_PYTHON ?= 3.12
gpu-wheels:
	PYTHON=$(PYTHON) scripts/gpu_wheels.sh --python-version $(GPU_PYTHON)

lint: $(STAMP)
	$(VENV)/bin/ruff check pml_rank_plugins tests benchmarks
	$(VENV)/bin/black --check pml_rank_plugins tests benchmarks
	$(VENV)/bin/isort --check-only pml_rank_plugins tests benchmarks

format: $(STAMP)
	$(VENV)/bin/isort pml_rank_plugins tests benchmarks
	$(VENV)/bin/black pml_rank_plugins tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache build dist
