"""Batches crossing from DataLoader workers packed as the storages they view
(torch_shards/transfer.py), in recycled shared memory leased to the main
process; and ts.DataLoader, whose workers send whole fetches: the same
batches in torch's order, never overwritten while held."""

import functools
import json
import os
import subprocess
import sys
import time

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import STRATEGIES, make_strategy
from torch.utils.data import DataLoader

import torch_shards as ts
from torch_shards._library import direct

ROWS, WIDTH = 1000, 6


def values():
    # Row r holds r * 10 + column: any batch can be checked against its index.
    return torch.arange(ROWS * WIDTH, dtype=torch.float32).reshape(ROWS, WIDTH) // WIDTH * 10 + torch.arange(WIDTH)


def dataset(strategy=None, **kwargs):
    arguments = dict(batch_size=16, fetch_factor=4, seed=5, num_threads=1)
    arguments.update(kwargs)
    return ts.ShardedDataset(ts.TensorSource(values()), strategy or ts.BlockShuffling(8), **arguments)


def intact(batch):
    expected = batch["index"].double().unsqueeze(1) * 10 + torch.arange(WIDTH)
    return torch.equal(batch["X"].double(), expected)


def order(loader):
    return [tuple(batch["index"].tolist()) for batch in loader]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("even_batches, drop_last", [("pad", False), (None, True), ("drop", False)])
def test_ts_dataloader_gives_torchs_batches_in_torchs_order(num_workers, even_batches, drop_last):
    kwargs = dict(even_batches=even_batches, drop_last=drop_last, rank=1, world_size=3)
    for epoch in range(2):
        theirs = dataset(**kwargs)
        theirs.set_epoch(epoch)
        ours = dataset(**kwargs)
        ours.set_epoch(epoch)
        expected = order(DataLoader(theirs, batch_size=None, num_workers=num_workers))
        loader = ts.DataLoader(ours, batch_size=None, num_workers=num_workers)
        assert len(loader) == len(expected)
        assert order(loader) == expected


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_every_strategy_crosses_packed_unchanged(strategy_name):
    def make():
        return dataset(make_strategy(strategy_name, ROWS, block_size=4))

    in_process = order(make())
    plain = list(DataLoader(make(), batch_size=None, num_workers=2))
    whole = list(ts.DataLoader(make(), batch_size=None, num_workers=2))
    assert all(intact(batch) for batch in plain + whole)
    assert sorted(order(plain)) == sorted(in_process) == sorted(order(whole))
    assert order(whole) == order(plain)


class RecordingDataset(ts.ShardedDataset):
    """Writes each worker's buffer-pool counters at the end of its epochs (next to the test's files)."""

    record_dir = None

    def _batches(self, iterator, packed=None):
        yield from super()._batches(iterator, packed)
        stats = iterator.stats()
        path = os.path.join(self.record_dir, f"{os.getpid()}-{iterator.epoch()}.json")
        with open(path, "w") as file:
            json.dump({key: stats[key] for key in stats if key.startswith("pool_")}, file)


def pool_counts(directory):
    records = [json.load(open(os.path.join(directory, name))) for name in os.listdir(directory)]
    return sum(r["pool_reuses"] for r in records), sum(r["pool_allocations"] for r in records)


