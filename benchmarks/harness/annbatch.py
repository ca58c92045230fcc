"""annbatch's side of a comparison, run in a Python that has annbatch (>= 3.12, no torch; the project's
may be older): benchmarks/annbatch_side.py, in its own process."""

import json
import os
import subprocess

from .cli import BENCHMARKS, ROOT
from .machine import taskset

SIDE = os.path.join(BENCHMARKS, "annbatch_side.py")


def default_python():
    """The Makefile's annbatch venv (make bench makes it), else the one this VM's sessions used."""
    for candidate in (os.path.join(ROOT, ".venv-annbatch", "bin", "python"), "/work/venv313/bin/python"):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    return None


def status(python):
    """None where python imports annbatch, else why not (for the reports)."""
    if not python:
        return "not installed (needs a Python >= 3.12 with annbatch: --annbatch-python)"
    done = subprocess.run(
        [python, "-c", "import annbatch, importlib.metadata as m; print(m.version('annbatch'))"],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"not importable by {python}"


def write(python, h5ad, collection, dataset_size=None):
    """A DatasetCollection of the .h5ad by annbatch's add_adatas (its defaults)."""
    sizes = [] if dataset_size is None else ["--dataset-size", str(dataset_size)]
    subprocess.run([python, SIDE, "write", h5ad, collection] + sizes, check=True)


def read(python, collection, chunk_size, preload_nchunks, batch_size, seconds, cpu_list=None, endpoint=None):
    """annbatch's Loader over the collection for `seconds`: {rows, seconds, cpu_seconds, batches, zarrs}."""
    command = [python, SIDE, "read", collection, "--chunk-size", str(chunk_size)]
    command += ["--preload-nchunks", str(preload_nchunks), "--batch-size", str(batch_size), "--seconds", str(seconds)]
    if endpoint:
        command += ["--endpoint", endpoint]
    done = subprocess.run(taskset(cpu_list, command), check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
