"""torchrun-style DDP end to end: real gloo ranks (spawned processes), real
DataLoader workers, a DDP training step per batch. Every test has a timeout:
unequal step counts would hang DDP's all-reduce and fail the test instead."""

import collections

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import global_batches, multiset
from distributed_run import run_ranks

import torch_shards as ts

ROWS, GENES = 103, 12  # divisible by neither the batch, the fetch nor any world size


def strategies():
    weights = np.arange(ROWS) % 4 + 0.5
    labels = np.arange(ROWS) % 3
    return {
        "Streaming": ts.Streaming(),
        "StreamingShuffle": ts.Streaming(shuffle=True),
        "BlockShuffling": ts.BlockShuffling(4),
        "BlockWeightedSampling": ts.BlockWeightedSampling(weights, total_size=150, block_size=4),
        "ClassBalancedSampling": ts.ClassBalancedSampling(labels, block_size=2),
    }


@pytest.fixture(scope="module")
def h5ad(tmp_path_factory):
    path = tmp_path_factory.mktemp("ddp") / "cells.h5ad"
    x = sp.random(ROWS, GENES, density=0.3, format="csr", dtype=np.float32, random_state=0)
    ad.AnnData(x).write_h5ad(path)
    return str(path)


def _train_every_strategy(rank, world_size, path, num_workers):
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    results = {}
    for name, strategy in strategies().items():
        dataset = ts.ShardedDataset(ts.AnnDataSource(path, dense=True), strategy, batch_size=8, fetch_factor=2)
        loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
        model = DistributedDataParallel(torch.nn.Linear(GENES, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = []
        for batch in loader:
            loss = model(batch["X"]).square().mean()
            optimizer.zero_grad()
            loss.backward()  # all-reduces: every rank must step the same number of times
            optimizer.step()
            batches.append(batch["index"].tolist())
        results[name] = {"seed": dataset.seed, "len": len(dataset), "batches": batches}
    return results


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ddp_ranks_read_disjoint_shares_and_step_equally(h5ad, world_size, num_workers):
    results = run_ranks(_train_every_strategy, world_size, h5ad, num_workers, timeout=240)
    assert all(status == "ok" for status, _ in results), [value for status, value in results if status != "ok"]
    per_rank = [value for _, value in results]
    for name, strategy in strategies().items():
        seeds = {rank[name]["seed"] for rank in per_rank}
        assert len(seeds) == 1, f"{name}: seed=None gave ranks different seeds {seeds}"
        steps = [len(rank[name]["batches"]) for rank in per_rank]
        assert len(set(steps)) == 1, f"{name}: ranks stepped {steps} times"
        assert all(rank[name]["len"] == len(rank[name]["batches"]) for rank in per_rank)
        # The union over ranks is the epoch's global batches, padding aside.
        reference = ts.ShardedDataset(
            ts.AnnDataSource(h5ad),
            strategy,
            batch_size=8,
            fetch_factor=2,
            seed=seeds.pop(),
            rank=0,
            world_size=world_size,
        )
        wanted = multiset(global_batches(reference, 0))
        delivered = multiset(batch for rank in per_rank for batch in rank[name]["batches"])
        assert not wanted - delivered, f"{name}: a global batch was never delivered"
        extra = delivered - wanted
        assert set(extra) <= set(wanted) and sum(extra.values()) < world_size
        if name in ("Streaming", "StreamingShuffle", "BlockShuffling"):
            rows = collections.Counter(row for rank in per_rank for batch in rank[name]["batches"] for row in batch)
            assert set(rows) == set(range(ROWS)), f"{name}: rows missing"
            # Ranks' shares are disjoint but for the padding: fewer repeats than one batch per rank.
            shares = [{row for batch in rank[name]["batches"] for row in batch} for rank in per_rank]
            repeats = sum(len(share) for share in shares) - len(set().union(*shares))
            assert repeats < world_size * 8, f"{name}: {repeats} rows on several ranks, more than padding"


def _build_with_rank_specific_data(rank, world_size, paths):
    try:
        ts.ShardedDataset(ts.AnnDataSource(paths[rank]), ts.BlockShuffling(4), batch_size=8)
    except ValueError as error:
        return str(error)
    return "no error"


def test_ranks_reading_different_data_all_fail_naming_the_difference(tmp_path):
    paths = []
    for rank, rows in enumerate([50, 50, 49]):
        path = tmp_path / f"part{rank}.h5ad"
        ad.AnnData(np.zeros((rows, 3), np.float32)).write_h5ad(path)
        paths.append(str(path))
    results = run_ranks(_build_with_rank_specific_data, 3, paths, timeout=120)
    messages = [value for _, value in results]
    assert all("ranks disagree about what they read" in m for m in messages), messages
    assert all("rank 1 differs from rank 0 in 'source'" in m for m in messages), messages  # same rows, other file
    assert len(set(messages)) == 1, "every rank reports the same first difference"


def _build_with_rank_specific_arguments(rank, world_size):
    source = ts.TensorSource(torch.zeros(40, 2))
    try:
        ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=8 if rank == 0 else 4, seed=1)
    except ValueError as error:
        return str(error)
    return "no error"


def test_ranks_passing_different_arguments_fail_on_every_rank():
    results = run_ranks(_build_with_rank_specific_arguments, 2, timeout=120)
    for _, message in results:
        assert "rank 1 differs from rank 0 in 'batch_size': rank 0 has 8, rank 1 has 4" in message, message


def _sampler_lengths_differ(rank, world_size):
    try:
        ts.DistributedSampler(range(10 + rank), seed=0)
    except ValueError as error:
        return str(error)
    return "no error"


def test_distributed_samplers_over_different_lengths_fail_clearly():
    for _, message in run_ranks(_sampler_lengths_differ, 2, timeout=120):
        assert "DistributedSampler: ranks disagree" in message and "'rows': rank 0 has 10, rank 1 has 11" in message


def _subgroups(rank, world_size):
    import torch.distributed as dist

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[rank // 2]
    source = ts.TensorSource(torch.arange(30))
    try:  # a group that is part of the job needs one seed for every group: peers read the same rank
        ts.ShardedDataset(source, ts.BlockShuffling(3), batch_size=4, process_group=group)
        refusal = None
    except ValueError as error:
        refusal = str(error)
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(3), batch_size=4, process_group=group, seed=11)
    rows = sorted(r for b in dataset for r in b["index"].tolist())
    return dataset.rank, dataset.world_size, refusal, rows


def test_process_group_argument_scopes_ranks_and_checks_and_needs_one_seed():
    results = [value for _, value in run_ranks(_subgroups, 4, timeout=120)]
    assert [(r, w) for r, w, _, _ in results] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    for _, _, refusal, _ in results:
        assert refusal is not None and "process_group" in refusal and "Pass seed=" in refusal
    assert results[0][3] == results[2][3] and results[1][3] == results[3][3]  # peers of the two groups agree
    for pair in (results[:2], results[2:]):
        rows = sorted(pair[0][3] + pair[1][3])
        assert set(rows) == set(range(30)) and len(rows) - 30 < 2 * 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")
def test_nccl_world_size_one(h5ad):
    import torch.distributed as dist
    from distributed_run import free_port

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        dataset = ts.ShardedDataset(ts.AnnDataSource(h5ad, dense=True), ts.BlockShuffling(4), batch_size=8)
        rows = sorted(r for b in dataset for r in b["index"].tolist())
        assert rows == list(range(ROWS)) and dataset.world_size == 1
    finally:
        dist.destroy_process_group()
