"""Loads the native library once and checks it was built for this torch."""

import os

import torch

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(PACKAGE_DIR, "lib", "libtorch_shards.so")


def _load():
    try:
        from ._build_info import TORCH_VERSION
    except ImportError as error:
        raise ImportError(
            "torch_shards is not built: run `pip install --no-build-isolation .` in the source tree"
        ) from error
    built = TORCH_VERSION.split("+")[0].split(".")[:2]
    running = torch.__version__.split("+")[0].split(".")[:2]
    if built != running:
        raise ImportError(
            f"torch_shards was built against torch {TORCH_VERSION} but torch {torch.__version__} is "
            "installed: rebuild with `pip install --no-build-isolation .`"
        )
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(f"torch_shards: the native library {LIBRARY_PATH} is missing; rebuild the package")
    torch.ops.load_library(LIBRARY_PATH)


def _load_module():
    """torch_shards._C: the Python door's per-batch calls (csrc/python/module.cpp), past torch.classes."""
    try:
        from . import _C
    except ImportError as error:
        raise ImportError(
            f"torch_shards: its extension module torch_shards._C does not load ({error}); rebuild the package "
            "with `pip install --no-build-isolation .`"
        ) from error
    return _C


_load()
ops = torch.ops.torch_shards
classes = torch.classes.torch_shards
direct = _load_module()
