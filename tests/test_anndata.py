"""AnnDataSource against files written by anndata (.h5ad and zarr stores):
dense and CSR X, layers, obs columns, names and categories; CSR validation."""

import os
import random
import subprocess
import sys

import anndata as ad
import h5py
import numcodecs
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import zarr
from conftest import (
    PER_CELL_FIELDS,
    RANDOM_OBS_COLUMNS,
    STRATEGIES,
    assert_field_rows,
    decoded,
    element_of,
    make_strategy,
    per_cell_anndata,
    random_anndata,
    read_anndata,
    write_anndata,
)
from torch.utils.data import DataLoader

import torch_shards as ts

N_OBS, N_VARS = 120, 37


def make_adata(x_format="csr", dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((N_OBS, N_VARS)).astype(dtype)
    dense[rng.random((N_OBS, N_VARS)) > 0.2] = 0  # ~80% zeros
    dense[5] = 0  # an empty row
    x = sp.csr_matrix(dense) if x_format == "csr" else dense
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["T", "B", "NK", "Mono"], size=N_OBS)),
            "batch": pd.Categorical(rng.choice([3, 1, 2], size=N_OBS)),
            "n_counts": rng.integers(0, 1000, size=N_OBS).astype(np.int32),
            "score": rng.standard_normal(N_OBS),
            "is_doublet": rng.random(N_OBS) > 0.9,
            # Unique strings stay a string column (anndata makes repeated ones categorical on write).
            "barcode": np.array([f"AC{i:04d}" for i in range(N_OBS)], dtype=object),
        },
        index=[f"cell{i}" for i in range(N_OBS)],
    )
    var = pd.DataFrame(index=[f"gene{j}" for j in range(N_VARS)])
    adata = ad.AnnData(X=x, obs=obs, var=var)
    adata.layers["counts"] = sp.csr_matrix(np.round(np.abs(dense) * 10).astype(np.int64))
    adata.layers["dense_layer"] = dense * 2
    return adata, dense


def write(adata, tmp_path, kind):
    if kind == "h5ad":
        path = tmp_path / "data.h5ad"
        adata.write_h5ad(path)
    elif kind == "h5ad-gzip":
        path = tmp_path / "data.h5ad"
        adata.write_h5ad(path, compression="gzip")
    elif kind == "h5ad-lzf":  # h5py's LZF filter, anndata's other compression option
        path = tmp_path / "data.h5ad"
        adata.write_h5ad(path, compression="lzf")
    elif kind == "zarr2":
        path = tmp_path / "data.zarr"
        with ad.settings.override(zarr_write_format=2):
            adata.write_zarr(path)
    elif kind == "zarr2-zlib":  # zlib records no decoded size: string chunks are inflated as far as they go
        path = tmp_path / "data.zarr"
        group = zarr.open_group(path, mode="w", zarr_format=2)
        ad.io.write_elem(group, "/", adata, dataset_kwargs={"compressors": [numcodecs.Zlib(level=5)]})
    else:  # zarr3, sharded as annbatch writes it
        path = tmp_path / "data.zarr"
        with ad.settings.override(zarr_write_format=3, auto_shard_zarr_v3=True):
            adata.write_zarr(path)
    return path


KINDS = ["h5ad", "h5ad-gzip", "h5ad-lzf", "zarr2", "zarr2-zlib", "zarr3"]
ROWS = [7, 0, 5, 119, 7, 60, 61, 62, 3]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("x_format", ["csr", "dense"])
def test_x_rows_match_anndata(tmp_path, kind, x_format):
    adata, dense = make_adata(x_format)
    path = write(adata, tmp_path, kind)
    source = ts.AnnDataSource(path)
    assert (source.n_obs, source.n_vars) == (N_OBS, N_VARS)
    x = source.read(ROWS, num_threads=2)["X"]
    if x_format == "csr":
        assert x.layout == torch.sparse_csr
        assert x.col_indices().dtype == torch.int32 and x.crow_indices().dtype == torch.int32
        expected = adata.X[ROWS]
        assert torch.equal(x.crow_indices().long(), torch.from_numpy(expected.indptr.astype(np.int64)))
        assert torch.equal(x.col_indices().long(), torch.from_numpy(expected.indices.astype(np.int64)))
        x = x.to_dense()
    assert x.dtype == torch.float32
    assert torch.equal(x, torch.from_numpy(dense[ROWS]))


@pytest.mark.parametrize("kind", KINDS)
def test_dense_true_densifies_csr(tmp_path, kind):
    adata, dense = make_adata("csr")
    source = ts.AnnDataSource(write(adata, tmp_path, kind), dense=True)
    x = source.read(ROWS)["X"]
    assert x.layout == torch.strided and torch.equal(x, torch.from_numpy(dense[ROWS]))


