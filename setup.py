"""Builds torch_shards._C, the native library, against the installed torch.

    pip install --no-build-isolation .        (or -e . for development)

The library registers torch.classes.torch_shards.* and torch.ops.torch_shards.*
and is loaded with torch.ops.load_library, so it carries no pybind module.
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    sys.exit(
        "torch_shards builds against an installed torch: install it first "
        "(python3 -m pip install torch==2.13.0), then "
        "pip install --no-build-isolation ."
    )

HERE = os.path.dirname(os.path.abspath(__file__))


def native_sources():
    return sorted(
        os.path.relpath(path, HERE) for path in glob.glob(os.path.join(HERE, "csrc", "**", "*.cpp"), recursive=True)
    )


# pkg-config name -> (a header that proves it is installed, the Debian package providing it)
SYSTEM_LIBRARIES = {
    "hdf5": ("hdf5.h", "libhdf5-dev"),
    "blosc": ("blosc.h", "libblosc-dev"),
    "libzstd": ("zstd.h", "libzstd-dev"),
    "zlib": ("zlib.h", "zlib1g-dev"),
    "nlohmann_json": ("nlohmann/json.hpp", "nlohmann-json3-dev"),
}


def pkg_config(name, flag):
    if shutil.which("pkg-config") is None:
        return None
    done = subprocess.run(["pkg-config", flag, name], capture_output=True, text=True)
    return done.stdout.split() if done.returncode == 0 else None


def system_library_flags():
    """Include dirs, library dirs and libraries of the C libraries the readers use;
    stops with the Debian package to install when one is missing."""
    include_dirs, library_dirs, libraries, missing = [], [], [], []
    for name, (header, package) in SYSTEM_LIBRARIES.items():
        cflags, libs = pkg_config(name, "--cflags"), pkg_config(name, "--libs")
        if cflags is None or libs is None:
            missing.append(f"{name} ({header}): apt-get install {package}")
            continue
        include_dirs += [flag[2:] for flag in cflags if flag.startswith("-I")]
        library_dirs += [flag[2:] for flag in libs if flag.startswith("-L")]
        libraries += [flag[2:] for flag in libs if flag.startswith("-l")]
    if missing:
        sys.exit("torch_shards needs these system libraries to build:\n  " + "\n  ".join(missing))
    return sorted(set(include_dirs)), sorted(set(library_dirs)), libraries


def write_build_info():
    # Checked at import: a library built against another torch fails with a clear message.
    with open(os.path.join(HERE, "torch_shards", "_build_info.py"), "w") as out:
        out.write(f'TORCH_VERSION = "{torch.__version__}"\n')


write_build_info()

include_dirs, library_dirs, libraries = system_library_flags()
extension = CppExtension(
    "torch_shards._C",
    native_sources(),
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    libraries=libraries + ["dl"],  # dlsym (python_gil.cpp); part of libc from glibc 2.34 on
    extra_compile_args={
        # No FMA contraction: plans must be bit-identical on every platform.
        "cxx": ["-O3", "-Wall", "-Wno-unused-parameter", "-fvisibility=hidden", "-ffp-contract=off"]
    },
)

setup(
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
