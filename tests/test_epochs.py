"""Epochs advance by themselves (main process and DataLoader workers, fork,
spawn and forkserver, persistent or not); plans are pure functions of
(seed, epoch); seeds are drawn once and inherited by workers."""

import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import rows_source
from torch.utils.data import DataLoader

import torch_shards as ts


def order(dataset, **loader_kwargs):
    loader = DataLoader(dataset, batch_size=None, **loader_kwargs)
    return tuple(torch.cat([batch["index"] for batch in loader]).tolist())


def shuffled(seed=7, num_rows=64):
    return ts.ShardedDataset(rows_source(num_rows), ts.BlockShuffling(2), batch_size=4, fetch_factor=2, seed=seed)


@pytest.mark.parametrize(
    "context,persistent",
    [("fork", False), ("fork", True), ("spawn", False), ("spawn", True), ("forkserver", False), ("forkserver", True)],
)
def test_epoch_advances_every_iteration_in_workers(context, persistent):
    dataset = shuffled()
    loader_kwargs = dict(num_workers=2, multiprocessing_context=context, persistent_workers=persistent)
    loader = DataLoader(dataset, batch_size=None, **loader_kwargs)
    epochs = [tuple(torch.cat([b["index"] for b in loader]).tolist()) for _ in range(3)]
    assert all(sorted(e) == list(range(64)) for e in epochs)
    assert len(set(epochs)) == 3, "a worker reused an earlier epoch's order"
    # Epoch e delivered by workers holds exactly the rows of epoch e read in the main process.
    reference = shuffled()
    for epoch, delivered in enumerate(epochs):
        reference.set_epoch(epoch)
        batches = {tuple(b["index"].tolist()) for b in reference}
        assert batches == set(map(tuple, torch.tensor(delivered).reshape(-1, 4).tolist()))
    assert dataset.epoch == 2


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_workers(context):
    dataset = shuffled()
    loader = DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=context, persistent_workers=True
    )
    first = [b["index"].tolist() for b in loader]
    [b for b in loader]  # epoch 1
    dataset.set_epoch(0)
    again = [b["index"].tolist() for b in loader]
    assert again == first
    assert dataset.epoch == 0
    nxt = [b["index"].tolist() for b in loader]
    assert nxt != first and dataset.epoch == 1


def test_epoch_advances_in_the_main_process():
    dataset = shuffled()
    orders = [order(dataset) for _ in range(4)]
    assert len(set(orders)) == 4
    assert dataset.epoch == 3
    dataset.set_epoch(1)
    assert order(dataset) == orders[1]
    assert order(dataset) == orders[2]  # counting continues from the pinned epoch


def test_mixing_main_process_and_worker_iterations_never_repeats_an_epoch():
    dataset = shuffled()
    seen = [order(dataset)]
    seen.append(order(dataset, num_workers=2, multiprocessing_context="fork"))
    seen.append(order(dataset))
    seen.append(order(dataset, num_workers=3, multiprocessing_context="fork"))
    as_sets = [tuple(sorted(s)) for s in seen]
    assert len(set(as_sets)) == 1  # every epoch complete
    assert dataset.epoch == 3
    # The batches of each epoch are those of epochs 0..3, once each.
    batches = [set(map(tuple, torch.tensor(s).reshape(-1, 4).tolist())) for s in seen]
    expected = []
    reference = shuffled()
    for epoch in range(4):
        reference.set_epoch(epoch)
        expected.append({tuple(b["index"].tolist()) for b in reference})
    assert batches == expected


def test_fixed_dataloader_generator_recreated_each_epoch_still_advances():
    dataset = shuffled()
    orders = []
    for _ in range(3):
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=2,
            multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(0),
        )
        orders.append(tuple(sorted(map(tuple, (b["index"].tolist() for b in loader)))))
    assert len(set(orders)) == 3
    assert dataset.epoch == 2


