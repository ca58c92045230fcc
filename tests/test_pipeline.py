"""The native prefetch pipeline (num_workers=0 or direct iteration): same
batches as the other modes, bounded memory, errors and every way of stopping
handled; and MonitoredLoader's figures."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest
import torch
from conftest import STRATEGIES, make_strategy, rows_source
from torch.utils.data import DataLoader

import torch_shards as ts
from torch_shards import _C


def native_threads():
    """This process's native threads running a task (readers and their helpers). Threads whose task
    ended wait, idle, for the next epoch's (csrc/core/thread_cache.h): they read nothing."""
    return _C.native_threads()["busy"]


def wait_for_threads(count, timeout=5.0):
    deadline = time.monotonic() + timeout
    while native_threads() > count and time.monotonic() < deadline:
        time.sleep(0.01)
    return native_threads()


def run_script(code, timeout):
    """Runs code in a fresh interpreter (where a hang in native code is a
    TimeoutExpired, and process-wide settings stay there); it prints "done".
    Returns the finished process (its stderr, for instance)."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    finished = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=timeout
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "done"
    return finished


def batches(dataset, **loader_kwargs):
    if loader_kwargs:
        return [tuple(b["index"].tolist()) for b in DataLoader(dataset, batch_size=None, **loader_kwargs)]
    return [tuple(b["index"].tolist()) for b in dataset]


def dataset(source, strategy, **kwargs):
    arguments = dict(batch_size=7, fetch_factor=3, seed=11)
    arguments.update(kwargs)
    return ts.ShardedDataset(source, strategy, **arguments)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_prefetched_batches_equal_on_demand_and_worker_batches(strategy_name):
    source = rows_source(200)
    reference = None
    for threads, prefetch in [(1, 0), (3, 0), (1, 1), (2, 2), (3, 5), (4, None)]:  # None: two per thread
        ds = dataset(source, make_strategy(strategy_name, 200), num_threads=threads, prefetch=prefetch)
        ds.set_epoch(4)
        got = batches(ds)
        reference = reference or got
        assert got == reference, (threads, prefetch)
    ds = dataset(source, make_strategy(strategy_name, 200), num_threads=2, prefetch=2)
    ds.set_epoch(4)
    in_workers = batches(ds, num_workers=2, multiprocessing_context="fork")
    assert sorted(in_workers) == sorted(reference)


def test_prefetched_files_read_like_on_demand(tmp_path):
    path = tmp_path / "x.h5"
    data = np.random.default_rng(0).standard_normal((500, 9)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(32, 9), compression="gzip")
    for prefetch in (0, 3):
        ds = dataset(ts.HDF5Source(path, "x"), ts.BlockShuffling(5), prefetch=prefetch, num_threads=2)
        for batch in ds:
            assert torch.equal(batch["X"], torch.from_numpy(data[batch["index"].numpy()]))


def test_len_and_epochs_hold_with_prefetching():
    ds = dataset(rows_source(100), ts.BlockShuffling(4), prefetch=3, num_threads=2)
    epochs = [batches(ds) for _ in range(3)]
    assert all(len(e) == len(ds) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3 and ds.epoch == 2


def test_queued_memory_stays_within_the_budget():
    # Units of 40 rows x 1000 float64 = 320 kB; a 1 MB budget admits ~3 beyond the first.
    source = ts.TensorSource(torch.zeros(4000, 1000, dtype=torch.float64))
    unit_bytes = 40 * 1000 * 8 + 40 * 8
    ds = ts.ShardedDataset(
        source,
        ts.Streaming(),
        batch_size=40,
        fetch_factor=1,
        seed=0,
        num_threads=3,
        prefetch=50,
        prefetch_bytes=1_000_000,
    )
    peak = 0
    for i, _ in enumerate(ds):
        if i % 5 == 0:
            time.sleep(0.02)  # a slow step: the readers run ahead until the budget stops them
        for stats in ds.reader_stats():
            peak = max(peak, stats["queued_bytes"] + stats["in_flight"] * unit_bytes)
    assert 0 < peak <= 1_000_000 + 3 * unit_bytes


def corrupt_file(tmp_path):
    """A gzip HDF5 dataset whose chunk 5 (rows 80..95) is corrupt."""
    path = tmp_path / "corrupt.h5"
    data = np.random.default_rng(1).standard_normal((320, 16)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(16, 16), compression="gzip")
        info = f["x"].id.get_chunk_info(5)
    raw = bytearray(path.read_bytes())
    for offset in range(info.byte_offset + 8, info.byte_offset + info.size - 8):
        raw[offset] ^= 0xA5
    path.write_bytes(bytes(raw))
    return path


def test_an_error_in_a_reader_thread_reaches_the_loop_with_its_file(tmp_path):
    path = corrupt_file(tmp_path)
    baseline = native_threads()
    ds = ts.ShardedDataset(
        ts.HDF5Source(path, "x"), ts.Streaming(), batch_size=16, fetch_factor=1, seed=0, num_threads=3, prefetch=4
    )
    seen = 0
    with pytest.raises(RuntimeError, match=r"corrupt.h5:/x: chunk \(5, 0\)"):
        for batch in ds:
            seen += batch["index"].shape[0]
    assert seen == 80  # every unit before the corrupt one arrived, in order
    assert wait_for_threads(baseline) <= baseline


@pytest.mark.timeout(60)
def test_breaking_out_and_deleting_iterators_stop_the_threads():
    source = ts.TensorSource(torch.zeros(20000, 100))
    baseline = native_threads()
    ds = ts.ShardedDataset(source, ts.BlockShuffling(8), batch_size=10, seed=0, num_threads=3, prefetch=4)
    for i, _ in enumerate(ds):
        if i == 5:
            assert native_threads() >= baseline + 3
            break
    gc.collect()
    assert wait_for_threads(baseline) <= baseline
    iterator = iter(ds)
    next(iterator)
    assert native_threads() >= baseline + 3
    del iterator
    gc.collect()
    assert wait_for_threads(baseline) <= baseline
    assert ds.reader_stats() == []


@pytest.mark.timeout(60)
def test_keyboard_interrupt_while_waiting_stops_promptly(tmp_path):
    # Slow units: 4096 rows of incompressible float32 through gzip, one thread.
    path = tmp_path / "slow.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "x",
            data=np.random.default_rng(2).standard_normal((40960, 512)).astype(np.float32),
            chunks=(512, 512),
            compression="gzip",
            compression_opts=9,
        )
    baseline = native_threads()
    # Endless (cycle=True): the loop cannot end before the interrupt arrives, however late the timer
    # thread runs on a loaded machine.
    ds = ts.ShardedDataset(
        ts.HDF5Source(path, "x"),
        ts.Streaming(),
        batch_size=4096,
        fetch_factor=1,
        seed=0,
        num_threads=1,
        prefetch=2,
        cycle=True,
    )
    iterator = iter(ds)
    next(iterator)
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        for _ in iterator:
            pass
    assert time.monotonic() - start < 5
    del iterator
    gc.collect()
    assert wait_for_threads(baseline, timeout=10) <= baseline


READERS_DROPPED_UNCLOSED = """
import torch, torch_shards as ts
source = ts.TensorSource(torch.zeros(4000, 256))
ds = ts.ShardedDataset(source, ts.Streaming(), batch_size=16, fetch_factor=4, seed=0, num_threads=3, prefetch=3)
for epoch in range(1500):
    reader = ds.native.iter_epoch(epoch, 0, 1)  # the previous one is destroyed here, unclosed
    while (batch := reader.next()) is not None:
        batch["X"].sum()  # the batch's tensors get Python objects, then die