@pytest.mark.parametrize("loader_class", [DataLoader, ts.DataLoader])
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_held_batches_are_never_overwritten_while_dropped_ones_are_recycled(tmp_path, loader_class, context):
    # Every third batch of the first epoch is held to the end (with the rest of its fetch's storage);
    # the other batches are dropped at once, so their memory goes back to the workers' pools and
    # is written again while the held ones must keep their values.
    ds = RecordingDataset(ts.TensorSource(values()), ts.BlockShuffling(8), batch_size=16, fetch_factor=4, seed=5)
    ds.record_dir = str(tmp_path)
    loader = loader_class(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    held, seen = [], []
    for epoch in range(3):
        for i, batch in enumerate(loader):
            assert intact(batch)
            seen.append(tuple(batch["index"].tolist()))
            if epoch == 0 and i % 3 == 0:
                held.append(batch)
        assert sorted(i for b in seen[-len(ds) :] for i in b) == list(range(ROWS))
    del loader  # workers exit: their records are complete
    assert all(intact(batch) for batch in held)
    reuses, allocations = pool_counts(tmp_path)
    assert reuses >= 10  # recycled across the processes


def test_packed_batches_of_a_sparse_anndata_arrive_equal(tmp_path):
    rng = np.random.default_rng(0)
    matrix = sp.random(300, 40, density=0.1, format="csr", dtype=np.float32, random_state=rng)
    path = str(tmp_path / "x.h5ad")
    ad.AnnData(X=matrix).write_h5ad(path)

    def make():
        return ts.ShardedDataset(ts.AnnDataSource(path), ts.BlockShuffling(4), batch_size=8, fetch_factor=4, seed=3)

    dense = matrix.toarray()
    for loader in (
        DataLoader(make(), batch_size=None, num_workers=2),
        ts.DataLoader(make(), batch_size=None, num_workers=2),
    ):
        rows = []
        for batch in loader:
            assert batch["X"].layout == torch.sparse_csr
            np.testing.assert_array_equal(batch["X"].to_dense().numpy(), dense[batch["index"].numpy()])
            rows.extend(batch["index"].tolist())
        assert sorted(rows) == list(range(300))


BETA_WARNING = "Sparse CSR tensor support is in beta state"


def small_csr_h5ad(tmp_path):
    path = str(tmp_path / "x.h5ad")
    ad.AnnData(X=sp.random(200, 30, density=0.1, format="csr", dtype=np.float32, random_state=1)).write_h5ad(path)
    return path


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_torchs_sparse_csr_beta_warning_shows_once_not_once_per_worker(tmp_path, context):
    # torch warns once per process; the workers' reader threads make CSR batches too, and printed it
    # again on stderr from each worker (3 times with 2 workers). A fresh process: the training process
    # shows it once (as it rebuilds the batches).
    path = small_csr_h5ad(tmp_path)
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch_shards as ts\n"
        "from torch.utils.data import DataLoader\n"
        "if __name__ == '__main__':\n"
        f"    ds = ts.ShardedDataset(ts.AnnDataSource({path!r}), ts.BlockShuffling(4), batch_size=8, seed=3)\n"
        "    for loader_class in (DataLoader, ts.DataLoader):\n"
        f"        loader = loader_class(ds, batch_size=None, num_workers=2, multiprocessing_context={context!r})\n"
        "        assert sum(b['index'].numel() for b in loader) == 200\n"
        "    print('OK')\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]
    assert result.stderr.count(BETA_WARNING) == 1, result.stderr[-3000:]


@pytest.mark.parametrize("filtered", [False, True])
def test_torchs_sparse_csr_beta_warning_is_a_python_warning_in_process(tmp_path, filtered):
    # Raised where the iteration starts, not on a reader thread (where c10 printed it on stderr, past
    # Python's filters): shown once as a UserWarning, and not at all when the user filters it.
    path = small_csr_h5ad(tmp_path)
    script = (
        "import warnings\n"
        + (f"warnings.filterwarnings('ignore', message={BETA_WARNING!r})\n" if filtered else "")
        + "import torch_shards as ts\n"
        f"ds = ts.ShardedDataset(ts.AnnDataSource({path!r}), ts.BlockShuffling(4), batch_size=8, seed=3)\n"
        "for epoch in range(2):\n"
        "    assert sum(b['index'].numel() for b in ds) == 200\n"
        "print('OK')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]
    assert result.stderr.count(BETA_WARNING) == (0 if filtered else 1), result.stderr[-3000:]
    assert filtered or f"UserWarning: {BETA_WARNING}" in result.stderr, result.stderr[-3000:]


def test_ts_dataloader_resumes_from_the_loops_count_like_torchs():
    consumed = 9
    for loader_class in (DataLoader, ts.DataLoader):
        ds = dataset()
        loader = loader_class(ds, batch_size=None, num_workers=3)
        first = []
        for batch in loader:
            first.append(tuple(batch["index"].tolist()))
            if len(first) == consumed:
                break
        state = ds.state_dict(consumed_batches=consumed)
        resumed = dataset()
        resumed.load_state_dict(state)
        rest = order(loader_class(resumed, batch_size=None, num_workers=2))
        assert sorted(i for b in first + rest for i in b) == list(range(ROWS))
        if loader_class is DataLoader:
            expected = (first, rest)
        else:
            assert (first, rest) == expected


def _slow_start(worker_id):
    time.sleep(1.5)  # the window between iter(loader) and the workers' claim of their epoch


@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_taken_before_the_workers_claim_their_epoch_is_that_epochs_start(persistent):
    # ts.DataLoader tells the dataset its workers are starting: a checkpoint at step 0 of epoch 1 is
    # epoch 1's start, not epoch 0 with nothing consumed (which would replay epoch 0, already trained on).
    ds = dataset()
    loader = ts.DataLoader(
        ds, batch_size=None, num_workers=2, worker_init_fn=_slow_start, persistent_workers=persistent
    )
    epoch0 = order(loader)
    iterator = iter(loader)
    state = ds.state_dict(consumed_batches=0)
    assert state["epoch"] == 1
    if not persistent:  # persistent workers sleep once, at their start: they may have claimed epoch 1 by now
        assert ds.state_dict()["epoch"] == 1
        with pytest.raises(ValueError, match="consumed_batches=2 but the DataLoader's workers have not started epoch"):
            ds.state_dict(consumed_batches=2)
    epoch1 = [tuple(batch["index"].tolist()) for batch in iterator]
    resumed = dataset()
    resumed.load_state_dict(state)
    assert order(ts.DataLoader(resumed, batch_size=None, num_workers=2)) == epoch1 != epoch0


def test_ts_dataloader_warns_that_in_order_false_is_not_applied():
    with pytest.warns(UserWarning, match="in_order=False is not applied to a ShardedDataset"):
        loader = ts.DataLoader(dataset(), batch_size=None, num_workers=2, in_order=False)
    assert sorted(i for b in order(loader) for i in b) == list(range(ROWS))


def test_ts_dataloader_endless_stream_keeps_torchs_order():
    theirs = iter(DataLoader(dataset(cycle=True), batch_size=None, num_workers=2))
    ours = iter(ts.DataLoader(dataset(cycle=True), batch_size=None, num_workers=2))
    for _ in range(3 * 63):
        a, b = next(theirs), next(ours)
        assert a["index"].tolist() == b["index"].tolist() and intact(b)


def test_transforms_and_custom_collate_still_work_through_ts_dataloader():
    def double(batch):
        return {**batch, "X": batch["X"] * 2}

    expected = order(DataLoader(dataset(batch_transform=double), batch_size=None, num_workers=2))
    got = list(ts.DataLoader(dataset(batch_transform=double), batch_size=None, num_workers=2))
    assert order(got) == expected
    assert all(torch.equal(b["X"], values()[b["index"]] * 2) for b in got)
    unit_transformed = list(ts.DataLoader(dataset(fetch_transform=double), batch_size=None, num_workers=2))
    assert order(unit_transformed) == expected
    assert all(torch.equal(b["X"], values()[b["index"]] * 2) for b in unit_transformed)
    collated = list(
        ts.DataLoader(dataset(), batch_size=None, num_workers=2, collate_fn=lambda b: {**b, "tag": torch.ones(1)})
    )
    assert order(collated) == expected and all("tag" in b and intact(b) for b in collated)


def test_ts_dataloader_is_torchs_for_other_datasets_and_in_process():
    data = torch.utils.data.TensorDataset(torch.arange(10))
    assert [b[0].tolist() for b in ts.DataLoader(data, batch_size=4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert order(ts.DataLoader(dataset(), batch_size=None)) == order(dataset())
    loader = ts.DataLoader(dataset(), batch_size=None, num_workers=2, worker_init_fn=lambda i: None)
    assert loader.dataset.batch_size == 16 and len(list(loader)) == len(loader)
    with pytest.raises(TypeError):
        ts.DataLoader(dataset(), batch_size=None, bad_argument=1)


def words(*values):
    return np.array(values, dtype=np.int64).tobytes()


def test_a_damaged_description_is_refused_not_followed():
    storage = torch.zeros(256, dtype=torch.uint8)
    # version 3, this pid, nonce 7, not last, no freed slab, no slab, 1 other storage, 1 unit, worker 0,
    # no worker counts; then the unit: batch size (0: one batch, uncut), 1 field (name 0, dense) of float32
    # (dtype code 6) at offset 0, 1-D, and no row offsets.
    header = (3, os.getpid(), 7, 0, 0, 0, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="another torch_shards version"):
        direct.unpack(words(2, *header[1:]), ["X"], [storage])
    with pytest.raises(ValueError, match="storages besides its slabs"):
        direct.unpack(words(*header), ["X"], [storage, storage])
    with pytest.raises(ValueError, match="ends early"):
        direct.unpack(words(*header), ["X"], [storage])
    with pytest.raises(ValueError, match="whole int64 words"):
        direct.unpack(words(*header)[:-3], ["X"], [storage])
    past = (*header, 0, 1, 0, 0, 0, 6, 0, 1, 1000, 1, 0)
    with pytest.raises(ValueError, match="past its storage"):
        direct.unpack(words(*past), ["X"], [storage])
    with pytest.raises(ValueError, match="field name 3 out of range"):
        direct.unpack(words(*(*header, 0, 1, 3, 0, 0, 6, 0, 1, 64, 1, 0)), ["X"], [storage])
    with pytest.raises(ValueError, match="bad batch size -2"):
        direct.unpack(words(*(*header, -2, 1, 0, 0, 0, 6, 0, 1, 64, 1, 0)), ["X"], [storage])
    with pytest.raises(ValueError, match="left over"):
        direct.unpack(words(*(*header, 0, 1, 0, 0, 0, 6, 0, 1, 64, 1, 0, 9)), ["X"], [storage])
    batches, worker, counts = direct.unpack(words(*(*header, 0, 1, 0, 0, 0, 6, 0, 1, 64, 1, 0)), ["X"], [storage])
    assert len(batches) == 1 and batches[0]["X"].shape == (64,) and worker == 0 and counts == []
    # The same 64 rows as a unit of batch size 24: cut here into 24, 24 and 16 rows.
    batches, _, _ = direct.unpack(words(*(*header, 24, 1, 0, 0, 0, 6, 0, 1, 64, 1, 0)), ["X"], [storage])
    assert [batch["X"].shape[0] for batch in batches] == [24, 24, 16]


def test_unpack_lazy_makes_each_batch_when_it_is_taken_in_order_then_none():
    # What ts.DataLoader's loop receives: the batches of a unit made into dicts one at a time, so that a
    # unit of many batches holds no Python objects for those not yet taken (nor the cyclic collector's work).
    storage = torch.zeros(256, dtype=torch.uint8)
    storage.view(torch.float32)[:] = torch.arange(64, dtype=torch.float32)
    header = (3, os.getpid(), 7, 0, 0, 0, 1, 1, 1, 2, 5, 7)  # worker 1 of 2, which deliver 5 and 7 batches
    description = words(*(*header, 24, 1, 0, 0, 0, 6, 0, 1, 64, 1, 0))
    pending, worker, counts = direct.unpack_lazy(description, ["X"], [storage])
    assert worker == 1 and counts == [5, 7]
    expected = direct.unpack(description, ["X"], [storage])[0]
    taken = [direct.take(pending) for _ in range(3)]
    assert [type(batch) for batch in taken] == [dict] * 3
    assert [batch["X"].tolist() for batch in taken] == [batch["X"].tolist() for batch in expected]
    assert torch.cat([batch["X"] for batch in taken]).tolist() == list(range(64))
    assert direct.take(pending) is None and direct.take(pending) is None
    with pytest.raises(TypeError, match="expected batches from unpack_lazy"):
        direct.take(object())
    with pytest.raises(ValueError, match="ends early"):
        direct.unpack_lazy(words(*header), ["X"], [storage])


def test_a_unit_pinned_gives_its_batches_pinned_in_order(monkeypatch):
    # DataLoader(pin_memory=True)'s thread calls Unit.pin_memory: every batch taken and pinned, in order (torch's
    # pin_memory itself needs an accelerator: stood in for by a copy marking what it made).
    from torch_shards import transfer

    monkeypatch.setattr(transfer, "_pin_memory", lambda batch, device: {**batch, "pinned": device})
    batches = [{"X": torch.full((2,), float(i))} for i in range(3)]
    unit = transfer.Unit(functools.partial(next, iter(batches), None), 1, [3, 3])
    pinned = unit.pin_memory("cuda")
    assert unit.take() is None  # the received unit was emptied into the pinned one
    assert (pinned.worker, pinned.worker_batches) == (1, [3, 3])
    taken = list(iter(pinned.take, None))
    assert [(b["X"][0].item(), b["pinned"]) for b in taken] == [(0.0, "cuda"), (1.0, "cuda"), (2.0, "cuda")]


def test_a_unit_whose_row_offsets_reach_past_its_values_is_refused_before_it_is_cut():
    # A 2 x 4 CSR matrix in one storage: row offsets (int64, code 4) at elements 0-2, column indices at 3-4,
    # float32 values at bytes 40-47; cut into batches of one row. Its offsets are read here, so they are
    # checked here: offsets past the stored values would cut views that reach outside them.
    storage = torch.zeros(256, dtype=torch.uint8)
    longs = storage.view(torch.int64)
    longs[3:5] = torch.tensor([0, 3])
    storage.view(torch.float32)[10:12] = torch.tensor([1.5, 2.5])
    header = (3, os.getpid(), 7, 0, 0, 0, 1, 1, 0, 0)

    def unit(*offsets):
        csr = (0, 1, 2, 4, 0, 4, 0, 1, 3, 1, 0, 4, 3, 1, 2, 1, 0, 6, 10, 1, 2, 1)
        return words(*header, 1, 1, *csr, len(offsets) // 7, *offsets)

    for bad in ([0, 1, 5], [0, 2, 1], [-1, 0, 2]):
        longs[0:3] = torch.tensor(bad)
        with pytest.raises(ValueError, match="row offsets out of order or past its 2 stored values"):
            direct.unpack(unit(), ["X"], [storage])
    longs[0:3] = torch.tensor([0, 1, 2])
    # Space set aside for the rebased offsets (rows + batches = 4 entries at elements 8-11), or too little.
    with pytest.raises(ValueError, match="offsets set aside for 'X' do not fit 2 batches of 2 rows"):
        direct.unpack(unit(0, 0, 4, 8, 1, 3, 1), ["X"], [storage])
    batches, _, _ = direct.unpack(unit(0, 0, 4, 8, 1, 4, 1), ["X"], [storage])
    assert [batch["X"].to_dense().tolist() for batch in batches] == [[[1.5, 0, 0, 0]], [[0, 0, 0, 2.5]]]
    assert longs[8:12].tolist() == [0, 1, 0, 1]  # rebased in place
    # ts.DataLoader's way: the unit is cut where each batch is taken, checked all the same.
    longs[8:12] = -1
    with pytest.raises(ValueError, match="offsets set aside for 'X' do not fit 2 batches of 2 rows"):
        direct.unpack_lazy(unit(0, 0, 4, 8, 1, 3, 1), ["X"], [storage])
    pending, _, _ = direct.unpack_lazy(unit(0, 0, 4, 8, 1, 4, 1), ["X"], [storage])
    first = direct.take(pending)
    assert first["X"].to_dense().tolist() == [[1.5, 0, 0, 0]] and longs[8:12].tolist() == [0, 1, -1, -1]
    assert direct.take(pending)["X"].to_dense().tolist() == [[0, 0, 0, 2.5]]
    assert longs[8:12].tolist() == [0, 1, 0, 1]
    assert direct.take(pending) is None and direct.take(pending) is None
    # Offsets written over after the unit was checked (only a worker breaking the leases would): the batch
    # taken then is refused, never cut into views reaching past the values.
    pending, _, _ = direct.unpack_lazy(unit(0, 0, 4, 8, 1, 4, 1), ["X"], [storage])
    longs[0:3] = torch.tensor([0, 1, 5])
    assert direct.take(pending)["X"].to_dense().tolist() == [[1.5, 0, 0, 0]]
    with pytest.raises(ValueError, match="rows 1-2 are out of order or past its 2 stored values"):
        direct.take(pending)


def test_a_slab_handle_that_names_no_slab_is_refused_naming_the_process_and_the_way_out():
    # One slab: id 1, descriptor 987654 (not open here), inode 1, 4096 bytes; no batch.
    description = words(3, os.getpid(), 7, 0, 0, 1, 1, 987654, 1, 4096, 0, 0, 0, 0)
    with pytest.raises(
        RuntimeError, match=f"worker process {os.getpid()} .*/proc/{os.getpid()}/fd/987654.*worker_transport='torch'"
    ):
        direct.unpack(description, [], [])
    # An open descriptor that is another file: refused by its inode.
    with open(__file__, "rb") as f:
        other = words(3, os.getpid(), 7, 0, 0, 1, 1, f.fileno(), 1, 4096, 0, 0, 0, 0)
        with pytest.raises(RuntimeError, match="another file now"):
            direct.unpack(other, [], [])
