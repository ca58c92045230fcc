"""The data files the benchmarks read, written once and kept: a CSR .h5ad (anndata's layout), a dense
HDF5 dataset, an annbatch collection of the .h5ad; warming them into the page cache; where they live."""

import os
import shutil
import tempfile

from . import annbatch
from .cli import DATA

COLUMNS = 2000
DENSITY = 0.05


def write_csr_h5ad(path, rows, seed=0):
    """AnnData, X CSR float32, rows x 2000, ~5% non-zeros in [0, 10), int32 indices."""
    import anndata as ad
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    pieces = []
    for start in range(0, rows, 20_000):
        count = min(20_000, rows - start)
        mask = rng.random((count, COLUMNS), dtype=np.float32) < DENSITY
        values = rng.random(int(mask.sum()), dtype=np.float32) * 10
        row, col = np.nonzero(mask)
        pieces.append(sp.csr_matrix((values, (row, col)), shape=(count, COLUMNS), dtype=np.float32))
    matrix = sp.vstack(pieces, format="csr")
    matrix.indices = matrix.indices.astype(np.int32)
    ad.AnnData(X=matrix).write_h5ad(path)


def write_dense_h5(path, rows, seed=0):
    """One float32 dataset X, rows x 2000, contiguous, standard normal values."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        dataset = f.create_dataset("X", shape=(rows, COLUMNS), dtype="f4")
        for start in range(0, rows, 20_000):
            count = min(20_000, rows - start)
            dataset[start : start + count] = rng.standard_normal((count, COLUMNS), dtype=np.float32)


def sparse_rows(rows, columns, per_row, seed=0):
    """A CSR matrix with per_row values in each row, at increasing columns spread over the width
    (scipy.sparse.random takes minutes at this size)."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    stride = columns // per_row
    indices = (np.arange(per_row) * stride + rng.integers(0, stride, size=(rows, per_row))).astype(np.int32)
    values = rng.standard_normal(rows * per_row, dtype=np.float32)
    indptr = np.arange(rows + 1, dtype=np.int64) * per_row
    return sp.csr_matrix((values, indices.ravel(), indptr), shape=(rows, columns))


def ensure(path, write, rows):
    """path, written by write(path, rows) unless it exists (through PATH.partial: an interrupted run leaves
    no half file behind)."""
    if not os.path.exists(path):
        print(f"writing {path} ...", flush=True)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write(path + ".partial", rows)
        os.replace(path + ".partial", path)
    return path


def csr_h5ad(data_dir, rows, name=None):
    return ensure(os.path.join(data_dir, name or f"csr_{rows}.h5ad"), write_csr_h5ad, rows)


def dense_h5(data_dir, rows):
    return ensure(os.path.join(data_dir, f"dense_{rows}.h5"), write_dense_h5, rows)


def memory_dir(needed_bytes=6 << 30, name="torch_shards_benchmark"):
    """/dev/shm/<name> when /dev/shm has room (files there stay in memory: the page cache holding them
    is not reclaimed between measurements), else benchmarks/data."""
    shm = "/dev/shm"
    if os.path.isdir(shm):
        stats = os.statvfs(shm)
        if stats.f_bavail * stats.f_frsize > needed_bytes:
            return os.path.join(shm, name)
    return DATA


def shm_or_tmp():
    """/dev/shm where it is writable, else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def scratch_dir(bytes_needed, prefix):
    """A new directory in /dev/shm when it has room for 3x bytes_needed, else in the temporary directory."""
    try:
        stat = os.statvfs("/dev/shm")
        if stat.f_bavail * stat.f_frsize > 3 * bytes_needed:
            return tempfile.mkdtemp(prefix=prefix, dir="/dev/shm")
    except OSError:
        pass
    return tempfile.mkdtemp(prefix=prefix)


def datasets_suffix(datasets):
    """Of the collection's and the results' names: "" for annbatch's default, one dataset here."""
    return "" if datasets == 1 else f"_{datasets}_datasets"


def annbatch_collection(data_dir, rows, datasets, annbatch_python):
    """The annbatch collection of csr_<rows>.h5ad (annbatch's add_adatas, its defaults; cut into `datasets`
    datasets), written by annbatch's Python unless it exists; None where it does not and annbatch_python
    is None."""
    collection = os.path.join(data_dir, f"annbatch_{rows}{datasets_suffix(datasets)}.zarr")
    if os.path.exists(os.path.join(collection, "zarr.json")):
        return collection
    if not annbatch_python:
        return None
    h5ad = csr_h5ad(data_dir, rows)
    print(f"writing {collection} with annbatch's add_adatas ...", flush=True)
    shutil.rmtree(collection, ignore_errors=True)
    annbatch.write(annbatch_python, h5ad, collection, None if datasets == 1 else -(-rows // datasets))
    return collection
