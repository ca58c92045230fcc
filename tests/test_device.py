"""Batches on the GPU (ShardedDataset(device=), ts.DeviceLoader): the checks
that run everywhere, and the GPU tests, which skip without CUDA."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import torch_shards as ts

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ROWS = 103


def source():
    x = torch.arange(ROWS * 6, dtype=torch.float32).reshape(ROWS, 6)
    return ts.TensorSource({"X": x, "y": torch.arange(ROWS) % 5})


def dataset(device=None, **kwargs):
    return ts.ShardedDataset(source(), ts.BlockShuffling(4), batch_size=8, seed=3, device=device, **kwargs)


def test_device_cpu_or_none_keeps_the_host_path():
    host = [b["X"] for b in dataset()]
    for device in ("cpu", torch.device("cpu")):
        batches = list(dataset(device))
        assert len(batches) == len(host) and all(torch.equal(a["X"], b) for a, b in zip(batches, host))
        assert all(b["X"].device.type == "cpu" for b in batches)


@pytest.mark.parametrize(
    "device,error,message",
    [
        ("bogus", ValueError, "device must be None, 'cpu', 'cuda' or 'cuda:<index>', got 'bogus'"),
        (3, TypeError, "device must be None, a str"),
        ("meta", ValueError, "device 'meta' is not supported"),
    ],
)
def test_bad_devices_are_named(device, error, message):
    with pytest.raises(error, match=message):
        dataset(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only torch's refusal")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_cuda_is_a_clear_error(device):
    with pytest.raises(ValueError, match="this torch has no CUDA device"):
        dataset(device)
    with pytest.raises(ValueError, match="this torch has no CUDA device"):
        ts.DeviceLoader([], device)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_loader_on_the_cpu_yields_the_loaders_batches(num_workers):
    def loader():  # a fresh dataset: epoch 0 each time
        return DataLoader(dataset(), batch_size=None, num_workers=num_workers)

    expected = [b["index"].tolist() for b in loader()]
    wrapped = ts.DeviceLoader(loader(), "cpu")
    assert len(wrapped) == len(expected)
    assert [b["index"].tolist() for b in wrapped] == expected
    assert sorted(r for b in wrapped for r in b["index"].tolist()) == list(range(ROWS))  # the next epoch


def test_device_loader_refuses_batches_that_are_not_dicts_of_tensors():
    with pytest.raises(TypeError, match="DeviceLoader: batches must be dicts of tensors, got list"):
        list(ts.DeviceLoader([[torch.zeros(1)]], "cpu"))
    with pytest.raises(ValueError, match="device must be given"):
        ts.DeviceLoader([], None)


def test_device_loader_checks_prefetch_bytes_and_counts_no_staging_on_the_cpu():
    with pytest.raises(ValueError, match="prefetch_bytes must be >= 0"):
        ts.DeviceLoader([], "cpu", prefetch_bytes=-1)
    with pytest.raises(TypeError, match="prefetch_bytes must be an int"):
        ts.DeviceLoader([], "cpu", prefetch_bytes=1.5)
    wrapped = ts.DeviceLoader([{"x": torch.ones(2)}], "cpu", prefetch_bytes=0)
    assert [b["x"].tolist() for b in wrapped] == [[1.0, 1.0]]
    assert wrapped.staging_stats["allocations"] == 0 and wrapped.staging_stats["in_flight"] == 0


def csr_batches(count, rows=16, columns=30):
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        dense = torch.rand(rows, columns, generator=generator)
        dense[dense < 0.8] = 0
        out.append({"X": dense.to_sparse_csr(), "y": torch.arange(rows) + i, "w": torch.rand(columns, rows).t()})
    return out


def test_the_torchscript_door_takes_the_device():
    native = torch.ops.torch_shards.sharded_dataset(source().native, ts.Streaming().native, 8, seed=0, device="cpu")
    assert native.device() is None
    with pytest.raises(ValueError, match="device must be None"):
        torch.ops.torch_shards.sharded_dataset(source().native, ts.Streaming().native, 8, device="nope")


# ---- on a GPU ----------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 0)])
def test_every_field_lands_on_the_device_equal_to_the_host_path(device):
    host = list(dataset())
    on_device = list(dataset(device))
    assert len(on_device) == len(host) == len(dataset(device))
    for a, b in zip(on_device, host):
        assert set(a) == set(b)
        for key in b:
            assert a[key].device == torch.device("cuda", 0) and torch.equal(a[key].cpu(), b[key])


@cuda
def test_anndata_csr_on_the_device(tmp_path):
    import anndata as ad
    import numpy as np
    import scipy.sparse as sp

    x = sp.random(ROWS, 20, density=0.2, format="csr", dtype=np.float32, random_state=0)
    ad.AnnData(x).write_h5ad(tmp_path / "a.h5ad")
    for batch in ts.ShardedDataset(ts.AnnDataSource(tmp_path / "a.h5ad"), ts.Streaming(), batch_size=8, device="cuda"):
        assert batch["X"].layout == torch.sparse_csr and batch["X"].is_cuda
        rows = batch["index"].cpu().numpy()
        assert np.array_equal(batch["X"].to_dense().cpu().numpy(), x[rows].toarray())


@cuda
def test_the_consumer_stream_sees_finished_data():
    # Large batches: a kernel queued right after next() on the current stream must read the copied values.
    n = 64
    x = torch.arange(n * 1_000_000, dtype=torch.float32).reshape(n, 1_000_000)
    data = ts.ShardedDataset(ts.TensorSource(x), ts.Streaming(), batch_size=8, device="cuda")
    for batch in data:
        torch.cuda._sleep(1_000_000)  # the consumer stream is busy; the copy runs beside it
        sums = batch["X"].sum(dim=1)
        expected = x[batch["index"].cpu()].sum(dim=1)
        assert torch.allclose(sums.cpu(), expected)


@cuda
def test_batches_held_are_never_overwritten():
    held = list(dataset("cuda", prefetch=1))
    again = list(dataset())
    for a, b in zip(held, again):
        assert torch.equal(a["X"].cpu(), b["X"])


@cuda
def test_exactly_once_and_len_unchanged_on_the_device():
    data = ts.ShardedDataset(source(), ts.BlockShuffling(4), batch_size=8, device="cuda", drop_last=False)
    rows = sorted(r for b in data for r in b["index"].cpu().tolist())
    assert rows == list(range(ROWS)) and len(data) == (ROWS + 7) // 8


@cuda
def test_local_rank_cross_check(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.current_device()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consistent: no warning
        dataset("cuda")
        ts.DeviceLoader([], "cuda")
    other = (torch.cuda.current_device() + 1) % max(torch.cuda.device_count(), 2)
    monkeypatch.setenv("LOCAL_RANK", str(other))
    with pytest.warns(UserWarning, match=f"ShardedDataset: the current device is cuda:.* but LOCAL_RANK={other}"):
        dataset("cuda")
    with pytest.warns(UserWarning, match=f"DeviceLoader: the current device is cuda:.* but LOCAL_RANK={other}"):
        ts.DeviceLoader([], "cuda")
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="but LOCAL_RANK="):
            dataset(f"cuda:{other}")


@cuda
@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_loader_over_workers(num_workers):
    # Two datasets built alike: each iteration of one dataset is its next epoch (another order).
    host = [b["X"] for b in DataLoader(dataset(), batch_size=None, num_workers=num_workers)]
    on_device = list(ts.DeviceLoader(DataLoader(dataset(), batch_size=None, num_workers=num_workers), "cuda"))
    assert len(on_device) == len(host)
    for a, b in zip(on_device, host):
        assert a["X"].is_cuda and torch.equal(a["X"].cpu(), b)


@cuda
def test_device_loader_stages_unpinned_batches_csr_included():
    # Pageable batches (as DataLoader workers send them): staged into pinned buffers, one copy each.
    host = csr_batches(40)  # each staged in under 4 KB (one size class)
    wrapped = ts.DeviceLoader(host, "cuda", prefetch_bytes=3 * 4096)  # at most 3 staged copies in flight
    for a, b in zip(wrapped, host, strict=True):
        assert a["X"].layout == torch.sparse_csr and a["X"].is_cuda
        assert torch.equal(a["X"].to_dense().cpu(), b["X"].to_dense())
        assert torch.equal(a["y"].cpu(), b["y"]) and torch.equal(a["w"].cpu(), b["w"])
    stats = wrapped.staging_stats
    assert stats["allocations"] <= 4 and stats["reuses"] >= 36  # recycled, not one pinned allocation per batch
    assert stats["peak_in_flight_bytes"] <= 3 * 4096


@cuda
def test_staging_buffers_are_reused_only_after_their_copies():
    # Large batches, the consumer stream kept busy: a staging buffer written again while its copy still
    # ran would show as a batch holding the next one's values. The bound forces reuse at once.
    n, width = 24, 4_000_000
    host = [{"X": torch.full((2, width), float(i))} for i in range(n)]
    wrapped = ts.DeviceLoader(host, "cuda", prefetch_bytes=2 * 2 * width * 4)
    held = []
    for batch in wrapped:
        torch.cuda._sleep(2_000_000)
        held.append(batch["X"])
    torch.cuda.synchronize()
    assert [float(x[0, 0]) for x in held] == [float(i) for i in range(n)]
    assert all(torch.all(x == i) for i, x in enumerate(held))
    stats = wrapped.staging_stats
    bound = 2 * 2 * width * 4
    assert stats["peak_in_flight_bytes"] <= bound * 9 // 8 and stats["allocations"] <= 3  # size classes: 1/8


@cuda
def test_pinned_batches_in_process_are_copied_directly():
    # ShardedDataset(device=): its batches come pinned from its BufferPool and are not staged.
    data = dataset("cuda")
    for _ in data:
        pass
    x = torch.arange(8.0).pin_memory()
    wrapped = ts.DeviceLoader([{"x": x}], "cuda")
    assert [b["x"].cpu().tolist() for b in wrapped] == [x.tolist()]
    assert wrapped.staging_stats["allocations"] == 0  # pinned: copied as it is


@cuda
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_device_loader_csr_over_workers(tmp_path, context):
    import anndata as ad
    import numpy as np
    import scipy.sparse as sp

    x = sp.random(ROWS, 20, density=0.2, format="csr", dtype=np.float32, random_state=0)
    ad.AnnData(x).write_h5ad(tmp_path / "a.h5ad")
    data = ts.ShardedDataset(ts.AnnDataSource(tmp_path / "a.h5ad"), ts.BlockShuffling(4), batch_size=8, seed=1)
    loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context=context)
    rows = []
    for batch in ts.DeviceLoader(loader, "cuda"):
        assert batch["X"].layout == torch.sparse_csr and batch["X"].is_cuda
        index = batch["index"].cpu().numpy()
        assert np.array_equal(batch["X"].to_dense().cpu().numpy(), x[index].toarray())
        rows.extend(index.tolist())
    assert sorted(rows) == list(range(ROWS))
