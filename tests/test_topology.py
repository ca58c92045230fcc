"""Who reads what, checked over the process group with real gloo processes:
the order torchrun scripts call things in (dataset before or after
init_process_group), explicit ranks that contradict the group, replicas and
tensor-parallel pairs."""

import collections

import pytest
from conftest import rows_source
from distributed_run import init_group, run_ranks
from torch.utils.data import DataLoader

import torch_shards as ts

ROWS = 1000

pytestmark = pytest.mark.timeout(300)


def shuffled(**kwargs):
    return ts.ShardedDataset(rows_source(ROWS), ts.BlockShuffling(8), batch_size=10, **kwargs)


def rows_of(batches):
    return [row for batch in batches for row in batch["index"].tolist()]


def rows_or_refusal(dataset, num_workers):
    """The rows a DataLoader yields, or the ValueError's message. After a
    worker raised in __iter__, torch's DataLoader terminates its idle workers
    at shutdown (after a 5 s join; a plain IterableDataset that raises does
    the same), and its SIGCHLD handler may then raise "killed by signal:
    Terminated" at any later point of the process: the workers are
    unregistered from that handler before the shutdown."""
    from torch.utils.data._utils import signal_handling

    iterator = None
    try:
        iterator = iter(DataLoader(dataset, batch_size=None, num_workers=num_workers))  # in-process: starts here
        return rows_of(iterator)
    except ValueError as error:
        return str(error)
    finally:
        if num_workers and iterator is not None:
            signal_handling._remove_worker_pids(id(iterator))
            signal_handling._set_worker_pids(id(iterator), ())  # still registered, with no pid to watch
            iterator._shutdown_workers()


def _built_before_init_then_iterated(rank, world_size):
    dataset = shuffled()  # RANK / WORLD_SIZE from torchrun's environment, no group yet, seed=None
    init_group()
    return rows_of(dataset), dataset.seed


def test_torchrun_order_dataset_before_init_agrees_at_the_first_iteration():
    results = run_ranks(_built_before_init_then_iterated, 2, init=False)
    assert [status for status, _ in results] == ["ok", "ok"], results
    (rows0, seed0), (rows1, seed1) = (value for _, value in results)
    assert seed0 == seed1
    counts = collections.Counter(rows0 + rows1)
    assert set(counts) == set(range(ROWS)) and max(counts.values()) == 1


def _built_after_init(rank, world_size):
    init_group()
    dataset = shuffled()
    return rows_of(dataset)


def test_torchrun_order_dataset_after_init():
    results = run_ranks(_built_after_init, 2, init=False)
    assert [status for status, _ in results] == ["ok", "ok"], results
    assert sorted(results[0][1] + results[1][1]) == list(range(ROWS))


def _no_group_at_all(rank, world_size, num_workers):
    result = rows_or_refusal(shuffled(), num_workers)
    return result if isinstance(result, str) else "iterated"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_without_a_group_and_without_a_seed_are_refused(num_workers):
    results = run_ranks(_no_group_at_all, 2, num_workers, init=False)
    for status, message in results:
        assert status == "ok"
        assert "have not agreed on a seed" in message and "pass the same seed=" in message, message


def _no_group_with_a_seed(rank, world_size):
    return rows_of(shuffled(seed=5))


def test_ranks_without_a_group_but_with_one_seed_read_exactly_once():
    results = run_ranks(_no_group_with_a_seed, 2, init=False)
    assert sorted(results[0][1] + results[1][1]) == list(range(ROWS))


def _built_before_init_read_by_workers(rank, world_size):
    dataset = shuffled()
    init_group()
    result = rows_or_refusal(dataset, 2)
    return result if isinstance(result, str) else "iterated"


def test_workers_cannot_agree_for_a_dataset_built_before_the_group():
    # Only the main process can talk over the group; its DataLoader workers say how to fix it.
    results = run_ranks(_built_before_init_read_by_workers, 2, init=False)
    assert all("Build the dataset after torch.distributed.init_process_group" in m for _, m in results), results


CLAIMS = {"zero": lambda rank: 0, "mod2": lambda rank: rank % 2}


def _claims(rank, world_size, claim, world):
    try:
        dataset = shuffled(rank=CLAIMS[claim](rank), world_size=world, seed=3)
    except ValueError as error:
        return "error: " + str(error)
    return rows_of(dataset)


