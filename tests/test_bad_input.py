"""Every invalid argument raises an exception naming the parameter and the
value; nothing crashes or hangs."""

import math

import pytest
import torch
from conftest import rows_source

import torch_shards as ts

SOURCE = rows_source(20)


def dataset(**kwargs):
    arguments = dict(batch_size=4, seed=0)
    arguments.update(kwargs)
    strategy = arguments.pop("strategy", ts.Streaming())
    source = arguments.pop("source", SOURCE)
    return ts.ShardedDataset(source, strategy, **arguments)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
        (dict(batch_size=-3), ValueError, "batch_size must be >= 1, got -3"),
        (dict(batch_size=2.5), TypeError, "batch_size must be an int, got 2.5"),
        (dict(batch_size=True), TypeError, "batch_size must be an int, got True"),
        (dict(fetch_factor=0), ValueError, "fetch_factor must be >= 1, got 0"),
        (dict(batch_size=2**20, fetch_factor=2**12), ValueError, r"batch_size \* fetch_factor must be < 2\*\*31"),
        (dict(rank=2, world_size=2), ValueError, r"rank must be in \[0, world_size=2\), got 2"),
        (dict(rank=-1, world_size=2), ValueError, r"rank must be in \[0, world_size=2\), got -1"),
        (dict(world_size=0, rank=0), ValueError, "world_size must be >= 1, got 0"),
        (dict(even_batches="equal"), ValueError, "even_batches must be 'pad', 'drop' or None, got 'equal'"),
        (dict(even_batches=True), ValueError, "even_batches must be 'pad', 'drop' or None, got True"),
        (dict(drop_last="yes"), TypeError, "drop_last must be a bool"),
        (dict(seed=2**64), ValueError, "seed must fit in 64 bits"),
        (dict(seed="1"), TypeError, "seed must be an int"),
        (dict(fetch_transform=3), TypeError, "fetch_transform must be callable"),
        (dict(source=[1, 2]), TypeError, "source must be a torch_shards source"),
        (dict(strategy="shuffle"), TypeError, "strategy must be a torch_shards strategy"),
    ],
)
def test_dataset_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        dataset(**kwargs)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: ts.BlockShuffling(0), "BlockShuffling: block_size must be >= 1, got 0"),
        (lambda: ts.BlockShuffling(-2), "BlockShuffling: block_size must be >= 1, got -2"),
        (lambda: ts.Streaming(indices=[3, 1, 3]), "Streaming: indices must be unique, got row 3 more than once"),
        (lambda: ts.Streaming(indices=[0, -1]), r"Streaming: indices must be >= 0, got indices\[1\] = -1"),
        (lambda: ts.Streaming(indices=[]), "Streaming: indices must not be empty"),
        (lambda: ts.Streaming(indices=[[1, 2]]), r"Streaming: indices must be 1-D, got shape \(1, 2\)"),
        (lambda: ts.Streaming(indices=[0.5, 1.0]), "Streaming: indices must contain integers, got dtype float64"),
        (lambda: ts.BlockWeightedSampling([1.0, -0.5]), r"weights must be finite and >= 0, got weights\[1\] = -0.5"),
        (lambda: ts.BlockWeightedSampling([1.0, math.nan]), r"weights must be finite and >= 0, got weights\[1\] = nan"),
        (lambda: ts.BlockWeightedSampling([math.inf]), r"weights must be finite and >= 0, got weights\[0\] = inf"),
        (lambda: ts.BlockWeightedSampling([0.0, 0.0]), "BlockWeightedSampling: weights must not all be zero"),
        (lambda: ts.BlockWeightedSampling([]), "BlockWeightedSampling: weights must not be empty"),
        (lambda: ts.BlockWeightedSampling(["a"]), "weights must contain numbers"),
        (lambda: ts.BlockWeightedSampling([1.0], total_size=0), "total_size must be >= 1, got 0"),
        (lambda: ts.BlockWeightedSampling([1.0], block_size=0), "block_size must be >= 1, got 0"),
        (lambda: ts.ClassBalancedSampling([]), "ClassBalancedSampling: labels must not be empty"),
        (lambda: ts.ClassBalancedSampling([1, 2], total_size=-1), "ClassBalancedSampling: total_size must be >= 1"),
        (lambda: ts.ClassBalancedSampling([1.0, math.nan]), "labels must not contain NaN"),
    ],
)
def test_strategy_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "strategy,message",
    [
        (
            ts.Streaming(indices=[0, 25]),
            r"Streaming: indices must be < the number of rows \(20\), got indices\[1\] = 25",
        ),
        (ts.BlockWeightedSampling([1.0] * 7), r"weights must have one entry per row \(20\), got 7"),
        (
            ts.BlockWeightedSampling([1.0] * 7, indices=[1, 2]),
            r"one entry per row \(20\) or one per entry of indices \(2\), got 7",
        ),
        (
            ts.BlockWeightedSampling([1.0] + [0.0] * 19, total_size=5, replacement=False),
            r"total_size \(5\) must not exceed the number of rows with positive weight \(1\)",
        ),
        (
            ts.BlockWeightedSampling([0.0] * 19 + [1.0], indices=[0, 1]),
            "the weights of the sampled rows must not all be zero",
        ),
        (
            ts.ClassBalancedSampling([1, 2, 3]),
            r"ClassBalancedSampling: labels must have one entry per row \(20\), got 3",
        ),
    ],
)
def test_strategy_against_source(strategy, message):
    with pytest.raises(ValueError, match=message):
        dataset(strategy=strategy)


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda: ts.TensorSource(torch.zeros(0, 3)), ValueError, "the tensors have no rows"),
        (lambda: ts.TensorSource({}), ValueError, "needs at least one tensor"),
        (lambda: ts.TensorSource(torch.tensor(1.0)), ValueError, "must have at least one dimension"),
        (
            lambda: ts.TensorSource({"a": torch.zeros(3), "b": torch.zeros(4)}),
            ValueError,
            "field 'b' has 4 but the first field has 3",
        ),
        (lambda: ts.TensorSource({"index": torch.zeros(3)}), ValueError, "'index' is reserved"),
        (lambda: ts.TensorSource({"a": [1, 2]}), TypeError, "field 'a' must be a tensor"),
        (lambda: ts.TensorSource(torch.zeros(3, 3).to_sparse()), ValueError, "must be a dense"),
        (lambda: ts.TensorSource("x"), TypeError, "expected a tensor or a dict of tensors"),
    ],
)
def test_source_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_bad_environment_rank_is_named(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="environment variable RANK must be an integer, got 'zero'"):
        dataset()
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 5"):
        dataset()


def test_source_read_rejects_out_of_range_rows():
    with pytest.raises(ValueError, match=r"row 20 out of range \[0, 20\)"):
        SOURCE.read([3, 20])