@pytest.mark.parametrize("kind", KINDS)
def test_layers_and_obs_columns(tmp_path, kind):
    adata, dense = make_adata("csr")
    path = write(adata, tmp_path, kind)
    source = ts.AnnDataSource(path, obs=["cell_type", "batch", "n_counts", "score", "is_doublet"], layer="counts")
    batch = source.read(ROWS)
    counts = adata.layers["counts"][ROWS].toarray()
    assert batch["X"].dtype == torch.int64 and torch.equal(batch["X"].to_dense(), torch.from_numpy(counts))
    cell_type = adata.obs["cell_type"].iloc[ROWS]
    assert batch["cell_type"].dtype == torch.int64
    assert batch["cell_type"].tolist() == cell_type.cat.codes.tolist()
    assert source.categories("cell_type") == list(adata.obs["cell_type"].cat.categories)
    assert source.categories("batch") == [1, 2, 3]
    assert batch["batch"].tolist() == adata.obs["batch"].iloc[ROWS].cat.codes.tolist()
    assert batch["n_counts"].dtype == torch.int32
    assert batch["n_counts"].tolist() == adata.obs["n_counts"].iloc[ROWS].tolist()
    assert torch.equal(batch["score"], torch.from_numpy(adata.obs["score"].to_numpy()[ROWS]))
    assert batch["is_doublet"].dtype == torch.bool
    assert batch["is_doublet"].tolist() == adata.obs["is_doublet"].iloc[ROWS].tolist()
    dense_layer = ts.AnnDataSource(path, layer="dense_layer").read(ROWS)["X"]
    assert torch.equal(dense_layer, torch.from_numpy(dense[ROWS] * 2))


def test_random_anndata_matches_anndata(tmp_path):
    # What the tests above fix, drawn at random (seeded): sizes, dtypes, densities, dense or CSR X and
    # layer, every obs encoding with missing values, .h5ad or zarr v2 / v3, rows in any order with repeats.
    rng = random.Random(0)
    columns = RANDOM_OBS_COLUMNS
    for trial in range(30):
        n_obs = rng.choice([1, 2, 7, 64, 300])
        (tmp_path / str(trial)).mkdir()
        path = write(random_anndata(rng, n_obs), tmp_path / str(trial), rng.choice(KINDS))
        adata = read_anndata(path)
        dense = rng.random() < 0.3
        source = ts.AnnDataSource(path, obs=columns, dense=dense, fields={"counts": "layers/counts", "pca": "obsm/pca"})
        rows = [rng.randrange(n_obs) for _ in range(rng.choice([1, 5, 40]))]
        batch = source.read(rows, num_threads=rng.randint(1, 2))
        context = (trial, path, rows)
        assert (batch["X"].layout == torch.sparse_csr) == (sp.issparse(adata.X) and not dense), context
        for field, element in (("X", "X"), ("counts", "layers/counts"), ("pca", "obsm/pca")):
            assert_field_rows(batch, field, element_of(adata, element), rows)
        obs = adata.obs.iloc[rows]
        for column in ("integer", "float", "boolean"):
            assert torch.equal(batch[column], torch.from_numpy(obs[column].to_numpy())), (column, context)
        for column in ("category", "string"):
            values = source.categories(column)
            expected = [None if pd.isna(value) else value for value in obs[column]]
            assert decoded(batch[column], values) == expected, (column, context)
        for column in ("nullable_integer", "nullable_boolean"):
            missing = obs[column].isna().to_numpy()
            assert batch[f"{column}_mask"].tolist() == missing.tolist(), (column, context)
            present = obs[column].to_numpy()[~missing].astype(batch[column].numpy().dtype)
            assert batch[column].numpy()[~missing].tolist() == present.tolist(), (column, context)


def test_random_datasets_deliver_the_rows_of_their_index(tmp_path):
    # Random AnnData through random ShardedDatasets (strategy, batch size, fetch factor, threads, read-ahead,
    # prefetch_bytes small enough to read fetches in pieces), in-process or through DataLoader workers: every
    # batch holds the rows its "index" names, batches kept across steps stay intact, len() is exact.
    rng = random.Random(1)
    for trial in range(30):
        n_obs = rng.choice([1, 7, 64, 300, 2000])
        (tmp_path / str(trial)).mkdir()
        path = write(random_anndata(rng, n_obs), tmp_path / str(trial), rng.choice(KINDS))
        adata = read_anndata(path)
        source = ts.AnnDataSource(path, dense=rng.random() < 0.3, fields={"counts": "layers/counts"})
        strategy = make_strategy(rng.choice(STRATEGIES), n_obs, block_size=rng.choice([1, 3, 8]))
        dataset = ts.ShardedDataset(
            source, strategy, batch_size=rng.choice([1, 3, 16, 64, 256]), fetch_factor=rng.choice([1, 2, 16]),
            num_threads=rng.randint(1, 3), prefetch=rng.choice([None, 0, 1, 4]),
            prefetch_bytes=rng.choice([1 << 30, 1 << 16, 4096]), drop_last=rng.random() < 0.2, seed=trial,
        )  # fmt: skip
        workers = rng.choice([0, 0, 1, 2])
        loader_type = rng.choice([ts.DataLoader, DataLoader])
        fork = {"multiprocessing_context": "fork"} if workers else {}
        loader = loader_type(dataset, batch_size=None, num_workers=workers, **fork)
        context = (trial, path, dataset.strategy, dataset.batch_size, workers, loader_type.__module__)
        kept, steps = [], 0
        for batch in loader:
            for field, element in (("X", "X"), ("counts", "layers/counts")):
                assert_field_rows(batch, field, element_of(adata, element), batch["index"].numpy())
            if rng.random() < 0.1:
                kept.append(
                    (batch, {name: value.clone() for name, value in batch.items() if value.layout == torch.strided})
                )
            steps += 1
        assert steps == len(loader), context
        for batch, copy in kept:
            assert all(torch.equal(batch[name], value) for name, value in copy.items()), context


