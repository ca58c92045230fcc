"""AnnDataSource against files written by every anndata from 0.7 to 0.13 (.h5ad, zarr v2, zarr v3,
sharded zarr v3): every obs encoding, X and layers, compared value by value with what that same
anndata read from the file (tests/data/anndata, written by tests/data/make_anndata_fixtures.py).
Also: what is refused, and how."""

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader

import torch_shards as ts

DATA = Path(__file__).parent / "data" / "anndata"
MANIFESTS = sorted(DATA.glob("anndata-*/manifest.json"))
FILES = [(m.parent.name, name) for m in MANIFESTS for name in json.loads(m.read_text())["files"]]
NEWEST = DATA / "anndata-0.13.4"


def expected_of(version, name):
    path = DATA / version / name
    values = json.loads(Path(f"{path}.json").read_text())
    with np.load(f"{path}.npz") as arrays:
        values["arrays"] = dict(arrays)
    return path, values


def rows_for(n_obs, seed=0):
    """Every row once, shuffled, plus repeats (weighted sampling reads rows twice)."""
    rng = np.random.default_rng(seed)
    rows = rng.permutation(n_obs)
    return np.concatenate([rows, rows[:5]]).tolist()


def torch_dtype(numpy_name):
    return torch.from_numpy(np.zeros(0, dtype=numpy_name)).dtype


