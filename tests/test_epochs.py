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


@pytest.mark.parametrize(
    "loader_class,context", [(DataLoader, "fork"), (ts.DataLoader, "fork"), (ts.DataLoader, "spawn")]
)
def test_persistent_workers_follow_set_epoch_and_a_checkpoint_loaded_between_epochs(loader_class, context):
    def make():
        return ts.ShardedDataset(rows_source(96), ts.BlockShuffling(2), batch_size=4, fetch_factor=2, seed=3)

    def batches(iterable):
        return [tuple(b["index"].tolist()) for b in iterable]

    def epoch_of_reference(epoch):
        reference.set_epoch(epoch)
        return sorted(batches(reference))

    dataset, reference = make(), make()
    loader = loader_class(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=context, persistent_workers=True
    )
    for expected in (0, 1, 2):
        assert sorted(batches(loader)) == epoch_of_reference(expected) and dataset.epoch == expected
    dataset.set_epoch(7)
    assert sorted(batches(loader)) == epoch_of_reference(7) and dataset.epoch == 7
    # A checkpoint of epoch 7 after 5 batches, loaded once epoch 8 ran: the rest of epoch 7 comes, once.
    state = dataset.state_dict(consumed_batches=5)
    assert sorted(batches(loader)) == epoch_of_reference(8)
    dataset.set_epoch(7)
    consumed = batches(loader)[:5]
    dataset.load_state_dict(state)
    rest = batches(loader)
    assert sorted(consumed + rest) == epoch_of_reference(7) and len(rest) == len(reference) - 5
    assert sorted(batches(loader)) == epoch_of_reference(8) and dataset.epoch == 8
    workers = list(loader._iterator._workers)
    del loader
    for worker in workers:
        worker.join(30)
    assert [worker.exitcode for worker in workers] == [0, 0]
