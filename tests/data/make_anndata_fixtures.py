"""Writes the AnnData fixture files the test suite reads (tests/test_anndata_encodings.py,
tests/test_annbatch.py), with whichever anndata runs this script, and next to each file what
that same anndata reads back from it (the expected values).

    python tests/data/make_anndata_fixtures.py            # into tests/data/anndata/anndata-<version>/
    make fixtures                                         # every environment below that exists

The suite itself needs none of these environments: it reads the committed files. The ones used
for the committed fixtures (each a venv outside the repository, no torch in any):

    anndata 0.13 (pandas 3, zarr 3)      /work/venv313:  CPython 3.13, pip install anndata zarr h5py annbatch
    anndata 0.12 (pandas 2, zarr 3)      the project's .venv
    anndata 0.10 (zarr 2)                CPython 3.10, pip install "anndata==0.10.9" "zarr<3"
    anndata 0.8                          CPython 3.9, pip install "anndata==0.8.0" "zarr<2.12" "pandas<1.5" ...
    anndata 0.7                          CPython 3.8, pip install "anndata==0.7.8" "zarr<2.11" "pandas<1.4" ...

Per anndata version, a directory with:
  obs.h5ad, obs-zarr2.zarr, obs-zarr3.zarr, obs-zarr3-sharded.zarr (the formats that version writes)
      40 x 12, X CSR float32 (scipy csr_matrix), layers "counts" (int64 CSR, csr_array where
      scipy and anndata have it) and "dense" (float64), and one obs column per element encoding
      the version writes (categorical with string / integer / float / boolean / nullable
      categories, ordered or not, with missing codes; string-array and nullable-string-array
      columns with and without missing values; nullable-integer and nullable-boolean; numeric
      and boolean arrays), a named var index
  dense.h5ad and dense-<newest zarr format>.zarr: X dense float32
  <file>.json   what anndata read back: names, every obs column (codes and categories, values
                and missing entries), each element's encoding-type as stored
  <file>.npz    X and the layers as dense arrays, as anndata read them
  manifest.json the files, the versions that wrote them (python, anndata, pandas, numpy, h5py,
                zarr, scipy), and the columns this version could not write (and why)
With annbatch installed (Python >= 3.12), also annbatch-<version>/collection.zarr, a
DatasetCollection written by annbatch's own add_adatas (zarr v3, sharded, small chunks and
shards), and collection-h5ad/ (is_collection_h5ad=True), each with the expected values of
every dataset in annbatch's order.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import warnings
from importlib.metadata import version as package_version

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

N_OBS, N_VARS = 40, 12
HERE = os.path.dirname(os.path.abspath(__file__))


def version_tuple(text):
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


ANNDATA = package_version("anndata")
ZARR = package_version("zarr")
AD = version_tuple(ANNDATA)


def settings_override(**kwargs):
    """ad.settings.override with the settings this anndata has (others dropped)."""
    settings = getattr(ad, "settings", None)
    known = {k: v for k, v in kwargs.items() if settings is not None and hasattr(settings, k)}
    if not known:
        import contextlib

        return contextlib.nullcontext()
    return settings.override(**known)


def write_elem_function():
    for module, name in (("anndata.io", "write_elem"), ("anndata.experimental", "write_elem")):
        try:
            return getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
    return None


# ---- the data -----------------------------------------------------------------------------------


def candidate_columns(rng):
    """name -> a zero-argument function building the column (some fail on old pandas/anndata)."""
    n = N_OBS

    def with_missing(values, every=7):
        values = list(values)
        for i in range(3, n, every):
            values[i] = None
        return values

    kinds = ["T", "B", "NK", "Mono"]
    return {
        "cat_str": lambda: pd.Categorical(with_missing(rng.choice(kinds, size=n)), categories=kinds),
        "cat_ordered": lambda: pd.Categorical(
            rng.choice(["low", "mid", "high"], size=n), categories=["low", "mid", "high"], ordered=True
        ),
        "cat_int": lambda: pd.Categorical(rng.choice([10, 3, 7], size=n)),
        "cat_float": lambda: pd.Categorical(rng.choice([0.5, 2.25, -1.0], size=n)),
        "cat_bool": lambda: pd.Categorical(rng.random(n) > 0.5),
        # categories rewritten below as nullable elements (anndata writes them as plain arrays)
        "cat_nullable_str_categories": lambda: pd.Categorical(with_missing(rng.choice(["x", "y", "z"], size=n))),
        "cat_nullable_int_categories": lambda: pd.Categorical(rng.choice([5, 1, 9], size=n)),
        # unique strings stay strings (anndata makes repeated ones categorical when it writes)
        "str_unique": lambda: np.array([f"bc{(i * 17) % n:03d}" for i in range(n)], dtype=object),
        "str_missing": lambda: pd.array(with_missing([f"s{i:02d}" for i in range(n)], every=6), dtype="string"),
        "int_nullable": lambda: pd.array(with_missing(rng.integers(-50, 50, n).tolist()), dtype="Int32"),
        "uint_nullable": lambda: pd.array(with_missing(rng.integers(0, 60000, n).tolist(), every=5), dtype="UInt16"),
        "int_nullable_full": lambda: pd.array(rng.integers(0, 1 << 40, n).tolist(), dtype="Int64"),
        "bool_nullable": lambda: pd.array(with_missing((rng.random(n) > 0.5).tolist()), dtype="boolean"),
        "int8": lambda: rng.integers(-128, 128, n).astype(np.int8),
        "uint16": lambda: rng.integers(0, 65536, n).astype(np.uint16),
        "int32": lambda: rng.integers(-(1 << 31), 1 << 31, n).astype(np.int32),
        "int64": lambda: rng.integers(-(1 << 62), 1 << 62, n).astype(np.int64),
        "float32": lambda: rng.standard_normal(n).astype(np.float32),
        "float64": lambda: rng.standard_normal(n),
        "bool": lambda: rng.random(n) > 0.3,
    }


def make_matrices(rng):
    dense = rng.standard_normal((N_OBS, N_VARS)).astype(np.float32)
    dense[rng.random(dense.shape) > 0.3] = 0
    dense[5] = 0  # an empty row
    counts = np.round(np.abs(dense) * 10).astype(np.int64)
    return dense, counts


def try_write(adata, directory, name):
    """Writes adata to a throwaway .h5ad and zarr store; returns the error text, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adata.write_h5ad(os.path.join(directory, name + ".h5ad"))
            adata.write_zarr(os.path.join(directory, name + ".zarr"))
            ad.read_h5ad(os.path.join(directory, name + ".h5ad"))
    except Exception as error:  # noqa: BLE001 - any failure means: this version cannot write it
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return None


