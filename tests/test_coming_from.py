"""The "Coming from ..." pages (docs/migration/), each mapping exercised once:
wsistream (cycle=True, MonitoredLoader(device=...)), annbatch (dist_info=),
scDataset (its suite is ported in test_scdataset_parity.py; here numpy
sources), and the common mistakes every guide warns about."""

import collections

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from distributed_run import run_ranks
from torch.utils.data import DataLoader

import torch_shards as ts


def rows_of(batches):
    return [row for batch in batches for row in batch["index"].tolist()]


def take(iterable, count):
    iterator = iter(iterable)
    return [next(iterator) for _ in range(count)]


# ---- wsistream: cycle=True ------------------------------------------------------------------------


def test_cycle_streams_epoch_after_epoch():
    ds = ts.ShardedDataset(torch.arange(50.0).reshape(50, 1), ts.BlockShuffling(4), batch_size=8, seed=1, cycle=True)
    with pytest.raises(TypeError, match="cycle=True\\) is endless"):
        len(ds)
    per_epoch = ds.batches_per_epoch()
    assert per_epoch == 7
    batches = take(ds, 3 * per_epoch + 2)
    for epoch in range(3):
        rows = rows_of(batches[epoch * per_epoch : (epoch + 1) * per_epoch])
        assert sorted(rows) == list(range(50)), epoch
        again = ts.ShardedDataset(torch.arange(50.0).reshape(50, 1), ts.BlockShuffling(4), batch_size=8, seed=1)
        again.set_epoch(epoch)
        assert rows == rows_of(again)  # the same epochs as a finite dataset's
    assert ds.epoch == 3


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_cycle_with_dataloader_workers(context):
    n = 96
    ds = ts.ShardedDataset(torch.arange(n), ts.BlockShuffling(4), batch_size=8, fetch_factor=2, seed=3, cycle=True)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    epochs = 3
    rows = rows_of(take(loader, epochs * ds.batches_per_epoch()))
    assert collections.Counter(rows) == collections.Counter({row: epochs for row in range(n)})


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("loader_class", [DataLoader, ts.DataLoader], ids=["torch", "ts"])
def test_each_epoch_of_an_endless_loop_over_workers_is_one_run_of_it(num_workers, loader_class):
    # 25 batches an epoch in fetches of 16 and 9: dealt round-robin by fetches, one worker would hold 16
    # and run two epochs behind the other; each epoch must be one run of the loop, as without workers.
    def dataset(**kwargs):
        return ts.ShardedDataset(torch.arange(200), ts.BlockShuffling(4), batch_size=8, seed=5, **kwargs)

    endless = dataset(cycle=True)
    per_epoch = endless.batches_per_epoch()
    assert per_epoch == 25
    loader = loader_class(endless, batch_size=None, num_workers=num_workers, multiprocessing_context="fork")
    batches = take(loader, 4 * per_epoch)
    for epoch in range(4):
        run = batches[epoch * per_epoch : (epoch + 1) * per_epoch]
        finite = dataset()
        finite.set_epoch(epoch)
        expected = sorted(tuple(batch["index"].tolist()) for batch in finite)
        assert sorted(tuple(batch["index"].tolist()) for batch in run) == expected, epoch
    assert endless.epoch >= 3  # workers read ahead, into later epochs
    with pytest.raises(ValueError, match=r"an endless loop \(cycle=True\) in workers has no checkpoint"):
        endless.state_dict(consumed_batches=3)


@pytest.mark.parametrize("even_batches", ["drop", None])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_endless_loop_of_empty_epochs_is_refused_not_spun(even_batches, num_workers):
    # 5 rows, batch 8, 2 ranks: one batch in all, so rank 1 gets none (and under "drop" neither does rank 0).
    ds = ts.ShardedDataset(
        np.arange(5), ts.Streaming(), batch_size=8, even_batches=even_batches, rank=1, world_size=2, seed=0, cycle=True
    )
    assert ds.batches_per_epoch() == 0
    context = "fork" if num_workers else None
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, multiprocessing_context=context)
    with pytest.raises(ValueError, match=r"rank 1 of 2 gets no batch in an epoch .* would spin without ever yielding"):
        next(iter(loader))
    assert ds.epoch <= 1 or num_workers > 0  # in the process: the first two (empty) epochs, no more
    rank0 = ts.ShardedDataset(
        np.arange(5), ts.Streaming(), batch_size=8, even_batches=None, rank=0, world_size=2, seed=0, cycle=True
    )
    assert [batch["index"].tolist() for batch in take(rank0, 3)] == [list(range(5))] * 3  # rank 0 has its batch


