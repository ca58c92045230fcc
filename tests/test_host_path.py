"""The host path (issue 17): output memory recycled across epochs, one pass
into the batches, copy work spread over the reader's threads, fetches larger
than prefetch_bytes read in pieces -- and none of it visible: the same
batches, in the same order, as before, and a batch the loop still holds is
never overwritten."""

import hashlib
import json
import os
import sys
import time

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import zarr
from conftest import STRATEGIES, make_strategy
from torch.utils.data import DataLoader
from zarr.codecs import BloscCodec

import torch_shards as ts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from host_path import faulted_bytes  # noqa: E402  (huge-page faults counted as their 2 MB)

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "host_path_batches.json")
ROWS = 203


# ---- identical batches before and after ------------------------------------------------------------------


def _plate(path, rows, seed):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, 11)).astype(np.float32)
    dense[rng.random(dense.shape) > 0.3] = 0
    obs = pd.DataFrame(
        {
            "label": pd.Categorical(rng.choice(["a", "b", "c"], size=rows), categories=["a", "b", "c"]),
            "depth": rng.integers(0, 1000, size=rows).astype(np.int32),
        },
        index=[f"s{seed}c{i}" for i in range(rows)],
    )
    ad.AnnData(sp.csr_matrix(dense), obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(11)])).write_h5ad(path)


@pytest.fixture(scope="module")
def golden_sources(tmp_path_factory):
    """Every kind of source, over deterministic values (the files' bytes may differ between library
    versions; their values do not)."""
    root = tmp_path_factory.mktemp("golden")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, 6)).astype(np.float32)
    y = rng.integers(0, 5, size=ROWS)
    with h5py.File(root / "contiguous.h5", "w") as f:
        f.create_dataset("X", data=x)
        f.create_dataset("y", data=y)
    with h5py.File(root / "chunked.h5", "w") as f:
        f.create_dataset("X", data=x, chunks=(16, 6), compression="gzip")
        f.create_dataset("y", data=y, chunks=(32,))
    z = zarr.create_array(root / "x.zarr", shape=x.shape, chunks=(10, 6), dtype=x.dtype, compressors=[BloscCodec()])
    z[:] = x
    _plate(root / "cells.h5ad", ROWS, 0)
    parts = []
    for i, rows in enumerate([70, 1, 132]):
        _plate(root / f"plate{i}.h5ad", rows, i + 1)
        parts.append(str(root / f"plate{i}.h5ad"))
    with h5py.File(root / "dense_a.h5", "w") as f:
        f.create_dataset("X", data=x[:90])
    with h5py.File(root / "dense_b.h5", "w") as f:
        f.create_dataset("X", data=x[90:], chunks=(8, 6), compression="gzip")
    return {
        "tensor": lambda: ts.TensorSource({"X": torch.from_numpy(x), "y": torch.from_numpy(y)}),
        "hdf5_contiguous": lambda: ts.HDF5Source(root / "contiguous.h5", {"X": "X", "y": "y"}),
        "hdf5_chunked": lambda: ts.HDF5Source(root / "chunked.h5", {"X": "X", "y": "y"}),
        "zarr": lambda: ts.ZarrSource(root / "x.zarr"),
        "anndata_csr": lambda: ts.AnnDataSource(root / "cells.h5ad", obs=["label", "depth"]),
        "anndata_dense": lambda: ts.AnnDataSource(root / "cells.h5ad", obs=["label"], dense=True),
        "collection_csr": lambda: ts.Collection([ts.AnnDataSource(p, obs=["label"]) for p in parts]),
        "collection_dense": lambda: ts.Collection(
            [ts.HDF5Source(root / "dense_a.h5", "X"), ts.HDF5Source(root / "dense_b.h5", "X")]
        ),
    }


