"""The two readers the harness compares: torch_shards, and the reference
library that wrote the seed (h5py, anndata, zarr). Both return the same
canonical result, compared part by part with `difference`:

  {"rows": N, "read": [row, ...],              rows read (all, or both ends of a huge array)
   "fields": {name: {"dtype": str, "shape": [...], "values": ndarray}}   dense rows read, in row order
   "csr": {"lengths": ndarray, "indices": ndarray, "data": ndarray, "dtype": str, "columns": int}
   "names": {"obs": [...], "var": [...], "categories/<column>": [...]},
   "refused": {part: message}}

The reference reads each part (a dataset, an array, X, an obs column, the
obs or var names) on its own, so that a part it refuses does not hide the
others: "refused" lists those parts ("field/<name>", "csr", "names/<key>").
A result with refused parts means the reference refuses the file; the parts
it did read still tell whether torch_shards' values are the file's.

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
    result = {"rows": num_rows, "read": rows.tolist(), "fields": {}, "names": {}, "refused": {}}
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


def _message(error):
    return f"{type(error).__name__}: {error}"


def _assemble(num_rows, parts, refused):
    """A canonical result from parts read one by one: {part: (kind, value)}."""
    if num_rows is None:
        raise ValueError(f"the reference reads no part: {refused}")
    result = {"rows": num_rows, "read": rows_to_read(num_rows).tolist(), "fields": {}, "names": {}, "refused": refused}
    for part, value in parts.items():
        kind, _, name = part.partition("/")
        if kind == "field":
            result["fields"][name] = value
        elif kind == "names":
            result["names"][name] = value
        else:
            result["csr"] = value
    return result


def _read_arrays(seed, open_array):
    """Each field of an HDF5 or zarr seed on its own; the rows of those that open."""
    parts, refused, counts = {}, {}, {}
    for name, inner in seed["fields"].items():
        try:
            array = open_array(inner)
            if not array.shape:
                raise ValueError("a scalar")
            counts[name] = array.shape[0]
        except Exception as error:  # noqa: BLE001 - a part the reference refuses
            refused[f"field/{name}"] = _message(error)
    if len(set(counts.values())) > 1:
        raise ValueError(f"fields disagree on their rows: {counts}")
    num_rows = next(iter(counts.values()), None)
    if num_rows is not None:
        rows = rows_to_read(num_rows)
        for name, inner in seed["fields"].items():
            if name not in counts:
                continue
            try:
                parts[f"field/{name}"] = _dense_field(_read_rows(open_array(inner), num_rows, rows))
            except Exception as error:  # noqa: BLE001
                refused[f"field/{name}"] = _message(error)
    return _assemble(num_rows, parts, refused)


def _read_h5py(seed, path):
    import h5py
    import hdf5plugin  # noqa: F401  (registers blosc and zstd with h5py's HDF5)

    with h5py.File(path, "r") as f:
        return _read_arrays(seed, lambda inner: f[inner])


def _read_zarr(seed, path):
    import zarr

    return _read_arrays(seed, lambda inner: zarr.open_array(os.path.join(path, inner.strip("/")), mode="r"))


def _read_anndata(seed, path):
    """anndata's element readers, one element at a time: X, each obs column,
    the obs and var names. When every one reads, they are assembled into an
    AnnData, which checks that their shapes agree. zarr stores are read
    without their consolidated metadata: torch_shards reads each array's own
    metadata, which the zarr specification makes authoritative."""
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
    elements, refused = {}, {}

    def attempt(part, read):
        try:
            elements[part] = read()
        except Exception as error:  # noqa: BLE001 - a part the reference refuses
            refused[part] = _message(error)

    def element(node):
        # Every attribute of the node is read, as torch_shards reads them all
        # (anndata itself reads only those it needs).
        dict(node.attrs)
        return read_elem(node)

    def index_of(frame):
        group = root[frame]
        name = dict(group.attrs).get("_index", "_index")
        return pd.Index(read_elem(group[name])).astype(str)

    attempt("x", lambda: element(root["X"]))
    attempt("names/obs", lambda: index_of("obs"))
    attempt("names/var", lambda: index_of("var"))
    for column in seed["obs"]:
        attempt(f"field/{column}", lambda column=column: element(root["obs"][column]))
    if not refused:  # the whole AnnData checks its parts agree
        try:
            obs = pd.DataFrame({c: elements[f"field/{c}"] for c in seed["obs"]}, index=elements["names/obs"])
            ad.AnnData(X=elements["x"], obs=obs, var=pd.DataFrame(index=elements["names/var"]))
        except Exception as error:  # noqa: BLE001
            raise ValueError(f"the parts do not make an AnnData: {_message(error)}") from error
    num_rows = None
    if "names/obs" in elements:
        num_rows = len(elements["names/obs"])
    elif "x" in elements:
        num_rows = elements["x"].shape[0]
    parts = {}
    if num_rows is not None:
        rows = rows_to_read(num_rows)
        for part, value in elements.items():
            try:
                if part == "x":
                    x = value
                    if sp.issparse(x):
                        if x.format != "csr":
                            raise ValueError(f"X is {x.format}, not csr")
                        x.check_format(full_check=True)  # scipy's own validation
                        lengths, indices, data = _split_csr(np.asarray(x.indptr), x.indices, x.data, rows)
                        parts["csr"] = {
                            "lengths": lengths,
                            "indices": indices,
                            "data": data,
                            "dtype": _native(data).dtype.str,
                            "columns": int(x.shape[1]),
                        }
                    else:
                        parts["field/X"] = _dense_field(np.asarray(x)[rows])
                elif part.startswith("names/"):
                    parts[part] = [str(name) for name in value]
                elif isinstance(value, pd.Categorical) or isinstance(
                    getattr(value, "dtype", None), pd.CategoricalDtype
                ):
                    categorical = pd.Categorical(value)
                    parts[part] = _dense_field(np.asarray(categorical.codes).astype(np.int64)[rows])
                    column = part.partition("/")[2]
                    parts["names/categories/" + column] = [_normal_category(c) for c in categorical.categories]
                else:
                    parts[part] = _dense_field(np.asarray(value)[rows])
            except Exception as error:  # noqa: BLE001
                refused["csr" if part == "x" else part] = _message(error)
    return _assemble(num_rows, parts, refused)


# -------------------------------------------------------------------- compare


def _same_values(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def parts_of(result):
    """The part names of a result (see the module's docstring)."""
    parts = {f"field/{name}" for name in result["fields"]} | {f"names/{key}" for key in result["names"]}
    return parts | ({"csr"} if "csr" in result else set())


def _part(result, part):
    kind, _, name = part.partition("/")
    if kind == "field":
        return result["fields"].get(name)
    if kind == "names":
        return result["names"].get(name)
    return result.get("csr")


def difference(a, b, parts=None):
    """None if two canonical results hold the same data (in `parts`, default
    all of both, and the rows read), else what differs."""
    if a["rows"] != b["rows"]:
        return f"rows {a['rows']} != {b['rows']}"
    if a["read"] != b["read"]:
        return "different rows read"
    for part in sorted(parts if parts is not None else parts_of(a) | parts_of(b)):
        x, y = _part(a, part), _part(b, part)
        if x is None or y is None:
            return f"{part} only in one"
        if part.startswith("field/"):
            if x["shape"] != y["shape"] or x["dtype"] != y["dtype"]:
                return f"{part}: {x['dtype']}{x['shape']} != {y['dtype']}{y['shape']}"
            if not _same_values(x["values"], y["values"]):
                return f"{part}: values differ"
        elif part == "csr":
            if x["columns"] != y["columns"] or x["dtype"] != y["dtype"]:
                return f"CSR {x['dtype']} x {x['columns']} != {y['dtype']} x {y['columns']}"
            for key in ("lengths", "indices", "data"):
                if not _same_values(np.asarray(x[key]), np.asarray(y[key])):
                    return f"CSR {key} differ"
        elif x != y:
            return f"{part} differ"
    return None
