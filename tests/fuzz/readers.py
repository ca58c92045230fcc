"""The two readers the harness compares: torch_shards, and the reference
library that wrote the seed (h5py, anndata, zarr). Both return the same
canonical result, so results compare with `same_result`:

  {"rows": N, "read": [row, ...],              rows read (all, or both ends of a huge array)
   "fields": {name: {"dtype": str, "shape": [...], "values": ndarray}}   dense rows read, in row order
   "csr": {"lengths": ndarray, "indices": ndarray, "data": ndarray, "dtype": str, "columns": int}
   "names": {"obs": [...], "var": [...], "categories/<column>": [...]}}

Rows read: every row when there are at most MAX_ROWS (seeds have <= 64),
else the first and last MAX_ROWS // 2: a mutated shape may claim 2**60 rows,
which neither reader could read whole.
"""

import os

import numpy as np

MAX_ROWS = 4096
BATCH = 37  # rows per torch_shards read: batches straddle chunk boundaries


def preload():
    """Imports both readers' libraries (children forked afterwards share them)."""
    import anndata  # noqa: F401
    import h5py  # noqa: F401
    import hdf5plugin  # noqa: F401
    import scipy.sparse  # noqa: F401
    import torch  # noqa: F401
    import zarr  # noqa: F401

    import torch_shards  # noqa: F401


def rows_to_read(num_rows):
    if num_rows <= MAX_ROWS:
        return np.arange(num_rows, dtype=np.int64)
    half = MAX_ROWS // 2
    return np.concatenate([np.arange(half), np.arange(num_rows - half, num_rows)]).astype(np.int64)


def _native(array):
    array = np.asarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array)


def _dense_field(values):
    values = _native(values)
    return {"dtype": values.dtype.str, "shape": list(values.shape[1:]), "values": values}


def _split_csr(indptr, indices, data, rows):
    starts, ends = indptr[rows], indptr[rows + 1]
    lengths = (ends - starts).astype(np.int64)
    take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(rows) else np.array([], np.int64)
    take = take.astype(np.int64)
    return lengths, _native(indices[take]).astype(np.int64), _native(data[take])


# ---------------------------------------------------------------- torch_shards


def _permuted_batches(rows, rng):
    order = rng.permutation(len(rows))
    for start in range(0, len(rows), BATCH):
        yield order[start : start + BATCH]


def read_ours(seed, path, rng):
    """Reads every row of the mutated file with torch_shards."""
    import torch_shards as ts

    kind = seed["kind"]
    if kind == "hdf5":
        source = ts.HDF5Source(path, seed["fields"])
    elif kind == "zarr":
        source = ts.ZarrSource(path, seed["fields"])
    else:
        source = ts.AnnDataSource(path, obs=seed["obs"])
    num_rows = len(source)
    rows = rows_to_read(num_rows)
    dense, csr_parts = {}, {}
    for positions in _permuted_batches(rows, rng):
        batch = source.read(rows[positions], num_threads=2)
        for name, tensor in batch.items():
            if name == "index":
                continue
            if tensor.layout == torch_sparse_csr():
                crow = tensor.crow_indices().numpy().astype(np.int64)
                columns = tensor.col_indices().numpy().astype(np.int64)
                values = tensor.values().numpy()
                for i, position in enumerate(positions):
                    csr_parts[int(position)] = (columns[crow[i] : crow[i + 1]], values[crow[i] : crow[i + 1]])
                csr_meta = (tensor.shape[1], values.dtype.str)
                continue
            array = tensor.numpy()
            if name not in dense:
                dense[name] = np.empty((len(rows),) + array.shape[1:], dtype=array.dtype)
            dense[name][positions] = array
    result = {"rows": num_rows, "read": rows.tolist(), "fields": {}, "names": {}}
    for name, values in dense.items():
        result["fields"][name] = _dense_field(values)
    if csr_parts:
        ordered = [csr_parts[i] for i in range(len(rows))]
        result["csr"] = {
            "lengths": np.array([len(c) for c, _ in ordered], np.int64),
            "indices": np.concatenate([c for c, _ in ordered]).astype(np.int64),
            "data": np.concatenate([v for _, v in ordered]),
            "dtype": csr_meta[1],
            "columns": int(csr_meta[0]),
        }
    if kind == "anndata":
        result["names"]["obs"] = source.obs_names
        result["names"]["var"] = source.var_names
        for column in seed["obs"]:
            categories = source.categories(column) if _is_categorical(source, column) else None
            if categories is not None:
                result["names"]["categories/" + column] = [_normal_category(c) for c in categories]
    return result


def torch_sparse_csr():
    import torch

    return torch.sparse_csr


def _is_categorical(source, column):
    try:
        source.categories(column)
        return True
    except (ValueError, RuntimeError):
        return False


def _normal_category(value):
    if isinstance(value, str):
        return value
    return float(value)


# ------------------------------------------------------------------- reference


def read_reference(seed, path, rng):
    """Reads the same rows with the library that wrote the seed."""
    kind = seed["kind"]
    if kind == "hdf5":
        return _read_h5py(seed, path)
    if kind == "zarr":
        return _read_zarr(seed, path)
    return _read_anndata(seed, path)


