# Two entry points for a fresh machine (see README.md):
#   make demo  -- builds .venv, then runs the main job on the embedded GlyphDataset
#   make test  -- builds .venv, then runs the test suite
#   make docs  -- builds the Sphinx site into docs/_build/html (warnings are errors)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test docs lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/pml-rank compare configs/default.yaml --seeds 3 --jobs 2 --out runs/default

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

docs: $(STAMP)
	$(PY) -m sphinx -W -b html docs docs/_build/html

lint: $(STAMP)
	$(VENV)/bin/ruff check pml_rank_plugins tests benchmarks
	$(VENV)/bin/black --check pml_rank_plugins tests benchmarks
	$(VENV)/bin/isort --check-only pml_rank_plugins tests benchmarks

format: $(STAMP)
	$(VENV)/bin/isort pml_rank_plugins tests benchmarks
	$(VENV)/bin/black pml_rank_plugins tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
