"""Loads the native library once and checks it was built for this torch."""

import glob
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


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
    candidates = sorted(glob.glob(os.path.join(_HERE, "_C*.so")))
    if not candidates:
        raise ImportError(f"torch_shards: the native library _C*.so is missing from {_HERE}; rebuild the package")
    torch.ops.load_library(candidates[0])
    return candidates[0]


LIBRARY_PATH = _load()
ops = torch.ops.torch_shards
classes = torch.classes.torch_shards
