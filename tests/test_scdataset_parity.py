"""scDataset's test suite (scdataset 0.3.0: tests/test_scdataset.py and
tests/test_strategy.py), each behaviour checked against torch_shards, with
scDataset itself running side by side where the two should agree exactly.

The mapping and the deliberate differences are in docs/migration/scdataset.md
("Coming from scDataset"); each difference is named where a test meets it:
  D1 batches of a numpy array / tensor source are dicts of tensors with
     "index" (the source is read natively); a collection source, or
     fetch_callback / batch_callback, yields what the collection returns, as
     scDataset does;
  D2 fetch_transform on a native source takes and returns a dict of tensors;
  D3 a collection needs len() (scDataset can take the length from indices=);
  D4 ranks get equal batch counts by default (even_batches="pad"); with
     even_batches=None counts differ by at most one: the fetches that do not
     make a whole round of ranks are dealt batch by batch (scDataset deals
     whole fetches, e.g. 8, 8 and 0 batches where we deal 6, 5 and 5);
  D5 an empty source is refused (scDataset yields nothing);
  D6 ds.epoch is the last started epoch (-1 before the first), scDataset's
     _epoch the next one; the seed is ds.seed (scDataset's _base_seed);
  D7 the order inside a BlockShuffling block is kept, but rows are also
     permuted inside each fetch, as scDataset does before yielding.
"""

import warnings

import numpy as np
import pytest
import scdataset
import torch
from torch.utils.data import DataLoader

import torch_shards as ts


def rows_of(batches):
    return [row for batch in batches for row in batch["index"].tolist()]


def drain(iterator):
    """The batches of a native iterator."""
    batches = []
    while (batch := iterator.next()) is not None:
        batches.append(batch)
    return batches


def values_of(batches):
    return np.concatenate([np.asarray(batch["X"]).reshape(-1) for batch in batches])


@pytest.fixture
def sample_data():
    return np.random.default_rng(0).standard_normal((1000, 50)).astype(np.float32)


@pytest.fixture
def small_data():
    return np.arange(100).reshape(-1, 1).astype(np.float32)


# ---- construction --------------------------------------------------------------------------------


def test_construction_and_defaults(sample_data):
    ds = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64)
    assert ds.batch_size == 64 and ds.fetch_factor == 16 and ds.drop_last is False
    assert ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64, fetch_factor=8).fetch_factor == 8
    # A collection source is kept as given (scDataset's dataset.collection).
    rows = list(range(10))
    assert ts.ShardedDataset(rows, ts.Streaming(), batch_size=2).collection is rows


@pytest.mark.parametrize("batch_size", [0, -1])
def test_invalid_batch_size(sample_data, batch_size):
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=batch_size)


def test_invalid_fetch_factor(sample_data):
    with pytest.raises(ValueError, match="fetch_factor must be >= 1"):
        ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64, fetch_factor=0)


def test_invalid_strategy(sample_data):
    with pytest.raises(TypeError, match="strategy must be a torch_shards strategy"):
        ts.ShardedDataset(sample_data, "not_a_strategy", batch_size=64)
    # scDataset's own strategies are not ours: the same clear error.
    with pytest.raises(TypeError, match="strategy must be a torch_shards strategy"):
        ts.ShardedDataset(sample_data, scdataset.Streaming(), batch_size=64)


def test_custom_collection_with_fetch_callback():
    class CustomCollection:  # indexable only through its own method
        def __init__(self, data):
            self._data = data

        def __len__(self):  # D3: needed (scDataset could do without, given indices=)
            return len(self._data)

        def __getitem__(self, rows):
            raise AssertionError("fetch_callback fetches")

        def custom_fetch(self, rows):
            return self._data[rows]

    data = np.random.default_rng(1).standard_normal((100, 10))
    ds = ts.ShardedDataset(
        CustomCollection(data),
        ts.Streaming(indices=np.arange(100)),
        batch_size=10,
        fetch_callback=lambda collection, rows: collection.custom_fetch(rows),
    )
    batches = list(ds)
    assert len(batches) == 10 and batches[0].shape == (10, 10)
    np.testing.assert_array_equal(np.concatenate(batches), data)


def test_collection_without_len_is_refused():
    class NoLength:
        def __getitem__(self, rows):
            return rows

    with pytest.raises(TypeError, match="supporting len\\(\\) and indexing"):
        ts.ShardedDataset(NoLength(), ts.Streaming(), batch_size=2, fetch_callback=lambda c, rows: rows)


