# Two commands do all set-up on a fresh machine with python3 and make:
#   make demo   sample photos, stoker doctor, pack, then one torchvision pipeline through a DataLoader and stoker.Loader
#   make test   run the test suite (the torchvision tests in .venv-tv)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A second venv with torchvision, for what needs it: the tests of Loader(transform=<torchvision pipeline>)
# against torchvision itself, and the demo. Its torch is pinned with torchvision (0.29.1 needs 2.14.1).
TV_VENV := .venv-tv
TV_BIN := $(TV_VENV)/bin
TV_STAMP := $(TV_VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml setup.py stoker/loader/_jpeg_region.c
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: a CPU build installs quickly here; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

$(TV_STAMP): pyproject.toml setup.py stoker/loader/_jpeg_region.c
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(TV_BIN)/pip install --quiet -e '.[test]'
	touch $(TV_STAMP)

demo: $(TV_STAMP)
	$(TV_BIN)/python examples/demo.py --out demo-data

test: $(STAMP) $(TV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q
	$(TV_BIN)/python -m pytest -q -m torchvision

clean:
	rm -rf $(VENV) $(TV_VENV) demo-data .pytest_cache
