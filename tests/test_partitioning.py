"""The distribution contract: every global batch delivered exactly once across
ranks and DataLoader workers, equal batch counts per rank, exact len()."""

import collections
import itertools

import pytest
import torch
from conftest import (
    STRATEGIES,
    global_batches,
    make_strategy,
    multiset,
    read_rank,
    read_rank_by_workers,
    rows_source,
)

import torch_shards as ts

SIZES = [1, 5, 37, 101]
BATCH_SIZES = [1, 4, 7]
FETCH_FACTORS = [1, 3]
WORLD_SIZES = [1, 2, 3, 4, 5]
NUM_WORKERS = [0, 1, 2, 3]


def build(num_rows, strategy, rank, world_size, **kwargs):
    return ts.ShardedDataset(rows_source(num_rows), strategy, rank=rank, world_size=world_size, seed=1234, **kwargs)


def build_ranks(num_rows, strategy_name, world_size, **kwargs):
    """Every rank's dataset over the same rows and strategy."""
    strategy = make_strategy(strategy_name, num_rows)
    return [build(num_rows, strategy, rank, world_size, **kwargs) for rank in range(world_size)]


def check_epoch(per_rank, dataset_ranks, epoch, even_batches, world_size):
    """per_rank[r]: batches rank r delivered. Checks the whole contract."""
    reference = dataset_ranks[0]
    expected = global_batches(reference, epoch)
    delivered = multiset(itertools.chain.from_iterable(per_rank))
    wanted = multiset(expected)
    for rank, (batches, dataset) in enumerate(zip(per_rank, dataset_ranks)):
        assert len(batches) == len(dataset), f"rank {rank}: len() {len(dataset)} != yielded {len(batches)}"
    counts = [len(batches) for batches in per_rank]
    if even_batches is None:
        assert delivered == wanted
        assert max(counts) - min(counts) <= 1
    elif even_batches == "pad":
        assert len(set(counts)) == 1, f"ranks step unequally: {counts}"
        assert not wanted - delivered, "a global batch was never delivered"
        extra = delivered - wanted
        assert set(extra) <= set(wanted) and sum(extra.values()) < world_size
    else:  # drop
        assert len(set(counts)) == 1, f"ranks step unequally: {counts}"
        assert not delivered - wanted, "a batch was delivered more often than planned"
        assert sum((wanted - delivered).values()) < world_size
    return delivered


@pytest.mark.parametrize("even_batches", ["pad", "drop", None])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_every_global_batch_once_across_ranks_and_workers(strategy_name, drop_last, even_batches):
    for num_rows, batch_size, fetch_factor in itertools.product(SIZES, BATCH_SIZES, FETCH_FACTORS):
        strategy = make_strategy(strategy_name, num_rows)
        reference = None
        for world_size, num_workers in itertools.product(WORLD_SIZES, NUM_WORKERS):
            ranks = [
                build(
                    num_rows,
                    strategy,
                    rank,
                    world_size,
                    batch_size=batch_size,
                    fetch_factor=fetch_factor,
                    drop_last=drop_last,
                    even_batches=even_batches,
                )
                for rank in range(world_size)
            ]
            per_rank = [read_rank_by_workers(dataset, num_workers, epoch=2) for dataset in ranks]
            for dataset in ranks:
                workers = max(num_workers, 1)
                by_worker = sum(dataset.native.worker_batches(w, workers) for w in range(workers))
                assert by_worker == len(dataset)
            delivered = check_epoch(per_rank, ranks, 2, even_batches, world_size)
            if even_batches is None:
                # Topology only decides who delivers: same global batches for every W and K.
                if reference is None:
                    reference = delivered
                assert delivered == reference, (num_rows, batch_size, fetch_factor, world_size, num_workers)