def _digest_batch(hasher, batch):
    for name in sorted(batch):
        tensor = batch[name]
        hasher.update(name.encode())
        if tensor.layout == torch.sparse_csr:
            parts = [tensor.crow_indices().long(), tensor.col_indices().long(), tensor.values()]
        else:
            parts = [tensor]
        for part in parts:
            hasher.update(str(part.dtype).encode() + str(tuple(part.shape)).encode())
            hasher.update(part.contiguous().view(torch.uint8).numpy().tobytes())


def _golden_configurations(sources):
    for source_name, make_source in sources.items():
        for strategy_name in STRATEGIES:
            for epoch in (0, 1):
                for worker, num_workers in ((0, 1), (0, 2), (1, 2)):
                    yield (
                        f"{source_name}/{strategy_name}/epoch{epoch}/worker{worker}of{num_workers}",
                        (
                            make_source,
                            strategy_name,
                            epoch,
                            worker,
                            num_workers,
                        ),
                    )


def _digest(make_source, strategy_name, epoch, worker, num_workers, **options):
    arguments = dict(batch_size=7, fetch_factor=3, seed=11, num_threads=2, prefetch=2)
    arguments.update(options)
    dataset = ts.ShardedDataset(make_source(), make_strategy(strategy_name, ROWS), **arguments)
    iterator = dataset.native.iter_epoch(epoch, worker, num_workers)
    hasher = hashlib.sha256()
    count = 0
    for batch in iter(iterator.next, None):
        _digest_batch(hasher, batch)
        count += 1
    return f"{count}:{hasher.hexdigest()[:24]}"


def test_batches_are_identical_to_those_recorded_before_the_host_path(golden_sources):
    """Every source, every strategy, two epochs, three worker shares: the batches (rows, values, dtypes,
    CSR arrays) digest to what the reader delivered before output memory was recycled and laid out in
    one allocation per unit (tests/data/host_path_batches.json; TORCH_SHARDS_WRITE_GOLDEN=1 rewrites it)."""
    got = {name: _digest(*configuration) for name, configuration in _golden_configurations(golden_sources)}
    if os.environ.get("TORCH_SHARDS_WRITE_GOLDEN"):
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=0, sort_keys=True)
            f.write("\n")
    with open(GOLDEN) as f:
        want = json.load(f)
    assert got.keys() == want.keys()
    different = [name for name in want if got[name] != want[name]]
    assert not different, f"{len(different)} of {len(want)} configurations changed, e.g. {different[:5]}"


# ---- recycling is invisible ---------------------------------------------------------------------------------


def _snapshot(batch):
    """A deep copy of a batch (CSR arrays included), to compare with later."""
    out = {}
    for name, tensor in batch.items():
        if tensor.layout == torch.sparse_csr:
            out[name] = (tensor.crow_indices().clone(), tensor.col_indices().clone(), tensor.values().clone())
        else:
            out[name] = (tensor.clone(),)
    return out


def _same(batch, snapshot):
    assert batch.keys() == snapshot.keys()
    for name, tensor in batch.items():
        parts = (
            (tensor.crow_indices(), tensor.col_indices(), tensor.values())
            if tensor.layout == torch.sparse_csr
            else (tensor,)
        )
        for got, want in zip(parts, snapshot[name], strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want), name


HOLD_SOURCES = ["tensor", "hdf5_contiguous", "hdf5_chunked", "zarr", "anndata_csr", "anndata_dense", "collection_csr"]
# Default budget; one so small that every fetch is read in pieces of one batch, and the pool keeps nothing.
BUDGETS = [1 << 30, 1]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("source_name", HOLD_SOURCES)
def test_held_batches_are_never_overwritten_by_later_epochs(golden_sources, source_name, budget):
    """Hold every batch of an epoch while the same dataset (the same pool) reads two more epochs: the held
    batches keep exactly the values a fresh dataset delivers (copied as they arrive)."""
    options = dict(batch_size=7, fetch_factor=3, seed=5, num_threads=2, prefetch=2, prefetch_bytes=budget)
    make_source = golden_sources[source_name]
    ds = ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options)
    held = list(ds)  # epoch 0, every batch kept
    for _ in range(2):  # epochs 1 and 2 recycle whatever the pool may
        for batch in ds:
            del batch
    fresh = [_snapshot(batch) for batch in ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options)]
    assert len(held) == len(fresh) == len(ds)
    for batch, snapshot in zip(held, fresh, strict=True):
        _same(batch, snapshot)
    assert sorted(torch.cat([b["index"] for b in held]).tolist()) == list(range(ROWS))


