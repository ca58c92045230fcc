"""The host path (issue 17): output memory recycled across epochs, one pass
into the batches, copy work spread over the reader's threads, fetches larger
than prefetch_bytes read in pieces -- and none of it visible: the same
batches, in the same order, as before, and a batch the loop still holds is
never overwritten."""

import hashlib
import json
import os
import resource

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import zarr
from conftest import STRATEGIES, make_strategy
from zarr.codecs import BloscCodec

import torch_shards as ts

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
                    yield f"{source_name}/{strategy_name}/epoch{epoch}/worker{worker}of{num_workers}", (
                        make_source,
                        strategy_name,
                        epoch,
                        worker,
                        num_workers,
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