# ---- length --------------------------------------------------------------------------------------


def test_len(small_data):
    assert len(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=10)) == 10
    assert len(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=7)) == 15
    assert len(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=10, drop_last=True)) == 10
    assert len(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=7, drop_last=True)) == 14
    assert len(ts.ShardedDataset(small_data, ts.Streaming(indices=np.arange(50)), batch_size=10)) == 5


LEN_CONFIGS = [
    (100, 10, 1, False),
    (105, 10, 1, True),
    (1000, 64, 4, False),
    (1000, 64, 4, True),
    (500, 32, 8, False),
    (10, 10, 1, False),
    (10, 10, 1, True),
    (9, 10, 1, False),
    (9, 10, 1, True),
    (1, 10, 1, False),
    (100, 1, 1, False),
    (100, 100, 1, False),
    (33, 7, 3, False),
    (33, 7, 3, True),
]


@pytest.mark.parametrize("n, batch_size, fetch_factor, drop_last", LEN_CONFIGS)
def test_len_is_exact_and_equals_scdatasets(n, batch_size, fetch_factor, drop_last):
    data = np.arange(n, dtype=np.float32).reshape(n, 1)
    kwargs = dict(batch_size=batch_size, fetch_factor=fetch_factor, drop_last=drop_last, seed=42)
    ours = ts.ShardedDataset(data, ts.Streaming(), **kwargs)
    theirs = scdataset.scDataset(data, scdataset.Streaming(), **kwargs)
    batches = list(ours)
    assert len(ours) == len(batches) == len(theirs) == len(list(theirs))
    # Streaming: the same rows in the same batches.
    assert [b["X"].reshape(-1).tolist() for b in batches] == [b.reshape(-1).tolist() for b in theirs]


DDP_CONFIGS = [
    (1000, 64, 4, 2),
    (1000, 64, 4, 4),
    (500, 32, 8, 3),
    (100, 16, 2, 4),
    (50, 10, 1, 8),
    (20, 5, 2, 4),
    (100, 7, 3, 5),
]


@pytest.mark.parametrize("n, batch_size, fetch_factor, world_size", DDP_CONFIGS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_ddp_len_is_exact(n, batch_size, fetch_factor, world_size, drop_last):
    data = np.arange(n, dtype=np.float32).reshape(n, 1)
    kwargs = dict(batch_size=batch_size, fetch_factor=fetch_factor, drop_last=drop_last, seed=42)
    padded, exact, lengths, uneven_lengths, their_lengths = [], [], set(), [], []
    for rank in range(world_size):
        ours = ts.ShardedDataset(data, ts.Streaming(), rank=rank, world_size=world_size, **kwargs)
        batches = list(ours)
        assert len(ours) == len(batches)
        lengths.add(len(batches))
        padded += rows_of(batches)
        uneven = ts.ShardedDataset(data, ts.Streaming(), rank=rank, world_size=world_size, even_batches=None, **kwargs)
        uneven_batches = list(uneven)
        assert len(uneven) == len(uneven_batches)
        uneven_lengths.append(len(uneven))
        exact += rows_of(uneven_batches)
        theirs = scdataset.scDataset(data, scdataset.Streaming(), rank=rank, world_size=world_size, **kwargs)
        assert len(theirs) == len(list(theirs))
        their_lengths.append(len(theirs))
    assert len(lengths) == 1  # D4: equal batch counts on every rank
    # D4: the same batches in all; the epoch's tail is dealt batch by batch, so ranks differ by at most one.
    assert sum(uneven_lengths) == sum(their_lengths)
    assert max(uneven_lengths) - min(uneven_lengths) <= 1
    expected = (n // batch_size) * batch_size if drop_last else n
    assert sorted(exact) == list(range(expected))
    assert sorted(set(padded)) == list(range(expected))  # D4: padding repeats rows, never drops one


# ---- iteration -----------------------------------------------------------------------------------


def test_iteration_and_batch_shapes(sample_data):
    batches = list(ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64))
    assert len(batches) == 16 and batches[0]["X"].shape == (64, 50)  # D1: a dict of tensors
    assert batches[0]["index"].dtype == torch.int64


def test_drop_last_iteration(small_data):
    batches = list(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=7, drop_last=True))
    assert len(batches) == 14 and all(len(batch["index"]) == 7 for batch in batches)


def test_streaming_covers_all_in_order(small_data):
    batches = list(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=10, fetch_factor=1))
    assert values_of(batches).tolist() == list(range(100))


