"""DataLoader workers read HDF5 after the main process used HDF5, under fork,
spawn and forkserver, persistent or not, on every HDF5 read path: pread of
contiguous data, native chunk decoding, and HDF5's own reader (filters only
the library decodes, compact layout), for HDF5Source and AnnDataSource.

Every DataLoader has a timeout: a worker that deadlocks on the HDF5 lock
fails the test ("DataLoader timed out") instead of hanging it."""

import threading

import anndata as ad
import h5py
import hdf5plugin
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from torch.utils.data import DataLoader

import torch_shards as ts

ROWS = 120

# One dataset per HDF5 read path, all with ROWS rows.
LAYOUTS = {
    "contiguous": {},
    "chunked": {"chunks": (10, 4)},
    "gzip": {"chunks": (10, 4), "compression": "gzip", "shuffle": True},
    "blosc": {"chunks": (10, 4), **hdf5plugin.Blosc(cname="lz4")},
    "zstd": {"chunks": (10, 4), **hdf5plugin.Zstd()},
    "fletcher32": {"chunks": (10, 4), "fletcher32": True},
    "scaleoffset": {"chunks": (10, 4), "scaleoffset": 0},
    "compact": {"compact": True},
}


def hdf5_values(layout):
    return (np.arange(ROWS * 4, dtype=np.int32).reshape(ROWS, 4) * 7 + len(layout)).astype(np.int32)


@pytest.fixture(scope="module")
def hdf5_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fork") / "layouts.h5"
    with h5py.File(path, "w") as f:
        for layout, kwargs in LAYOUTS.items():
            kwargs = dict(kwargs)
            if kwargs.pop("compact", False):
                space = h5py.h5s.create_simple((ROWS, 4))
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.COMPACT)
                h5py.h5d.create(f.id, layout.encode(), h5py.h5t.STD_I32LE, space, dcpl=dcpl)
                f[layout][...] = hdf5_values(layout)
            else:
                f.create_dataset(layout, data=hdf5_values(layout), **kwargs)
        assert f["compact"].id.get_create_plist().get_layout() == h5py.h5d.COMPACT
    return path


@pytest.fixture(scope="module")
def h5ad_file(tmp_path_factory):
    """CSR X whose data HDF5 itself must decode (Fletcher-32), a categorical obs column."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((ROWS, 9)).astype(np.float32)
    dense[rng.random(dense.shape) > 0.3] = 0
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(rng.choice(["T", "B", "NK"], size=ROWS))},
        index=[f"c{i}" for i in range(ROWS)],
    )
    adata = ad.AnnData(X=sp.csr_matrix(dense), obs=obs)
    path = tmp_path_factory.mktemp("fork") / "cells.h5ad"
    adata.write_h5ad(path)
    with h5py.File(path, "r+") as f:
        data = f["X/data"][...]
        del f["X/data"]
        f.create_dataset("X/data", data=data, chunks=(16,), fletcher32=True)
    codes = obs["cell_type"].cat.codes.to_numpy()
    return path, dense, codes


def check_hdf5_batch(batch):
    index = batch["index"].numpy()
    for layout in LAYOUTS:
        assert torch.equal(batch[layout], torch.from_numpy(hdf5_values(layout)[index])), layout


def check_anndata_batch(batch, dense, codes):
    index = batch["index"].numpy()
    assert torch.equal(batch["X"].to_dense(), torch.from_numpy(dense[index]))
    assert batch["cell_type"].tolist() == codes[index].tolist()


def read_epochs(source, check, context, persistent, epochs):
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(8), batch_size=10, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        timeout=30,
        multiprocessing_context=context,
        persistent_workers=persistent,
    )
    for _ in range(epochs):
        seen = []
        for batch in loader:
            check(batch)
            seen.extend(batch["index"].tolist())
        assert sorted(seen) == list(range(ROWS))


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_read_every_hdf5_path_after_the_parent_used_hdf5(hdf5_file, h5ad_file, context, persistent):
    h5ad_path, dense, codes = h5ad_file
    # Building the sources (and reading once) uses HDF5 in this process before the workers start.
    hdf5 = ts.HDF5Source(hdf5_file, {layout: layout for layout in LAYOUTS})
    check_hdf5_batch(dict(hdf5.read(range(ROWS)), index=torch.arange(ROWS)))
    anndata = ts.AnnDataSource(h5ad_path, obs=["cell_type"])
    epochs = 2 if persistent else 1  # persistent workers: the second epoch reuses them
    read_epochs(hdf5, check_hdf5_batch, context, persistent, epochs)
    read_epochs(anndata, lambda batch: check_anndata_batch(batch, dense, codes), context, persistent, epochs)


def test_forked_workers_start_while_parent_threads_are_inside_hdf5(hdf5_file):
    """The parent's native threads read through HDF5's own reader while forked
    workers start: each fork waits for them to leave the library."""
    library_paths = ts.HDF5Source(hdf5_file, {layout: layout for layout in ("fletcher32", "scaleoffset", "compact")})
    stop = threading.Event()
    parent_batches = []
    failure = []

    def read_in_parent():
        try:
            while not stop.is_set():
                dataset = ts.ShardedDataset(library_paths, ts.BlockShuffling(4), batch_size=5, seed=1, num_threads=2)
                for batch in dataset:
                    index = batch["index"].numpy()
                    assert torch.equal(batch["fletcher32"], torch.from_numpy(hdf5_values("fletcher32")[index]))
                    parent_batches.append(len(index))
        except Exception as error:  # reported by the main thread
            failure.append(error)

    thread = threading.Thread(target=read_in_parent)
    thread.start()
    try:
        for _ in range(3):
            read_epochs(ts.HDF5Source(hdf5_file, {"fletcher32": "fletcher32"}), check_fletcher32, "fork", False, 1)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and not failure, failure
    assert parent_batches


def check_fletcher32(batch):
    index = batch["index"].numpy()
    assert torch.equal(batch["fletcher32"], torch.from_numpy(hdf5_values("fletcher32")[index]))