@pytest.mark.parametrize("kind", KINDS)
def test_names_and_columns(tmp_path, kind):
    adata, _ = make_adata("csr")
    source = ts.AnnDataSource(write(adata, tmp_path, kind))
    assert source.obs_names == list(adata.obs_names)
    assert source.var_names == list(adata.var_names)
    assert set(source.obs_columns) == set(adata.obs.columns)


@pytest.mark.parametrize("nullable", [False, True])
def test_an_obs_index_of_another_length_than_x_is_refused_at_open(tmp_path, nullable):
    # n_obs is the index's length as its metadata gives it (its names are read only when asked for): an
    # index of 12 names over 10 rows of X is still refused when the file opens, naming both.
    path = tmp_path / "cells.h5ad"
    ad.AnnData(X=np.ones((10, 3), np.float32)).write_h5ad(path)
    names = np.array([f"c{i}" for i in range(12)], dtype=object)
    with h5py.File(path, "r+") as f:
        del f["obs/_index"]
        if nullable:
            index = f["obs"].create_group("_index")
            index.attrs.update({"encoding-type": "nullable-string-array", "encoding-version": "0.1.0"})
            index.create_dataset("values", data=names, dtype=h5py.string_dtype())
            index.create_dataset("mask", data=np.zeros(12, bool))
        else:
            f["obs"].create_dataset("_index", data=names, dtype=h5py.string_dtype())
    with pytest.raises(RuntimeError, match="has 10 rows but obs has 12"):
        ts.open(path)


@pytest.mark.parametrize("as_dense, columns", [(False, N_VARS), (True, N_VARS), (True, 32)])
def test_shuffled_epoch_through_workers_matches_anndata(tmp_path, as_dense, columns):
    # dense=True: CSR rows scattered into dense rows in the workers' slabs; rows of 37 float32 (148 bytes)
    # written directly, rows of 32 (128 bytes, whole lines) built in a buffer and streamed out.
    adata, dense = make_adata("csr")
    adata, dense = adata[:, :columns].copy(), dense[:, :columns]
    path = write(adata, tmp_path, "h5ad")
    dataset = ts.ShardedDataset(
        ts.AnnDataSource(path, obs=["cell_type"], dense=as_dense),
        ts.BlockShuffling(8),
        batch_size=16,
        fetch_factor=2,
        seed=1,
    )
    codes = adata.obs["cell_type"].cat.codes.to_numpy()
    for context in ("fork", "spawn"):
        seen = []
        for batch in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context):
            index = batch["index"].numpy()
            assert batch["X"].layout == (torch.strided if as_dense else torch.sparse_csr)
            assert torch.equal(batch["X"].to_dense(), torch.from_numpy(dense[index]))
            assert batch["cell_type"].tolist() == codes[index].tolist()
            seen.extend(index.tolist())
        assert sorted(seen) == list(range(N_OBS))


def test_weighted_rows_repeat_within_a_fetch(tmp_path):
    adata, dense = make_adata("csr")
    path = write(adata, tmp_path, "zarr3")
    source = ts.AnnDataSource(path)
    rows = [3, 3, 3, 50, 3, 50]
    assert torch.equal(source.read(rows)["X"].to_dense(), torch.from_numpy(dense[rows]))


def _row_requests(rng):
    """Row orders a reader asks for: blocks in random order, single rows, runs that abut or overlap,
    repeats, the empty row 5, the first and last rows."""
    blocks = [list(range(b, min(b + 8, N_OBS))) for b in range(0, N_OBS, 8)]
    order = rng.permutation(len(blocks))
    yield [row for b in order for row in blocks[b]]  # BlockShuffling
    yield list(range(N_OBS))  # Streaming
    yield rng.permutation(N_OBS).tolist()  # every row alone
    yield [4, 5, 6, 0, 1, 2, 3, 7]  # runs that abut in the source, apart in the batch
    yield [10, 11, 12, 11, 12, 13]  # overlapping runs
    yield [119, 0, 119, 5, 5]  # repeats, the last row, the empty row
    yield rng.choice(N_OBS, size=300).tolist()  # with replacement (weighted sampling)


@pytest.mark.parametrize("kind", ["h5ad", "zarr3"])
def test_csr_rows_in_any_order_read_as_scipy_indexes_them(tmp_path, kind):
    adata, dense = make_adata("csr")
    source = ts.AnnDataSource(write(adata, tmp_path, kind))
    for rows in _row_requests(np.random.default_rng(3)):
        got = source.read(rows)["X"]
        want = adata.X[rows]
        assert torch.equal(got.crow_indices().long(), torch.from_numpy(want.indptr).long()), rows
        assert torch.equal(got.col_indices().long(), torch.from_numpy(want.indices).long()), rows
        assert torch.equal(got.values(), torch.from_numpy(want.data)), rows
        assert torch.equal(got.to_dense(), torch.from_numpy(dense[rows]))