def test_multiple_iterations_have_the_same_shapes(sample_data):
    ds = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64)
    assert [b["X"].shape for b in ds] == [b["X"].shape for b in ds]


# ---- transforms and callbacks --------------------------------------------------------------------


def test_fetch_transform_on_a_native_source(small_data):
    # D2: a dict of tensors in, a dict of tensors out.
    ds = ts.ShardedDataset(
        small_data,
        ts.Streaming(),
        batch_size=10,
        fetch_factor=1,
        fetch_transform=lambda unit: {"X": unit["X"] + 100},
        batch_transform=lambda batch: {"X": batch["X"] * 10},
    )
    assert next(iter(ds))["X"].min() >= 1000


def test_fetch_and_batch_transform_on_a_collection(small_data):
    # With callbacks the collection's own objects flow through, as in scDataset.
    def fetch(collection, rows):
        return collection[rows]

    ds = ts.ShardedDataset(
        small_data,
        ts.Streaming(),
        batch_size=10,
        fetch_factor=1,
        fetch_callback=fetch,
        fetch_transform=lambda data: data + 100,
        batch_transform=lambda batch: batch * 10,
    )
    batch = next(iter(ds))
    assert isinstance(batch, np.ndarray) and batch.min() >= 1000


def test_fetch_callback_gets_sorted_rows(sample_data):
    calls = []

    def fetch(collection, rows):
        calls.append(rows)
        return -collection[rows]

    ds = ts.ShardedDataset(
        sample_data, ts.BlockShuffling(8), batch_size=64, fetch_factor=4, fetch_callback=fetch, seed=3
    )
    batches = list(ds)
    assert all(isinstance(rows, np.ndarray) and (np.diff(rows) >= 0).all() for rows in calls)
    assert sorted(np.concatenate(calls).tolist()) == list(range(1000))
    # Each batch row is the negated data row: rows are found again from the values.
    got = np.concatenate(batches)
    order = np.lexsort((-got).T[::-1])
    np.testing.assert_array_equal((-got)[order], sample_data[np.lexsort(sample_data.T[::-1])])


def test_batch_callback_gets_positions(small_data):
    def cut(fetched, positions):
        assert isinstance(positions, np.ndarray) and positions.dtype == np.int64
        return fetched[positions] * 2

    ds = ts.ShardedDataset(small_data, ts.Streaming(), batch_size=10, fetch_factor=1, batch_callback=cut)
    batch = next(iter(ds))
    assert batch[0, 0] == 0 and batch[1, 0] == 2


def test_callbacks_need_a_collection_not_a_native_source(small_data):
    with pytest.raises(ValueError, match="fetch_callback and batch_callback fetch rows from a collection"):
        ts.ShardedDataset(
            ts.TensorSource(torch.from_numpy(small_data)),
            ts.Streaming(),
            batch_size=2,
            fetch_callback=lambda c, rows: rows,
        )


def test_collection_batches_match_scdatasets_with_callbacks(sample_data):
    # With callbacks, Streaming yields exactly what scDataset yields.
    fetch = lambda collection, rows: collection[rows] * 3  # noqa: E731
    cut = lambda fetched, positions: fetched[positions] + 1  # noqa: E731
    kwargs = dict(batch_size=32, fetch_factor=4, fetch_callback=fetch, batch_callback=cut, seed=0)
    ours = list(ts.ShardedDataset(sample_data, ts.Streaming(), **kwargs))
    theirs = list(scdataset.scDataset(sample_data, scdataset.Streaming(), **kwargs))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


# ---- strategies ----------------------------------------------------------------------------------


def test_strategies_run(sample_data):
    for strategy in (ts.Streaming(), ts.BlockShuffling(block_size=8)):
        assert len(list(ts.ShardedDataset(sample_data, strategy, batch_size=64))) == 16
    weights = np.ones(len(sample_data)) / len(sample_data)
    weighted = ts.ShardedDataset(
        sample_data, ts.BlockWeightedSampling(weights=weights, block_size=8, total_size=500), batch_size=64
    )
    assert len(weighted) == len(list(weighted)) == 8
    labels = np.random.default_rng(0).choice(["A", "B", "C"], len(sample_data))
    balanced = ts.ShardedDataset(
        sample_data, ts.ClassBalancedSampling(labels=labels, total_size=200, block_size=8), batch_size=32
    )
    assert len(balanced) == len(list(balanced)) == 7