def _worker_1_fails_to_start(worker_id):
    if worker_id == 1:
        raise OSError("transient failure in worker_init_fn")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_an_iteration_under_the_seed_of_one_whose_worker_never_started_is_its_own_epoch(context):
    # Worker 0 of the failed iteration claimed an epoch, worker 1 never did. The retry, under the same
    # base seed (torch.manual_seed), took the failed iteration's name: its worker 1 joined that epoch
    # while its worker 0 claimed a new one (489 of 2000 rows twice, 489 never).
    dataset = ts.ShardedDataset(rows_source(400), ts.BlockShuffling(4), batch_size=8, seed=3)
    failing = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        worker_init_fn=_worker_1_fails_to_start,
        multiprocessing_context=context,
    )
    torch.manual_seed(0)
    with pytest.raises(OSError, match="transient failure"):
        for _ in failing:
            pass
    torch.manual_seed(0)
    rows = torch.cat(
        [b["index"] for b in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)]
    )
    assert sorted(rows.tolist()) == list(range(400))


def _worker_1_starts_late(worker_id):
    if worker_id == 1:
        time.sleep(1.0)


def test_two_loaders_with_one_generator_are_two_iterations():
    # Loader a's worker 1 starts after loader b's workers claimed: under one base seed it joined b's epoch.
    dataset = shuffled(num_rows=200)
    loaders = [
        iter(
            DataLoader(
                dataset,
                batch_size=None,
                num_workers=2,
                generator=torch.Generator().manual_seed(0),
                worker_init_fn=init,
                multiprocessing_context="fork",
            )
        )
        for init in (_worker_1_starts_late, None)
    ]
    rows = [[], []]
    for a, b in zip(*loaders):
        rows[0] += a["index"].tolist()
        rows[1] += b["index"].tolist()
    assert sorted(rows[0]) == sorted(rows[1]) == list(range(200))


def test_same_seed_same_batches_and_different_seeds_differ():
    assert order(shuffled(seed=1)) == order(shuffled(seed=1))
    assert order(shuffled(seed=1)) != order(shuffled(seed=2))


def test_plans_are_identical_in_another_process():
    code = textwrap.dedent(
        """
        import torch, torch_shards as ts
        w = torch.arange(500, dtype=torch.float64) % 7
        strategies = [ts.Streaming(shuffle=True), ts.BlockShuffling(16), ts.BlockWeightedSampling(w, 999, 4),
                      ts.BlockWeightedSampling(w, 300, 4, replacement=False),
                      ts.ClassBalancedSampling(torch.arange(500) % 5, 700, 8)]
        out = []
        for s in strategies:
            ds = ts.ShardedDataset(ts.TensorSource(torch.zeros(500)), s, batch_size=16, fetch_factor=4, seed=99)
            ds.set_epoch(3)
            out.append([b["index"].tolist() for b in ds])
        print(repr(out))
        """
    )
    results = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    assert results[0] == results[1]
    assert len(results[0]) > 1000


def test_seed_none_draws_once_and_workers_inherit_it():
    dataset = ts.ShardedDataset(rows_source(64), ts.BlockShuffling(2), batch_size=4, seed=None)
    assert isinstance(dataset.seed, int)
    # Workers (which re-create the native object from the pickled state) must
    # use the same seed: batches as sets equal those of the main process.
    dataset.set_epoch(0)
    in_workers = sorted(
        map(
            tuple,
            (
                b["index"].tolist()
                for b in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
            ),
        )
    )
    dataset.set_epoch(0)
    in_main = sorted(map(tuple, (b["index"].tolist() for b in dataset)))
    assert in_workers == in_main
    other = ts.ShardedDataset(rows_source(64), ts.BlockShuffling(2), batch_size=4, seed=None)
    assert other.seed != dataset.seed