def dealt_batches(dataset, epoch, world_size, num_workers):
    """DESIGN.md's dealing, computed here: [rank][worker] -> that worker's batches in order (even_batches=None)."""
    fetch_size = dataset.batch_size * dataset.fetch_factor
    fetches = [
        dataset.native.fetch_rows(epoch, f).tolist()
        for f in range((dataset.native.plan_size() + fetch_size - 1) // fetch_size)
    ]
    units = [[] for _ in range(world_size)]  # per rank: units, each a list of batches
    whole = 0
    while whole + world_size <= len(fetches) and all(len(f) == fetch_size for f in fetches[whole : whole + world_size]):
        for rank in range(world_size):
            fetch = fetches[whole + rank]
            units[rank].append([fetch[b : b + dataset.batch_size] for b in range(0, fetch_size, dataset.batch_size)])
        whole += world_size
    tail = [f[b : b + dataset.batch_size] for f in fetches[whole:] for b in range(0, len(f), dataset.batch_size)]
    for k, batch in enumerate(tail):
        units[k % world_size].append([batch])
    return [
        [[batch for unit in units[rank][worker::num_workers] for batch in unit] for worker in range(num_workers)]
        for rank in range(world_size)
    ]


@pytest.mark.parametrize("strategy_name", ["Streaming", "BlockShuffling"])
def test_each_worker_delivers_its_dealt_batches_in_dealing_order(strategy_name):
    """Tail batches are dealt one at a time; the reader reads a worker's tail batches of one fetch together
    (one unit): the batches, and their order, stay those of the dealing."""
    for num_rows, batch_size, fetch_factor in itertools.product([37, 101, 250], [1, 4, 7], [3, 8]):
        for world_size, num_workers in itertools.product([1, 2, 3], [1, 2, 3]):
            ranks = build_ranks(
                num_rows,
                strategy_name,
                world_size,
                batch_size=batch_size,
                fetch_factor=fetch_factor,
                even_batches=None,
                num_threads=2,
            )
            want = dealt_batches(ranks[0], 1, world_size, num_workers)
            for rank, dataset in enumerate(ranks):
                for worker in range(num_workers):
                    iterator = dataset.native.iter_epoch(1, worker, num_workers)
                    got = [batch["index"].tolist() for batch in iter(iterator.next, None)]
                    assert got == want[rank][worker], (num_rows, batch_size, fetch_factor, world_size, rank, worker)


@pytest.mark.parametrize("strategy_name", ["Streaming", "StreamingShuffle", "BlockShuffling"])
@pytest.mark.parametrize("num_rows", [1, 9, 64, 250])
def test_unweighted_plans_visit_every_row_exactly_once(strategy_name, num_rows):
    for batch_size, fetch_factor, world_size in itertools.product([1, 4, 16], [1, 3, 16], [1, 3, 4]):
        ranks = build_ranks(
            num_rows, strategy_name, world_size, batch_size=batch_size, fetch_factor=fetch_factor, even_batches=None
        )
        rows = [row for dataset in ranks for batch in read_rank_by_workers(dataset, 2, 0) for row in batch]
        assert sorted(rows) == list(range(num_rows))


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_global_batches_concatenate_to_the_plan(strategy_name):
    for num_rows, batch_size, fetch_factor in itertools.product([3, 37, 200], [1, 4, 7], [1, 3]):
        strategy = make_strategy(strategy_name, num_rows)
        dataset = build(num_rows, strategy, 0, 1, batch_size=batch_size, fetch_factor=fetch_factor)
        plan = strategy.plan(num_rows, seed=1234, epoch=5).tolist()
        rows = [row for batch in global_batches(dataset, 5) for row in batch]
        assert collections.Counter(rows) == collections.Counter(plan)
        # Fetches are consecutive plan slices.
        fetch_size = batch_size * fetch_factor
        for fetch in range((len(plan) + fetch_size - 1) // fetch_size):
            got = dataset.native.fetch_rows(5, fetch).tolist()
            assert sorted(got) == sorted(plan[fetch * fetch_size : (fetch + 1) * fetch_size])


def test_streaming_without_shuffle_keeps_row_order():
    dataset = build(50, ts.Streaming(), 0, 1, batch_size=4, fetch_factor=2)
    rows = [row for batch in dataset for row in batch["index"].tolist()]
    assert rows == list(range(50))


def test_streaming_subset_keeps_ascending_order_and_only_subset_rows():
    subset = [40, 3, 17, 8, 25]
    dataset = build(50, ts.Streaming(indices=subset), 0, 1, batch_size=2, fetch_factor=1)
    rows = [row for batch in dataset for row in batch["index"].tolist()]
    assert rows == sorted(subset)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_subset_restricts_every_strategy(strategy_name):
    subset = list(range(3, 90, 4))
    maker = {
        "Streaming": lambda: ts.Streaming(indices=subset),
        "StreamingShuffle": lambda: ts.Streaming(shuffle=True, indices=subset),
        "BlockShuffling": lambda: ts.BlockShuffling(2, indices=subset),
        "BlockWeightedSampling": lambda: ts.BlockWeightedSampling(torch.ones(100), 500, 2, indices=subset),
        "ClassBalancedSampling": lambda: ts.ClassBalancedSampling(torch.arange(100) % 2, 500, 2, indices=subset),
    }[strategy_name]
    dataset = build(100, maker(), 0, 1, batch_size=8)
    rows = [row for batch in dataset for row in batch["index"].tolist()]
    assert set(rows) <= set(subset)
    if strategy_name in ("Streaming", "StreamingShuffle", "BlockShuffling"):
        assert sorted(rows) == subset


def test_batches_carry_the_rows_they_name():
    source = ts.TensorSource({"X": torch.arange(300).reshape(100, 3), "y": torch.arange(100) * 2})
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=8, seed=5)
    for batch in dataset:
        index = batch["index"]
        assert batch["index"].dtype == torch.int64
        assert torch.equal(batch["X"], torch.arange(300).reshape(100, 3)[index])
        assert torch.equal(batch["y"], index * 2)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize("even_batches", ["pad", None])
def test_real_dataloader_workers_deliver_each_batch_once(strategy_name, even_batches):
    for num_rows, world_size, num_workers in itertools.product([37, 101], [1, 2, 3], NUM_WORKERS):
        ranks = [
            build(
                num_rows,
                make_strategy(strategy_name, num_rows),
                rank,
                world_size,
                batch_size=4,
                fetch_factor=3,
                even_batches=even_batches,
            )
            for rank in range(world_size)
        ]
        per_rank = [read_rank(dataset, num_workers, multiprocessing_context="fork") for dataset in ranks]
        # Each rank's first iteration is epoch 0.
        check_epoch(per_rank, ranks, 0, even_batches, world_size)


def test_real_spawn_workers_deliver_each_batch_once():
    ranks = [build(83, ts.BlockShuffling(3), rank, 2, batch_size=4, fetch_factor=2) for rank in range(2)]
    per_rank = [read_rank(dataset, 2, multiprocessing_context="spawn") for dataset in ranks]
    check_epoch(per_rank, ranks, 0, "pad", 2)


def test_padding_waste_is_at_most_world_size_minus_one_batches():
    for num_rows in range(1, 60):
        for world_size in range(1, 6):
            ranks = [
                build(num_rows, ts.Streaming(), r, world_size, batch_size=3, fetch_factor=2) for r in range(world_size)
            ]
            total = sum(len(dataset) for dataset in ranks)
            assert total - ranks[0].native.num_global_batches() < world_size


def test_drop_last_drops_only_the_short_batch():
    dataset = build(50, ts.Streaming(), 0, 1, batch_size=8, drop_last=True)
    batches = [batch["index"].tolist() for batch in dataset]
    assert len(batches) == len(dataset) == 6
    assert all(len(batch) == 8 for batch in batches)
    assert [row for batch in batches for row in batch] == list(range(48))


def test_fewer_rows_than_ranks_still_gives_every_rank_a_batch_with_padding():
    ranks = [build(2, ts.Streaming(), r, 5, batch_size=1) for r in range(5)]
    per_rank = [[batch["index"].tolist() for batch in dataset] for dataset in ranks]
    assert [len(batches) for batches in per_rank] == [1] * 5
    delivered = sorted(row for batches in per_rank for batch in batches for row in batch)
    assert set(delivered) == {0, 1}


def test_len_matches_yield_for_rank_in_env(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dataset = ts.ShardedDataset(rows_source(40), ts.Streaming(), batch_size=4, seed=0)
    assert (dataset.rank, dataset.world_size) == (1, 3)
    assert len(list(dataset)) == len(dataset)


def test_a_dict_of_tensors_is_accepted_as_source():
    dataset = ts.ShardedDataset({"a": torch.zeros(10, 2), "b": torch.ones(10)}, ts.Streaming(), batch_size=5, seed=0)
    batch = next(iter(dataset))
    assert set(batch) == {"a", "b", "index"}


def test_transforms_apply_per_fetch_and_per_batch():
    seen = []

    def fetch_transform(unit):
        seen.append(unit["index"].shape[0])
        return {**unit, "X2": unit["X"] * 2}

    dataset = ts.ShardedDataset(
        rows_source(30),
        ts.Streaming(),
        batch_size=4,
        fetch_factor=3,
        seed=0,
        fetch_transform=fetch_transform,
        batch_transform=lambda b: {**b, "n": torch.tensor(len(b["index"]))},
    )
    batches = list(dataset)
    assert seen == [12, 12, 6]  # two whole fetches, then the tail batches of the last one, read together
    assert all(torch.equal(b["X2"], b["index"] * 20) for b in batches)
    assert [int(b["n"]) for b in batches] == [4] * 7 + [2]


def test_batches_are_tensors_of_the_source_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.bool, torch.float64):
        source = ts.TensorSource(torch.zeros(10, 3, dtype=dtype))
        batch = next(iter(ts.ShardedDataset(source, ts.Streaming(), batch_size=4, seed=0)))
        assert batch["X"].dtype == dtype and batch["X"].shape == (4, 3)