@pytest.mark.parametrize("budget", BUDGETS)
def test_batches_read_in_pieces_are_the_recorded_ones(golden_sources, budget):
    """prefetch_bytes below a fetch splits its reading into pieces of whole batches: every source, strategy,
    epoch and worker share still digests to the recorded batches."""
    with open(GOLDEN) as f:
        want = json.load(f)
    different = [
        name
        for name, configuration in _golden_configurations(golden_sources)
        if _digest(*configuration, prefetch_bytes=budget) != want[name]
    ]
    assert not different, different[:5]


def test_read_on_demand_is_the_recorded_batches(golden_sources):
    """prefetch=0 (read on the calling thread and its helpers) with the recycled memory: same batches."""
    with open(GOLDEN) as f:
        want = json.load(f)
    different = [
        name
        for name, configuration in _golden_configurations(golden_sources)
        if _digest(*configuration, prefetch=0) != want[name]
    ]
    assert not different, different[:5]


def test_fetch_transform_sees_whole_fetches_when_read_in_pieces(golden_sources):
    seen = []

    def transform(unit):
        seen.append(unit["index"].numel())
        return unit

    ds = ts.ShardedDataset(
        golden_sources["anndata_csr"](),
        ts.BlockShuffling(4),
        batch_size=7,
        fetch_factor=3,
        seed=5,
        num_threads=2,
        prefetch_bytes=1,
        fetch_transform=transform,
    )
    batches = [_snapshot(b) for b in ds]
    plain = ts.ShardedDataset(
        golden_sources["anndata_csr"](), ts.BlockShuffling(4), batch_size=7, fetch_factor=3, seed=5, num_threads=2
    )
    for batch, snapshot in zip(plain, batches, strict=True):
        _same(batch, snapshot)
    # Whole fetches of 21 rows; the rows past the last full fetch are dealt as single batches, and one
    # worker's tail batches of one fetch are read (and transformed) together.
    full = ROWS // 21
    assert seen == [21] * full + [ROWS - 21 * full]


def test_output_memory_is_recycled_across_epochs():
    """After the first epoch the reader hands out memory it already has: the memory faulted in per epoch
    is a small fraction of the bytes delivered, and the pool reports reuses."""
    rows, width = 4096, 1024  # 16 MB of 4 KB rows per epoch
    source = ts.TensorSource({"X": torch.randn(rows, width)})
    ds = ts.ShardedDataset(source, ts.BlockShuffling(64), batch_size=256, seed=0, num_threads=2)
    faulted = []
    for _ in range(4):
        before = faulted_bytes()
        count = sum(batch["X"].shape[0] for batch in ds)
        faulted.append(faulted_bytes() - before)
        assert count == rows
    epoch_bytes = rows * width * 4
    assert max(faulted[1:]) < 0.05 * epoch_bytes, (faulted, epoch_bytes)
    iterator = ds.native.iter()
    next(iter(iter(iterator.next, None)))
    stats = dict(iterator.stats())
    iterator.close()
    assert stats["pool_reuses"] > 0 and stats["pool_kept_bytes"] <= ds.prefetch_bytes + 2 * 16 * 256 * 4 * width


def _pool_allocations(ds):
    iterator = ds.native.iter()
    next(iter(iter(iterator.next, None)))
    stats = dict(iterator.stats())
    iterator.close()
    return stats["pool_allocations"]