def test_epochs_differ_for_every_shuffling_strategy():
    weights = torch.rand(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    dataset = ts.ShardedDataset(rows_source(200), ts.Streaming(shuffle=True), batch_size=8, seed=3)
    assert len({order(dataset) for _ in range(5)}) == 5  # permuted inside fetches, differently each epoch
    for strategy in [
        ts.BlockShuffling(4),
        ts.BlockWeightedSampling(weights),
        ts.BlockWeightedSampling(weights, 100, replacement=False),
        ts.ClassBalancedSampling(torch.arange(200) % 4),
    ]:
        plans = {tuple(strategy.plan(200, seed=3, epoch=e).tolist()) for e in range(5)}
        assert len(plans) == 5, strategy


def test_streaming_plan_does_not_change_with_the_epoch():
    assert torch.equal(ts.Streaming().plan(50, 1, 0), ts.Streaming().plan(50, 1, 9))


def test_set_epoch_rejects_negative_epochs():
    with pytest.raises(ValueError, match=r"epoch must be in \[0, 2\*\*62\], got -1"):
        shuffled().set_epoch(-1)


def test_dataset_pickles_and_keeps_its_epoch_state():
    import pickle

    dataset = shuffled()
    order(dataset)
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.seed == dataset.seed and len(clone) == len(dataset)
    dataset.set_epoch(0)
    clone.set_epoch(0)
    assert order(clone) == order(dataset)


def _mark_read_ahead(batch):
    """batch_transform (in a DataLoader worker): each row tagged with whether its iteration was read ahead."""
    stats = torch.utils.data.get_worker_info().dataset.reader_stats()
    assert len(stats) == 1, stats  # the iteration under way alone: one read ahead and not taken is closed
    batch["read_ahead"] = torch.full_like(batch["index"], stats[0]["read_ahead"])
    return batch


def _plan_function(num_rows, seed, epoch):
    return torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 1000 + epoch))[: num_rows // 2]


def _epoch_batches(dataset, epoch):
    """Epoch `epoch` of `dataset`'s arguments read in this process: its batches, as sets of rows."""
    dataset.set_epoch(epoch)
    return sorted(tuple(b["index"].tolist()) for b in dataset)


@pytest.mark.parametrize(
    "loader_class,context", [(DataLoader, "fork"), (ts.DataLoader, "fork"), (ts.DataLoader, "spawn")]
)
def test_persistent_workers_read_their_next_epoch_ahead_and_deliver_the_epoch_claimed(loader_class, context):
    def make(**kwargs):
        return ts.ShardedDataset(rows_source(96), ts.BlockShuffling(2), batch_size=4, fetch_factor=2, seed=3, **kwargs)

    dataset, reference = make(batch_transform=_mark_read_ahead), make()
    loader = loader_class(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=context, persistent_workers=True
    )

    def epoch(expected_epoch, read_ahead):
        batches = list(loader)
        assert dataset.epoch == expected_epoch
        assert sorted(tuple(b["index"].tolist()) for b in batches) == _epoch_batches(reference, expected_epoch)
        assert {int(b["read_ahead"][0]) for b in batches} == {int(read_ahead)}

    epoch(0, False)
    # ts.DataLoader tells its workers they are persistent; torch's learn it when they iterate again.
    epoch(1, loader_class is ts.DataLoader)
    epoch(2, True)
    dataset.set_epoch(3)  # the epoch it would claim anyway (as DistributedSampler's users do): the one read ahead
    epoch(3, True)
    dataset.set_epoch(7)  # another one: what was read ahead (epoch 4) is dropped, 7 is read
    epoch(7, False)
    epoch(8, True)
    # A checkpoint of epoch 8 after 5 batches, loaded once epoch 9 is read ahead: epoch 8's rest comes.
    state = dataset.state_dict(consumed_batches=5)
    epoch(9, True)
    dataset.set_epoch(8)
    consumed = [tuple(b["index"].tolist()) for b in list(loader)[:5]]
    dataset.load_state_dict(state)
    rest = list(loader)
    assert {int(b["read_ahead"][0]) for b in rest} == {0}
    assert sorted(consumed + [tuple(b["index"].tolist()) for b in rest]) == _epoch_batches(reference, 8)


def test_a_plan_python_provides_each_epoch_is_not_read_ahead():
    dataset = ts.ShardedDataset(
        rows_source(64),
        ts.CustomStrategy(_plan_function),
        batch_size=4,
        fetch_factor=2,
        seed=5,
        batch_transform=_mark_read_ahead,
    )
    loader = ts.DataLoader(dataset, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    for epoch in range(3):
        batches = list(loader)
        assert sorted(int(i) for b in batches for i in b["index"]) == sorted(_plan_function(64, 5, epoch).tolist())
        assert {int(b["read_ahead"][0]) for b in batches} == {0}