def test_multiindexable_collection():
    # scDataset's MultiIndexable as the collection: batches come back as MultiIndexable.
    features = np.random.default_rng(0).standard_normal((100, 50)).astype(np.float32)
    labels = np.arange(100) % 3
    unstructured = {"gene_names": [f"Gene_{i}" for i in range(50)]}
    multi = scdataset.MultiIndexable(features, labels, names=["X", "y"], unstructured=unstructured)
    batches = list(ts.ShardedDataset(multi, ts.BlockShuffling(4), batch_size=10, seed=1))
    assert all(isinstance(batch, scdataset.MultiIndexable) for batch in batches)
    assert batches[0]["X"].shape == (10, 50) and batches[0].unstructured == unstructured
    ys = np.concatenate([batch["y"] for batch in batches])
    xs = np.concatenate([batch["X"] for batch in batches])
    assert sorted(xs[:, 0].tolist()) == sorted(features[:, 0].tolist())
    # Each batch row's label belongs to its features.
    row_of = {value: row for row, value in enumerate(features[:, 0].tolist())}
    assert [labels[row_of[value]] for value in xs[:, 0].tolist()] == ys.tolist()


def test_dataloader(sample_data):
    ds = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64, fetch_factor=4)
    assert next(iter(DataLoader(ds, batch_size=None)))["X"].shape[0] == 64
    assert sum(len(b["index"]) for b in DataLoader(ds, batch_size=None, num_workers=0)) == 1000
    assert sorted(rows_of(DataLoader(ds, batch_size=None, num_workers=2))) == list(range(1000))


def test_dataloader_workers_with_a_collection():
    data = np.arange(500).reshape(500, 1)
    ds = ts.ShardedDataset(
        data,
        ts.Streaming(),
        batch_size=32,
        fetch_factor=2,
        rank=0,
        world_size=2,
        seed=42,
        fetch_callback=lambda collection, rows: collection[rows],
    )
    rows = np.concatenate(list(DataLoader(ds, batch_size=None, num_workers=2))).reshape(-1).tolist()
    assert len(rows) == len(set(rows)) == 256  # rank 0's fetches, none twice


# ---- edge cases ----------------------------------------------------------------------------------


def test_single_sample_and_batch_sizes(small_data):
    data = np.array([[1, 2, 3]])
    batches = list(ts.ShardedDataset(data, ts.Streaming(), batch_size=1))
    assert len(batches) == 1 and batches[0]["X"].tolist() == [[1, 2, 3]]
    assert len(list(ts.ShardedDataset(small_data, ts.Streaming(), batch_size=100))) == 1
    batches = list(ts.ShardedDataset(np.arange(10).reshape(-1, 1), ts.Streaming(), batch_size=100))
    assert len(batches) == 1 and len(batches[0]["index"]) == 10
    assert (
        len(list(ts.ShardedDataset(np.arange(50).reshape(-1, 1), ts.Streaming(), batch_size=10, fetch_factor=100))) == 5
    )


def test_list_collection():
    # A plain list: indexed by an array of rows through fetch_callback (a list takes no arrays).
    data = [[i, i + 1, i + 2] for i in range(100)]
    ds = ts.ShardedDataset(
        data, ts.Streaming(), batch_size=10, fetch_callback=lambda c, rows: np.array([c[r] for r in rows])
    )
    assert len(next(iter(ds))) == 10


def test_empty_source_is_refused():
    # D5
    with pytest.raises(ValueError, match="no rows"):
        ts.ShardedDataset(np.zeros((0, 3), dtype=np.float32), ts.Streaming(), batch_size=2)


# ---- DDP -----------------------------------------------------------------------------------------


def test_ddp_defaults_and_explicit(sample_data):
    ds = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64)
    assert (ds.rank, ds.world_size) == (0, 1)
    ds = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64, rank=1, world_size=4, seed=42)
    assert (ds.rank, ds.world_size) == (1, 4)
    single = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64)
    four = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=64, world_size=4, rank=0, seed=42)
    assert len(single) // 5 <= len(four) <= len(single)


