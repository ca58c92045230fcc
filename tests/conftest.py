import collections
import os
import shutil
import subprocess
import sys

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from torch.utils.data import DataLoader

import torch_shards as ts

# Nothing a test starts asks EC2's instance metadata service (169.254.169.254) for credentials: the
# tests that read it set AWS_EC2_METADATA_SERVICE_ENDPOINT to a server of their own on loopback.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

# With pandas 3 an AnnData's default index is a pandas StringArray, which anndata 0.11-0.12 writes
# only when asked (0.13 writes it by default): the tests' files are written as users' are.
if hasattr(ad.settings, "allow_write_nullable_strings"):
    ad.settings.allow_write_nullable_strings = True

# Every dtype the sources read, in native byte order.
DTYPES = [
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bool",
    "complex64",
    "complex128",
]


def make_strategy(name, num_rows, block_size=3):
    """One instance of each strategy, over a source of num_rows rows."""
    if name == "Streaming":
        return ts.Streaming()
    if name == "StreamingShuffle":
        return ts.Streaming(shuffle=True)
    if name == "BlockShuffling":
        return ts.BlockShuffling(block_size=block_size)
    if name == "BlockWeightedSampling":
        weights = torch.arange(num_rows, dtype=torch.float64) % 5 + 0.5
        return ts.BlockWeightedSampling(weights, total_size=num_rows + 3, block_size=block_size)
    if name == "ClassBalancedSampling":
        labels = torch.arange(num_rows) % 3
        return ts.ClassBalancedSampling(labels, block_size=block_size)
    raise ValueError(name)


STRATEGIES = ["Streaming", "StreamingShuffle", "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling"]


def rows_source(num_rows):
    """A source whose field "X" holds each row's own index, to audit reads."""
    return ts.TensorSource({"X": torch.arange(num_rows, dtype=torch.int64) * 10})


def read_rank(dataset, num_workers, **loader_kwargs):
    """Every batch one rank yields through a real DataLoader, as (worker-order) list."""
    if num_workers == 0:
        loader_kwargs.pop("multiprocessing_context", None)
        loader_kwargs.pop("persistent_workers", None)
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, **loader_kwargs)
    return [batch["index"].tolist() for batch in loader]


def read_rank_by_workers(dataset, num_workers, epoch):
    """What the DataLoader workers of one rank deliver in one epoch, without
    processes: worker w of K runs the same native reader a worker would."""
    workers = max(num_workers, 1)
    batches = []
    for worker in range(workers):
        iterator = dataset.native.iter_epoch(epoch, worker, workers)
        for batch in iter(iterator.next, None):
            batches.append(batch["index"].tolist())
    return batches


def global_batches(dataset, epoch):
    """The epoch's global batches, computed from the fetches (drop_last applied)."""
    native = dataset.native
    batches = []
    for fetch in range(
        (native.plan_size() + dataset.batch_size * dataset.fetch_factor - 1)
        // (dataset.batch_size * dataset.fetch_factor)
    ):
        rows = native.fetch_rows(epoch, fetch).tolist()
        for start in range(0, len(rows), dataset.batch_size):
            batch = rows[start : start + dataset.batch_size]
            if dataset.drop_last and len(batch) < dataset.batch_size:
                continue
            batches.append(batch)
    return batches


def multiset(batches):
    return collections.Counter(tuple(batch) for batch in batches)