def build_obs(skipped):
    rng = np.random.default_rng(12)
    obs = pd.DataFrame(index=[f"cell_{i:03d}" for i in range(N_OBS)])
    probe = tempfile.mkdtemp()
    try:
        for name, make in candidate_columns(rng).items():
            try:
                values = make()
            except Exception as error:  # noqa: BLE001
                skipped[name] = f"pandas cannot build it: {type(error).__name__}: {error}"
                continue
            trial = pd.DataFrame({name: values}, index=obs.index)
            problem = try_write(ad.AnnData(obs=trial), probe, name)
            if problem:
                skipped[name] = problem
                continue
            obs[name] = values
    finally:
        shutil.rmtree(probe)
    return obs


def build_adata(skipped):
    rng = np.random.default_rng(3)
    dense, counts = make_matrices(rng)
    obs = build_obs(skipped)
    var = pd.DataFrame(index=pd.Index([f"gene_{j:02d}" for j in range(N_VARS)], name="gene_id"))
    adata = ad.AnnData(X=sp.csr_matrix(dense), obs=obs, var=var)
    adata.layers["counts"] = sp.csr_matrix(counts)
    if hasattr(sp, "csr_array"):  # scipy's csr_array where this anndata writes it (same encoding on disk)
        probe = tempfile.mkdtemp()
        try:
            trial = ad.AnnData(X=sp.csr_array(counts))
            if try_write(trial, probe, "csr_array") is None:
                adata.layers["counts"] = sp.csr_array(counts)
            else:
                skipped["layers/counts as csr_array"] = try_write(trial, probe, "csr_array2")
        except (ValueError, TypeError) as error:
            skipped["layers/counts as csr_array"] = f"{type(error).__name__}: {error}"
        finally:
            shutil.rmtree(probe)
    adata.layers["dense"] = dense.astype(np.float64) * 2
    return adata