@pytest.mark.parametrize(
    "strategy",
    [
        lambda n: ts.Streaming(),
        lambda n: ts.BlockShuffling(block_size=16),
        lambda n: ts.BlockWeightedSampling(np.ones(n), block_size=16),
        lambda n: ts.ClassBalancedSampling(np.arange(n) % 3, block_size=16),
    ],
)
def test_ddp_ranks_never_overlap(strategy):
    n = 5000
    data = np.arange(n, dtype=np.float32).reshape(n, 1)
    per_rank = []
    for rank in range(2):
        ds = ts.ShardedDataset(data, strategy(n), batch_size=64, rank=rank, world_size=2, seed=42, even_batches=None)
        per_rank.append(rows_of(list(ds)))
    assert per_rank[0] and per_rank[1]
    if not isinstance(strategy(n), (ts.BlockWeightedSampling, ts.ClassBalancedSampling)):
        assert sorted(per_rank[0] + per_rank[1]) == list(range(n))


def test_ddp_high_world_size_small_data():
    data = np.random.default_rng(0).standard_normal((100, 10))
    kwargs = dict(batch_size=64, fetch_factor=1, world_size=8, seed=42)
    # D4: every rank yields as many batches (padding repeats rows) ...
    assert {len(ts.ShardedDataset(data, ts.Streaming(), rank=r, **kwargs)) for r in range(8)} == {1}
    # ... and with even_batches=None ranks without a fetch yield none, as in scDataset.
    uneven = ts.ShardedDataset(data, ts.Streaming(), rank=2, even_batches=None, **kwargs)
    assert len(uneven) == 0 and list(uneven) == []


def test_ddp_all_data_covered_once():
    data = np.arange(1000).reshape(1000, 1)
    rows = []
    for rank in range(4):
        ds = ts.ShardedDataset(
            data, ts.Streaming(), batch_size=64, fetch_factor=2, rank=rank, world_size=4, seed=42, even_batches=None
        )
        rows += values_of(list(ds)).tolist()
    assert sorted(rows) == list(range(1000))


def test_seed_and_epochs(sample_data):
    # D6: ds.seed and ds.epoch (last started epoch) for scDataset's _base_seed and _epoch.
    ds = ts.ShardedDataset(sample_data, ts.BlockShuffling(block_size=4), batch_size=64)
    assert isinstance(ds.seed, int)
    assert ts.ShardedDataset(sample_data, ts.BlockShuffling(4), batch_size=64, seed=123).seed == 123
    seeds = {ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=32).seed for _ in range(5)}
    assert len(seeds) >= 2
    ds = ts.ShardedDataset(sample_data, ts.BlockShuffling(block_size=4), batch_size=64, seed=42)
    assert ds.epoch == -1
    first = [b["X"].clone() for b in ds]
    assert ds.epoch == 0
    second = [b["X"].clone() for b in ds]
    assert ds.epoch == 1
    assert any(not torch.equal(a, b) for a, b in zip(first, second))
    again = ts.ShardedDataset(sample_data, ts.BlockShuffling(block_size=4), batch_size=64, seed=42)
    assert all(torch.equal(a, b["X"]) for a, b in zip(first, again))


def test_worker_split_without_a_dataloader(sample_data):
    # scDataset's mocked get_worker_info: here each worker's share is asked for natively.
    ds = ts.ShardedDataset(sample_data, ts.Streaming(), batch_size=16, fetch_factor=4, seed=42)
    shares = [rows_of(drain(ds.native.iter_epoch(0, worker, 3))) for worker in range(3)]
    assert sorted(shares[0] + shares[1] + shares[2]) == list(range(1000))


# ---- scDataset's strategy tests ------------------------------------------------------------------


def test_streaming_plans():
    assert ts.Streaming().plan(1000).tolist() == list(range(1000))
    assert ts.Streaming(indices=[10, 20, 30, 40]).plan(100).tolist() == [10, 20, 30, 40]
    assert ts.Streaming(indices=[1, 2, 3]).plan_size(1000) == 3
    assert torch.equal(ts.Streaming().plan(50), ts.Streaming().plan(50))


@pytest.mark.parametrize(
    "make",
    [
        lambda indices: ts.Streaming(indices=indices),
        lambda indices: ts.BlockShuffling(indices=indices, block_size=3),
        lambda indices: ts.BlockWeightedSampling(np.ones(100), indices=indices, block_size=3, total_size=6),
        lambda indices: ts.ClassBalancedSampling(np.arange(100) % 2, indices=indices, block_size=3),
    ],
)
def test_unsorted_indices_warn_and_are_sorted(make):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = make(np.array([50, 10, 30, 20, 40, 0]))
    assert len([w for w in caught if "sorted" in str(w.message)]) == 1
    assert caught[0].category is UserWarning and caught[0].filename == __file__
    if isinstance(strategy, ts.Streaming):
        assert strategy.plan(100).tolist() == [0, 10, 20, 30, 40, 50]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make(np.array([0, 10, 20, 30, 40, 50]))
    assert not caught