def values_of(dtype, shape, seed=0):
    """Random values covering a dtype's whole range (bool, complex, float, int)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype.newbyteorder("="), endpoint=True).astype(dtype)


# ---- AnnData files with every kind of per-cell element (AnnDataSource(fields=...)) ----------------

# Field name -> element of the files per_cell_anndata writes: CSR and dense layers, obsm dense (2-D and
# 3-D) and CSR, obsp CSR and dense, raw/X (with more columns than X).
PER_CELL_FIELDS = {
    "counts": "layers/counts",
    "scaled": "layers/scaled",
    "pca": "obsm/X_pca",
    "cube": "obsm/cube",
    "topics": "obsm/topics",
    "connectivities": "obsp/connectivities",
    "distances": "obsp/distances",
    "raw": "raw/X",
}
# The ones whose row shape does not depend on the number of cells (obsp's does): parts of a Collection.
PER_CELL_FIELDS_ACROSS_FILES = {name: element for name, element in PER_CELL_FIELDS.items() if "obsp" not in element}


def per_cell_anndata(n_obs, seed, n_vars=11):
    """An AnnData holding every kind of element in PER_CELL_FIELDS, a categorical obs column
    (cell_type, the same categories in every file) and a nullable one (age)."""
    rng = np.random.default_rng(seed)
    x = sp.random(n_obs, n_vars, density=0.3, format="csr", dtype=np.float32, random_state=rng)
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["T", "B", "NK"], size=n_obs), categories=["T", "B", "NK"]),
            "age": pd.array([None if i % 7 == 3 else i for i in range(n_obs)], dtype="Int64"),
        },
        index=[f"s{seed}c{i}" for i in range(n_obs)],
    )
    adata = ad.AnnData(x, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(n_vars)]))
    adata.layers["counts"] = sp.csr_matrix(rng.poisson(0.7, (n_obs, n_vars)).astype(np.int64))
    adata.layers["scaled"] = rng.standard_normal((n_obs, n_vars))
    adata.obsm["X_pca"] = rng.standard_normal((n_obs, 5)).astype(np.float32)
    adata.obsm["cube"] = rng.integers(-100, 100, (n_obs, 2, 3)).astype(np.int16)
    adata.obsm["topics"] = sp.random(n_obs, 4, density=0.4, format="csr", dtype=np.float32, random_state=rng)
    adata.obsp["connectivities"] = sp.random(n_obs, n_obs, density=0.2, format="csr", random_state=rng)
    adata.obsp["distances"] = rng.random((n_obs, n_obs)).astype(np.float32)
    raw_x = sp.random(n_obs, n_vars + 3, density=0.3, format="csr", dtype=np.float32, random_state=rng)
    adata.raw = ad.AnnData(raw_x, obs=obs[[]], var=pd.DataFrame(index=[f"r{j}" for j in range(n_vars + 3)]))
    return adata


def expected_tensor(array):
    """The tensor torch_shards reads for a numpy array: native byte order, contiguous."""
    native = array.astype(array.dtype.newbyteorder("="))
    return torch.from_numpy(np.ascontiguousarray(native))


def decoded(codes, categories):
    """Codes of a categorical or string obs column as their values (None: missing)."""
    return [categories[code] if code >= 0 else None for code in codes.tolist()]


# The obs columns random_anndata writes, one of each encoding torch_shards reads.
RANDOM_OBS_COLUMNS = ["category", "integer", "float", "boolean", "string", "nullable_integer", "nullable_boolean"]


def random_anndata(rng, n_obs):
    """An AnnData of random sizes and kinds (seeded by rng): X dense or CSR of a random dtype and density
    (rows without entries at both ends, explicit zeros or not), a CSR or dense layer, an obsm array, and
    obs columns of every encoding torch_shards reads, with missing values."""
    values = np.random.default_rng(rng.randrange(1 << 30))
    n_vars = rng.choice([1, 3, 50, 200])
    x = sp.random(n_obs, n_vars, density=rng.choice([0.0, 0.01, 0.1, 0.5, 1.0]), format="csr", random_state=values)
    x = (x * 100).astype(rng.choice([np.float32, np.float64, np.int32, np.int64, np.int8]))
    if rng.random() < 0.3:
        x = sp.vstack([sp.csr_matrix((1, n_vars), dtype=x.dtype), x[1:-1], sp.csr_matrix((1, n_vars), dtype=x.dtype)])
        x = x.tocsr()[:n_obs]
    elif rng.random() < 0.5:
        x.eliminate_zeros()
    categories = ["a", "b", "c", "d"][: rng.randint(1, 4)]
    obs = pd.DataFrame(
        {
            "category": pd.Categorical(values.choice(categories + [None], size=n_obs), categories=categories),
            "integer": values.integers(-5, 5, n_obs),
            "float": values.standard_normal(n_obs).astype(np.float32),
            "boolean": values.random(n_obs) > 0.5,
            "string": pd.array(values.choice(["x", "yy", "zzz", "é"], size=n_obs), dtype=object),
            "nullable_integer": pd.array([None if v < 0.2 else int(v * 10) for v in values.random(n_obs)], "Int32"),
            "nullable_boolean": pd.array([None if v < 0.2 else bool(v > 0.6) for v in values.random(n_obs)], "boolean"),
        },
        index=[f"cell{i}" for i in range(n_obs)],
    )
    adata = ad.AnnData(X=x.toarray() if rng.random() < 0.3 else x, obs=obs)
    adata.layers["counts"] = x.copy() if rng.random() < 0.5 else x.toarray()
    adata.obsm["pca"] = values.standard_normal((n_obs, rng.choice([1, 2, 5]))).astype(np.float32)
    return adata


def write_anndata(adata, path):
    """Writes adata at path: .h5ad, or a zarr store (zarr v2 for *.zarr2.zarr, else v3)."""
    path = str(path)
    if path.endswith(".h5ad"):
        adata.write_h5ad(path)
    else:
        with ad.settings.override(zarr_write_format=2 if path.endswith(".zarr2.zarr") else 3):
            adata.write_zarr(path)
    return path


def read_anndata(path):
    path = str(path)
    return ad.read_h5ad(path) if path.endswith(".h5ad") else ad.read_zarr(path)


def element_of(adata, element):
    """What anndata reads for an element path, as a dense numpy array (one row per cell)."""
    if element == "X":
        value = adata.X
    elif element == "raw/X":
        value = adata.raw.X
    else:
        group, name = element.split("/")
        value = getattr(adata, group)[name]
    return value.toarray() if sp.issparse(value) else np.asarray(value)


def assert_field_rows(batch, name, expected, rows):
    """batch[name] (dense, or a sparse CSR tensor) holds rows `rows` of `expected` (numpy), exactly."""
    got = batch[name]
    if got.layout == torch.sparse_csr:
        got = got.to_dense()
    want = torch.from_numpy(np.ascontiguousarray(expected[np.asarray(rows, dtype=np.int64)]))
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert torch.equal(got, want), name


def cmake_build(source_dir, build_dir, python=sys.executable):
    """Configures and builds a C++ project that finds TorchShards through `python`'s installed package."""
    prefix = subprocess.run(
        [python, "-m", "torch_shards", "--cmake-prefix-path"], check=True, capture_output=True, text=True, cwd="/"
    ).stdout.strip()
    configure = ["cmake", "-S", source_dir, "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={prefix}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    for command in (configure, ["cmake", "--build", str(build_dir), "--parallel", str(os.cpu_count() or 1)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return prefix
