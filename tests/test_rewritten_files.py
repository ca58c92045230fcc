"""Files rewritten or replaced while a job reads them: never mixed rows, a clear error instead.

A file written in place (an .h5ad saved again under its path, a zarr shard rewritten) is found out
after the read that could have seen it, before its rows are delivered; a store replaced (renamed over)
is found out when a read opens one of its new files; a chunk or shard that zarr-python wrote again
(a new file renamed over the old, the metadata left alone) is found out once read before; a forked
DataLoader worker that finds another file under the path than its parent opened refuses it. What was
read before the change is delivered as it was read.
"""

import os
import shutil
import time

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

import torch_shards as ts

anndata = pytest.importorskip("anndata")
zarr = pytest.importorskip("zarr")


def _write_h5ad(path, x):
    anndata.AnnData(X=sp.csr_matrix(x)).write_h5ad(path)


def _matrix(rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = rng.random((rows, cols), dtype=np.float32)
    x[x < 0.8] = 0
    return x


def _dense(batch):
    x = batch["X"]
    return x.to_dense() if x.layout == torch.sparse_csr else x


def test_an_h5ad_written_again_in_place_is_refused_and_nothing_mixed_is_delivered(tmp_path):
    path = tmp_path / "cells.h5ad"
    old, new = _matrix(20000, 30, 0), _matrix(20000, 30, 1)
    _write_h5ad(path, old)
    inode = os.stat(path).st_ino
    dataset = ts.ShardedDataset(
        ts.AnnDataSource(path), ts.BlockShuffling(block_size=50), batch_size=100, fetch_factor=1, prefetch=1, seed=0
    )
    batches = iter(dataset)
    delivered = [next(batches) for _ in range(3)]
    _write_h5ad(path, new)
    assert os.stat(path).st_ino == inode  # anndata (h5py) truncates and writes the same file
    with pytest.raises(RuntimeError, match=r"cells.h5ad: the file changed while being read \((size|written) "):
        for batch in batches:
            delivered.append(batch)
    assert len(delivered) < 200
    for batch in delivered:  # read before the change: the old rows, whole
        assert np.array_equal(_dense(batch).numpy(), old[batch["index"].numpy()])
    # Opened again, the file reads as written now.
    again = ts.AnnDataSource(path).read([0, 19999])
    assert np.array_equal(_dense(again).numpy(), new[[0, 19999]])


def _zarr_array(path, x, *, zarr_format, shards=None):
    if zarr_format == 2:
        z = zarr.create_array(path, shape=x.shape, chunks=(10, x.shape[1]), dtype=x.dtype, zarr_format=2)
    else:
        z = zarr.create_array(path, shape=x.shape, chunks=(10, x.shape[1]), shards=shards, dtype=x.dtype)
    z[:] = x


def _opened_after_a_read(path, *, zarr_format=3, shards=None, rows=(3,)):
    """A zarr array of 100 x 4 written, opened and read once (its first chunk, or shard, opened)."""
    old = np.arange(400, dtype=np.float32).reshape(100, 4)
    _zarr_array(path, old, zarr_format=zarr_format, shards=shards)
    source = ts.ZarrSource(path)
    assert torch.equal(source.read(list(rows))["X"], torch.from_numpy(old[list(rows)]))
    return source, old


def _replace(path, tmp_path, write):
    """A new store written beside `path`, renamed over it; the old store kept (moved aside)."""
    fresh = tmp_path / "fresh.zarr"
    write(fresh)
    os.rename(path, tmp_path / "old.zarr")
    os.rename(fresh, path)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_store_replaced_by_a_rename_is_refused_when_its_new_chunks_would_be_read(tmp_path, zarr_format):
    path = tmp_path / "x.zarr"
    source, old = _opened_after_a_read(path, zarr_format=zarr_format, rows=(0, 1))
    _replace(path, tmp_path, lambda fresh: _zarr_array(fresh, old + 1000, zarr_format=zarr_format))
    metadata = ".zarray" if zarr_format == 2 else "zarr.json"
    with pytest.raises(
        RuntimeError, match=rf"x.zarr/{metadata}: the zarr store changed while being read \(another file now: inode"
    ):
        source.read([0, 55])


def test_a_sharded_store_replaced_reads_the_shards_it_opened_and_refuses_new_ones(tmp_path):
    path = tmp_path / "x.zarr"
    source, old = _opened_after_a_read(path, shards=(50, 4))  # shard 0 opened
    _replace(path, tmp_path, lambda fresh: _zarr_array(fresh, old + 1000, zarr_format=3, shards=(50, 4)))
    # Shard 0 is the file opened (still there, moved aside): its rows read as they were.
    assert torch.equal(source.read([7, 3])["X"], torch.from_numpy(old[[7, 3]]))
    with pytest.raises(RuntimeError, match=r"the zarr store changed while being read"):
        source.read([7, 60])  # shard 1 would come from the new store


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_chunks_written_again_by_zarr_are_refused_once_read_before(tmp_path, zarr_format):
    # zarr-python writes each chunk to a new file renamed over the old one and leaves the metadata file
    # alone: a chunk read before is found changed by its stamp from then (rows 0-9, chunk 0).
    path = tmp_path / "x.zarr"
    source, old = _opened_after_a_read(path, zarr_format=zarr_format, rows=(0, 1))
    metadata = path / (".zarray" if zarr_format == 2 else "zarr.json")
    before = metadata.stat().st_mtime_ns
    zarr.open_array(path, mode="r+")[:] = old + 1000
    assert metadata.stat().st_mtime_ns == before
    with pytest.raises(RuntimeError, match=r"x.zarr/(0.0|c/0/0): the zarr chunk changed while being read"):
        source.read([55, 0])


def test_a_shard_opened_after_held_shards_were_written_again_is_refused(tmp_path):
    path = tmp_path / "x.zarr"
    source, old = _opened_after_a_read(path, shards=(50, 4))  # holds shard 0
    zarr.open_array(path, mode="r+")[:] = old + 1000  # every shard a new file
    assert torch.equal(source.read([7])["X"], torch.from_numpy(old[[7]]))  # the shard held, as it was
    with pytest.raises(RuntimeError, match=r"c/0/0: the zarr store changed while being read \(another file now"):
        source.read([7, 60])  # shard 1 would be the new one


def test_a_category_code_past_the_categories_of_a_rewritten_file_is_reported_as_the_change(tmp_path):
    path = tmp_path / "cells.h5ad"
    x = sp.csr_matrix(_matrix(200, 4, 0))

    def write(codes, categories):
        obs = pd.DataFrame(
            {"cat": pd.Categorical.from_codes(codes, categories=categories)}, index=[str(i) for i in range(200)]
        )
        anndata.AnnData(X=x, obs=obs).write_h5ad(path)

    write(np.arange(200) % 3, ["a", "b", "c"])
    source = ts.AnnDataSource(path, obs=["cat"])
    assert source.read([0, 1, 2])["cat"].tolist() == [0, 1, 2]
    time.sleep(0.02)
    write(np.arange(200) % 6, ["a", "b", "c", "d", "e", "f"])
    with pytest.raises(RuntimeError, match=r"cells.h5ad: the file changed while being read"):
        source.read([3, 4, 5])


def test_a_shard_written_again_in_place_is_refused_even_with_the_same_bytes(tmp_path):
    path = tmp_path / "x.zarr"
    old = np.arange(400, dtype=np.float32).reshape(100, 4)
    _zarr_array(path, old, zarr_format=3, shards=(100, 4))
    source = ts.ZarrSource(path)
    dataset = ts.ShardedDataset(source, ts.Streaming(), batch_size=10, fetch_factor=1, prefetch=1)
    batches = iter(dataset)
    assert torch.equal(next(batches)["X"], torch.from_numpy(old[:10]))
    assert torch.equal(source.read([3])["X"], torch.from_numpy(old[[3]]))
    shard = path / "c" / "0" / "0"
    contents = shard.read_bytes()
    time.sleep(0.02)  # past a clock tick: kernels before 6.13 stamp a write in the tick of the open alike
    shard.write_bytes(contents)
    with pytest.raises(RuntimeError, match=r"c/0/0: the file changed while being read"):
        source.read([3])
    with pytest.raises(RuntimeError, match=r"c/0/0: the file changed while being read"):
        list(batches)


def test_a_file_read_before_the_change_and_not_since_does_not_fail_other_reads(tmp_path):
    # Only the files a read used are checked: a collection part rewritten is the concern of reads of it.
    a, b = tmp_path / "a.h5ad", tmp_path / "b.h5ad"
    x = _matrix(100, 8, 0)
    _write_h5ad(a, x)
    _write_h5ad(b, x)
    collection = ts.open([a, b])
    assert np.array_equal(_dense(collection.read([0, 150])).numpy(), x[[0, 50]])
    _write_h5ad(b, x * 2)
    assert np.array_equal(_dense(collection.read([5, 6])).numpy(), x[[5, 6]])
    with pytest.raises(RuntimeError, match=r"b.h5ad: the file changed while being read"):
        collection.read([5, 106])


def test_a_forked_worker_that_finds_another_file_under_the_path_refuses_it(tmp_path):
    path = tmp_path / "cells.h5ad"
    old = _matrix(1000, 8, 0)
    _write_h5ad(path, old)
    dataset = ts.ShardedDataset(ts.AnnDataSource(path), ts.Streaming(), batch_size=100)
    assert np.array_equal(_dense(next(iter(dataset))).numpy(), old[:100])  # opened in this process
    fresh = tmp_path / "fresh.h5ad"
    _write_h5ad(fresh, old + 1)
    os.replace(fresh, path)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(RuntimeError, match=r"cells.h5ad: the file changed since the dataset opened it \(another file"):
        list(loader)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_checks_can_be_turned_off_for_storage_whose_files_get_touched(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "x.zarr"
    _zarr_array(path, np.arange(400, dtype=np.float32).reshape(100, 4), zarr_format=3, shards=(100, 4))
    script = f"""
import os, torch_shards as ts
source = ts.ZarrSource({str(path)!r})
source.read([3])
os.utime({str(path / "c" / "0" / "0")!r}, ns=(0, 0))  # a purge script's touch: the same bytes
try:
    print(source.read([3])["X"].tolist())
except RuntimeError as error:
    print("refused:", "the file changed while being read" in str(error))
"""
    outputs = []
    for setting in ("1", "0"):
        env = dict(os.environ, TORCH_SHARDS_CHECK_FILES=setting)
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout.strip().splitlines()[-1])
    assert outputs == ["refused: True", "[[12.0, 13.0, 14.0, 15.0]]"]


def test_the_torchscript_door_refuses_a_rewritten_file_alike(tmp_path):
    path = tmp_path / "cells.h5ad"
    old = _matrix(4000, 8, 0)
    _write_h5ad(path, old)
    dataset = ts.ShardedDataset(ts.AnnDataSource(path), ts.Streaming(), batch_size=100, fetch_factor=1, prefetch=1)
    native = dataset.native
    iterator = native.iter()
    assert np.array_equal(_dense(iterator.next()).numpy(), old[:100])
    time.sleep(0.02)
    _write_h5ad(path, old * 2)
    with pytest.raises(RuntimeError, match=r"cells.h5ad: the file changed while being read"):
        for _ in range(40):
            batch = iterator.next()
            assert np.array_equal(_dense(batch).numpy(), old[batch["index"].numpy()])


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_spawned_worker_that_finds_another_file_than_the_main_process_opened_refuses_it(tmp_path, context):
    path = tmp_path / "cells.h5ad"
    old = _matrix(1000, 8, 0)
    _write_h5ad(path, old)
    dataset = ts.ShardedDataset(ts.AnnDataSource(path), ts.Streaming(), batch_size=100)
    fresh = tmp_path / "fresh.h5ad"
    _write_h5ad(fresh, old + 1)
    os.replace(fresh, path)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context=context)
    with pytest.raises(RuntimeError, match=r"cells.h5ad: the file changed since the dataset opened it in the main"):
        list(loader)


def test_a_source_pickled_for_later_reads_the_files_as_they_are_then(tmp_path):
    # Only a process being spawned compares its files with the spawning one's: a source pickled and
    # loaded later (the files rewritten on purpose in between) opens them as they are.
    import pickle

    path = tmp_path / "cells.h5ad"
    old = _matrix(100, 8, 0)
    _write_h5ad(path, old)
    pickled = pickle.dumps(ts.AnnDataSource(path))
    _write_h5ad(path, old + 1)
    assert np.array_equal(_dense(pickle.loads(pickled).read([5])).numpy(), old[[5]] + 1)
