"""Strategies: plan shape, locality, and the probabilities weighted draws hit."""

import collections

import numpy as np
import pytest
import torch
from scipy import stats

import torch_shards as ts

P_VALUE_FLOOR = 1e-4  # fixed seeds: a correct sampler passes; a biased one fails by many orders


def chi_square_p(observed_counts, expected_probabilities):
    observed = np.asarray(observed_counts, dtype=np.float64)
    expected = np.asarray(expected_probabilities, dtype=np.float64) * observed.sum()
    return stats.chisquare(observed, expected).pvalue


def test_block_shuffling_is_a_permutation_of_contiguous_blocks():
    for num_rows, block_size in [(100, 8), (101, 8), (7, 8), (1, 1), (1000, 1), (999, 64)]:
        plan = ts.BlockShuffling(block_size).plan(num_rows, seed=5, epoch=2).tolist()
        assert sorted(plan) == list(range(num_rows))
        blocks = [plan[i : i + block_size] for i in range(0, num_rows, block_size)]
        # Blocks may straddle the short block; every run of the plan is made of whole blocks.
        starts = [row for row in plan if row % block_size == 0]
        rebuilt = []
        for start in starts:
            rebuilt.extend(range(start, min(start + block_size, num_rows)))
        assert rebuilt == plan, (num_rows, block_size, blocks[:3])


