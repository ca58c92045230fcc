"""DistributedSampler as a drop-in for torch's: the behaviours PyTorch's
test_dataloader.py and torchdata's sampler tests check, run against ours.

Deliberate differences (docs/migration/torch-sampler.md): without set_epoch a
finished iteration is followed by a new epoch (torch's repeats epoch 0); an
unfinished one is replayed in its epoch; the checkpoint is our own state_dict
(torchdata's StatefulDistributedSampler exposes `yielded`)."""

import itertools
import math

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import torch_shards as ts


class MockDataset(Dataset):
    def __init__(self, size):
        self.data = torch.arange(size)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


# ---- PyTorch's test_dataloader.py


def test_distributed_sampler_invalid_rank():
    dataset = torch.IntTensor(range(10))
    with pytest.raises(ValueError, match="Invalid rank"):
        ts.DistributedSampler(dataset, 3, 3)
    with pytest.raises(ValueError, match="Invalid rank"):
        ts.DistributedSampler(dataset, 3, -1)


def test_duplicating_data_with_drop_last():
    num_processes, num_batches = 4, 9
    data = torch.IntTensor(range(num_batches))
    scanned = torch.IntTensor([])
    for rank in range(num_processes):
        sampler = ts.DistributedSampler(data, num_processes, rank)
        for batch in DataLoader(data, batch_size=num_batches // num_processes, drop_last=True, sampler=sampler):
            scanned = torch.cat((scanned, batch), 0)
    assert scanned.size() == scanned.unique().size()


@pytest.mark.parametrize("size", [1, 7, 10, 100, 101])
@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_without_shuffle_the_indices_are_torchs(size, replicas, drop_last):
    dataset = MockDataset(size)
    for rank in range(replicas):
        ours = ts.DistributedSampler(dataset, replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(dataset, replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs) and ours.num_samples == theirs.num_samples
        assert ours.total_size == theirs.total_size


def test_the_set_epoch_loop_torch_requires_works_unchanged():
    dataset = MockDataset(50)
    sampler = ts.DistributedSampler(dataset, 2, 1, seed=3)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        epochs.append([int(x) for batch in DataLoader(dataset, batch_size=5, sampler=sampler) for x in batch])
    assert len({tuple(e) for e in epochs}) == 3
    sampler.set_epoch(1)
    assert [int(x) for batch in DataLoader(dataset, batch_size=5, sampler=sampler) for x in batch] == epochs[1]
    assert sampler.epoch == 1


# ---- torchdata's stateful_dataloader/test_sampler.py


def test_initialization():
    dataset = MockDataset(100)
    sampler = ts.DistributedSampler(dataset, num_replicas=10, rank=0, shuffle=False, seed=42, drop_last=False)
    assert sampler.dataset is dataset
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed, sampler.drop_last) == (
        10,
        0,
        False,
        42,
        False,
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_where_it_stopped(num_workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = MockDataset(100)

    def loader(sampler):
        return stateful.StatefulDataLoader(dataset, batch_size=10, sampler=sampler, num_workers=num_workers)

    dataloader = loader(ts.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False))
    for i, _ in enumerate(dataloader):
        if i == 4:
            break
    state = dataloader.state_dict()
    resumed_loader = loader(ts.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False))
    resumed_loader.load_state_dict(state)
    resumed = [batch.tolist() for batch in resumed_loader]
    expected = [
        batch.tolist() for batch in loader(ts.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False))
    ]
    assert resumed == expected[5:]


def test_stateful_dataloader_restoring_a_shuffled_epoch_stays_in_that_epoch():
    # StatefulDataLoader calls the sampler's __iter__ several times while it restores: an unfinished
    # iteration is replayed in its own epoch, so the restored loop goes on with the same order.
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = MockDataset(100)
    full = [b.tolist() for b in DataLoader(dataset, batch_size=10, sampler=ts.DistributedSampler(dataset, 1, 0))]
    dataloader = stateful.StatefulDataLoader(dataset, batch_size=10, sampler=ts.DistributedSampler(dataset, 1, 0))
    iterator = iter(dataloader)
    taken = [next(iterator).tolist() for _ in range(3)]
    state = dataloader.state_dict()
    resumed = stateful.StatefulDataLoader(dataset, batch_size=10, sampler=ts.DistributedSampler(dataset, 1, 0))
    resumed.load_state_dict(state)
    assert taken + [b.tolist() for b in resumed] == full


def test_drop_last_effect():
    dataset = MockDataset(100)
    with_drop = ts.DistributedSampler(dataset, num_replicas=3, rank=0, drop_last=True, shuffle=False)
    without_drop = ts.DistributedSampler(dataset, num_replicas=3, rank=0, drop_last=False, shuffle=False)
    dropped = [x for batch in DataLoader(dataset, sampler=with_drop) for x in batch]
    kept = [x for batch in DataLoader(dataset, sampler=without_drop) for x in batch]
    assert len(dropped) == 100 // 3
    assert len(kept) == math.ceil(100 / 3)


def test_data_order_with_shuffle():
    dataset = MockDataset(100)
    sampler = ts.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True)
    sampler.set_epoch(0)
    sampled = [int(dataset[i]) for i in sampler]
    assert sampled != list(range(100)) and sorted(sampled) == list(range(100))
    sampler.set_epoch(0)
    loaded = [int(x) for batch in DataLoader(dataset, sampler=sampler) for x in batch]
    assert loaded == sampled


def test_data_order_without_shuffle():
    dataset = MockDataset(100)
    sampler = ts.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    assert [int(dataset[i]) for i in sampler] == list(range(100))
    loaded = [int(x) for batch in DataLoader(dataset, batch_size=32, sampler=sampler) for x in batch]
    assert loaded == list(range(100))


def test_data_distribution_across_replicas():
    dataset = MockDataset(100)
    seen = []
    for rank in range(5):
        sampler = ts.DistributedSampler(dataset, num_replicas=5, rank=rank, shuffle=False)
        seen += [int(x) for batch in DataLoader(dataset, sampler=sampler) for x in batch]
    assert sorted(seen) == list(range(100))


def test_seed_replicability():
    dataset = MockDataset(100)
    first = list(ts.DistributedSampler(dataset, 1, 0, seed=7))
    assert first == list(ts.DistributedSampler(dataset, 1, 0, seed=7))
    assert first != list(ts.DistributedSampler(dataset, 1, 0, seed=8))


def test_a_broken_off_iteration_is_replayed_in_its_epoch():
    sampler = ts.DistributedSampler(MockDataset(40), 1, 0, seed=1)
    first = list(itertools.islice(iter(sampler), 5))
    assert list(itertools.islice(iter(sampler), 5)) == first  # the same epoch again
    whole = list(sampler)
    assert whole[:5] == first and sampler.epoch == 0
    assert list(sampler)[:5] != first and sampler.epoch == 1  # finished: a new epoch