def test_units_larger_than_half_the_budget_are_recycled_too():
    """Units of 2/3 of prefetch_bytes, four per epoch: two in flight (the second starts while the bytes out
    are under the budget, and takes them past it), the one the loop goes through and the one before it (its
    last batch still held while the next is asked for). The pool keeps all four: after the first epochs it
    allocates nothing more (it kept three and allocated the fourth afresh every epoch)."""
    rows, width = 16384, 256  # 1 KB rows; units of 4096 rows = 4 MB
    source = ts.TensorSource({"X": torch.randn(rows, width)})
    ds = ts.ShardedDataset(source, ts.BlockShuffling(64), batch_size=256, seed=0, num_threads=2, prefetch_bytes=6 << 20)

    def epoch():  # a loop slower than the reader, holding the previous batch while it takes the next
        count, previous = 0, None
        for batch in ds:
            time.sleep(0.002)
            count += batch["X"].shape[0]
            previous = batch  # noqa: F841
        assert count == rows

    for _ in range(2):
        epoch()
    settled = _pool_allocations(ds)
    for _ in range(3):
        epoch()
    assert _pool_allocations(ds) == settled


# ---- outputs past the caches are streamed out (core/streaming_copy.h) ----------------------------------------

STREAMED_ROWS = 5000  # one whole fetch (batch 256 x fetch_factor 16 = 4096 rows) of >= 8 MB: streamed out


def _epoch_by_row(dataset, field):
    """Every row of one epoch, by source row, as dense numpy (CSR batches densified)."""
    out = {}
    for batch in dataset:
        values = batch[field]
        values = values.to_dense() if values.layout == torch.sparse_csr else values
        for row, value in zip(batch["index"].tolist(), values.numpy()):
            assert row not in out
            out[row] = value
    return out


@pytest.mark.parametrize("kind", ["tensor", "tensor_collection", "hdf5_contiguous", "hdf5_chunked"])
@pytest.mark.parametrize("columns", [1001, 2048])  # rows of 4004 bytes (not 16-byte aligned) and of 8 KB
# Whole fetches (the default budget), or pieces of 8 MB, one in flight at a time.
@pytest.mark.parametrize("prefetch_bytes", [None, 8 << 20])
def test_large_fetches_are_read_exactly(tmp_path, kind, columns, prefetch_bytes):
    x = torch.randn(STREAMED_ROWS, columns)
    if kind == "tensor":
        source = ts.TensorSource({"X": x})
    elif kind == "tensor_collection":  # each part copies its rows in source order to scattered places
        source = ts.Collection([ts.TensorSource({"X": x[:1700]}), ts.TensorSource({"X": x[1700:]})])
    else:
        path = tmp_path / "wide.h5"
        with h5py.File(path, "w") as f:  # chunked: uncompressed, read straight from the file like contiguous
            f.create_dataset("X", data=x.numpy(), chunks=(64, columns) if kind == "hdf5_chunked" else None)
        source = ts.HDF5Source(path, "X")
    budget = {} if prefetch_bytes is None else {"prefetch_bytes": prefetch_bytes}
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(64), batch_size=256, seed=3, num_threads=2, **budget)
    for _ in range(2):  # the second epoch writes into recycled memory
        rows = _epoch_by_row(dataset, "X")
        assert sorted(rows) == list(range(STREAMED_ROWS))
        np.testing.assert_array_equal(np.stack([rows[i] for i in range(STREAMED_ROWS)]), x.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.bool_])