def _ranges(rows):
    """rows (sorted) as [start, stop) ranges."""
    ranges = []
    for row in rows.tolist():
        if ranges and ranges[-1][1] == row:
            ranges[-1][1] = row + 1
        else:
            ranges.append([row, row + 1])
    return ranges


def _read_rows(array, num_rows, rows):
    if len(rows) == 0:
        return np.asarray(array[0:0])
    return np.concatenate([np.asarray(array[start:stop]) for start, stop in _ranges(rows)])


def _read_h5py(seed, path):
    import h5py
    import hdf5plugin  # noqa: F401  (registers blosc and zstd with h5py's HDF5)

    with h5py.File(path, "r") as f:
        datasets = {name: f[inner] for name, inner in seed["fields"].items()}
        counts = {d.shape[0] if d.ndim else None for d in datasets.values()}
        if len(counts) != 1 or None in counts:
            raise ValueError(f"datasets disagree on rows or are scalars: {counts}")
        num_rows = counts.pop()
        rows = rows_to_read(num_rows)
        fields = {name: _dense_field(_read_rows(d, num_rows, rows)) for name, d in datasets.items()}
    return {"rows": num_rows, "read": rows.tolist(), "fields": fields, "names": {}}


def _read_zarr(seed, path):
    import zarr

    arrays = {
        name: zarr.open_array(os.path.join(path, inner.strip("/")), mode="r") for name, inner in seed["fields"].items()
    }
    counts = {a.shape[0] if a.ndim else None for a in arrays.values()}
    if len(counts) != 1 or None in counts:
        raise ValueError(f"arrays disagree on rows or are scalars: {counts}")
    num_rows = counts.pop()
    rows = rows_to_read(num_rows)
    fields = {name: _dense_field(_read_rows(a, num_rows, rows)) for name, a in arrays.items()}
    return {"rows": num_rows, "read": rows.tolist(), "fields": fields, "names": {}}


def _read_anndata(seed, path):
    """anndata's readers for the elements torch_shards reads (X, obs, var),
    assembled into an AnnData (which checks their shapes agree). zarr stores
    are read without their consolidated metadata: torch_shards reads each
    array's own metadata, which the zarr specification makes authoritative."""
    import anndata as ad
    import h5py
    import pandas as pd
    import scipy.sparse as sp
    import zarr
    from anndata.io import read_elem

    if path.endswith(".h5ad"):
        root = h5py.File(path, "r")
    else:
        root = zarr.open_group(path, mode="r", use_consolidated=False)
    adata = ad.AnnData(X=read_elem(root["X"]), obs=read_elem(root["obs"]), var=read_elem(root["var"]))
    num_rows = adata.n_obs
    rows = rows_to_read(num_rows)
    result = {"rows": num_rows, "read": rows.tolist(), "fields": {}, "names": {}}
    x = adata.X
    if sp.issparse(x):
        if x.format != "csr":
            raise ValueError(f"X is {x.format}, not csr")
        x.check_format(full_check=True)  # scipy's own validation: indices in range, indptr monotone
        lengths, indices, data = _split_csr(np.asarray(x.indptr), x.indices, x.data, rows)
        result["csr"] = {
            "lengths": lengths,
            "indices": indices,
            "data": data,
            "dtype": _native(data).dtype.str,
            "columns": int(x.shape[1]),
        }
    else:
        result["fields"]["X"] = _dense_field(np.asarray(x)[rows])
    for column in seed["obs"]:
        values = adata.obs[column]
        if isinstance(values.dtype, pd.CategoricalDtype):
            result["fields"][column] = _dense_field(values.cat.codes.to_numpy().astype(np.int64)[rows])
            result["names"]["categories/" + column] = [_normal_category(c) for c in values.cat.categories]
        else:
            result["fields"][column] = _dense_field(values.to_numpy()[rows])
    result["names"]["obs"] = [str(name) for name in adata.obs_names]
    result["names"]["var"] = [str(name) for name in adata.var_names]
    return result


# -------------------------------------------------------------------- compare


def _same_values(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def difference(a, b):
    """None if two canonical results hold the same data, else what differs."""
    if a["rows"] != b["rows"]:
        return f"rows {a['rows']} != {b['rows']}"
    if a["read"] != b["read"]:
        return "different rows read"
    if sorted(a["fields"]) != sorted(b["fields"]):
        return f"fields {sorted(a['fields'])} != {sorted(b['fields'])}"
    for name, field in a["fields"].items():
        other = b["fields"][name]
        if field["shape"] != other["shape"] or field["dtype"] != other["dtype"]:
            return f"field {name}: {field['dtype']}{field['shape']} != {other['dtype']}{other['shape']}"
        if not _same_values(field["values"], other["values"]):
            return f"field {name}: values differ"
    if ("csr" in a) != ("csr" in b):
        return "one is CSR, the other not"
    if "csr" in a:
        x, y = a["csr"], b["csr"]
        if x["columns"] != y["columns"] or x["dtype"] != y["dtype"]:
            return f"CSR {x['dtype']} x {x['columns']} != {y['dtype']} x {y['columns']}"
        for key in ("lengths", "indices", "data"):
            if not _same_values(np.asarray(x[key]), np.asarray(y[key])):
                return f"CSR {key} differ"
    for key in sorted(set(a["names"]) | set(b["names"])):
        if a["names"].get(key) != b["names"].get(key):
            return f"{key} differ"
    return None