print("done")
"""


def test_readers_destroyed_by_python_while_their_threads_finish_never_deadlock():
    # Destroyed from Python, a reader joins its threads with the GIL held; a
    # thread freeing a tensor with a Python object needs it. In a subprocess:
    # a deadlock in native code would not let pytest's timeout fire.
    run_script(READERS_DROPPED_UNCLOSED, timeout=60)


ITERATORS_LEFT_AT_EXIT = """
import torch, torch_shards as ts
rows = torch.arange(20000).reshape(-1, 2)
def dataset(source, **kwargs):
    return ts.ShardedDataset(source, ts.BlockShuffling(8), batch_size=16, seed=0, num_threads=2, **kwargs)
def first(iterator):
    for batch in iterator:  # left unfinished: the generator lives on in a global below
        return batch
native = iter(dataset(ts.TensorSource(rows)))
endless = iter(dataset(ts.TensorSource(rows), cycle=True))
collection = iter(dataset(rows, fetch_callback=lambda source, positions: source[positions]))
for iterator in (native, endless, collection):
    first(iterator)
print("done")
"""


def test_iterators_left_unfinished_at_interpreter_exit_end_quietly():
    # Their generators end while Python finalizes: no "Exception ignored" traceback, no hang.
    finished = run_script(ITERATORS_LEFT_AT_EXIT, timeout=60)
    assert "Exception ignored" not in finished.stderr and "Error" not in finished.stderr, finished.stderr


def test_two_iterators_over_one_dataset_both_work():
    ds = dataset(rows_source(90), ts.BlockShuffling(3), prefetch=2, num_threads=2)
    first, second = iter(ds), iter(ds)
    a, b = [], []
    for x, y in zip(first, second):
        a.append(x["index"].tolist())
        b.append(y["index"].tolist())
    assert sorted(r for batch in a for r in batch) == list(range(90))
    assert sorted(r for batch in b for r in batch) == list(range(90))
    assert a != b  # two iterations, two epochs


def test_batches_cut_from_a_fetch_transforms_tensors_keep_their_history_and_layout():
    # Batches of the readers' own tensors are views made directly; a fetch_transform's tensors may require
    # grad, carry a conjugate bit or be strided otherwise: their batches are narrowed and stay exact.
    rows = 40
    weight = torch.ones((), requires_grad=True)
    grid = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    source = ts.TensorSource({"X": grid, "Z": torch.complex(grid[:, 0], grid[:, 1])})

    def transform(unit):
        columns_first = unit["X"].t().contiguous().t()  # strides (1, rows): not row-major
        return {"index": unit["index"], "X": columns_first * weight, "Z": unit["Z"].conj(), "Y": columns_first}

    total, seen = torch.zeros(()), []
    for batch in dataset(source, ts.BlockShuffling(4), fetch_transform=transform):
        index = batch["index"]
        seen += index.tolist()
        assert batch["X"].requires_grad and batch["X"].grad_fn is not None
        assert torch.equal(batch["X"].detach(), grid[index])
        assert torch.equal(batch["Y"], grid[index]) and batch["Y"].stride(0) == 1  # a view of the unit's tensor
        assert torch.equal(batch["Z"].resolve_conj(), torch.complex(grid[index, 0], -grid[index, 1]))
        total = total + batch["X"].sum()
    assert sorted(seen) == list(range(rows))
    total.backward()
    assert weight.grad.item() == grid.sum().item()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_conjugate_and_negative_views_arrive_as_they_read(num_workers):
    # x.conj() and x.conj().imag are views whose bit says how to read their memory: a TensorSource
    # over one, or a fetch_transform returning one, must deliver the values they show, not their memory.
    z = torch.complex(torch.arange(6.0), torch.ones(6))
    expected = z.conj().resolve_conj()

    def loader(dataset):
        return DataLoader(dataset, batch_size=None, num_workers=num_workers)

    source = ts.ShardedDataset(ts.TensorSource(z.conj()), ts.Streaming(), batch_size=6, seed=0)
    assert torch.equal(next(iter(loader(source)))["X"], expected)
    assert torch.equal(ts.TensorSource(z.conj()).read(list(range(6)))["X"], expected)

    def transform(unit):
        return {**unit, "X": torch.complex(unit["X"], torch.ones_like(unit["X"])).conj(), "Y": z[:6].conj().imag}

    real = ts.ShardedDataset(torch.arange(6.0), ts.Streaming(), batch_size=3, seed=0, fetch_transform=transform)
    batches = list(loader(real))
    assert torch.equal(torch.cat([batch["X"] for batch in batches]), expected)
    assert torch.equal(torch.cat([batch["Y"] for batch in batches]), -torch.ones(6))


def test_forked_workers_start_while_reader_threads_run():
    source = rows_source(300)
    ds = dataset(source, ts.BlockShuffling(4), prefetch=3, num_threads=3)
    running = iter(ds)
    first = next(running)  # reader threads are running in this process now
    forked = batches(ds, num_workers=2, multiprocessing_context="fork")
    assert sorted(r for batch in forked for r in batch) == list(range(300))
    rest = [first["index"].tolist()] + [b["index"].tolist() for b in running]
    assert sorted(r for batch in rest for r in batch) == list(range(300))


def test_pin_memory_without_cuda_warns_and_keeps_batches_pageable():
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA: see test_pin_memory_gives_pinned_batches")
    with pytest.warns(UserWarning, match="pin_memory=True has no effect"):
        ds = dataset(rows_source(30), ts.Streaming(), pin_memory=True)
    assert not any(b["X"].is_pinned() for b in ds)


def _mark_shared(batch):
    """batch_transform run where the batch is made: records whether its tensors are shared memory."""
    return {**batch, "shared": torch.tensor([batch["X"].is_shared(), batch["index"].is_shared()])}


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("transport", ["handles", "torch"])
def test_worker_batches_are_made_in_shared_memory_and_arrive_intact(context, transport):
    # "torch": made in torch's shared memory, sent by file descriptor without a copy, never recycled;
    # "handles": made in the worker's slabs (shared memory torch does not know: is_shared() is False),
    # recycled only once the main process let go. Either way batches the main process still holds keep
    # their values while the workers read on.
    source = ts.TensorSource(torch.arange(600 * 5, dtype=torch.float32).reshape(600, 5))
    options = dict(batch_transform=_mark_shared, prefetch=2, num_threads=2, worker_transport=transport)
    ds = dataset(source, ts.BlockShuffling(4), **options)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    held = list(loader)  # every batch kept until the end
    assert all(bool(batch["shared"].all()) == (transport == "torch") for batch in held)
    for batch in held:
        np.testing.assert_array_equal(batch["X"][:, 0].numpy(), batch["index"].numpy() * 5.0)
    assert sorted(i for batch in held for i in batch["index"].tolist()) == list(range(600))
    in_process = next(iter(dataset(source, ts.BlockShuffling(4), batch_transform=_mark_shared)))
    assert not in_process["shared"].any()  # recycled pageable memory in the main process


FILE_SYSTEM_SHARING = """
import torch, torch_shards as ts
from torch.utils.data import DataLoader
torch.multiprocessing.set_sharing_strategy("file_system")
mark = lambda b: {**b, "shared": torch.tensor(b["X"].is_shared())}
source = ts.TensorSource(torch.arange(300, dtype=torch.float32))
ds = ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=7, seed=1, batch_transform=mark)
held = list(DataLoader(ds, batch_size=None, num_workers=2))
# Plain memory, moved by torch into its own segments when a unit's first batch is sent (the
# unit's later batches, views of it, then see shared memory): so not all made in shared memory.
assert not all(b["shared"] for b in held)
assert all(torch.equal(b["X"], b["index"].float()) for b in held)
assert sorted(i for b in held for i in b["index"].tolist()) == list(range(300))
print("done")
"""


def test_workers_under_the_file_system_sharing_strategy_use_plain_memory():
    run_script(FILE_SYSTEM_SHARING, timeout=120)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_gives_pinned_batches():
    ds = dataset(rows_source(300), ts.BlockShuffling(4), pin_memory=True, prefetch=2, num_threads=2)
    for batch in ds:
        assert batch["X"].is_pinned() and batch["index"].is_pinned()
        batch["X"].to("cuda", non_blocking=True)
    torch.cuda.synchronize()


def test_bad_pipeline_arguments_are_named():
    for kwargs, message in [
        (dict(prefetch=-1), r"prefetch must be in \[0, 1024\], got -1"),
        (dict(prefetch_bytes=-5), "prefetch_bytes must be >= 0, got -5"),
        (dict(num_threads=0), r"num_threads must be in \[1, 256\], got 0"),
        (dict(pin_memory="yes"), "pin_memory must be a bool"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            dataset(rows_source(10), ts.Streaming(), **kwargs)


# ---- MonitoredLoader --------------------------------------------------------------------------------------


class SlowLoader:
    """Yields batches of 32 rows x 1000 bytes after `load` seconds each."""

    def __init__(self, batches, load):
        self.count, self.load = batches, load

    def __len__(self):
        return self.count

    def __iter__(self):
        for i in range(self.count):
            time.sleep(self.load)
            yield {"X": torch.zeros(32, 250), "index": torch.arange(32) + 32 * i}


def test_monitor_measures_waiting_throughput_and_bytes():
    monitor = ts.MonitoredLoader(SlowLoader(60, load=0.01), log_every=20)
    assert len(monitor) == 60
    payloads = []
    for _ in monitor:
        time.sleep(0.01)  # compute as long as loading: half the step waits for data
        payload = monitor.mark_step(extra={"train/loss": 1.5})
        if payload is not None:
            payloads.append(payload)
    assert len(payloads) == 3
    for payload in payloads:
        assert payload["train/loss"] == 1.5
        assert 0.35 < payload["data/wait_fraction"] < 0.65
        assert payload["data/batches"] == 20
        rate = payload["data/samples_per_s"]
        assert 32 / 0.03 < rate < 32 / 0.015  # one batch per ~20 ms step
        assert payload["data/mb_per_s"] == pytest.approx(rate * 1000 / 1e6, rel=0.01)
    summary = monitor.summary()
    assert summary["data/batches"] == 60


def test_monitor_without_waiting_reports_a_small_wait_fraction():
    monitor = ts.MonitoredLoader(SlowLoader(30, load=0.0), log_every=30)
    for _ in monitor:
        time.sleep(0.02)  # long enough that one scheduling stall of a busy CI machine stays a few percent
        payload = monitor.mark_step()
    assert payload["data/wait_fraction"] < 0.1


def test_monitor_counts_per_worker_and_per_thread_batches():
    ds = dataset(rows_source(2000), ts.BlockShuffling(8), batch_size=20, fetch_factor=2, num_threads=2, prefetch=2)
    monitor = ts.MonitoredLoader(
        DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"), log_every=25
    )
    totals = {}
    for _ in monitor:
        payload = monitor.mark_step()
        if payload:
            for key, value in payload.items():
                if key.startswith("data/worker"):
                    totals[key] = totals.get(key, 0) + value
    assert set(totals) == {"data/worker0/batches", "data/worker1/batches"}
    assert sum(totals.values()) >= 100 - 2 * 10  # all but what the last window still holds
    in_process = ts.MonitoredLoader(ds, log_every=50)
    threads = {}
    for _ in in_process:
        payload = in_process.mark_step()
        if payload:
            for key, value in payload.items():
                if key.startswith("data/thread"):
                    threads[key] = threads.get(key, 0) + value
            assert payload["data/main/batches"] == 50
    assert set(threads) == {"data/thread0/units", "data/thread1/units"} and sum(threads.values()) > 0


def test_monitor_rejects_bad_log_every():
    with pytest.raises(ValueError, match="log_every must be an int >= 1, got 0"):
        ts.MonitoredLoader([], log_every=0)
    assert ts.MonitoredLoader([], log_every=np.int64(5)).log_every == 5  # numpy's ints, as everywhere
    with pytest.raises(TypeError, match=r"mark_step: extra must be a dict of metrics, got 'x'"):
        ts.MonitoredLoader([], log_every=1).mark_step(extra="x")


def test_reading_after_close_raises_instead_of_waiting():
    ds = dataset(rows_source(50), ts.Streaming(), prefetch=2, num_threads=2)
    iterator = ds.native.iter_epoch(0, 0, 1)
    assert iterator.wait(1000)
    iterator.close()
    with pytest.raises(RuntimeError, match=r"read after close\(\)"):
        iterator.next()


def test_an_iterator_never_advanced_holds_no_reader():
    ds = dataset(rows_source(50), ts.Streaming(), prefetch=2)
    for _ in range(3):
        iter(ds)
    assert ds.reader_stats() == []


def test_the_python_doors_direct_poll_delivers_what_torch_classes_poll_does(tmp_path):
    """torch_shards._C.poll (what ShardedDataset's loop calls) and BatchIterator.poll through
    torch.classes: the same epoch, batch for batch, sparse and dense fields alike."""
    import anndata
    import pandas as pd
    import scipy.sparse as sp

    from torch_shards._library import direct

    x = sp.random(100, 7, density=0.3, format="csr", dtype=np.float32, random_state=0)
    obs = pd.DataFrame({"y": np.arange(100.0)}, index=[f"c{i}" for i in range(100)])
    anndata.AnnData(X=x, obs=obs).write_h5ad(tmp_path / "a.h5ad")
    ds = dataset(ts.AnnDataSource(str(tmp_path / "a.h5ad"), obs=["y"]), ts.BlockShuffling(4), num_threads=2)

    def epoch(poll):
        out = []
        while True:
            batch = poll()
            if batch is None:
                if iterator.finished():
                    return out
                continue
            out.append(batch)

    iterator = ds.native.iter_epoch(3, 0, 1)
    through_classes = epoch(lambda: iterator.poll(100))
    iterator = ds.native.iter_epoch(3, 0, 1)
    handle = direct.iterator_handle(iterator)
    through_direct = epoch(lambda: direct.poll(handle, 100))
    assert len(through_direct) == len(through_classes) == 15
    for a, b in zip(through_classes, through_direct):
        assert sorted(a) == sorted(b) == ["X", "index", "y"]
        assert b["X"].layout == torch.sparse_csr
        assert torch.equal(a["X"].to_dense(), b["X"].to_dense())
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["y"], b["y"])


def test_the_direct_poll_names_what_it_was_given_instead():
    from torch_shards._library import direct

    ds = dataset(rows_source(50), ts.Streaming())
    with pytest.raises(
        TypeError, match=r"expected a torch.classes.torch_shards.BatchIterator, got torch._C.ScriptObject"
    ):
        direct.iterator_handle(ds.native)
    with pytest.raises(TypeError, match=r"expected a torch.classes.torch_shards.BatchIterator, got int"):
        direct.iterator_handle(3)
    handle = direct.iterator_handle(ds.native.iter_epoch(0, 0, 1))
    with pytest.raises(TypeError, match=r"expected a handle from iterator_handle\(\), got str"):
        direct.poll("handle", 100)
    with pytest.raises(TypeError, match=r"takes 2 arguments, got 1"):
        direct.poll(handle)
    with pytest.raises(TypeError, match=r"integer"):
        direct.poll(handle, "100")
    assert direct.poll(handle, 1000)["index"].tolist() == list(range(7))