def build_dense_adata():
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((N_OBS, N_VARS)).astype(np.float32)
    obs = pd.DataFrame(index=[f"d{i}" for i in range(N_OBS)])
    return ad.AnnData(X=dense, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(N_VARS)]))


# ---- formats --------------------------------------------------------------------------------------


def formats():
    """(suffix, writer) pairs for the formats this anndata/zarr can write."""
    out = [("h5ad", lambda adata, path: adata.write_h5ad(path, **string_kwargs()))]
    zarr_major = version_tuple(ZARR)[0]
    settings = getattr(ad, "settings", None)
    has_format_setting = settings is not None and hasattr(settings, "zarr_write_format")

    def zarr_writer(**overrides):
        def write(adata, path):
            with settings_override(**overrides):
                adata.write_zarr(path, chunks=(16, N_VARS), **zarr_string_kwargs())

        return write

    if zarr_major < 3 or has_format_setting:
        out.append(("zarr2", zarr_writer(zarr_write_format=2)))
    if zarr_major >= 3 and has_format_setting:
        out.append(("zarr3", zarr_writer(zarr_write_format=3, auto_shard_zarr_v3=False)))
        if hasattr(settings, "auto_shard_zarr_v3"):
            out.append(("zarr3-sharded", zarr_writer(zarr_write_format=3, auto_shard_zarr_v3=True)))
    return out


def string_kwargs():
    # Keep string columns as strings (anndata otherwise makes repeated ones categorical), where
    # this anndata lets us.
    import inspect

    accepted = inspect.signature(ad.AnnData.write_h5ad).parameters
    return {"convert_strings_to_categoricals": False} if "convert_strings_to_categoricals" in accepted else {}


def zarr_string_kwargs():
    import inspect

    accepted = inspect.signature(ad.AnnData.write_zarr).parameters
    return {"convert_strings_to_categoricals": False} if "convert_strings_to_categoricals" in accepted else {}


def file_name(kind, suffix):
    return f"{kind}.h5ad" if suffix == "h5ad" else f"{kind}-{suffix}.zarr"


def open_group(path, mode="r"):
    if path.endswith(".h5ad"):
        return h5py.File(path, mode)
    import zarr

    return zarr.open_group(path, mode=mode)


def consolidate(path):
    """Rewrites consolidated metadata (anndata reads it) after a store was changed by hand."""
    if path.endswith(".h5ad"):
        return
    import zarr

    root_json = os.path.join(path, "zarr.json")
    consolidated = os.path.exists(os.path.join(path, ".zmetadata"))
    if os.path.exists(root_json):
        with open(root_json) as f:
            consolidated = consolidated or json.load(f).get("consolidated_metadata") is not None
    if consolidated:
        zarr.consolidate_metadata(path)


def nullable_categories(path, obs, skipped):
    """Rewrites the categories of two categorical columns as nullable elements (no missing entry,
    so anndata itself can read them): a nullable-string-array and a nullable-integer."""
    write_elem = write_elem_function()
    rewrites = {
        "cat_nullable_str_categories": lambda cats: pd.array(list(cats), dtype="string"),
        "cat_nullable_int_categories": lambda cats: pd.array(list(cats), dtype="Int64"),
    }
    for column, make in rewrites.items():
        if column not in obs.columns:
            continue
        if write_elem is None:
            skipped[column] = "categories left as written: this anndata has no write_elem to rewrite them"
            continue
        categories = make(list(obs[column].cat.categories))
        try:
            with warnings.catch_warnings(), settings_override(allow_write_nullable_strings=True):
                warnings.simplefilter("ignore")
                replace_element(path, f"obs/{column}/categories", categories, write_elem)
        except Exception as error:  # noqa: BLE001 - this anndata cannot write that element
            skipped[column] = f"categories left as written: {type(error).__name__}: {str(error).splitlines()[0]}"


