"""Loads the native library once and checks it was built for this torch."""

import os

import torch

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(PACKAGE_DIR, "lib", "libtorch_shards.so")
"""The path of the native library (libtorch_shards.so) this package loads, e.g. for
``torch.ops.load_library`` in a process that runs saved TorchScript without importing torch_shards."""


def _release(version):
    """'2.13.0+cpu' -> '2.13': torch's C++ ABI holds within a release, not across releases."""
    return ".".join(version.split("+")[0].split(".")[:2])


def check_torch(built_version, built_cuda, running_version, running_cuda):
    """The ImportError to raise when this build cannot run with the torch installed, else None."""
    built, running = _release(built_version), _release(running_version)
    if built != running:
        return ImportError(
            f"torch_shards was built for torch {built} (built against {built_version}) but torch {running_version} "
            f"is installed; torch's C++ ABI changes between releases. Either install the torch it was built for "
            f"(pip install 'torch=={built}.*'), or a torch_shards wheel built for torch {running} (in the source "
            f"tree: make wheel TORCH=torch=={running_version.split('+')[0]}), or build it from source against this "
            f"torch (pip install --no-build-isolation <source tree or sdist>)"
        )
    if built_cuda is not None and running_cuda is None:
        return ImportError(
            f"torch_shards was built against a CUDA build of torch ({built_version}, CUDA {built_cuda}) but this "
            f"torch ({running_version}) has no CUDA: install a CUDA build of torch {built}, or a torch_shards built "
            "against this torch"
        )
    return None


def _load():
    try:
        from . import _build_info
    except ImportError as error:
        raise ImportError(
            "torch_shards is not built: run `pip install --no-build-isolation .` in the source tree"
        ) from error
    problem = check_torch(
        _build_info.TORCH_VERSION, getattr(_build_info, "TORCH_CUDA", None), torch.__version__, torch.version.cuda
    )
    if problem is not None:
        raise problem
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
