"""Builds torch_shards._C, the native library, against the installed torch.

    pip install --no-build-isolation .        (or -e . for development)

The library registers torch.classes.torch_shards.* and torch.ops.torch_shards.*
and is loaded with torch.ops.load_library, so it carries no pybind module.
"""

import glob
import os
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


def write_build_info():
    # Checked at import: a library built against another torch fails with a clear message.
    with open(os.path.join(HERE, "torch_shards", "_build_info.py"), "w") as out:
        out.write(f'TORCH_VERSION = "{torch.__version__}"\n')


write_build_info()

extension = CppExtension(
    "torch_shards._C",
    native_sources(),
    extra_compile_args={
        # No FMA contraction: plans must be bit-identical on every platform.
        "cxx": ["-O3", "-Wall", "-Wno-unused-parameter", "-fvisibility=hidden", "-ffp-contract=off"]
    },
)

setup(
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