def replace_element(path, element, value, write_elem):
    """Writes `value` with anndata's write_elem in place of `element`; the old one is removed only
    once the new one is written."""
    parent, name = element.rsplit("/", 1)
    if path.endswith(".h5ad"):
        with h5py.File(path, "r+") as root:
            write_elem(root[parent], name + "_new", value)
            del root[parent][name]
            root[parent].move(name + "_new", name)
        return
    # anndata refuses to edit a consolidated store: write the element into a scratch store of the
    # same zarr format, move it in place, and consolidate again.
    import zarr

    scratch = tempfile.mkdtemp()
    try:
        scratch_store = os.path.join(scratch, "s.zarr")
        fmt = 3 if os.path.exists(os.path.join(path, "zarr.json")) else 2
        new_zarr = version_tuple(ZARR)[0] >= 3
        group = zarr.open_group(scratch_store, mode="w", **({"zarr_format": fmt} if new_zarr else {}))
        write_elem(group, name, value)
        target = os.path.join(path, *element.split("/"))
        shutil.rmtree(target)
        shutil.copytree(os.path.join(scratch_store, name), target)
    finally:
        shutil.rmtree(scratch)
    consolidate(path)


# ---- what anndata reads back ---------------------------------------------------------------------


def plain(value):
    """A JSON-safe scalar; missing values (None, NaN, pd.NA) become None."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (float, np.floating)) and np.isnan(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


def attributes_of(node):
    attrs = node.attrs.asdict() if hasattr(node.attrs, "asdict") else dict(node.attrs)
    return attrs


def stored_encodings(path):
    """encoding-type of each obs column and index as stored (anndata 0.7 columns: the layout)."""
    root = open_group(path)
    try:
        obs = root["obs"]
        attrs = attributes_of(obs)
        names = [str(c) for c in np.atleast_1d(attrs.get("column-order", []))] + [str(attrs.get("_index", "_index"))]
        out = {}
        for name in names:
            node_attrs = attributes_of(obs[name])
            encoding = node_attrs.get("encoding-type")
            if encoding is None:
                if "categories" in node_attrs:
                    encoding = "categorical (anndata 0.7)"
                elif obs[name].dtype.kind in "OSU":
                    encoding = "string-array (anndata 0.7)"
                else:
                    encoding = "array (anndata 0.7)"
            out[name] = str(encoding)
            if str(encoding) == "categorical":
                categories = attributes_of(obs[name]["categories"]).get("encoding-type", "array")
                out[name + "/categories"] = str(categories)
        out["X"] = str(attributes_of(root["X"]).get("encoding-type", "array"))
        return out
    finally:
        if path.endswith(".h5ad"):
            root.close()


def describe_column(series):
    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return {
            "kind": "categorical",
            "codes": series.cat.codes.astype(np.int64).tolist(),
            "categories": [plain(c) for c in series.cat.categories],
            "ordered": bool(dtype.ordered),
        }
    if isinstance(dtype, pd.StringDtype) or dtype.kind in "OSU":
        return {"kind": "string", "values": [plain(v) for v in series.tolist()]}
    if isinstance(dtype, pd.api.extensions.ExtensionDtype):  # Int32, UInt16, boolean, ...
        return {
            "kind": "nullable",
            "dtype": str(np.dtype(dtype.numpy_dtype)),
            "values": [plain(v) for v in series.tolist()],
        }
    return {"kind": "numeric", "dtype": str(dtype), "values": series.to_numpy().tolist()}


def layer_names(adata):
    return sorted(k for k in adata.layers.keys() if k is not None)  # anndata 0.13 lists X as layers[None]


def dense_of(matrix):
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix)


def write_expected(path, adata, destination):
    """<file>.json (names, obs, encodings) and <file>.npz (X, layers) from what anndata read."""
    expected = {
        "n_obs": int(adata.n_obs),
        "n_vars": int(adata.n_vars),
        "obs_names": [plain(v) for v in adata.obs_names],
        "var_names": [plain(v) for v in adata.var_names],
        "obs": {str(name): describe_column(adata.obs[name]) for name in adata.obs.columns},
        "layers": layer_names(adata),
        "x_sparse": bool(sp.issparse(adata.X)),
        "encodings": stored_encodings(path),
    }
    with open(destination + ".json", "w") as out:
        json.dump(expected, out, indent=1, sort_keys=True)
    arrays = {"X": dense_of(adata.X)}
    for name in layer_names(adata):
        arrays["layer_" + name] = dense_of(adata.layers[name])
    np.savez_compressed(destination + ".npz", **arrays)


def read_back(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ad.read_h5ad(path) if path.endswith(".h5ad") else ad.read_zarr(path)


# ---- annbatch ------------------------------------------------------------------------------------


def write_annbatch(out_root):
    """A DatasetCollection written by annbatch (zarr, and the h5ad variant), with expected values."""
    try:
        import annbatch
        import zarr
        from annbatch import DatasetCollection
    except ImportError:
        return None
    directory = os.path.abspath(os.path.join(out_root, f"annbatch-{package_version('annbatch')}"))
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    rng = np.random.default_rng(21)
    n = 200
    dense = rng.standard_normal((n, N_VARS)).astype(np.float32)
    dense[rng.random(dense.shape) > 0.25] = 0
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["T", "B", "NK"], size=n)),
            "n_counts": rng.integers(0, 1000, n).astype(np.int32),
            "barcode": [f"AC{i:04d}" for i in range(n)],
        },
        index=[f"cell_{i}" for i in range(n)],
    )
    source = ad.AnnData(X=sp.csr_matrix(dense), obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(N_VARS)]))
    scratch = tempfile.mkdtemp()
    cwd = os.getcwd()
    try:
        # annbatch records the input's path in obs["src_path"]: a relative one keeps the files the same
        # from run to run.
        os.chdir(scratch)
        input_path = "input.h5ad"
        source.write_h5ad(input_path)
        manifest = {"annbatch": package_version("annbatch"), "writer": versions(), "collections": {}}
        for name, h5ad in (("collection.zarr", False), ("collection-h5ad", True)):
            path = os.path.abspath(os.path.join(directory, name))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                target = zarr.open_group(path, mode="w") if not h5ad else path
                collection = DatasetCollection(target, is_collection_h5ad=h5ad) if h5ad else DatasetCollection(target)
                collection.add_adatas(
                    [input_path],
                    dataset_size=80,
                    shuffle_chunk_size=20,
                    n_obs_per_chunk=16,
                    shard_size=64,
                    rng=np.random.default_rng(0),
                )
            if h5ad:
                datasets = sorted(
                    (f for f in os.listdir(path) if f.startswith("dataset_") and f.endswith(".h5ad")),
                    key=lambda f: int(f[len("dataset_") : -len(".h5ad")]),
                )
            else:
                datasets = [group.basename for group in DatasetCollection(zarr.open_group(path, mode="r"))]
            for dataset in datasets:
                dataset_path = os.path.join(path, dataset)
                write_expected(dataset_path, read_back(dataset_path), dataset_path)
            manifest["collections"][name] = datasets
        with open(os.path.join(directory, "manifest.json"), "w") as out:
            json.dump(manifest, out, indent=1, sort_keys=True)
    finally:
        os.chdir(cwd)
        shutil.rmtree(scratch)
    del annbatch
    return directory


# ---- main ----------------------------------------------------------------------------------------


def versions():
    out = {"python": platform.python_version()}
    for package in ("anndata", "pandas", "numpy", "h5py", "zarr", "scipy"):
        out[package] = package_version(package)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "anndata"))
    parser.add_argument("--no-annbatch", action="store_true", help="skip the annbatch collection")
    args = parser.parse_args()
    directory = os.path.join(args.out, f"anndata-{ANNDATA}")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    skipped = {}
    with settings_override(allow_write_nullable_strings=True):
        adata = build_adata(skipped)
        files = []
        writers = formats()
        for suffix, write in writers:
            # Dense X reads as the dense layer does: one .h5ad and one zarr store of it suffice.
            dense_too = suffix == "h5ad" or suffix == writers[-1][0]
            for kind, data in (("obs", adata), ("dense", build_dense_adata()))[: 2 if dense_too else 1]:
                path = os.path.join(directory, file_name(kind, suffix))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    write(data, path)
                if kind == "obs":
                    nullable_categories(path, data.obs, skipped)
                write_expected(path, read_back(path), path)
                files.append(os.path.basename(path))
    manifest = {"anndata": ANNDATA, "writer": versions(), "files": files, "skipped_columns": skipped}
    with open(os.path.join(directory, "manifest.json"), "w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
    print(f"anndata {ANNDATA}: {len(files)} files in {directory}; not as planned: {sorted(skipped) or 'nothing'}")
    if not args.no_annbatch and sys.version_info >= (3, 12):
        written = write_annbatch(args.out)
        print(f"annbatch collection: {written or 'annbatch not installed'}")


if __name__ == "__main__":
    main()
