"""DistributedSampler: torch's layout and output where promised, any strategy
partitioned across ranks, auto-advancing epochs, exact len()."""

import collections
import copy
import itertools
import pickle

import numpy as np
import pytest
import torch
import torch.utils.data.distributed as torch_distributed
from torch.utils.data import DataLoader, TensorDataset

import torch_shards as ts


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("drop_last", [False, True])
def test_without_shuffle_output_equals_torch_distributed_sampler(drop_last):
    for num_rows, replicas in itertools.product([1, 2, 7, 10, 33, 64, 100], [1, 2, 3, 4, 8]):
        if drop_last and num_rows < replicas:
            continue
        for rank in range(replicas):
            ours = ts.DistributedSampler(Rows(num_rows), replicas, rank, shuffle=False, drop_last=drop_last)
            theirs = torch_distributed.DistributedSampler(
                Rows(num_rows), replicas, rank, shuffle=False, drop_last=drop_last
            )
            assert list(ours) == list(theirs), (num_rows, replicas, rank)
            assert len(ours) == len(theirs)
            assert ours.total_size == theirs.total_size and ours.num_samples == theirs.num_samples


@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffled_ranks_partition_a_permutation_like_torch(drop_last):
    for num_rows, replicas in itertools.product([5, 10, 33, 100], [1, 2, 3, 4]):
        samplers = [
            ts.DistributedSampler(Rows(num_rows), replicas, r, seed=3, drop_last=drop_last) for r in range(replicas)
        ]
        per_rank = [list(s) for s in samplers]
        assert all(len(indices) == len(s) for indices, s in zip(per_rank, samplers))
        merged = [per_rank[r][j] for j in range(samplers[0].num_samples) for r in range(replicas)]
        # merged is the padded (or trimmed) plan: a permutation, wrapped around.
        unique = merged[: min(num_rows, len(merged))]
        assert len(set(unique)) == len(unique)
        if not drop_last:
            assert set(merged) == set(range(num_rows))
            assert merged[num_rows:] == merged[: len(merged) - num_rows]
        else:
            assert len(merged) == num_rows - num_rows % replicas


def test_epoch_advances_without_set_epoch_and_set_epoch_pins():
    sampler = ts.DistributedSampler(Rows(50), 2, 0, seed=1)
    epochs = [list(sampler) for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3
    assert sampler.epoch == 2
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]
    # Code written for torch (set_epoch before every epoch) gets exactly those epochs.
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert list(sampler) == epochs[epoch]


@pytest.mark.parametrize(
    "copy_of", [copy.deepcopy, lambda s: pickle.loads(pickle.dumps(s))], ids=["deepcopy", "pickle"]
)
def test_a_copy_goes_on_from_where_the_sampler_stands(copy_of):
    sampler = ts.DistributedSampler(Rows(50), 2, 1, seed=3)
    sampler.set_epoch(4)
    assert list(copy_of(sampler)) == list(sampler)  # pinned epoch 4, in both
    assert list(copy_of(sampler)) == list(sampler)  # both advanced to epoch 5
    iterator = iter(sampler)
    taken = [next(iterator) for _ in range(7)]
    copied = copy_of(sampler)  # mid-iteration: the copy yields the rest of this epoch, then goes on
    rest = list(iterator)
    assert len(copied) == len(rest) and list(copied) == rest and len(taken + rest) == len(sampler) == 25
    assert list(copied) == list(sampler)  # the next epoch, in both


def test_dataloader_with_persistent_workers_uses_a_new_epoch_each_time():
    dataset = TensorDataset(torch.arange(40))
    sampler = ts.DistributedSampler(dataset, 2, 1, seed=0)
    loader = DataLoader(
        dataset, batch_size=5, sampler=sampler, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    epochs = [tuple(torch.cat([b[0] for b in loader]).tolist()) for _ in range(3)]
    assert len(set(epochs)) == 3 and all(len(e) == len(sampler) == 20 for e in epochs)


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_weighted_strategy_partitions_its_plan_across_ranks(replicas):
    weights = np.arange(30, dtype=np.float64) % 4
    strategy = ts.BlockWeightedSampling(weights, total_size=103)
    samplers = [ts.DistributedSampler(Rows(30), replicas, r, seed=8, strategy=strategy) for r in range(replicas)]
    per_rank = [list(s) for s in samplers]
    plan = strategy.plan(30, seed=8, epoch=0).tolist()
    merged = [per_rank[r][j] for j in range(samplers[0].num_samples) for r in range(replicas)]
    assert merged[:103] == plan
    assert merged[103:] == plan[: len(merged) - 103]
    assert all(weights[i] > 0 for i in merged)
    assert len({len(indices) for indices in per_rank}) == 1


def test_class_balanced_strategy_balances_across_ranks():
    labels = np.array([0] * 95 + [1] * 5)
    strategy = ts.ClassBalancedSampling(labels, total_size=20_000)
    counts = collections.Counter()
    for rank in range(4):
        counts.update(labels[list(ts.DistributedSampler(Rows(100), 4, rank, strategy=strategy))].tolist())
    assert abs(counts[0] - counts[1]) < 600


def test_sampler_reads_rank_from_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr("torch_shards.sampler._warned_without_group", False)
    with pytest.warns(UserWarning, match="no torch.distributed process group is initialised"):
        sampler = ts.DistributedSampler(Rows(10), shuffle=False)
    assert (sampler.rank, sampler.num_replicas) == (2, 4)
    assert list(sampler) == [2, 6, 0]  # padded to 12 by wrapping, as torch does


@pytest.mark.parametrize("drop_last", [False, True])
def test_an_empty_dataset_yields_nothing_as_torchs_sampler_does(drop_last):
    for rank in range(2):
        ours = ts.DistributedSampler(Rows(0), 2, rank, drop_last=drop_last)
        theirs = torch.utils.data.DistributedSampler(Rows(0), 2, rank, drop_last=drop_last)
        assert list(ours) == list(theirs) == [] and len(ours) == len(theirs) == 0
        assert list(ours) == [] and ours.state_dict()["epoch"] == 2


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        ts.DistributedSampler(Rows(10), 2, 2)
    with pytest.raises(ValueError, match=r"num_replicas must be in \[1, 2\*\*20\], got 0"):
        ts.DistributedSampler(Rows(10), 0, 0)
    with pytest.raises(ValueError, match="dataset is empty .*: a strategy has nothing to draw from"):
        ts.DistributedSampler(Rows(0), 1, 0, strategy=ts.BlockShuffling(2))
    for strategy in (ts.Streaming(shuffle=True), ts.CustomStrategy([0, 1, 2], shuffle=True)):
        with pytest.raises(ValueError, match="shuffle=True permutes rows within the fetches of a ShardedDataset"):
            ts.DistributedSampler(Rows(10), 1, 0, strategy=strategy)
    with pytest.raises(ValueError, match="weights must have one entry per row"):
        ts.DistributedSampler(Rows(10), 1, 0, strategy=ts.BlockWeightedSampling(np.ones(3)))
    with pytest.raises(TypeError, match="strategy must be a torch_shards strategy"):
        ts.DistributedSampler(Rows(10), 1, 0, strategy="shuffle")


def test_large_plan_yields_lazily_in_constant_memory():
    sampler = ts.DistributedSampler(Rows(10**9), 8, 3, seed=0)
    first = list(itertools.islice(iter(sampler), 100_000))
    assert len(set(first)) == len(first) and max(first) < 10**9
    assert len(sampler) == 125_000_000