def test_two_processes_claiming_rank_0_of_2_are_refused_on_both():
    results = run_ranks(_claims, 2, "zero", 2)
    for status, message in results:
        assert status == "ok" and message.startswith("error: "), message
        assert "do not share the 2 ranks evenly (processes per rank: rank 0: 2, rank 1: 0" in message


def test_three_processes_sharing_two_ranks_unevenly_are_refused():
    results = run_ranks(_claims, 3, "mod2", 2)
    for status, message in results:
        assert status == "ok" and "rank 0: 2, rank 1: 1" in message, message


def test_processes_disagreeing_about_world_size_are_refused():
    results = run_ranks(_claims_world, 2)
    for status, message in results:
        assert status == "ok" and "disagree about world_size" in message, message


def _claims_world(rank, world_size):
    try:
        shuffled(rank=0, world_size=1 + rank, seed=3)
    except ValueError as error:
        return str(error)
    return "built"


def test_replicas_with_world_size_1_read_identical_batches():
    results = run_ranks(_claims, 2, "zero", 1)
    assert [status for status, _ in results] == ["ok", "ok"], results
    assert results[0][1] == results[1][1] and sorted(results[0][1]) == list(range(ROWS))


def _replicas_without_seed(rank, world_size):
    dataset = shuffled(rank=0, world_size=1)  # seed=None: the group agrees on one
    return rows_of(dataset)


def test_replicas_without_a_seed_agree_on_one():
    results = run_ranks(_replicas_without_seed, 2)
    assert results[0][1] == results[1][1]


def _tensor_parallel_pairs(rank, world_size, use_group):
    import torch.distributed as dist

    data_parallel = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every process takes part in both
    if use_group:
        # The recipe: the data-parallel group of this process, and one seed for all of them.
        dataset = shuffled(process_group=data_parallel[rank % 2], seed=11)
        return rows_of(dataset), dataset.rank
    dataset = shuffled(rank=rank // 2, world_size=2, seed=None)
    return rows_of(dataset), dataset.rank


@pytest.mark.parametrize("use_group", [False, True])
def test_tensor_parallel_pairs_read_identical_rows_and_every_row_once_per_pair(use_group):
    results = run_ranks(_tensor_parallel_pairs, 4, use_group)
    assert [status for status, _ in results] == ["ok"] * 4, results
    rows = [value[0] for _, value in results]
    ranks = [value[1] for _, value in results]
    # Processes 0 and 1 (a tensor-parallel pair) are data-parallel rank 0, 2 and 3 rank 1.
    assert ranks == [0, 0, 1, 1]
    assert rows[0] == rows[1] and rows[2] == rows[3]  # a tensor-parallel pair reads the same batches
    assert sorted(rows[0] + rows[2]) == list(range(ROWS))  # the two data-parallel ranks: every row once


def _sub_group_without_seed(rank, world_size):
    import torch.distributed as dist

    data_parallel = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    try:
        shuffled(process_group=data_parallel[rank % 2])
        outcome = "built"
    except ValueError as error:
        outcome = str(error)
    # Leave together: a process gone while a peer still connects a sub-group fails the peer's connection.
    dist.barrier()
    return outcome


def test_a_data_parallel_sub_group_without_a_seed_is_refused():
    # Each sub-group could only agree on its own seed: tensor-parallel peers would read different rows.
    results = run_ranks(_sub_group_without_seed, 4)
    assert all(status == "ok" and "Pass seed=" in message for status, message in results), results


def _mismatched_data(rank, world_size):
    try:
        ts.ShardedDataset(rows_source(ROWS + rank), ts.BlockShuffling(8), batch_size=10)
    except ValueError as error:
        return str(error)
    return "built"


def test_ranks_reading_different_data_are_refused_on_every_rank():
    results = run_ranks(_mismatched_data, 2)
    for status, message in results:
        assert status == "ok" and "rank 1 differs from rank 0 in 'rows'" in message, message


def _sampler_before_init(rank, world_size):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler = ts.DistributedSampler(range(100))
    return [str(w.message) for w in caught], list(sampler)


def test_sampler_warns_when_the_environment_says_several_ranks_without_a_group():
    results = run_ranks(_sampler_before_init, 2, init=False)
    for status, (warnings_seen, _) in results:
        assert status == "ok" and any("no torch.distributed process group" in w for w in warnings_seen)
    assert sorted(results[0][1][1] + results[1][1][1]) == list(range(100))
