"""Builds torch_shards' native library with the project's CMake build, against the installed torch.

    pip install --no-build-isolation .        (or -e . for development)
    make wheel                                (the binary wheel: see below)

CMakeLists.txt is the one build description of the native code; this file
only drives it: configure (once) in build/native, build the library, and
install it into the package, which then holds

    torch_shards/lib/libtorch_shards.so          loaded by Python (torch.ops.load_library)
    torch_shards/_C.<abi>.so                     the Python door's per-batch calls (csrc/python)
    torch_shards/include/torch_shards/*.h        the C++ API
    torch_shards/share/cmake/TorchShards/        find_package(TorchShards) for C++ programs

The source build links the system's HDF5, c-blosc, lz4, zstd and zlib (their Debian -dev packages);
with TORCH_SHARDS_BUNDLED_DEPENDENCIES=1 (make wheel) CMake builds them from source and links them
into the library instead, and the installed libraries are stripped. The package requires the torch
release it was built against (torch==X.Y.*): torch's C++ ABI changes between releases.

TORCH_SHARDS_BUILD_DIR moves the CMake build directory (default build/native);
TORCH_SHARDS_CMAKE_ARGS adds arguments to the configure step.
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    import torch
except ImportError:
    sys.exit(
        "torch_shards builds against an installed torch: install it first "
        "(python3 -m pip install torch==2.13.0), then "
        "pip install --no-build-isolation ."
    )

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.path.abspath(os.environ.get("TORCH_SHARDS_BUILD_DIR") or os.path.join(HERE, "build", "native"))
BUNDLED = os.environ.get("TORCH_SHARDS_BUNDLED_DEPENDENCIES", "0") not in ("", "0", "OFF", "off")
TORCH_RELEASE = ".".join(torch.__version__.split("+")[0].split(".")[:2])

# pkg-config name -> (a header that proves it is installed, the Debian package providing it)
SYSTEM_LIBRARIES = {
    "hdf5": ("hdf5.h", "libhdf5-dev"),
    "blosc": ("blosc.h", "libblosc-dev"),
    "liblz4": ("lz4.h", "liblz4-dev"),
    "libzstd": ("zstd.h", "libzstd-dev"),
    "zlib": ("zlib.h", "zlib1g-dev"),
    "nlohmann_json": ("nlohmann/json.hpp", "nlohmann-json3-dev"),
}
# What the wheel's build takes from the system: the JSON headers, and libaec's archives (no pkg-config
# file: cmake/BundledDependencies.cmake names its package); CMake builds the rest.
BUNDLED_BUILD_LIBRARIES = {"nlohmann_json": SYSTEM_LIBRARIES["nlohmann_json"]}
TOOLS = {"cmake": "cmake", "ninja": "ninja-build", "pkg-config": "pkg-config"}


def check_prerequisites():
    """Stops with the Debian packages to install when a build tool or library is missing."""
    missing = [f"{tool}: apt-get install {package}" for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if shutil.which("pkg-config") is not None:
        for name, (header, package) in (BUNDLED_BUILD_LIBRARIES if BUNDLED else SYSTEM_LIBRARIES).items():
            if subprocess.run(["pkg-config", "--exists", name]).returncode != 0:
                missing.append(f"{name} ({header}): apt-get install {package}")
    # torch_shards._C (csrc/python) builds against this Python's headers.
    python_header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.exists(python_header):
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        missing.append(f"{python_header} (this Python's headers): apt-get install python{version}-dev")
    if missing:
        sys.exit("torch_shards needs these to build:\n  " + "\n  ".join(missing))


def run(command):
    print(" ".join(shlex.quote(part) for part in command), flush=True)
    subprocess.run(command, check=True)


class CMakeBuild(build_ext):
    """Builds the library once in build/native and installs it into the package
    (build_lib for a wheel, the source tree for an editable install)."""

    def build_extension(self, ext):
        check_prerequisites()
        configure = [
            "cmake",
            "-S",
            HERE,
            "-B",
            BUILD_DIR,
            "-G",
            "Ninja",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            "-DTORCH_SHARDS_PYTHON=ON",
            f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        if "CMAKE_BUILD_TYPE" not in os.environ.get("TORCH_SHARDS_CMAKE_ARGS", ""):
            configure.append("-DCMAKE_BUILD_TYPE=Release")
        if shutil.which("ccache"):  # rebuilds only recompile what changed
            configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        configure.append(f"-DTORCH_SHARDS_BUNDLED_DEPENDENCIES={'ON' if BUNDLED else 'OFF'}")
        configure += shlex.split(os.environ.get("TORCH_SHARDS_CMAKE_ARGS", ""))
        run(configure)
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        run(["cmake", "--build", BUILD_DIR, "--target", "torch_shards", "torch_shards_python", "--parallel", jobs])
        if not self.editable_mode and not self.inplace:
            self.install_into(os.path.join(self.build_lib, "torch_shards"))

    def copy_extensions_to_source(self):
        # Editable install: the package is the source tree.
        self.install_into(os.path.join(HERE, "torch_shards"))

    def install_into(self, package_dir):
        # A wheel's libraries are stripped; an editable install keeps the build's symbols.
        strip = [] if self.editable_mode or self.inplace else ["--strip"]
        run(["cmake", "--install", BUILD_DIR, "--prefix", package_dir, *strip])
        # Checked at import: a library built against another torch fails with a clear message.
        with open(os.path.join(package_dir, "_build_info.py"), "w") as out:
            out.write(f"TORCH_VERSION = {torch.__version__!r}\n")
            out.write(f"TORCH_CUDA = {torch.version.cuda!r}\n")

    def get_outputs(self):
        return []

    def get_output_mapping(self):
        return {}


setup(
    # torch's C++ ABI (custom classes, c10) changes between releases: the release built against, exactly.
    install_requires=[f"torch=={TORCH_RELEASE}.*", "numpy"],
    ext_modules=[Extension("torch_shards._native", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
