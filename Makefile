# Two commands do all set-up on a fresh machine with python3 and make:
#   make demo   generate sample photos, pack them, read them back, compare loose files with shards
#   make test   run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml setup.py stoker/loader/_jpeg_region.c stoker/pack/_jpeg_restart.c stoker/_jpeg_strict.h
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: a CPU build installs quickly here; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py --out demo-data

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo-data .pytest_cache