def _cycle_rank(rank, world_size):
    ds = ts.ShardedDataset(torch.arange(256), ts.BlockShuffling(8), batch_size=16, fetch_factor=2, cycle=True)
    per_epoch = ds.batches_per_epoch()
    batches = take(ds, 2 * per_epoch + 3)  # into the third epoch
    return ds.seed, per_epoch, rows_of(batches[: 2 * per_epoch])


def test_cycle_under_ddp_is_exactly_once_per_epoch_on_equal_counts():
    results = run_ranks(_cycle_rank, 2)
    assert all(status == "ok" for status, _ in results), results
    (seed0, per0, rows0), (seed1, per1, rows1) = (value for _, value in results)
    assert seed0 == seed1 and per0 == per1 == 8
    assert collections.Counter(rows0 + rows1) == collections.Counter({row: 2 for row in range(256)})


# ---- wsistream: MonitoredLoader(loader, dataset=..., device=..., log_every=...) -------------------


def test_monitored_loader_takes_wsistreams_arguments():
    ds = ts.ShardedDataset(torch.arange(64.0).reshape(64, 1), ts.Streaming(), batch_size=8)
    loader = DataLoader(ds, batch_size=None)
    monitor = ts.MonitoredLoader(loader, dataset=ds, device=torch.device("cpu"), log_every=4)
    payloads = []
    for batch in monitor:
        payloads.append(monitor.mark_step(extra={"train/loss": float(batch["X"].mean())}))
    logged = [payload for payload in payloads if payload is not None]
    assert len(logged) == 2 and logged[0]["data/batches"] == 4 and "train/loss" in logged[0]
    assert "data/gpu_memory_gb" not in logged[0]  # a CPU device has no device memory to report


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_monitored_loader_refuses_a_cuda_device_without_cuda():
    with pytest.raises(ValueError, match="device=cuda:0 but this torch has no CUDA device"):
        ts.MonitoredLoader([], device="cuda:0")
    with pytest.raises(ValueError, match="device must be a torch.device"):
        ts.MonitoredLoader([], device="gpu-please")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_monitored_loader_reports_device_memory():
    ds = ts.ShardedDataset(torch.arange(64.0).reshape(64, 1), ts.Streaming(), batch_size=8)
    monitor = ts.MonitoredLoader(ds, device=torch.device("cuda", 0), log_every=1)
    for batch in monitor:
        batch["X"].cuda()
        payload = monitor.mark_step()
    assert payload["data/gpu_peak_memory_gb"] > 0


# ---- annbatch: dist_info= ---------------------------------------------------------------------------


def test_dist_info_callable_inspects_a_split_without_processes():
    lengths = []
    rows = []
    for rank in range(2):
        ds = ts.ShardedDataset(torch.arange(100), ts.Streaming(), batch_size=8, seed=0, dist_info=lambda r=rank: (r, 2))
        assert (ds.rank, ds.world_size) == (rank, 2)
        lengths.append(len(ds))
        rows += rows_of(ds)
        sampler = ts.DistributedSampler(range(100), dist_info=lambda r=rank: (r, 2))
        assert (sampler.rank, sampler.num_replicas) == (rank, 2)
    assert lengths == [7, 7] and set(rows) == set(range(100))


def test_dist_info_errors():
    with pytest.raises(ValueError, match="pass dist_info= or the rank and world size, not both"):
        ts.ShardedDataset(torch.arange(10), ts.Streaming(), batch_size=2, rank=0, dist_info=lambda: (0, 1))
    with pytest.raises(ValueError, match="dist_info\\(\\) must return \\(rank, world_size\\), got 3"):
        ts.ShardedDataset(torch.arange(10), ts.Streaming(), batch_size=2, dist_info=lambda: 3)
    with pytest.raises(ValueError, match="dist_info must be 'torch', 'jax' or a callable"):
        ts.DistributedSampler(range(10), dist_info="mpi")
    with pytest.raises(ValueError, match="Invalid rank 2"):
        ts.DistributedSampler(range(10), dist_info=lambda: (2, 2))
    try:
        import jax  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="dist_info='jax' but jax is not installed"):
            ts.ShardedDataset(torch.arange(10), ts.Streaming(), batch_size=2, dist_info="jax")
    # "torch" is the default: the process group, then RANK / WORLD_SIZE.
    assert ts.ShardedDataset(torch.arange(10), ts.Streaming(), batch_size=2, dist_info="torch").world_size == 1


# ---- scDataset: numpy sources ------------------------------------------------------------------------