def test_short_final_block_takes_every_position():
    positions = collections.Counter()
    for epoch in range(400):
        plan = ts.BlockShuffling(4).plan(18, seed=1, epoch=epoch).tolist()  # blocks 0..3 full, block 4 = rows 16,17
        positions[plan.index(16) // 4] += 1
    assert set(positions) == set(range(5))


def test_block_order_is_uniform_over_positions():
    # Where block 0 lands, over many epochs: uniform over the 10 slots.
    slots = collections.Counter(
        ts.BlockShuffling(10).plan(100, seed=11, epoch=e).tolist().index(0) // 10 for e in range(5000)
    )
    assert chi_square_p([slots[i] for i in range(10)], [0.1] * 10) > P_VALUE_FLOOR


def independent_draws(draws, block_size, offset=0):
    """Draws of one group share a block; draws at the same offset in different
    groups are independent, each with the exact target marginal."""
    return draws[offset::block_size]


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_weighted_draws_match_target_probabilities(block_size):
    weights = np.array([1, 2, 3, 4, 0, 10, 0.5, 7, 7, 1, 2, 3, 9, 0, 1, 1, 5], dtype=np.float64)
    strategy = ts.BlockWeightedSampling(weights, total_size=50_000 * block_size, block_size=block_size)
    all_draws = strategy.plan(len(weights), seed=42, epoch=0).numpy()
    assert np.bincount(all_draws, minlength=len(weights))[weights == 0].sum() == 0
    draws = independent_draws(all_draws, block_size, offset=block_size - 1)
    counts = np.bincount(draws, minlength=len(weights))
    assert counts[weights == 0].sum() == 0, "a zero-weight row was drawn"
    positive = weights > 0
    p = chi_square_p(counts[positive], weights[positive] / weights.sum())
    assert p > P_VALUE_FLOOR, p


def test_weighted_blocks_keep_each_group_of_draws_local():
    weights = np.random.default_rng(0).random(1000)
    draws = ts.BlockWeightedSampling(weights, total_size=4096, block_size=16).plan(1000, 3, 0).numpy()
    for group in draws.reshape(-1, 16):
        assert len(set(group // 16)) == 1, "a group of draws left its block"


def test_biased_sampler_would_fail_the_chi_square_check():
    # The check has teeth: uniform draws tested against skewed weights fail.
    weights = np.array([1, 2, 3, 4], dtype=np.float64)
    draws = ts.BlockWeightedSampling(np.ones(4), total_size=50_000).plan(4, 1, 0).numpy()
    assert chi_square_p(np.bincount(draws, minlength=4), weights / weights.sum()) < P_VALUE_FLOOR


def test_weighted_sampling_without_replacement_draws_distinct_positive_rows():
    weights = np.arange(50, dtype=np.float64) % 5  # rows with weight 0 every 5th
    for epoch in range(5):
        plan = ts.BlockWeightedSampling(weights, total_size=30, block_size=4, replacement=False).plan(50, 9, epoch)
        rows = plan.tolist()
        assert len(rows) == 30 and len(set(rows)) == 30
        assert all(weights[r] > 0 for r in rows)


def test_without_replacement_prefers_heavy_rows():
    weights = np.array([100.0] * 5 + [1.0] * 95)
    hits = collections.Counter()
    for epoch in range(200):
        hits.update(ts.BlockWeightedSampling(weights, 10, replacement=False).plan(100, 1, epoch).tolist())
    heavy = sum(hits[r] for r in range(5)) / 200
    assert heavy > 4.5  # nearly always all five heavy rows among the ten


def test_class_balanced_draws_every_class_equally_often():
    labels = np.array([0] * 900 + [1] * 90 + [2] * 9 + [3] * 1)
    draws = ts.ClassBalancedSampling(labels, total_size=100_000, block_size=1).plan(1000, 4, 0).numpy()
    counts = np.bincount(labels[draws], minlength=4)
    assert chi_square_p(counts, [0.25] * 4) > P_VALUE_FLOOR
    with_blocks = ts.ClassBalancedSampling(labels, total_size=800_000, block_size=8).plan(1000, 4, 0).numpy()
    with_blocks = independent_draws(with_blocks, 8, offset=3)
    assert chi_square_p(np.bincount(labels[with_blocks], minlength=4), [0.25] * 4) > P_VALUE_FLOOR


def test_class_balanced_accepts_string_and_categorical_labels():
    pandas = pytest.importorskip("pandas")
    names = ["T", "B", "T", "NK", "T", "B"]
    strategy = ts.ClassBalancedSampling(names, total_size=60_000)
    assert strategy.classes == ["B", "NK", "T"]
    draws = strategy.plan(6, 0, 0).numpy()
    counts = collections.Counter(names[r] for r in draws)
    assert chi_square_p([counts["B"], counts["NK"], counts["T"]], [1 / 3] * 3) > P_VALUE_FLOOR
    categorical = ts.ClassBalancedSampling(pandas.Series(names, dtype="category"), total_size=10)
    assert categorical.classes == ["B", "NK", "T"]


def test_weights_per_subset_entry_follow_the_given_indices_order():
    indices = [9, 2, 5]
    weights = [0.0, 1.0, 0.0]  # only row 2 may be drawn
    plan = ts.BlockWeightedSampling(weights, total_size=50, indices=indices).plan(10, 0, 0)
    assert set(plan.tolist()) == {2}
    full = [0.0] * 10
    full[5] = 1.0  # one weight per row of the source
    plan = ts.BlockWeightedSampling(full, total_size=50, indices=indices).plan(10, 0, 0)
    assert set(plan.tolist()) == {5}


def test_class_frequencies_are_counted_over_the_labels_given():
    labels = np.array([0] * 90 + [1] * 10)
    subset = list(range(80, 100))  # 10 of class 0, 10 of class 1
    # Labels of the subset only: classes counted over it, balanced there.
    draws = ts.ClassBalancedSampling(labels[subset], 40_000, indices=subset).plan(100, 2, 0).numpy()
    assert set(draws.tolist()) <= set(subset)
    assert chi_square_p(np.bincount(labels[draws], minlength=2), [0.5, 0.5]) > P_VALUE_FLOOR
    # Labels of every row: a class keeps its weight in the whole dataset (1/90 vs 1/10 per row).
    draws = ts.ClassBalancedSampling(labels, 40_000, indices=subset).plan(100, 2, 0).numpy()
    assert set(draws.tolist()) <= set(subset)
    assert chi_square_p(np.bincount(labels[draws], minlength=2), [0.1, 0.9]) > P_VALUE_FLOOR


def test_default_total_size_is_the_number_of_rows_sampled_from():
    assert ts.BlockWeightedSampling(np.ones(40)).plan_size(40) == 40
    assert ts.BlockWeightedSampling(np.ones(40), indices=range(10)).plan_size(40) == 10
    assert ts.ClassBalancedSampling(np.arange(40) % 2, total_size=7).plan_size(40) == 7


def test_plan_memory_does_not_grow_with_rows_for_block_shuffling():
    # A billion-row plan: evaluating a window must not allocate O(N).
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    strategy = ts.BlockShuffling(64)
    dataset = ts.ShardedDataset(
        ts.TensorSource(torch.zeros(1)), ts.Streaming(), batch_size=1, seed=0
    )  # warm up allocations
    del dataset
    rows = strategy.native.strided(10**9, 1, 0, 0, 1, 1 << 16)
    assert rows.min() >= 0 and rows.max() < 10**9
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert (after - before) < 200_000  # KiB: far below the 8 GB an index array would need


def test_bfloat16_weights_and_labels_are_read_as_the_float32_values_they_hold():
    weights = torch.tensor([1.0, 2.0, 0.0, 3.0], dtype=torch.bfloat16)
    plan = ts.BlockWeightedSampling(weights, total_size=50).plan(4, seed=5)
    assert torch.equal(plan, ts.BlockWeightedSampling(weights.float(), total_size=50).plan(4, seed=5))
    labels = torch.tensor([0, 1, 1, 2], dtype=torch.bfloat16)
    plan = ts.ClassBalancedSampling(labels, total_size=50).plan(4, seed=5)
    assert torch.equal(plan, ts.ClassBalancedSampling(labels.float(), total_size=50).plan(4, seed=5))


def test_plan_takes_the_seeds_and_epochs_a_dataset_and_sampler_take():
    # Unsigned 64-bit seeds wrap around, as the dataset's and sampler's do; epochs stop at 2**62 as theirs.
    strategy = ts.BlockShuffling(2)
    sampler = ts.DistributedSampler(range(10), num_replicas=1, rank=0, seed=2**64 - 1, strategy=strategy)
    assert strategy.plan(10, seed=2**64 - 1).tolist() == list(sampler) == strategy.plan(10, seed=-1).tolist()
    with pytest.raises(ValueError, match="seed must fit in 64 bits, got 18446744073709551616"):
        strategy.plan(10, seed=2**64)
    with pytest.raises(TypeError, match="seed must be an int, got None"):
        strategy.plan(10, seed=None)
    with pytest.raises(ValueError, match=r"epoch must be in \[0, 2\*\*62\], got 4611686018427387905"):
        strategy.plan(10, epoch=2**62 + 1)
    assert len(strategy.plan(10, epoch=2**62)) == 10
