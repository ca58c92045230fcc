"""Building the C++ programs the benchmarks run: decode_limit (the limits, in the project's build
directory with the library's flags) and iterate (a program using the installed CMake package)."""

import os
import shutil
import subprocess
import sys

from .cli import BENCHMARKS, ROOT


def build_decode_limit():
    """benchmarks/decode_limit.cpp, in build/native (configured by `make setup`); the environment's
    TORCH_SHARDS_DECODE_LIMIT names a program built already instead (build/native left alone)."""
    if os.environ.get("TORCH_SHARDS_DECODE_LIMIT"):
        return os.environ["TORCH_SHARDS_DECODE_LIMIT"]
    build = os.path.join(ROOT, "build", "native")
    subprocess.run(["cmake", "--build", build, "--target", "decode_limit"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(build, "decode_limit")


def build_iterate():
    """benchmarks/cpp/iterate.cpp through the CMake package (find_package(torch_shards)), in build/bench-cpp."""
    build = os.path.join(ROOT, "build", "bench-cpp")
    prefix = subprocess.run(
        [sys.executable, "-m", "torch_shards", "--cmake-prefix-path"], check=True, capture_output=True, text=True
    ).stdout.strip()
    configure = ["cmake", "-S", os.path.join(BENCHMARKS, "cpp"), "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}"]
    configure += ["-DCMAKE_BUILD_TYPE=Release"] + (["-G", "Ninja"] if shutil.which("ninja") else [])
    subprocess.run(configure, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build], check=True, capture_output=True)
    return os.path.join(build, "iterate")
