"""What this installation is and runs with: `python -m torch_shards info` prints it for bug reports."""

import json
import platform
import sys

import torch

from . import _build_info
from ._library import LIBRARY_PATH, ops


def build_info():
    """A dict describing this torch_shards: the native library's own account (torch_shards::build_info():
    version, the torch it was compiled against, whether HDF5/c-blosc/lz4/zstd/zlib/libaec are bundled, each
    library's version and the file it was loaded from, the compiler, the CPU features detected) plus the
    torch, Python and platform running it.

    ``python -m torch_shards info`` prints it; paste it into bug reports.

    Returns:
        dict: ``version``, ``torch``, ``bundled_dependencies``, ``libraries``, ``compiler``, ``cpu``,
        ``url_reader``, ``library`` (the path of the native library), ``torch_built_against`` and
        ``running`` (``torch``, ``torch_cuda``, ``torch_cpu_capability``, ``python``, ``platform``).
    """
    info = json.loads(ops.build_info())
    info["library"] = LIBRARY_PATH
    info["torch_built_against"] = _build_info.TORCH_VERSION
    info["running"] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    return info


def format_info(info):
    """build_info() as the lines `python -m torch_shards info` prints."""
    running = info["running"]
    lines = [
        f"torch_shards {info['version']}  ({info['library']})",
        f"built against torch {info['torch_built_against']} with {info['compiler']}",
        f"running torch {running['torch']} (CUDA {running['torch_cuda'] or 'none'}, "
        f"CPU capability {running['torch_cpu_capability']}), Python {running['python']}, {running['platform']}",
        "libraries: " + ("bundled in the library" if info["bundled_dependencies"] else "the system's"),
    ]
    for library in info["libraries"]:
        detail = f"; {library['detail']}" if library["detail"] else ""
        lines.append(f"  {library['name']:<6} {library['version']:<10} {library['location']}{detail}")
    lines.append(f"URLs read with: {info['url_reader']}")
    cpu = info["cpu"]
    lines.append(f"cpu: {cpu['architecture']}, {' '.join(cpu['features']) or 'no vector extensions detected'}")
    return "\n".join(lines)