def test_fixtures_cover_every_writer_format_and_encoding():
    versions = {m.parent.name for m in MANIFESTS}
    assert {"anndata-0.7.8", "anndata-0.8.0", "anndata-0.10.9", "anndata-0.12.19", "anndata-0.13.4"} <= versions
    suffixes = {name.split(".")[0].split("-", 1)[-1] if "-" in name else "h5ad" for _, name in FILES}
    assert {"h5ad", "zarr2", "zarr3", "zarr3-sharded"} <= suffixes
    encodings = set()
    for version, name in FILES:
        _, expected = expected_of(version, name)
        encodings |= {f"{key.split('/')[-1]}={value}" for key, value in expected["encodings"].items() if "/" in key}
        encodings |= set(expected["encodings"].values())
    assert {
        "array",
        "categorical",
        "string-array",
        "nullable-string-array",
        "nullable-integer",
        "nullable-boolean",
        "csr_matrix",
        "categorical (anndata 0.7)",
        "string-array (anndata 0.7)",
        "categories=string-array",
        "categories=array",
        "categories=nullable-integer",
        "categories=nullable-string-array",
    } <= encodings
    # the sharded stores are sharded, as anndata 0.13 writes them by default
    meta = json.loads((NEWEST / "obs-zarr3-sharded.zarr" / "X" / "data" / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "sharding_indexed"


@pytest.mark.parametrize("version, name", FILES)
def test_names_and_shape_match_anndata(version, name):
    path, expected = expected_of(version, name)
    source = ts.AnnDataSource(path)
    assert (source.n_obs, source.n_vars) == (expected["n_obs"], expected["n_vars"])
    assert source.obs_names == [v if v is not None else "" for v in expected["obs_names"]]
    assert source.var_names == expected["var_names"]
    assert set(source.obs_columns) == set(expected["obs"])


@pytest.mark.parametrize("version, name", [f for f in FILES if f[1].startswith("obs")])
def test_every_obs_column_matches_anndata(version, name):
    path, expected = expected_of(version, name)
    columns = sorted(expected["obs"])
    source = ts.AnnDataSource(path, obs=columns)
    rows = rows_for(expected["n_obs"])
    batch = source.read(rows, num_threads=2)
    for column in columns:
        want = expected["obs"][column]
        got = batch[column]
        where = f"{version}/{name}: {column} ({expected['encodings'][column]})"
        if want["kind"] == "categorical":
            assert got.dtype == torch.int64, where
            assert got.tolist() == [want["codes"][r] for r in rows], where
            assert source.categories(column) == want["categories"], where
        elif want["kind"] == "string":
            values = [want["values"][r] for r in rows]
            categories = source.categories(column)
            assert categories == sorted({v for v in want["values"] if v is not None}), where
            assert got.dtype == torch.int64, where
            assert [categories[c] if c >= 0 else None for c in got.tolist()] == values, where
        elif want["kind"] == "nullable":
            values = [want["values"][r] for r in rows]
            assert got.dtype == torch_dtype(want["dtype"]), where
            assert batch[column + "_mask"].dtype == torch.bool, where
            assert batch[column + "_mask"].tolist() == [v is None for v in values], where
            filled = [0 if v is None else v for v in values]
            assert got.tolist() == filled, where  # missing entries read as 0 / False
        else:
            assert want["kind"] == "numeric", where
            assert got.dtype == torch_dtype(want["dtype"]), where
            assert got.tolist() == [want["values"][r] for r in rows], where
        assert column + "_mask" in batch or want["kind"] != "nullable", where
    nullable = {c for c in columns if expected["obs"][c]["kind"] == "nullable"}
    assert set(batch) == {"X"} | set(columns) | {c + "_mask" for c in nullable}


@pytest.mark.parametrize("version, name", FILES)
def test_x_and_layers_match_anndata(version, name):
    path, expected = expected_of(version, name)
    rows = rows_for(expected["n_obs"], seed=1)
    x = ts.AnnDataSource(path).read(rows, num_threads=2)["X"]
    assert x.layout == (torch.sparse_csr if expected["x_sparse"] else torch.strided)
    want = expected["arrays"]["X"][rows]
    assert torch.equal(x.to_dense(), torch.from_numpy(want))
    if expected["x_sparse"]:
        assert torch.equal(ts.AnnDataSource(path, dense=True).read(rows)["X"], torch.from_numpy(want))
    for layer in expected["layers"]:
        got = ts.AnnDataSource(path, layer=layer).read(rows)["X"]
        assert torch.equal(got.to_dense(), torch.from_numpy(expected["arrays"]["layer_" + layer][rows])), layer


def test_newest_format_through_workers_matches_anndata():
    path, expected = expected_of("anndata-0.13.4", "obs-zarr3-sharded.zarr")
    columns = ["cat_str", "int_nullable", "str_missing", "bool_nullable"]
    source = ts.AnnDataSource(path, obs=columns)
    strings = source.categories("str_missing")
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=8, fetch_factor=2, seed=3)
    seen = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn"):
        index = batch["index"].tolist()
        assert torch.equal(batch["X"].to_dense(), torch.from_numpy(expected["arrays"]["X"][index]))
        assert batch["cat_str"].tolist() == [expected["obs"]["cat_str"]["codes"][i] for i in index]
        ints = [expected["obs"]["int_nullable"]["values"][i] for i in index]
        assert batch["int_nullable_mask"].tolist() == [v is None for v in ints]
        assert batch["int_nullable"].tolist() == [v or 0 for v in ints]
        assert [strings[c] if c >= 0 else None for c in batch["str_missing"].tolist()] == [
            expected["obs"]["str_missing"]["values"][i] for i in index
        ]
        seen += index
    assert sorted(seen) == list(range(expected["n_obs"]))


# ---- what is refused, and how ---------------------------------------------------------------------


@pytest.fixture(params=["obs.h5ad", "obs-zarr2.zarr", "obs-zarr3-sharded.zarr"])
def newest_copy(request, tmp_path):
    """A writable copy of one of the newest fixtures."""
    source = NEWEST / request.param
    target = tmp_path / request.param
    (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    return target


def set_values(path, element, index, value):
    if str(path).endswith(".h5ad"):
        with h5py.File(path, "r+") as f:
            values = f[element][...]
            values[index] = value
            f[element][...] = values
    else:
        array = zarr.open_array(str(path / element), mode="r+")
        array[index] = value


@pytest.mark.parametrize("bad", [4, -2, 127])
def test_categorical_code_outside_the_categories_is_refused(newest_copy, bad):
    set_values(newest_copy, "obs/cat_str/codes", 6, bad)
    source = ts.AnnDataSource(newest_copy, obs=["cat_str"])
    assert source.read([0, 1, 2])["cat_str"].shape == (3,)  # other rows still read
    message = rf"{newest_copy}:/obs/cat_str/codes: category code {bad} at row 6 is outside \[-1, 4\) "
    with pytest.raises(RuntimeError, match=message + r"\(obs column 'cat_str' has 4 categories\)"):
        source.read([0, 6])


def test_codes_of_a_missing_category_read_as_missing(tmp_path):
    path = tmp_path / "masked.h5ad"
    shutil.copy(NEWEST / "obs.h5ad", path)
    with h5py.File(path, "r+") as f:  # mark category 1 ('y') missing
        mask = f["obs/cat_nullable_str_categories/categories/mask"]
        mask[1] = True
        codes = f["obs/cat_nullable_str_categories/codes"][...]
    source = ts.AnnDataSource(path, obs=["cat_nullable_str_categories"])
    assert source.categories("cat_nullable_str_categories") == ["x", None, "z"]
    got = source.read(range(len(codes)))["cat_nullable_str_categories"].tolist()
    assert got == [-1 if c == 1 else int(c) for c in codes] and 1 in codes.tolist()


def test_unsupported_obs_encodings_name_the_element_and_encoding(tmp_path):
    path = tmp_path / "odd.h5ad"
    shutil.copy(NEWEST / "obs.h5ad", path)
    with h5py.File(path, "r+") as f:
        awkward = f["obs"].create_group("ragged")
        awkward.attrs["encoding-type"] = "awkward-array"
        awkward.attrs["encoding-version"] = "0.1.0"
        awkward["node0_offsets"] = np.arange(41)
        table = f["obs"].create_dataset("table", data=np.zeros(40, dtype=[("a", "i4"), ("b", "f8")]))
        table.attrs["encoding-type"] = "rec-array"
    with pytest.raises(ValueError, match=rf"{path}:/obs/ragged: unsupported obs column encoding-type 'awkward-array'"):
        ts.AnnDataSource(path, obs=["ragged"])
    with pytest.raises(ValueError, match=rf"{path}:/obs/table: unsupported obs column encoding-type 'rec-array'"):
        ts.AnnDataSource(path, obs=["table"])


def test_unsupported_matrix_encodings_name_the_element_and_encoding(tmp_path):
    path = tmp_path / "odd.h5ad"
    shutil.copy(NEWEST / "obs.h5ad", path)
    with h5py.File(path, "r+") as f:
        f["layers/counts"].attrs["encoding-type"] = "csc_matrix"
        ragged = f["layers"].create_group("ragged")
        ragged.attrs["encoding-type"] = "awkward-array"
    with pytest.raises(ValueError, match=rf"{path}:/layers/counts: is a CSC .*encoding-type 'csc_matrix'"):
        ts.AnnDataSource(path, layer="counts")
    with pytest.raises(ValueError, match=rf"{path}:/layers/ragged: unsupported matrix encoding-type 'awkward-array'"):
        ts.AnnDataSource(path, layer="ragged")


def test_malformed_nullable_and_categorical_elements_are_named(tmp_path):
    path = tmp_path / "bad.h5ad"
    shutil.copy(NEWEST / "obs.h5ad", path)
    with h5py.File(path, "r+") as f:
        del f["obs/int_nullable/mask"]
        f["obs/int_nullable/mask"] = np.zeros(39, dtype=bool)
        codes = f["obs/cat_int/codes"][...]
        del f["obs/cat_int/codes"]
        f["obs/cat_int/codes"] = codes.astype(np.float32)
        del f["obs/bool_nullable/values"]
        f["obs/bool_nullable/values"] = np.zeros(40, dtype=np.float64)
    with pytest.raises(
        RuntimeError, match=rf"{path}:/obs/int_nullable/mask: mask has 39 entries but the values have 40"
    ):
        ts.AnnDataSource(path, obs=["int_nullable"])
    with pytest.raises(
        RuntimeError, match=rf"{path}:/obs/cat_int/codes: categorical codes must be integers, got float32"
    ):
        ts.AnnDataSource(path, obs=["cat_int"])
    with pytest.raises(
        RuntimeError, match=rf"{path}:/obs/bool_nullable/values: nullable-boolean values of dtype float64"
    ):
        ts.AnnDataSource(path, obs=["bool_nullable"])


def test_mask_field_names_that_clash_are_refused(tmp_path):
    path = tmp_path / "clash.h5ad"
    shutil.copy(NEWEST / "obs.h5ad", path)
    with h5py.File(path, "r+") as f:
        f.copy(f["obs/int32"], f["obs"], "int_nullable_mask")
    with pytest.raises(
        ValueError, match="mask field 'int_nullable_mask' of nullable obs column 'int_nullable' clashes"
    ):
        ts.AnnDataSource(path, obs=["int_nullable", "int_nullable_mask"])
    with pytest.raises(ValueError, match="obs column 'int32' is asked for twice"):
        ts.AnnDataSource(path, obs=["int32", "int32"])