def test_block_shuffling_plans():
    plan = ts.BlockShuffling(block_size=8).plan(1000, seed=42)
    assert sorted(plan.tolist()) == list(range(1000))
    blocks = ts.BlockShuffling(block_size=10).plan(100, seed=42).tolist()
    assert all(blocks[i : i + 10] == sorted(blocks[i : i + 10]) for i in range(0, 100, 10))  # D7
    custom = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert set(ts.BlockShuffling(indices=custom, block_size=5).plan(100, seed=42).tolist()) == set(custom)
    assert torch.equal(ts.BlockShuffling(8).plan(1000, seed=42), ts.BlockShuffling(8).plan(1000, seed=42))
    assert not torch.equal(ts.BlockShuffling(8).plan(1000, seed=42), ts.BlockShuffling(8).plan(1000, seed=123))
    assert ts.BlockShuffling(indices=[1, 2, 3, 4], block_size=2).plan_size(1000) == 4
    assert sorted(ts.BlockShuffling(block_size=100).plan(5, seed=42).tolist()) == list(range(5))
    assert sorted(ts.BlockShuffling(block_size=1).plan(100, seed=42).tolist()) == list(range(100))


def test_weighted_plans():
    weights = np.random.default_rng(0).random(1000)
    assert ts.BlockWeightedSampling(weights, block_size=8, total_size=500).plan_size(1000) == 500
    strategy = ts.BlockWeightedSampling(weights, block_size=8, total_size=200)
    assert torch.equal(strategy.plan(1000, seed=42), strategy.plan(1000, seed=42))
    skewed = np.r_[np.full(50, 0.99 / 50), np.full(50, 0.01 / 50)]
    plan = ts.BlockWeightedSampling(skewed, block_size=4, total_size=1000).plan(100, seed=42)
    assert (plan < 50).float().mean() > 0.8
    plan = ts.BlockWeightedSampling(np.ones(100), block_size=4, total_size=50).plan(100, seed=42)
    assert len(plan) == 50 and ((plan >= 0) & (plan < 100)).all()
    with pytest.raises(ValueError, match="weights"):
        ts.BlockWeightedSampling(np.ones(50), block_size=4, total_size=50).plan(100)
    with pytest.raises(ValueError, match="weights"):
        ts.BlockWeightedSampling(np.ones(7), indices=[0, 1, 2, 3, 4], block_size=4).plan(100)
    # scDataset's replace=False (with sampling_size rounds) -> replacement=False: distinct rows.
    plan = ts.BlockWeightedSampling(np.ones(100), block_size=4, total_size=50, replacement=False).plan(100, seed=42)
    assert len(plan) == 50 and len(set(plan.tolist())) == 50


def test_weights_of_the_whole_source_keep_their_importance_in_a_subset():
    full = np.array([1.0] * 90 + [9.0] * 10)
    subset = np.array([0, 1, 2, 3, 4, 90, 91, 92, 93, 94])
    # scDataset's test draws 1,000 rows; blocks of 4 draws make the ratio's spread too wide for its
    # bounds at any one seed, so these draw 40,000 (the expected ratio is exactly 9, then 1).
    plan = ts.BlockWeightedSampling(full, indices=subset, total_size=40000, block_size=4).plan(100, seed=42)
    assert 8 < (plan >= 90).sum() / (plan < 90).sum() < 10
    plan = ts.BlockWeightedSampling(np.ones(10), indices=subset, total_size=40000, block_size=4).plan(100, seed=42)
    assert 0.9 < (plan >= 90).sum() / (plan < 90).sum() < 1.1


