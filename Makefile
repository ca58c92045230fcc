# Everything the project needs, from a fresh Debian machine:
#   make demo   system packages + venv + torch + build, then a 2-rank torchrun DDP run on CPU
#   make test   the same setup, then lint, pytest and the GoogleTest suites

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
SYSTEM_PACKAGES := build-essential python3-dev pkg-config cmake ninja-build ccache clang-format libgtest-dev \
	libhdf5-dev libblosc-dev liblz4-dev libzstd-dev zlib1g-dev nlohmann-json3-dev libgloo-dev
PYTHON_PACKAGES := numpy pytest pytest-timeout scipy pandas h5py hdf5plugin anndata zarr ruff

# ccache's compiler links first: rebuilds only recompile what changed.
export PATH := /usr/lib/ccache:$(PATH)
export MAX_JOBS ?= $(shell nproc)

BENCH_PACKAGES := scdataset matplotlib

.PHONY: setup demo test system lint test-python test-cpp bench fixtures clean

system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		echo "installing system packages:" $$missing; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$missing; \
	fi

# torch is installed first and alone, so no later package can pull another build.
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q $(PYTHON_PACKAGES)
	# torchdata's StatefulDataLoader (checkpoint tests) and scdataset (its suite, ported, runs side by
	# side with ours): --no-deps, so they cannot pull another torch.
	$(PY) -m pip install -q --no-deps torchdata scdataset==0.3.0
	touch $@

setup: system $(VENV)/.installed
	$(PY) -m pip install -q --no-build-isolation -e .

demo: setup
	$(VENV)/bin/torchrun --standalone --nproc_per_node=2 examples/ddp_train.py

lint: setup
	$(VENV)/bin/ruff check torch_shards tests examples benchmarks setup.py
	$(VENV)/bin/ruff format --check torch_shards tests examples benchmarks setup.py
	clang-format --dry-run -Werror $$(find csrc include tests/cpp tests/cpp_package tests/fuzz/libfuzzer examples benchmarks -name '*.cpp' -o -name '*.h' | grep -v /build/)

test-python: setup
	$(PY) -m pytest -q tests

# The GoogleTest suites build in the same build directory as the library
# (build/native, configured by setup): nothing is compiled twice.
test-cpp: setup
	cmake -S . -B build/native -DTORCH_SHARDS_TESTS=ON
	cmake --build build/native
	ctest --test-dir build/native --output-on-failure

test: lint test-python test-cpp

# annbatch (and the newest anndata) need Python >= 3.12: its own venv, no torch, made from pyenv's
# newest CPython 3.12+ (NEW_PYTHON=/path/to/python3.12+ to choose), with zarrs' codec pipeline as
# annbatch documents.
NEW_PYTHON ?= $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python)))
ANNBATCH_VENV := .venv-annbatch
ANNBATCH_PYTHON ?= $(ANNBATCH_VENV)/bin/python
$(ANNBATCH_VENV)/.installed:
	@test -n "$(NEW_PYTHON)" || { echo "annbatch needs Python >= 3.12: pass NEW_PYTHON=/path/to/python"; exit 1; }
	$(NEW_PYTHON) -m venv $(ANNBATCH_VENV)
	$(ANNBATCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(ANNBATCH_VENV)/bin/python -m pip install -q annbatch zarrs anndata
	touch $@

# Side-by-side benchmarks (tables in benchmarks/results/, see the README). annbatch runs in its own
# Python (ANNBATCH_PYTHON, by default the venv above).
bench: setup $(if $(filter $(ANNBATCH_VENV)/%,$(ANNBATCH_PYTHON)),$(ANNBATCH_VENV)/.installed)
	$(PY) -m pip install -q $(BENCH_PACKAGES)
	$(PY) benchmarks/plan_throughput.py --json benchmarks/results/plan_throughput.json | tee benchmarks/results/plan_throughput.txt
	$(PY) benchmarks/storage_throughput.py | tee benchmarks/results/storage_throughput.txt
	$(PY) benchmarks/cpp_iteration.py
	$(PY) benchmarks/annbatch_format.py --annbatch-python $(ANNBATCH_PYTHON) | tee benchmarks/results/annbatch_format.txt

# The AnnData fixtures (tests/data/anndata): the script runs once per Python listed, each with its
# own anndata (the environments are in the script's docstring), e.g.
#   make fixtures FIXTURE_PYTHONS="/work/venv313/bin/python .venv/bin/python /work/venv-ad07/bin/python"
FIXTURE_PYTHONS ?= $(PY)
fixtures:
	for python in $(FIXTURE_PYTHONS); do $$python -W ignore tests/data/make_anndata_fixtures.py || exit 1; done

clean:
	rm -rf build $(VENV) $(ANNBATCH_VENV) torch_shards/lib torch_shards/include torch_shards/share torch_shards/_build_info.py *.egg-info

# Robustness (see README, Development): the GoogleTest suites and the libFuzzer
# targets built with AddressSanitizer + UndefinedBehaviorSanitizer (clang from
# Debian), and the fuzzing harness's long run against the reference libraries.
SANITIZE_PACKAGES := clang-14 libclang-rt-14-dev
SANITIZE_CXX ?= clang++-14
SANITIZE_BUILD := build/sanitize
FUZZ_CASES ?= 3400
FUZZ_SEED ?= 0

.PHONY: sanitize fuzz-long

sanitize: system $(VENV)/.installed
	@missing=$$(for p in $(SANITIZE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		echo "installing system packages:" $$missing; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$missing; \
	fi
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
		-DCMAKE_CXX_COMPILER=$(SANITIZE_CXX) -DTORCH_SHARDS_TESTS=ON -DTORCH_SHARDS_SANITIZE=ON
	cmake --build $(SANITIZE_BUILD) --target core_tests io_tests fuzz_codecs fuzz_zarr fuzz_hdf5_format
	UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir $(SANITIZE_BUILD) --output-on-failure

fuzz-long: setup
	mkdir -p build
	$(PY) tests/fuzz/run.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --report build/fuzz-report.json