def test_large_dense_outputs_of_csr_match_scipy(tmp_path, dtype):
    """dense=True with fetches of many MB: rows are built in a small buffer and streamed out, which must
    zero every column between rows and sum duplicate column entries as scipy's toarray() does."""
    columns = 2100  # a fetch's output is >= 8.6 MB for every dtype
    rng = np.random.default_rng(11)
    matrix = sp.random(STREAMED_ROWS, columns, density=0.02, format="csr", random_state=11, dtype=np.float64)
    matrix.data = rng.integers(1, 4, size=matrix.nnz).astype(np.float64)
    # Row 5 lists column 7 three times (non-canonical CSR): scipy sums them.
    indptr, indices, data = matrix.indptr.copy(), matrix.indices.copy(), matrix.data.copy()
    insert_at = indptr[5]
    indices = np.insert(indices, insert_at, [7, 7, 7])
    data = np.insert(data, insert_at, [1.0, 2.0, 1.0])
    indptr[6:] += 3
    matrix = sp.csr_matrix((data.astype(dtype), indices, indptr), shape=(STREAMED_ROWS, columns))
    path = tmp_path / "wide.h5ad"
    ad.AnnData(matrix).write_h5ad(path)
    want = matrix.toarray()
    dataset = ts.ShardedDataset(
        ts.AnnDataSource(path, dense=True), ts.BlockShuffling(64), batch_size=256, seed=1, num_threads=2
    )
    for _ in range(2):
        rows = _epoch_by_row(dataset, "X")
        assert sorted(rows) == list(range(STREAMED_ROWS))
        np.testing.assert_array_equal(np.stack([rows[i] for i in range(STREAMED_ROWS)]), want)


def _in_turn(by_worker):
    """The batches of each worker in the order a DataLoader yields them: one from each worker in turn, skipping
    workers that have delivered all theirs."""
    out = []
    for i in range(max(len(batches) for batches in by_worker)):
        out.extend(batches[i] for batches in by_worker if i < len(batches))
    return out


def _loader_epochs(make_dataset, context, epochs, pin_memory=False):
    loader = DataLoader(
        make_dataset(),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,
        pin_memory=pin_memory,
    )
    held = list(loader)  # epoch 0, every batch kept by the main process
    assert len(held) == len(loader)
    for _ in range(epochs - 1):
        for batch in loader:
            del batch
    return held


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("source_name", ["tensor", "hdf5_chunked", "anndata_csr"])
def test_batches_from_workers_held_by_the_main_process_are_never_overwritten(golden_sources, source_name, context):
    options = dict(batch_size=7, fetch_factor=3, seed=5, num_threads=1, prefetch=2)
    make_source = golden_sources[source_name]
    held = _loader_epochs(lambda: ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options), context, 3)
    # The same batches, copied as they arrive, read in-process by worker share (the DataLoader's order).
    ds = ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options)
    by_worker = [[_snapshot(b) for b in iter(ds.native.iter_epoch(0, w, 2).next, None)] for w in range(2)]
    expected = _in_turn(by_worker)
    assert len(held) == len(expected)
    for batch, snapshot in zip(held, expected, strict=True):
        _same(batch, snapshot)
    assert sorted(torch.cat([b["index"] for b in held]).tolist()) == list(range(ROWS))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory needs CUDA")
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_pinned_batches_from_workers_are_never_overwritten(golden_sources, context):
    options = dict(batch_size=7, fetch_factor=3, seed=5, num_threads=1, prefetch=2)
    make_source = golden_sources["hdf5_contiguous"]
    held = _loader_epochs(
        lambda: ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options), context, 3, pin_memory=True
    )
    assert all(b["X"].is_pinned() for b in held)
    ds = ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options)
    by_worker = [[_snapshot(b) for b in iter(ds.native.iter_epoch(0, w, 2).next, None)] for w in range(2)]
    expected = _in_turn(by_worker)
    for batch, snapshot in zip(held, expected, strict=True):
        _same(batch, snapshot)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory needs CUDA")
def test_pinned_batches_in_process_are_recycled_and_never_overwritten(golden_sources):
    options = dict(batch_size=7, fetch_factor=3, seed=5, num_threads=2, prefetch=2, pin_memory=True)
    make_source = golden_sources["hdf5_chunked"]
    ds = ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options)
    held = list(ds)
    assert all(b["X"].is_pinned() for b in held)
    for _ in range(2):
        for batch in ds:
            del batch
    fresh = [_snapshot(b) for b in ts.ShardedDataset(make_source(), ts.BlockShuffling(4), **options)]
    for batch, snapshot in zip(held, fresh, strict=True):
        _same(batch, snapshot)