@pytest.mark.parametrize("kind", ["h5ad", "zarr3"])
@pytest.mark.parametrize("index_dtype", [np.uint16, np.int32, np.int64])
def test_large_csr_read_in_pieces_as_scipy_indexes_it(tmp_path, kind, index_dtype):
    """Reads of many pieces: a shuffled fetch (a segment per row) is read through source order a few
    hundred KB at a time, and dense=True reads its rows in groups of about 128 KB (cut between blocks of
    rows, or inside a long one) scattered as they come: rows shuffled, repeated, and all in order."""
    rng = np.random.default_rng(5)
    x = sp.random(4000, 300, density=0.25, format="csr", dtype=np.float32, random_state=rng)
    x.indices = x.indices.astype(index_dtype)
    x.indptr = x.indptr.astype(np.int64)
    path = write(ad.AnnData(X=x), tmp_path, kind)
    sparse, dense = ts.AnnDataSource(path), ts.AnnDataSource(path, dense=True)
    blocks = rng.permutation(4000 // 50)
    rows = [r for b in blocks for r in range(b * 50, b * 50 + 50)]
    for request in (rng.permutation(rows).tolist(), rng.permutation(rows + rows[:700]).tolist(), list(range(4000))):
        got = sparse.read(request, num_threads=2)["X"]
        want = x[request]
        assert torch.equal(got.crow_indices().long(), torch.from_numpy(want.indptr).long())
        assert torch.equal(got.col_indices().long(), torch.from_numpy(want.indices).long())
        assert torch.equal(got.values(), torch.from_numpy(want.data))
        assert torch.equal(dense.read(request, num_threads=2)["X"], torch.from_numpy(want.toarray()))


def test_large_csr_reads_the_same_rows_from_a_mapping_and_by_copy(tmp_path):
    """A shuffled fetch's CSR rows are copied into place from where they lie in a mapped .h5ad (chunks
    of raw values), else through a staging of what was read by copy (TORCH_SHARDS_MMAP=0, read once per
    process: a process of its own): the same rows both ways, rows across chunks included."""
    rng = np.random.default_rng(8)
    x = sp.random(6000, 200, density=0.3, format="csr", dtype=np.float32, random_state=rng)
    path = tmp_path / "data.h5ad"
    ad.AnnData(X=x).write_h5ad(path)
    with h5py.File(path) as f:
        assert f["X/data"].chunks is not None and f["X/data"].chunks[0] < x.nnz  # rows cross chunks
    blocks = rng.permutation(6000 // 40)
    rows = rng.permutation([r for b in blocks for r in range(b * 40, b * 40 + 40)] + list(range(100))).tolist()
    script = (
        "import sys, torch, torch_shards as ts\n"
        "x = ts.AnnDataSource(sys.argv[1]).read([int(r) for r in sys.argv[3].split(',')], num_threads=2)['X']\n"
        "torch.save([t.clone() for t in (x.crow_indices(), x.col_indices(), x.values())], sys.argv[2])\n"
    )
    outputs = {}
    for mmap in ("1", "0"):
        out = tmp_path / f"rows_{mmap}.pt"
        env = dict(os.environ, TORCH_SHARDS_MMAP=mmap)
        done = subprocess.run(
            [sys.executable, "-c", script, str(path), str(out), ",".join(map(str, rows))],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outputs[mmap] = torch.load(out)
    want = x[rows]
    for got in outputs.values():
        assert torch.equal(got[0].long(), torch.from_numpy(want.indptr).long())
        assert torch.equal(got[1].long(), torch.from_numpy(want.indices).long())
        assert torch.equal(got[2], torch.from_numpy(want.data))


# ---- bad input ------------------------------------------------------------------------------------------


def test_string_obs_column_reads_as_codes_into_its_sorted_values(tmp_path):
    adata, _ = make_adata("csr")
    adata.obs["barcode"] = [f"AC{(i * 7) % N_OBS:04d}" for i in range(N_OBS)]  # unique, unsorted
    path = write(adata, tmp_path, "h5ad")
    source = ts.AnnDataSource(path, obs=["barcode"])
    values = sorted(adata.obs["barcode"])
    assert source.categories("barcode") == values
    codes = source.read(ROWS)["barcode"]
    assert codes.dtype == torch.int64
    assert [values[c] for c in codes.tolist()] == adata.obs["barcode"].iloc[ROWS].tolist()


def test_unknown_obs_column_and_layer_are_named(tmp_path):
    adata, _ = make_adata("csr")
    path = write(adata, tmp_path, "h5ad")
    with pytest.raises(ValueError, match=r"data.h5ad:/obs/age: no such obs column \(columns: .*cell_type"):
        ts.AnnDataSource(path, obs=["age"])
    with pytest.raises(ValueError, match=r"no layer 'spliced' \(layers: counts, dense_layer\)"):
        ts.AnnDataSource(path, layer="spliced")
    with pytest.raises(ValueError, match="obs column 'n_counts' is not categorical"):
        ts.AnnDataSource(path).categories("n_counts")


def test_csc_matrix_asks_for_csr(tmp_path):
    adata, dense = make_adata("dense")
    adata.X = sp.csc_matrix(dense)
    path = write(adata, tmp_path, "h5ad")
    with pytest.raises(ValueError, match=r"data.h5ad:/X: is a CSC .* adata.X = adata.X.tocsr\(\)"):
        ts.AnnDataSource(path)


def test_nullable_integer_column_reads_values_and_mask(tmp_path):
    adata, _ = make_adata("csr")
    adata.obs["age"] = pd.array([None] + list(range(1, N_OBS)), dtype="Int64")
    adata.obs["full"] = pd.array(range(N_OBS), dtype="Int64")
    path = write(adata, tmp_path, "h5ad")
    batch = ts.AnnDataSource(path, obs=["full", "age"]).read([4, 0, 9])
    assert batch["full"].tolist() == [4, 0, 9] and batch["full_mask"].tolist() == [False, False, False]
    assert batch["age"].dtype == torch.int64 and batch["age"].tolist() == [4, 0, 9]
    assert batch["age_mask"].dtype == torch.bool and batch["age_mask"].tolist() == [False, True, False]


def test_not_anndata_is_named(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((3, 3))
    with pytest.raises(RuntimeError, match="plain.h5:/: not an AnnData store"):
        ts.AnnDataSource(path)
    with pytest.raises(FileNotFoundError, match="AnnDataSource: No such file or directory") as caught:
        ts.AnnDataSource(tmp_path / "missing.h5ad")
    assert caught.value.filename == str(tmp_path / "missing.h5ad")


def rewrite(path, dataset, change):
    """Writes `dataset` of an HDF5 file again as change(its values) returns it, or as change left it in
    place (returning None)."""
    with h5py.File(path, "r+") as f:
        values = f[dataset][...]
        changed = change(values)
        del f[dataset]
        f[dataset] = values if changed is None else changed


def test_inconsistent_csr_is_detected(tmp_path):
    adata, _ = make_adata("csr")
    cases = {
        "indptr not monotone": ("X/indptr", lambda v: v.__setitem__(10, v[12] + 1), r"indptr: inconsistent at row"),
        "index out of range": (
            "X/indices",
            lambda v: v.__setitem__(3, N_VARS + 5),
            r"X/indices: column index 42 out of range \[0, 37\)",
        ),
        "negative index": ("X/indices", lambda v: v.__setitem__(0, -1), r"column index -1 out of range"),
    }
    for name, (dataset, mutate, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.h5ad"
        adata.write_h5ad(path)
        rewrite(path, dataset, mutate)
        source = ts.AnnDataSource(path)
        with pytest.raises(RuntimeError, match=message):
            source.read(range(N_OBS))


@pytest.mark.parametrize(
    "dtype, bad, message",
    [
        ("int8", -3, r"column index -3 out of range"),  # a number, not a character
        ("uint16", 40, r"column index 40 out of range \[0, 37\)"),
        ("int64", 1 << 40, r"column index 1099511627776 out of range"),
        ("uint64", (1 << 64) - 2, r"column index 18446744073709551614 out of range"),  # not negative
    ],
)
def test_column_indices_of_every_stored_width_are_read_and_checked(tmp_path, dtype, bad, message):
    adata, expected = make_adata("csr")
    path = tmp_path / f"{dtype}.h5ad"
    adata.write_h5ad(path)
    rewrite(path, "X/indices", lambda indices: indices.astype(dtype))
    # Shuffled, some rows twice: dense reads go in source order, then each row to its place.
    order = np.random.default_rng(1).permutation(N_OBS).tolist()
    order += order[:7]
    rows = ts.AnnDataSource(path, dense=True).read(order)["X"]
    np.testing.assert_array_equal(rows.numpy(), expected[order])
    with h5py.File(path, "r+") as f:
        indices = f["X/indices"][...]
        indices[5] = bad
        f["X/indices"][...] = indices
    for dense in (False, True):
        with pytest.raises(RuntimeError, match=message):
            ts.AnnDataSource(path, dense=dense).read(order)


def test_csr_lengths_that_disagree_are_detected_at_open(tmp_path):
    adata, _ = make_adata("csr")
    path = tmp_path / "short.h5ad"
    adata.write_h5ad(path)
    rewrite(path, "X/data", lambda data: data[:-3])
    with pytest.raises(RuntimeError, match=r"short.h5ad:/X: indices has \d+ entries but data has \d+"):
        ts.AnnDataSource(path)
    path = tmp_path / "rows.h5ad"
    adata.write_h5ad(path)
    rewrite(path, "X/indptr", lambda indptr: indptr[:-1])
    with pytest.raises(RuntimeError, match=r"rows.h5ad:/X/indptr: has 120 entries but the matrix has 120 rows"):
        ts.AnnDataSource(path)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_float_indptr_of_whole_numbers_reads_as_anndata_reads_it(tmp_path, dtype):
    adata, dense = make_adata("csr")
    path = tmp_path / f"{dtype}.h5ad"
    adata.write_h5ad(path)
    rewrite(path, "X/indptr", lambda indptr: indptr.astype(dtype))
    expected = ad.read_h5ad(path).X[ROWS]  # its indptr stays float, scipy's indexing casts it
    x = ts.AnnDataSource(path).read(ROWS)["X"]
    assert torch.equal(x.crow_indices().long(), torch.from_numpy(expected.indptr.astype(np.int64)))
    assert torch.equal(x.col_indices().long(), torch.from_numpy(expected.indices.astype(np.int64)))
    assert torch.equal(x.to_dense(), torch.from_numpy(dense[ROWS]))
    assert torch.equal(ts.AnnDataSource(path, dense=True).read(ROWS)["X"], torch.from_numpy(expected.toarray()))


@pytest.mark.parametrize(
    "dtype, entry, value, message",
    [
        ("float64", 7, "fraction", r"at row 7, indptr\[7\] is \d+\.5, not a whole number in \[0, 2\^53\]"),
        ("float64", 7, np.nan, r"at row 7, indptr\[7\] is nan, not a whole number"),
        ("float64", 0, -1.0, r"at row 0, indptr\[0\] is -1, not a whole number"),
        ("float64", 7, 2.0**53 + 2, r"at row 7, indptr\[7\] is 9007199254740994, not a whole number in \[0, 2\^53\]"),
        ("float64", N_OBS, np.inf, r"at the end of the last row, indptr\[120\] is inf, not a whole number"),
        ("float32", 7, 2.0**24 + 2, r"at row 7, indptr\[7\] is 16777218, not a whole number in \[0, 2\^24\]"),
    ],
)
def test_a_float_indptr_that_is_not_whole_numbers_is_refused_naming_the_row_and_value(
    tmp_path, dtype, entry, value, message
):
    adata, _ = make_adata("csr")
    path = tmp_path / "bad.h5ad"
    adata.write_h5ad(path)

    def change(indptr):
        indptr = indptr.astype(dtype)
        indptr[entry] = indptr[entry] + 0.5 if value == "fraction" else value
        return indptr

    rewrite(path, "X/indptr", change)
    with pytest.raises(RuntimeError, match=r"bad.h5ad:/X/indptr: " + message):
        ts.AnnDataSource(path).read(range(N_OBS))
    with pytest.raises(RuntimeError, match=r"not a whole number"):
        ts.AnnDataSource(path, dense=True).read([entry % N_OBS])


def test_fuzzed_csr_arrays_never_crash(tmp_path):
    adata, dense = make_adata("csr")
    rng = np.random.default_rng(7)
    template = tmp_path / "template.h5ad"
    adata.write_h5ad(template)
    for trial in range(60):
        path = tmp_path / f"fuzz{trial}.h5ad"
        path.write_bytes(template.read_bytes())
        dataset = ["X/indptr", "X/indices"][trial % 2]

        def scramble(values, trial=trial):
            positions = rng.integers(0, len(values), size=1 + trial % 5)
            values[positions] = rng.integers(-50, 5000, size=len(positions))

        rewrite(path, dataset, scramble)
        try:
            source = ts.AnnDataSource(path)
            x = source.read(range(N_OBS))["X"]
        except (RuntimeError, ValueError) as error:
            assert str(path) in str(error)
        else:
            # Corruption the checks let through stays within the matrix's shape.
            assert x.shape == (N_OBS, N_VARS)
            assert int(x.col_indices().max()) < N_VARS


def test_dense_true_sums_duplicate_entries_like_scipy(tmp_path):
    # Non-canonical CSR (a column listed twice in a row): toarray() sums them.
    matrix = sp.csr_matrix(
        (np.array([1.0, 2.0, 3.0], dtype=np.float32), np.array([1, 1, 0]), np.array([0, 2, 3])), shape=(2, 3)
    )
    path = tmp_path / "duplicates.h5ad"
    ad.AnnData(matrix).write_h5ad(path)
    got = ts.AnnDataSource(path, dense=True).read([1, 0])["X"]
    assert torch.equal(got, torch.from_numpy(matrix.toarray()[[1, 0]]))


def test_repeated_categories_are_refused_naming_the_element(tmp_path):
    # Two codes meaning one value: a corrupt file (pandas and anndata refuse it too), never silent data.
    path = tmp_path / "dup.h5ad"
    obs = pd.DataFrame({"cell_type": pd.Categorical(["a", "b", "c", "a"])}, index=[f"c{i}" for i in range(4)])
    ad.AnnData(np.zeros((4, 2), dtype=np.float32), obs=obs).write_h5ad(path)
    with h5py.File(path, "r+") as f:
        categories = f["obs/cell_type/categories"]
        categories[2] = "a"
    with pytest.raises(RuntimeError, match=r"obs/cell_type/categories: categories must be unique, \"a\" appears more"):
        list(ts.ShardedDataset(ts.AnnDataSource(path, obs=["cell_type"]), ts.Streaming(), batch_size=2))


def test_x_wider_than_var_is_refused(tmp_path):
    path = tmp_path / "wide.h5ad"
    ad.AnnData(sp.random(6, 4, density=0.5, format="csr", dtype=np.float32, random_state=0)).write_h5ad(path)
    with h5py.File(path, "r+") as f:
        f["X"].attrs["shape"] = np.array([6, 2**40])
    with pytest.raises(RuntimeError, match=r"/X: has 1099511627776 columns but var has 4 rows"):
        ts.AnnDataSource(path)


# ---- fields: every per-cell element in one batch --------------------------------------------------

FIELD_KINDS = ["h5ad", "zarr2", "zarr3"]
FIELD_SUFFIX = {"h5ad": ".h5ad", "zarr2": ".zarr2.zarr", "zarr3": ".zarr"}


def fields_file(tmp_path, kind, n_obs=40, seed=0):
    """A file with every kind of per-cell element, and what anndata reads for each field."""
    path = write_anndata(per_cell_anndata(n_obs, seed), tmp_path / f"cells{seed}{FIELD_SUFFIX[kind]}")
    adata = read_anndata(path)
    expected = {name: element_of(adata, element) for name, element in PER_CELL_FIELDS.items()}
    expected["X"] = element_of(adata, "X")
    expected["cell_type"] = adata.obs["cell_type"].cat.codes.to_numpy().astype(np.int64)
    expected["age"] = adata.obs["age"].fillna(0).to_numpy().astype(np.int64)
    expected["age_mask"] = adata.obs["age"].isna().to_numpy()
    return path, expected


@pytest.mark.parametrize("kind", FIELD_KINDS)
@pytest.mark.parametrize("dense", [False, True])
def test_every_field_holds_the_rows_anndata_reads(tmp_path, kind, dense):
    path, expected = fields_file(tmp_path, kind)
    source = ts.AnnDataSource(path, fields=PER_CELL_FIELDS, obs=["cell_type", "age"], dense=dense)
    assert source.fields == ["X", *PER_CELL_FIELDS, "cell_type", "age", "age_mask"]
    assert source.elements == PER_CELL_FIELDS
    sparse = {"X", "counts", "topics", "connectivities", "raw"}
    for rows in ([7, 0, 5, 39, 7, 20, 21, 22], list(range(40)), np.random.default_rng(1).permutation(40).tolist()):
        batch = source.read(rows, num_threads=2)
        assert list(batch) == source.fields
        for name in source.fields:
            assert (batch[name].layout == torch.sparse_csr) == (name in sparse and not dense), name
            assert_field_rows(batch, name, expected[name], rows)
    # Row shapes past the first dimension, dtypes as stored.
    assert batch["cube"].shape == (40, 2, 3) and batch["cube"].dtype == torch.int16
    assert batch["connectivities"].shape == (40, 40) and batch["raw"].shape == (40, 14)


def test_fields_through_a_sharded_dataset_and_dataloader_workers(tmp_path):
    path, expected = fields_file(tmp_path, "h5ad", n_obs=57)
    fields = {"counts": "layers/counts", "pca": "obsm/X_pca", "topics": "obsm/topics", "raw": "raw/X"}
    source = ts.AnnDataSource(path, fields=fields, obs=["cell_type"])
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=8, fetch_factor=2, seed=5)
    for workers, context in ((0, None), (2, "fork"), (2, "spawn")):
        seen = []
        loader = DataLoader(dataset, batch_size=None, num_workers=workers, multiprocessing_context=context)
        for batch in loader:
            assert list(batch) == ["X", *fields, "cell_type", "index"]
            index = batch["index"].numpy()
            for name in ["X", *fields, "cell_type"]:
                assert_field_rows(batch, name, expected[name], index)
            seen.extend(index.tolist())
        assert sorted(seen) == list(range(57)), workers


def test_x_under_another_name_is_delivered_only_there(tmp_path):
    path, expected = fields_file(tmp_path, "h5ad")
    # An obs column may then be named "X".
    source = ts.AnnDataSource(path, fields={"expression": "X", "pca": "obsm/X_pca"})
    assert source.fields == ["expression", "pca"]
    batch = source.read([3, 1])
    assert_field_rows(batch, "expression", expected["X"], [3, 1])
    # A field named "X" is the X field: layers/counts, as layer="counts" reads it.
    renamed = ts.AnnDataSource(path, fields={"pca": "obsm/X_pca", "X": "/layers/counts"})
    assert renamed.fields == ["pca", "X"]
    assert torch.equal(
        renamed.read([4, 2])["X"].to_dense(), ts.AnnDataSource(path, layer="counts").read([4, 2])["X"].to_dense()
    )


def test_layer_with_fields_reads_the_layer_as_x_and_ambiguous_combinations_are_refused(tmp_path):
    path, expected = fields_file(tmp_path, "h5ad")
    source = ts.AnnDataSource(path, layer="scaled", fields={"pca": "obsm/X_pca", "counts": "layers/counts"})
    assert source.fields == ["X", "pca", "counts"]
    batch = source.read([9, 0])
    for name, want in (("X", expected["scaled"]), ("pca", expected["pca"]), ("counts", expected["counts"])):
        assert_field_rows(batch, name, want, [9, 0])
    for fields in ({"X": "obsm/X_pca"}, {"expression": "X"}):
        with pytest.raises(
            ValueError, match=r"cells0.h5ad\): layer='scaled' and fields \{'\w+': '[\w/]+'\} are ambiguous"
        ):
            ts.AnnDataSource(path, layer="scaled", fields=fields)


def test_describe_names_the_fields_and_is_unchanged_without_them(tmp_path):
    path, _ = fields_file(tmp_path, "h5ad")
    size = os.path.getsize(path)
    # A checkpoint's source_hash hashes describe(): without fields= it stays as it always was.
    assert repr(ts.AnnDataSource(path, obs=["cell_type"])) == (
        f"AnnDataSource({path} [{size} bytes], X=X 40x11 csr, obs=[cell_type])"
    )
    assert repr(ts.AnnDataSource(path, layer="scaled", dense=True)) == (
        f"AnnDataSource({path} [{size} bytes], X=layers/scaled 40x11 dense, obs=[])"
    )
    assert repr(ts.AnnDataSource(path, fields={"pca": "obsm/X_pca", "cube": "obsm/cube", "t": "obsm/topics"})) == (
        f"AnnDataSource({path} [{size} bytes], X=X 40x11 csr, fields=[pca=obsm/X_pca 40x5 dense, "
        "cube=obsm/cube 40x2x3 dense, t=obsm/topics 40x4 csr], obs=[])"
    )
    assert repr(ts.AnnDataSource(path, fields={"x": "X"}, dense=True)) == (
        f"AnnDataSource({path} [{size} bytes], 40x11, fields=[x=X 40x11 csr->dense], obs=[])"
    )


def test_fields_pickle_and_sources_pickled_without_them_load(tmp_path):
    import pickle

    path, expected = fields_file(tmp_path, "zarr3")
    source = ts.AnnDataSource(path, fields={"pca": "obsm/X_pca"}, obs=["cell_type"])
    loaded = pickle.loads(pickle.dumps(source))
    assert loaded.fields == ["X", "pca", "cell_type"] and repr(loaded) == repr(source)
    assert_field_rows(loaded.read([6, 1]), "pca", expected["pca"], [6, 1])
    # A source pickled before fields= existed has no `elements`: it reads X and its obs columns.
    old = ts.AnnDataSource(path, obs=["cell_type"])
    state = old.__getstate__()
    del state["elements"]
    restored = ts.AnnDataSource.__new__(ts.AnnDataSource)
    restored.__dict__.update(state)
    assert restored.fields == ["X", "cell_type"] and repr(restored) == repr(old)


def test_open_passes_fields(tmp_path):
    path, expected = fields_file(tmp_path, "zarr2")
    source = ts.open(path, fields={"pca": "obsm/X_pca"})
    assert isinstance(source, ts.AnnDataSource) and source.fields == ["X", "pca"]
    assert_field_rows(source.read([2]), "pca", expected["pca"], [2])


def test_field_elements_that_are_not_read_are_refused_naming_file_element_and_encoding(tmp_path):
    adata = per_cell_anndata(12, 0)
    adata.layers["csc"] = sp.csc_matrix(adata.layers["counts"])
    adata.obsm["csc"] = sp.csc_matrix(adata.obsm["topics"])
    adata.obsm["frame"] = pd.DataFrame({"a": np.arange(12)}, index=adata.obs_names)
    adata.varm["loadings"] = np.zeros((11, 3))
    adata.uns["scalar"] = np.arange(4)
    path = write_anndata(adata, tmp_path / "bad.h5ad")
    with h5py.File(path, "r+") as f:
        # An awkward array as anndata writes one (a group of buffers), and an obsm array of another length.
        group = f["obsm"].create_group("ragged")
        group.attrs.update({"encoding-type": "awkward-array", "encoding-version": "0.1.0", "length": 12})
        group["node0-offsets"] = np.arange(13)
        f["obsm/short"] = np.zeros((5, 2), np.float32)
        f["obsm/short"].attrs.update({"encoding-type": "array", "encoding-version": "0.2.0"})
        f["obsm/names"] = np.array([b"a"] * 12, dtype="S1")
    where = r"bad\.h5ad:/"
    cases = {
        "layers/spliced": where + r"layers/spliced: no such element \(layers: counts, csc, scaled\)",
        "obsm/X_umap": where
        + r"obsm/X_umap: no such element \(obsm: X_pca, csc, cube, frame, names, ragged, short, topics\)",
        "layers/csc": where
        + r"layers/csc: is a CSC .*encoding-type 'csc_matrix'.*adata.layers\['csc'\] = adata.layers\['csc'\].tocsr\(\)",
        "obsm/csc": where + r"obsm/csc: is a CSC .*adata.obsm\['csc'\] = adata.obsm\['csc'\].tocsr\(\)",
        "obsm/frame": where + r"obsm/frame: unsupported matrix encoding-type 'dataframe'",
        "obsm/ragged": where + r"obsm/ragged: unsupported matrix encoding-type 'awkward-array'",
        "obsm/short": where + r"obsm/short: a dense array \(encoding-type 'array'\) of shape \[5, 2\] whose first "
        r"dimension is not n_obs \(12\)",
        "obsm/names": where + r"obsm/names: is an array of strings",
        "varm/loadings": r"bad\.h5ad: fields cannot read element 'varm/loadings' \(var, varm, varp, uns",
        "uns/scalar": r"bad\.h5ad: fields cannot read element 'uns/scalar' \(var, varm",
        "var": r"bad\.h5ad: fields cannot read element 'var' \(var, varm",
        "raw/var": r"fields cannot read element 'raw/var'",
        "obs/cell_type": r"fields cannot read element 'obs/cell_type' \(obs columns are read with obs=\)",
        "layers/a/b": r"element 'layers/a/b'; they read X, layers/<name>, obsm/<name>, obsp/<name> or raw/X",
    }
    for element, message in cases.items():
        with pytest.raises(ValueError, match=message):
            ts.AnnDataSource(path, fields={"f": element})
    # raw/X where the file has no raw.
    del adata.raw
    no_raw = write_anndata(adata, tmp_path / "no_raw.zarr")
    with pytest.raises(ValueError, match=r"no_raw.zarr:/raw/X: no such element \(the AnnData has no raw group\)"):
        ts.AnnDataSource(no_raw, fields={"f": "raw/X"})
    with pytest.raises(TypeError, match="fields must be a dict of field name -> element path"):
        ts.AnnDataSource(path, fields=["obsm/X_pca"])


def test_field_names_that_clash_are_refused(tmp_path):
    path, _ = fields_file(tmp_path, "h5ad")
    cases = [
        (
            {"fields": {"index": "obsm/X_pca"}},
            r"field 'index' \(element 'obsm/X_pca'\) clashes with the batch's \"index\"",
        ),
        (
            {"fields": {"cell_type": "obsm/X_pca"}, "obs": ["cell_type"]},
            r"obs column 'cell_type' clashes with a field name \(X, cell_type, index\)",
        ),
        (
            {"fields": {"age_mask": "obsm/X_pca"}, "obs": ["age"]},
            r"the mask field 'age_mask' of nullable obs column 'age' clashes",
        ),
        ({"fields": {"": "obsm/X_pca"}}, r"the field reading 'obsm/X_pca' has an empty name"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=r"AnnDataSource\(.*cells0\.h5ad\): " + message):
            ts.AnnDataSource(path, **kwargs)
    # Fields named like obs columns not asked for are fine; so is X read twice under two names.
    assert ts.AnnDataSource(path, fields={"cell_type": "X", "again": "X"}).fields == ["cell_type", "again"]