def test_numpy_arrays_and_dicts_of_them_are_sources():
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    y = np.arange(10) % 2
    batch = next(iter(ts.ShardedDataset({"X": x, "y": y}, ts.Streaming(), batch_size=4)))
    assert batch["X"].tolist() == x[:4].tolist() and batch["y"].tolist() == y[:4].tolist()
    readonly = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(10, 3)
    assert not readonly.flags.writeable
    with np.testing.suppress_warnings() as quiet:
        quiet.record(UserWarning)
        assert next(iter(ts.ShardedDataset(readonly, ts.Streaming(), batch_size=4)))["X"].shape == (4, 3)
        assert not quiet.log
    with pytest.raises(TypeError, match="field 'X' is a numpy array of dtype <U1"):
        ts.TensorSource(np.array(["a", "b"]))
    z = (np.arange(10) + 1j * np.arange(10, 20)).astype(np.complex64)  # complex arrays, as complex tensors
    assert next(iter(ts.ShardedDataset(z, ts.Streaming(), batch_size=4)))["X"].numpy().tolist() == z[:4].tolist()


def test_tensor_source_reads_detached_and_refuses_meta():
    x = torch.arange(10.0, requires_grad=True)
    batch = next(iter(ts.ShardedDataset(x, ts.Streaming(), batch_size=4)))
    assert not batch["X"].requires_grad
    with pytest.raises(ValueError, match="field 'X' is on the meta device"):
        ts.TensorSource(torch.empty(10, device="meta"))


# ---- common mistakes -----------------------------------------------------------------------------------


def test_dataloader_without_batch_size_none_is_refused(tmp_path):
    dense = ts.ShardedDataset(torch.arange(20.0).reshape(10, 2), ts.Streaming(), batch_size=4)
    path = tmp_path / "csr.h5ad"
    anndata = pytest.importorskip("anndata")
    anndata.AnnData(X=sp.random(10, 5, density=0.5, format="csr", dtype=np.float32)).write_h5ad(path)
    csr = ts.ShardedDataset(ts.AnnDataSource(path), ts.Streaming(), batch_size=4)
    for ds in (dense, csr):
        for kwargs in ({}, {"batch_size": 4}, {"num_workers": 1}):
            with pytest.raises(ValueError, match="create the DataLoader with batch_size=None"):
                next(iter(DataLoader(ds, **kwargs)))
        assert next(iter(DataLoader(ds, batch_size=None)))["index"].tolist() == [0, 1, 2, 3]
    from torchdata.stateful_dataloader import StatefulDataLoader

    with pytest.raises(ValueError, match="create the DataLoader with batch_size=None"):
        next(iter(StatefulDataLoader(dense)))


@pytest.mark.parametrize(
    "make",
    [
        lambda path: ts.HDF5Source(path / "missing.h5", "/x"),
        lambda path: ts.ZarrSource(path / "missing.zarr"),
        lambda path: ts.AnnDataSource(path / "missing.h5ad"),
        lambda path: ts.AnnDataSource(path / "missing.zarr"),
        lambda path: ts.open(path / "missing.h5ad"),
        lambda path: ts.open([path / "missing.h5ad"]),
    ],
)
def test_a_missing_file_raises_file_not_found(tmp_path, make):
    with pytest.raises(FileNotFoundError, match="No such file or directory") as caught:
        make(tmp_path)
    assert caught.value.filename.startswith(str(tmp_path / "missing"))


def test_a_file_removed_before_a_worker_opens_it(tmp_path):
    path = tmp_path / "gone.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(10.0)
    source = ts.HDF5Source(path, "/x")
    path.unlink()
    source._native_object = None  # as in a DataLoader worker: the source re-opens its file
    with pytest.raises(FileNotFoundError, match="HDF5Source: No such file or directory"):
        len(source)


def test_collection_of_a_dense_and_a_csr_file_says_dense_true(tmp_path):
    anndata = pytest.importorskip("anndata")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    anndata.AnnData(X=x).write_h5ad(tmp_path / "dense.h5ad")
    anndata.AnnData(X=sp.csr_matrix(x)).write_h5ad(tmp_path / "csr.h5ad")
    paths = [tmp_path / "dense.h5ad", tmp_path / "csr.h5ad"]
    with pytest.raises(
        ValueError, match="'X' is sparse CSR in one and dense in the other; open the AnnData sources with dense=True"
    ):
        ts.open(paths)
    together = ts.open(paths, dense=True)
    assert together.read(range(8))["X"].tolist() == np.vstack([x, x]).tolist()