def test_class_balanced_plans():
    labels = np.random.default_rng(0).choice(["A", "B", "C"], size=1000)
    assert ts.ClassBalancedSampling(labels=labels, total_size=600, block_size=8).plan_size(1000) == 600
    imbalanced = np.array(["A"] * 700 + ["B"] * 200 + ["C"] * 100)
    plan = ts.ClassBalancedSampling(labels=imbalanced, total_size=300, block_size=4).plan(1000, seed=42).numpy()
    for value in "ABC":
        assert abs((imbalanced[plan] == value).sum() - 100) < 50
    strategy = ts.ClassBalancedSampling(labels=labels, total_size=300, block_size=8)
    assert torch.equal(strategy.plan(1000, seed=42), strategy.plan(1000, seed=42))
    assert not torch.equal(strategy.plan(1000, seed=42), strategy.plan(1000, seed=123))
    subset = ts.ClassBalancedSampling(labels=labels, indices=np.arange(500), total_size=200, block_size=4)
    assert (subset.plan(1000, seed=42) < 500).all()
    binary = np.array([0] * 90 + [1] * 10)
    plan = ts.ClassBalancedSampling(labels=binary, block_size=4, total_size=100).plan(100, seed=42)
    assert (binary[plan.numpy()] == 1).mean() > 0.2
    with pytest.raises(ValueError, match="must not be empty"):
        ts.ClassBalancedSampling(labels=[], block_size=4)
    with pytest.raises(ValueError, match="labels"):
        ts.ClassBalancedSampling(labels=[0, 1, 2], indices=[0, 1, 2, 3, 4], block_size=4).plan(100)


def test_class_balancing_global_versus_subset_labels():
    full = np.array([0] * 90 + [1] * 10)
    subset = np.array([0, 1, 2, 3, 4, 90, 91, 92, 93, 94])

    def ratio(strategy):
        plan = strategy.plan(100, seed=42).numpy()
        return (full[plan] == 1).sum() / (full[plan] == 0).sum()

    # Labels of the whole source: the classes keep their global weights (scDataset's ~9; more draws
    # than its 1,000, see above).
    big = dict(total_size=40000, block_size=4)
    assert 8 < ratio(ts.ClassBalancedSampling(labels=full, indices=subset, **big)) < 10
    # Labels of the subset only: balanced within it.
    assert 0.9 < ratio(ts.ClassBalancedSampling(labels=full[subset], indices=subset, **big)) < 1.1
    assert 0.9 < ratio(ts.ClassBalancedSampling(labels=full, **big)) < 1.1
    # ... and the same with scDataset's own strategy.
    theirs = scdataset.ClassBalancedSampling(labels=full, indices=subset, total_size=1000, block_size=4)
    plan = theirs.get_indices(range(100), seed=42)
    assert 6 < (full[plan] == 1).sum() / (full[plan] == 0).sum() < 12


# ---- what the scDataset guide adds: label_key, smoothing, custom strategies ----------------------


def test_label_key_reads_an_anndata_obs_column(tmp_path):
    anndata = pytest.importorskip("anndata")
    import pandas as pd

    n = 400
    cell_type = pd.Categorical(["T"] * 300 + ["B"] * 90 + ["NK"] * 10)
    adata = anndata.AnnData(
        X=np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        obs=pd.DataFrame({"cell_type": cell_type}, index=[f"c{i}" for i in range(n)]),
    )
    path = tmp_path / "cells.h5ad"
    adata.write_h5ad(path)
    codes = np.asarray(cell_type.codes)
    for source in (ts.AnnDataSource(path, obs=["cell_type"]), adata):  # native, and scDataset's collection
        ds = ts.ShardedDataset(
            source,
            ts.ClassBalancedSampling(label_key="cell_type", total_size=3000, block_size=1),
            batch_size=100,
            seed=0,
            fetch_callback=None if isinstance(source, ts.Source) else (lambda c, rows: rows),
        )
        rows = np.concatenate([b["index"].numpy() if isinstance(b, dict) else b for b in ds])
        counts = np.bincount(codes[rows], minlength=3)
        assert (abs(counts - 1000) < 150).all(), counts
    with pytest.raises(ValueError, match="obs/nope: no such obs column"):
        list(ts.ShardedDataset(ts.AnnDataSource(path), ts.ClassBalancedSampling(label_key="nope"), batch_size=4))
    with pytest.raises(ValueError, match="label_key='cell' is not an obs column"):
        ts.ShardedDataset(
            adata, ts.ClassBalancedSampling(label_key="cell"), batch_size=4, fetch_callback=lambda c, rows: rows
        )


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5, 1.0])
def test_smoothing_moves_classes_towards_their_frequencies(smoothing):
    labels = np.array([0] * 900 + [1] * 90 + [2] * 10)
    plan = ts.ClassBalancedSampling(labels, total_size=60000, smoothing=smoothing).plan(1000, seed=1).numpy()
    observed = np.bincount(labels[plan], minlength=3) / len(plan)
    expected = (1 - smoothing) / 3 + smoothing * np.array([0.9, 0.09, 0.01])
    np.testing.assert_allclose(observed, expected, atol=0.01)


