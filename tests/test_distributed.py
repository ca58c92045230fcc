"""Real multi-process torch.distributed runs (gloo on CPU)."""

import torch
from distributed_run import run_ranks

import torch_shards as ts


def _seed_and_batches(rank, world_size):
    dataset = ts.ShardedDataset(
        ts.TensorSource(torch.arange(97)), ts.BlockShuffling(4), batch_size=5, fetch_factor=2, seed=None
    )
    assert (dataset.rank, dataset.world_size) == (rank, world_size)
    return dataset.seed, [batch["index"].tolist() for batch in dataset]


def test_seed_none_is_rank_zeros_seed_on_every_rank():
    results = run_ranks(_seed_and_batches, 3)
    assert all(status == "ok" for status, _ in results), results
    seeds = {value[0] for _, value in results}
    assert len(seeds) == 1
    rows = sorted(row for _, (_, batches) in results for batch in batches for row in batch)
    counts = {len(batches) for _, (_, batches) in results}
    assert len(counts) == 1  # every rank steps equally often
    assert set(rows) == set(range(97)) and len(rows) - 97 < 3 * 5  # padding waste below W batches