def test_smoothing_is_checked():
    with pytest.raises(ValueError, match="smoothing must be in \\[0, 1\\], got 1.5"):
        ts.ClassBalancedSampling([0, 1], smoothing=1.5)
    with pytest.raises(TypeError, match="smoothing must be a number"):
        ts.ClassBalancedSampling([0, 1], smoothing="0.1")
    with pytest.raises(ValueError, match="pass labels= or label_key=.*got neither"):
        ts.ClassBalancedSampling()
    with pytest.raises(ValueError, match="pass labels= or label_key=.*got both"):
        ts.ClassBalancedSampling([0, 1], label_key="cell_type")


def test_missing_labels_are_never_drawn():
    labels = np.array([0] * 50 + [-1] * 50)
    plan = ts.ClassBalancedSampling(labels, total_size=1000).plan(100, seed=0)
    assert (plan < 50).all()


def epoch_permutation(num_rows, seed, epoch):
    return np.random.default_rng([seed % 2**32, epoch]).permutation(num_rows)[: num_rows // 2]


def test_custom_strategy_from_a_function_is_partitioned_exactly_once():
    n = 301
    data = np.arange(n, dtype=np.float32).reshape(n, 1)
    strategy = ts.CustomStrategy(epoch_permutation)
    for epoch in range(2):
        rows = []
        for rank in range(3):
            ds = ts.ShardedDataset(
                data, strategy, batch_size=8, fetch_factor=2, rank=rank, world_size=3, seed=5, even_batches=None
            )
            ds.set_epoch(epoch)
            rows += rows_of(list(ds))
        assert sorted(rows) == sorted(epoch_permutation(n, 5, epoch).tolist())
    assert ts.CustomStrategy(epoch_permutation).plan(n, seed=5, epoch=1).tolist() == epoch_permutation(n, 5, 1).tolist()


def test_custom_strategy_with_dataloader_workers():
    n = 200
    ds = ts.ShardedDataset(
        np.arange(n, dtype=np.float32).reshape(n, 1), ts.CustomStrategy(epoch_permutation), batch_size=8, seed=7
    )
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        assert sorted(rows_of(loader)) == sorted(epoch_permutation(n, 7, epoch).tolist())


def test_custom_strategy_fixed_plan_and_sampler():
    plan = [5, 3, 3, 9, 0, 1]
    ds = ts.ShardedDataset(
        np.arange(10, dtype=np.float32).reshape(10, 1), ts.CustomStrategy(plan), batch_size=2, fetch_factor=1, seed=0
    )
    assert rows_of(list(ds)) == plan
    sampler = ts.DistributedSampler(range(10), num_replicas=2, rank=0, strategy=ts.CustomStrategy(plan))
    assert list(sampler) == plan[0::2]
    sampler = ts.DistributedSampler(
        range(301), num_replicas=1, rank=0, seed=4, strategy=ts.CustomStrategy(epoch_permutation)
    )
    assert list(sampler) == epoch_permutation(301, 4, 0).tolist()
    assert list(sampler) == epoch_permutation(301, 4, 1).tolist()


def test_custom_strategy_errors():
    calls = iter(range(100))  # a function with state of its own: not a function of its arguments
    with pytest.raises(ValueError, match="returned different rows when called twice"):
        ts.ShardedDataset(np.zeros((10, 1)), ts.CustomStrategy(lambda n, s, e: [next(calls) % n]), batch_size=2)
    with pytest.raises(ValueError, match="rows outside \\[0, 10\\)"):
        list(ts.ShardedDataset(np.zeros((10, 1)), ts.CustomStrategy(lambda n, s, e: [0, 10 + e]), batch_size=2))
    with pytest.raises(ValueError, match="the plan of epoch 1 has 3 entries, but the plans of this strategy have 2"):
        ds = ts.ShardedDataset(np.zeros((10, 1)), ts.CustomStrategy(lambda n, s, e: list(range(e + 2))), batch_size=2)
        list(ds)
        list(ds)
    with pytest.raises(ValueError, match="the plan's rows must be < the number of rows"):
        ts.ShardedDataset(np.zeros((10, 1)), ts.CustomStrategy([0, 12]), batch_size=2)
    with pytest.raises(ValueError, match="returned no rows"):
        ts.ShardedDataset(np.zeros((10, 1)), ts.CustomStrategy(lambda n, s, e: []), batch_size=2)
    with pytest.raises(ValueError, match="size= is for a plan function"):
        ts.CustomStrategy([1, 2], size=2)
