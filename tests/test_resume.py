"""Mid-epoch checkpoints and elastic resume: whatever the strategy, the stop
point and the topologies before and after, consumed plus resumed batches are
the uninterrupted epoch's global batches exactly once (padding aside), later
epochs are the uninterrupted run's, and resuming reads no consumed row.

Ranks and DataLoader workers are emulated here with the native objects a real
run uses (one dataset per rank, one copy per worker, batches taken in
DataLoader's order); real workers, StatefulDataLoader, gloo ranks and
TorchScript follow below."""

import collections
import copy
import itertools
import random

import pytest
import torch
from conftest import STRATEGIES, make_strategy, rows_source
from torch.utils.data import DataLoader

import torch_shards as ts

ROWS = 61  # a short last batch, fetch and rank share at every batch size below


def make(strategy_name, world_size=1, rank=0, rows=ROWS, block_size=3, **kwargs):
    arguments = dict(batch_size=4, fetch_factor=3, seed=7, prefetch=0, num_threads=1)
    arguments.update(kwargs)
    return ts.ShardedDataset(
        rows_source(rows), make_strategy(strategy_name, rows, block_size), rank=rank, world_size=world_size, **arguments
    )


class Rank:
    """One rank of an emulated job: its dataset and, per epoch, its workers'
    iterators read in DataLoader's order (one batch from each in turn)."""

    def __init__(self, dataset, num_workers):
        self.dataset = dataset
        self.num_workers = num_workers
        self.copies = [copy.copy(dataset) for _ in range(num_workers)]  # a worker's copy shares the epoch state
        self.generation = 0

    def start(self):
        self.generation += 1
        if self.num_workers == 0:
            self.iterators = [self.dataset.native.iter()]
        else:
            self.iterators = [
                worker.native.iter_worker(w, self.num_workers, 1000 * self.generation, False)
                for w, worker in enumerate(self.copies)
            ]
        self.turn = 0
        self.live = list(range(len(self.iterators)))

    def next(self):
        """(rows, padding) of the next batch, or None at the end of the epoch."""
        while self.live:
            position = self.turn % len(self.live)
            iterator = self.iterators[self.live[position]]
            batch = iterator.next()
            if batch is None:
                del self.live[position]
                self.turn = position  # the next worker now sits there (a wrapped turn would skip it)
                continue
            self.turn = position + 1
            return tuple(batch["index"].tolist()), iterator.last_was_padding()
        return None

    def rows_read(self):
        return sum(dict(iterator.stats())["rows"] for iterator in self.iterators)


def job(strategy_name, world_size, num_workers, **kwargs):
    return [Rank(make(strategy_name, world_size, rank, **kwargs), num_workers) for rank in range(world_size)]


def run(ranks, steps=None):
    """Every rank takes `steps` batches (all of them if None); returns them per rank."""
    for rank in ranks:
        rank.start()
    out = []
    for rank in ranks:
        taken = []
        while steps is None or len(taken) < steps:
            batch = rank.next()
            if batch is None:
                break
            taken.append(batch)
        out.append(taken)
    return out


def real(batches):
    return collections.Counter(rows for per_rank in batches for rows, padding in per_rank if not padding)


def uninterrupted(strategy_name, epoch=0, **kwargs):
    dataset = make(strategy_name, **kwargs)
    dataset.set_epoch(epoch)
    return collections.Counter(tuple(batch["index"].tolist()) for batch in dataset)


def stop_points(batches_per_rank, batch_size, fetch_factor):
    points = {0, 1, batches_per_rank, batches_per_rank - 1, fetch_factor, fetch_factor + 1, batches_per_rank // 2}
    return sorted(point for point in points if 0 <= point <= batches_per_rank)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_every_stop_point_resumes_exactly_once_on_any_topology(strategy_name):
    checked = 0
    for world_size in range(1, 5):
        for num_workers in range(4):
            before = job(strategy_name, world_size, num_workers)
            steps = len(before[0].dataset)
            for stop in stop_points(steps, 4, 3):
                after_topologies = {(world_size, num_workers), (world_size % 4 + 1, (num_workers + 1) % 4)}
                for new_world, new_workers in sorted(after_topologies):
                    before = job(strategy_name, world_size, num_workers)
                    consumed = run(before, stop)
                    # In place the dataset counts the loop's batches; with workers the loop says how many.
                    state = before[0].dataset.state_dict(consumed_batches=stop if num_workers else None)
                    after = job(strategy_name, new_world, new_workers, seed=None)  # the state brings the seed
                    for rank in after:
                        rank.dataset.load_state_dict(state)
                    lengths = [len(rank.dataset) for rank in after]  # exact: the rest of the epoch
                    resumed = run(after)
                    context = (world_size, num_workers, stop, new_world, new_workers)
                    if stop < steps:
                        assert state["epoch"] == 0, context
                        assert real(consumed) + real(resumed) == uninterrupted(strategy_name), context
                    else:  # the whole epoch was consumed: the state points at the next one
                        assert state["epoch"] == 1 and state["segments"] == [], context
                        assert real(consumed) == uninterrupted(strategy_name), context
                        assert real(resumed) == uninterrupted(strategy_name, epoch=1), context
                    assert [len(r) for r in resumed] == lengths, context
                    assert len({len(r) for r in resumed}) == 1, context  # even_batches="pad": equal steps
                    # Resuming reads the rows it delivers, and no others.
                    assert sum(rank.rows_read() for rank in after) == sum(len(rows) for r in resumed for rows, _ in r)
                    # The next epoch is the uninterrupted run's.
                    assert real(run(after)) == uninterrupted(strategy_name, epoch=state["epoch"] + 1), context
                    checked += 1
    assert checked > 100


def test_len_is_the_rest_of_the_resumed_epoch_then_a_whole_one():
    before = job("BlockShuffling", 2, 0)
    run(before, 5)
    state = before[0].dataset.state_dict()
    after = make("BlockShuffling", world_size=3, rank=1)
    after.load_state_dict(state)
    expected = len([batch for batch in after])
    resumed = make("BlockShuffling", world_size=3, rank=1)
    resumed.load_state_dict(state)
    whole = len(make("BlockShuffling", world_size=3))
    assert len(resumed) == expected < whole
    assert [len(resumed) for _ in resumed] == [expected] * expected  # also while the resumed epoch runs
    assert len(resumed) == whole
    # A resumed epoch broken out of: the next iteration is a whole epoch, and len() says so.
    broken = make("BlockShuffling", world_size=3, rank=1)
    broken.load_state_dict(state)
    for _ in broken:
        assert len(broken) == expected
        break
    assert len(broken) == whole


def test_successive_resumes_in_one_epoch_stay_exact():
    for strategy_name in STRATEGIES:
        topologies = [(2, 2), (3, 0), (3, 1), (1, 3)]
        ranks = job(strategy_name, *topologies[0])
        delivered = []
        for step, (world_size, num_workers) in enumerate(topologies[1:]):
            part = run(ranks, 1 + step % 2)
            delivered += part
            state = ranks[0].dataset.state_dict(consumed_batches=len(part[0]))
            assert state["epoch"] == 0 and len(state["segments"]) == step + 1
            ranks = job(strategy_name, world_size, num_workers)
            for rank in ranks:
                rank.dataset.load_state_dict(state)
        delivered += run(ranks)
        assert real(delivered) == uninterrupted(strategy_name), strategy_name


@pytest.mark.parametrize("seed", range(4))
def test_random_jobs_resume_twice_on_random_topologies_exactly_once(seed):
    # Configurations the tests above fix, drawn at random (seeded): rows, batch size, fetch factor,
    # drop_last, even_batches, block size, up to 64 ranks of up to 8 workers, two interruptions at random
    # steps, each resumed on another topology.
    rng = random.Random(seed)
    for trial in range(60):
        name = rng.choice(STRATEGIES)
        arguments = dict(rows=rng.choice([1, 5, 61, 257, 1000]), block_size=rng.choice([1, 3, 8]))
        arguments.update(batch_size=rng.randint(1, 9), fetch_factor=rng.randint(1, 5), drop_last=rng.random() < 0.3)
        even_batches = arguments["even_batches"] = rng.choice(["pad", "drop", None])
        topologies = [(rng.choice([1, 2, 7, 16, 64]), rng.choice([0, 1, 3, 8])) for _ in range(3)]
        context = (trial, name, arguments, topologies)
        delivered, state = collections.Counter(), None
        for segment, (world_size, num_workers) in enumerate(topologies):
            ranks = job(name, world_size, num_workers, seed=7 if state is None else None, **arguments)
            if state is not None:
                for rank in ranks:
                    rank.dataset.load_state_dict(state)
            lengths = [len(rank.dataset) for rank in ranks]
            stop = None if segment == 2 else rng.randint(0, lengths[0])
            part = run(ranks, stop)
            steps = {len(batches) for batches in part}
            if even_batches is not None:
                assert len(set(lengths)) == 1 and steps == {lengths[0] if stop is None else stop}, context
            if stop is None:
                assert [len(batches) for batches in part] == lengths, context
            delivered += real(part)
            if stop is None:
                break
            state = ranks[0].dataset.state_dict(consumed_batches=stop if num_workers else None)
            if state["epoch"] == 1:  # the whole epoch was consumed
                break
        reference = make(name, **arguments)
        expected = collections.Counter(tuple(batch["index"].tolist()) for batch in reference)
        if even_batches == "drop":  # at most world_size - 1 batches of the epoch's end left out, none added
            assert not delivered - expected, context
            assert sum((expected - delivered).values()) <= world_size - 1, context
        else:
            assert delivered == expected, context


def test_thousands_of_restarts_in_one_epoch_keep_the_state_small():
    # Each interruption adds a segment; on one topology (in-process, or restarts that consumed nothing)
    # they merge, where they filled the region workers share and a load raised after ~1,000 restarts.
    def fresh():
        return ts.ShardedDataset(rows_source(20_000), ts.BlockShuffling(16), batch_size=2, fetch_factor=1, seed=0)

    consumed, state = [], None
    for restart in range(1500):
        dataset = fresh()
        if state is not None:
            dataset.load_state_dict(state)
        steps = restart % 3  # 0: crashed before its first step
        for step, batch in enumerate(dataset if steps else []):
            consumed.append(batch["index"])
            if step + 1 == steps:
                break
        state = dataset.state_dict()
        assert len(state["segments"]) <= 2, (restart, state["segments"])
    dataset = fresh()
    dataset.load_state_dict(state)
    rows = torch.cat(consumed + [batch["index"] for batch in dataset])
    assert sorted(rows.tolist()) == list(range(20_000))


def test_a_state_of_too_many_interruptions_is_refused_saying_why():
    dataset = ts.ShardedDataset(rows_source(20_000), ts.BlockShuffling(16), batch_size=2, fetch_factor=1, seed=0)
    state = dataset.state_dict()
    # 64 ranks each counting its own batches, on topologies alternating: nothing merges.
    per_rank = [rank % 2 for rank in range(64)]
    state["segments"] = [[64, 1 + s % 2, *per_rank] for s in range(70)]
    with pytest.raises(ValueError, match=r"does not fit .* its 70 segments \(one per interruption"):
        dataset.load_state_dict(state)


def test_ranks_not_in_lockstep_resume_from_every_ranks_state():
    ranks = job("BlockShuffling", 3, 0, even_batches=None)
    consumed = [run([rank], steps)[0] for rank, steps in zip(ranks, (1, 4, 2))]
    states = [rank.dataset.state_dict() for rank in ranks]
    after = job("BlockShuffling", 2, 2, even_batches=None)
    for rank in after:
        rank.dataset.load_state_dict(states)
    assert real(consumed) + real(run(after)) == uninterrupted("BlockShuffling", even_batches=None)


@pytest.mark.parametrize("steps", [(0, 2, 2), (0, 1, 0), (0, 0, None), (3, 0, 0), (0, 0, 0)])
@pytest.mark.parametrize("started", [True, False], ids=["started", "never-started"])
def test_ranks_that_consumed_nothing_count_in_the_merged_state(steps, started):
    # Ranks not in lockstep where some took no batch (None: one took all of its share): their states say so.
    ranks = job("BlockShuffling", 3, 0, even_batches=None)
    consumed = [run([rank], n)[0] if started or n != 0 else [] for rank, n in zip(ranks, steps)]
    states = [rank.dataset.state_dict() for rank in ranks]
    after = job("BlockShuffling", 2, 1, even_batches=None)
    for rank in after:
        rank.dataset.load_state_dict(states)
    assert real(consumed) + real(run(after)) == uninterrupted("BlockShuffling", even_batches=None)


@pytest.mark.parametrize("idle", ["never-started", "started"])
@pytest.mark.parametrize("steps", [2, None])
def test_ranks_through_workers_merge_with_a_rank_that_took_no_batch(idle, steps):
    # Rank 0 consumed batches through 2 workers (None: all of them); rank 1 took none: never started its
    # loader (its dataset knows of no workers) or started it and stopped before the first batch.
    ranks = job("BlockShuffling", 2, 2, even_batches=None)
    consumed = run([ranks[0]], steps)
    if idle == "started":
        run([ranks[1]], 0)
    states = [ranks[0].dataset.state_dict(consumed_batches=len(consumed[0])), ranks[1].dataset.state_dict(0)]
    after = job("BlockShuffling", 3, 1, even_batches=None)
    for rank in after:
        rank.dataset.load_state_dict(states)
    assert real(consumed) + real(run(after)) == uninterrupted("BlockShuffling", even_batches=None)


def test_merged_states_of_a_finished_epoch_point_at_the_next():
    # One batch in all: rank 0 took it, rank 1 had none (and never started): the epoch is over.
    ranks = job("BlockShuffling", 2, 0, even_batches=None, batch_size=64)
    consumed = run([ranks[0]])
    assert len(consumed[0]) == 1 and len(ranks[1].dataset) == 0
    states = [rank.dataset.state_dict() for rank in ranks]
    assert [state["epoch"] for state in states] == [1, 0]
    after = make("BlockShuffling", even_batches=None, batch_size=64)
    after.load_state_dict(states)
    assert len(after) == 1
    assert real([run([Rank(after, 0)])[0]]) == uninterrupted("BlockShuffling", epoch=1, batch_size=64)
    assert after.epoch == 1


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_state_taken_before_the_resumed_epoch_goes_on_keeps_its_position(world_size):
    first = job("BlockShuffling", 3, 0, even_batches=None)
    consumed = [run([rank], n)[0] for rank, n in zip(first, (3, 1, 0))]
    states = [rank.dataset.state_dict() for rank in first]
    # Resumed, then stopped again before a batch was taken: started or not at all.
    for started in (False, True):
        resumed = job("BlockShuffling", world_size, 0, even_batches=None)
        for rank in resumed:
            rank.dataset.load_state_dict(states)
            if started:
                rank.start()
        again = [rank.dataset.state_dict() for rank in resumed]
        assert all(len(state["segments"]) == 2 for state in again)
        final = job("BlockShuffling", 2, 2, even_batches=None)
        for rank in final:
            rank.dataset.load_state_dict(again if world_size > 1 else again[0])
        assert real(consumed) + real(run(final)) == uninterrupted("BlockShuffling", even_batches=None), started
    # The same from a loaded state alone, in lockstep.
    one = make("BlockShuffling")
    taken = [tuple(b["index"].tolist()) for _, b in zip(range(3), one)]
    reloaded = make("BlockShuffling")
    reloaded.load_state_dict(one.state_dict())
    last = make("BlockShuffling")
    last.load_state_dict(reloaded.state_dict())  # nothing consumed in between: the same position
    assert collections.Counter(taken + [tuple(b["index"].tolist()) for b in last]) == uninterrupted("BlockShuffling")


def test_in_process_state_counts_the_loops_batches_and_survives_a_break():
    dataset = make("BlockShuffling", prefetch=2, num_threads=2)
    taken = []
    for batch in dataset:
        taken.append(tuple(batch["index"].tolist()))
        if len(taken) == 4:
            break
    state = dataset.state_dict()
    assert state["epoch"] == 0 and state["segments"] == [[1, 1, 4]]
    resumed = make("BlockShuffling")
    resumed.load_state_dict(state)
    assert collections.Counter(taken + [tuple(b["index"].tolist()) for b in resumed]) == uninterrupted("BlockShuffling")
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["segments"] == []


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_resume_from_the_loops_step(context):
    dataset = make("StreamingShuffle", prefetch=2)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    taken = []
    for batch in loader:
        taken.append(tuple(batch["index"].tolist()))
        if len(taken) == 5:
            break
    with pytest.raises(ValueError, match="pass consumed_batches"):
        dataset.state_dict()
    state = dataset.state_dict(consumed_batches=5)
    assert state["segments"] == [[1, 2, 5]]
    for num_workers in (0, 3):
        resumed = make("StreamingShuffle")
        resumed.load_state_dict(state)
        workers = dict(num_workers=num_workers, multiprocessing_context=context) if num_workers else {}
        loader = DataLoader(resumed, batch_size=None, **workers)
        rest = [tuple(batch["index"].tolist()) for batch in loader]
        assert collections.Counter(taken + rest) == uninterrupted("StreamingShuffle"), num_workers


@pytest.mark.parametrize("seed", range(3))
def test_random_loaders_broken_out_of_resume_exactly_once(seed):
    # Real workers (fork or forkserver, persistent or not, ts.DataLoader or torch's), random
    # configurations as in the emulated test above: a loop that breaks at a random step, a state at
    # that step, and the rest read on another number of workers.
    rng = random.Random(seed)
    for trial in range(3):
        name = rng.choice(STRATEGIES)
        arguments = dict(rows=rng.choice([7, 61, 300]), block_size=rng.choice([1, 3, 8]))
        arguments.update(batch_size=rng.randint(1, 9), fetch_factor=rng.randint(1, 5), drop_last=rng.random() < 0.3)
        world_size = rng.randint(1, 3)
        arguments.update(even_batches=None, rank=rng.randrange(world_size), world_size=world_size)
        arguments.update(prefetch=None, num_threads=None)  # the reader's defaults, in the workers
        before, after = rng.randint(1, 3), rng.randint(0, 3)
        loader_type = rng.choice([ts.DataLoader, DataLoader])
        workers = dict(multiprocessing_context=rng.choice(["fork", "forkserver"]))
        workers["persistent_workers"] = rng.random() < 0.5
        context = (trial, name, arguments, before, after, loader_type.__module__, workers)
        expected = collections.Counter(tuple(batch["index"].tolist()) for batch in make(name, **arguments))
        first = make(name, **arguments)
        loader = loader_type(first, batch_size=None, num_workers=before, **workers)
        steps = len(loader)
        assert steps == sum(expected.values()), context
        stop = rng.randint(0, steps)
        taken = collections.Counter()
        for step, batch in enumerate(loader):
            if step == stop:
                break
            taken[tuple(batch["index"].tolist())] += 1
        state = first.state_dict(consumed_batches=stop)
        resumed = make(name, seed=None, **arguments)
        resumed.load_state_dict(state)
        rest = loader_type(resumed, batch_size=None, num_workers=after, **(workers if after else {}))
        length = len(rest)
        rest = [tuple(batch["index"].tolist()) for batch in rest]
        if stop < steps:  # else the state points at the next epoch
            assert len(rest) == length, context
            taken.update(rest)
        assert taken == expected, context


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_stateful_dataloader_resumes_twice_in_one_epoch(context):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(dataset):
        return stateful.StatefulDataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)

    taken, state = [], None
    for stop in (3, 4):
        current = loader(make("BlockShuffling"))
        if state is not None:
            current.load_state_dict(state)
        iterator = iter(current)
        taken += [tuple(next(iterator)["index"].tolist()) for _ in range(stop)]
        state = current.state_dict()
        del iterator
    last = loader(make("BlockShuffling"))
    last.load_state_dict(state)
    taken += [tuple(batch["index"].tolist()) for batch in last]
    assert collections.Counter(taken) == uninterrupted("BlockShuffling")
    # ... and the next epoch is whole.
    assert collections.Counter(tuple(b["index"].tolist()) for b in last) == uninterrupted("BlockShuffling", epoch=1)


@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_a_state_taken_in_the_main_process_after_a_stateful_dataloader_restore_resumes_exactly(num_workers, seed):
    # StatefulDataLoader hands each worker its own state; the main process's dataset sees none of them. It
    # must still report and checkpoint the restored seed and position: a later dataset.state_dict(
    # consumed_batches=...) there resumed with other rows (seed=None: the main process kept its own draw).
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    workers = dict(num_workers=num_workers, multiprocessing_context="fork") if num_workers else {}

    def fresh():
        return make("BlockShuffling", seed=seed, prefetch=None)

    first = fresh()
    loader = stateful.StatefulDataLoader(first, batch_size=None, **workers)
    iterator = iter(loader)
    taken = [tuple(next(iterator)["index"].tolist()) for _ in range(4)]
    state = loader.state_dict()
    del iterator
    restored = fresh()
    loader = stateful.StatefulDataLoader(restored, batch_size=None, **workers)
    loader.load_state_dict(state)
    iterator = iter(loader)
    taken += [tuple(next(iterator)["index"].tolist()) for _ in range(3)]
    assert restored.seed == first.seed
    checkpoint = restored.state_dict(consumed_batches=3)
    del iterator
    assert checkpoint["seed"] == first.seed
    for resume_workers in sorted({num_workers, 2}):
        resumed = fresh()
        resumed.load_state_dict(checkpoint)
        more = dict(num_workers=resume_workers, multiprocessing_context="fork") if resume_workers else {}
        rest = [tuple(batch["index"].tolist()) for batch in DataLoader(resumed, batch_size=None, **more)]
        every_row = collections.Counter(row for batch in taken + rest for row in batch)
        assert every_row == collections.Counter(range(ROWS)), (resume_workers, every_row)


def test_a_workers_state_on_another_topology_points_at_the_datasets_checkpoint():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(
        make("BlockShuffling", world_size=2), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    iterator = iter(loader)
    next(iterator)
    worker_state = loader.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    del iterator
    with pytest.raises(
        ValueError, match=r"rank 0 of 2 cannot resume rank 0 of 1 .*state_dict\(consumed_batches=step\)"
    ):
        make("BlockShuffling").load_state_dict(worker_state)


def test_stateful_dataloader_in_process():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    current = stateful.StatefulDataLoader(make("Streaming"), batch_size=None)
    iterator = iter(current)
    taken = [tuple(next(iterator)["index"].tolist()) for _ in range(6)]
    state = current.state_dict()
    resumed = stateful.StatefulDataLoader(make("Streaming"), batch_size=None)
    resumed.load_state_dict(state)
    taken += [tuple(batch["index"].tolist()) for batch in resumed]
    assert collections.Counter(taken) == uninterrupted("Streaming")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_at_the_next_epoch_after_a_finished_one(num_workers):
    # A checkpoint taken once the loop ran out: StatefulDataLoader restores it by making an iterator of
    # the finished epoch and dropping it unused, then a fresh one. That one is the next epoch (1), not 2.
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    epochs = [uninterrupted("BlockShuffling", epoch) for epoch in range(3)]
    kwargs = dict(batch_size=None, num_workers=num_workers, multiprocessing_context="fork" if num_workers else None)
    current = stateful.StatefulDataLoader(make("BlockShuffling"), **kwargs)
    assert collections.Counter(tuple(b["index"].tolist()) for b in current) == epochs[0]
    resumed = stateful.StatefulDataLoader(make("BlockShuffling"), **kwargs)
    resumed.load_state_dict(current.state_dict())
    for epoch in (1, 2):
        assert collections.Counter(tuple(b["index"].tolist()) for b in resumed) == epochs[epoch]


def test_a_state_from_other_data_or_arguments_is_refused_naming_what_differs():
    ranks = job("BlockShuffling", 1, 0)
    run(ranks, 3)
    state = ranks[0].dataset.state_dict()
    cases = [
        (make("BlockShuffling", batch_size=5), "batch_size is 4, this dataset's is 5"),
        (make("BlockShuffling", fetch_factor=2), "fetch_factor is 3, this dataset's is 2"),
        (make("Streaming"), "another strategy"),
        (make("BlockShuffling", drop_last=True), "drop_last is 0, this dataset's is 1"),
        (make("BlockShuffling", even_batches="drop"), "even_batches"),
        (ts.ShardedDataset(rows_source(60), ts.BlockShuffling(3), batch_size=4, fetch_factor=3), "rows is 61"),
        (
            ts.ShardedDataset(ts.TensorSource(torch.zeros(ROWS)), ts.BlockShuffling(3), batch_size=4, fetch_factor=3),
            "another source",
        ),
    ]
    for dataset, message in cases:
        with pytest.raises(ValueError, match=message):
            dataset.load_state_dict(state)
    with pytest.raises(ValueError, match="has no 'epoch'"):
        make("BlockShuffling").load_state_dict({key: value for key, value in state.items() if key != "epoch"})
    with pytest.raises(TypeError, match="expected a dict from state_dict"):
        make("BlockShuffling").load_state_dict(3)
    bad = dict(state, segments=[[1, 1, 10_000]])
    with pytest.raises(ValueError, match="consumed 10000 batches, but had only"):
        make("BlockShuffling").load_state_dict(bad)
    with pytest.raises(ValueError, match="consumed_batches=5 but no epoch is under way here: .* start of epoch 0"):
        make("BlockShuffling").state_dict(consumed_batches=5)  # nothing ran: 5 cannot be counted anywhere
    for rank, world_size in [(5, 1), (-1, 2), (0, 0)]:
        with pytest.raises(ValueError, match=f"taken on rank {rank} of world_size {world_size} .*damaged state"):
            make("BlockShuffling").load_state_dict(dict(state, rank=rank, world_size=world_size))
    # Version 1 states were dealt in the Feistel network's block orders, which version 2 replaced.
    assert state["version"] == 2
    with pytest.raises(ValueError, match=r"earlier torch_shards \(state version 1\), .* would repeat some rows"):
        make("BlockShuffling").load_state_dict(dict(state, version=1))
    with pytest.raises(ValueError, match=r"unknown state version 3 \(this torch_shards reads version 2\)"):
        make("BlockShuffling").load_state_dict(dict(state, version=3))
    sampler = ts.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler_state = sampler.state_dict()
    assert sampler_state["version"] == 2
    with pytest.raises(ValueError, match=r"DistributedSampler.load_state_dict: the state was written by an earlier"):
        sampler.load_state_dict(dict(sampler_state, version=1))


def test_state_survives_torch_save_and_distributed_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp

    dataset = make("BlockShuffling")
    taken = [tuple(b["index"].tolist()) for _, b in zip(range(4), iter(dataset))]
    torch.save(dataset.state_dict(), tmp_path / "state.pt")
    dcp.save({"data": dataset}, checkpoint_id=str(tmp_path / "dcp"))
    for resume in ("torch.save", "dcp"):
        resumed = make("BlockShuffling", seed=None)
        if resume == "torch.save":
            resumed.load_state_dict(torch.load(tmp_path / "state.pt"))
        else:
            dcp.load({"data": resumed}, checkpoint_id=str(tmp_path / "dcp"))
        rest = [tuple(b["index"].tolist()) for b in resumed]
        assert collections.Counter(taken + rest) == uninterrupted("BlockShuffling"), resume


@pytest.mark.filterwarnings("ignore:`torch.jit.[a-z]+` is deprecated:DeprecationWarning")
def test_scripted_loop_checkpoints_and_resumes():
    class Steps(torch.nn.Module):
        def __init__(self, dataset):
            super().__init__()
            self.dataset = dataset

        def forward(self, steps: int) -> tuple[list[list[int]], dict[str, int]]:
            iterator = self.dataset.iter()
            out: list[list[int]] = []
            for _ in range(steps):
                batch = iterator.next()
                if batch is None:
                    break
                else:
                    rows: list[int] = batch["index"].tolist()
                    out.append(rows)
            return out, self.dataset.state_dict(None)

    first, state = torch.jit.script(Steps(make("ClassBalancedSampling").native))(5)
    resumed = make("ClassBalancedSampling").native
    resumed.load_state_dict(state)
    rest, _ = torch.jit.script(Steps(resumed))(1000)
    assert collections.Counter(map(tuple, first + rest)) == uninterrupted("ClassBalancedSampling")


def test_states_move_between_the_python_door_and_the_others():
    # Python's state (segments as a list) into the TorchScript door via flat_state_dict, and the
    # TorchScript door's flat state into Python's load_state_dict, each resuming the rest exactly.
    whole = uninterrupted("BlockShuffling")
    python = make("BlockShuffling")
    iterator = iter(python)
    first = [next(iterator)["index"].tolist() for _ in range(3)]
    state = python.state_dict()
    flat = ts.flat_state_dict(state)
    assert flat["segments"] == len(state["segments"]) and all(isinstance(v, int) for v in flat.values())
    assert ts.flat_state_dict(flat) == flat
    native = make("BlockShuffling").native
    native.load_state_dict(flat)
    native_iterator = native.iter()
    second = [native_iterator.next()["index"].tolist() for _ in range(2)]
    native_state = native.state_dict(None)
    resumed = make("BlockShuffling")
    resumed.load_state_dict(dict(native_state))
    rest = [b["index"].tolist() for b in resumed]
    assert collections.Counter(map(tuple, first + second + rest)) == whole
    with pytest.raises(ValueError, match=r"flat_state_dict: the state's 'segments' must be a list .* got 'x'"):
        ts.flat_state_dict({"segments": "x"})


def _ddp_epoch_part(rank, world_size, state_path, steps):
    """Trains in lockstep (a gloo all-reduce per batch) for `steps` batches, or
    to the end after loading the saved state; returns the rows read."""
    import torch.distributed as dist

    dataset = make("BlockWeightedSampling", world_size=None, rank=None, prefetch=2)  # from the group
    if steps is None:
        dataset.load_state_dict(torch.load(state_path))
    rows = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=1):
        dist.all_reduce(torch.ones(1))  # lockstep: every rank steps the same number of times
        rows.append(batch["index"].tolist())
        if steps is not None and len(rows) == steps:
            break
    if steps is not None and rank == 0:
        torch.save(dataset.state_dict(consumed_batches=steps), state_path)
    dist.barrier()
    return rows


@pytest.mark.timeout(300)
def test_gloo_ranks_resume_on_another_world_size(tmp_path):
    from distributed_run import run_ranks

    state_path = str(tmp_path / "state.pt")
    before = run_ranks(_ddp_epoch_part, 2, state_path, 3)
    assert all(status == "ok" for status, _ in before), before
    after = run_ranks(_ddp_epoch_part, 3, state_path, None)
    assert all(status == "ok" for status, _ in after), after
    assert len({len(rows) for _, rows in after}) == 1  # equal steps after resuming
    delivered = collections.Counter(tuple(b) for _, rows in before + after for b in rows)
    expected = uninterrupted("BlockWeightedSampling")
    # Every global batch at least once; the surplus is padding (at most world_size - 1 batches per part).
    assert not expected - delivered
    assert sum((delivered - expected).values()) <= 1 + 2


def _load_mismatched(rank, world_size, state_path):
    try:
        make("BlockWeightedSampling", world_size=None, rank=None, batch_size=5).load_state_dict(torch.load(state_path))
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.timeout(300)
def test_a_mismatched_resume_fails_on_every_rank(tmp_path):
    from distributed_run import run_ranks

    state_path = str(tmp_path / "state.pt")
    ranks = job("BlockWeightedSampling", 1, 0)
    run(ranks, 2)
    torch.save(ranks[0].dataset.state_dict(), state_path)
    results = run_ranks(_load_mismatched, 2, state_path)
    assert [status for status, _ in results] == ["ok", "ok"]
    assert all("batch_size is 4, this dataset's is 5" in message for _, message in results)


# ---- DistributedSampler


@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_resumes_on_another_number_of_replicas(drop_last):
    for replicas, stop, new_replicas in [(2, 5, 3), (3, 0, 2), (4, 13, 4), (1, 20, 5)]:
        taken = []
        samplers = [ts.DistributedSampler(range(53), replicas, r, seed=3, drop_last=drop_last) for r in range(replicas)]
        for sampler in samplers:
            iterator = iter(sampler)
            taken += [next(iterator) for _ in range(stop)]
        state = samplers[0].state_dict()
        if state["epoch"] == 1:  # the whole epoch was consumed (drop_last trims it to 13 per rank)
            assert stop == len(samplers[0]) and state["offset"] == 0
            continue
        rest = []
        for r in range(new_replicas):
            resumed = ts.DistributedSampler(range(53), new_replicas, r, seed=0, drop_last=drop_last)
            resumed.load_state_dict(state)
            expected_len = len(resumed)
            got = list(resumed)
            assert len(got) == expected_len
            rest += got
        counts = collections.Counter(taken + rest)
        assert set(counts) <= set(range(53))
        if not drop_last:
            assert set(counts) == set(range(53))
        assert sum(counts.values()) - len(counts) < replicas + new_replicas  # padding only


def test_random_samplers_resume_on_another_number_of_replicas():
    # Sizes, replicas, shuffle, drop_last, strategies and epochs drawn at random (seeded): every replica
    # stops at the same random step, the rest is read on another number of replicas; together the plan
    # exactly once, but for the padding or trimming of the epoch's end (fewer entries than the replicas
    # that end it).
    rng = random.Random(0)
    for trial in range(400):
        size, replicas, new_replicas = rng.choice([1, 2, 7, 53, 64, 257]), rng.randint(1, 9), rng.randint(1, 9)
        name, block = (
            rng.choice([None, "Streaming", "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling"]),
            rng.choice([1, 3, 8]),
        )
        arguments = dict(shuffle=rng.random() < 0.5, drop_last=rng.random() < 0.5)
        epoch = rng.randint(0, 3)

        def sampler(num_replicas, rank, seed=5, config=(size, name, block, arguments)):
            size, name, block, arguments = config
            strategy = None if name is None else make_strategy(name, size, block)
            return ts.DistributedSampler(range(size), num_replicas, rank, seed=seed, strategy=strategy, **arguments)

        whole = sampler(1, 0)
        whole.set_epoch(epoch)
        plan = collections.Counter(whole)
        before = [sampler(replicas, rank) for rank in range(replicas)]
        stop = rng.randint(0, len(before[0]))
        taken = collections.Counter()
        for replica in before:
            replica.set_epoch(epoch)
            taken.update(itertools.islice(iter(replica), stop))
        state = before[0].state_dict()
        context = (trial, size, replicas, new_replicas, name, block, arguments, epoch, stop)
        finishing = new_replicas  # the replicas that pad or trim the epoch's end
        if state["epoch"] == epoch:
            for rank in range(new_replicas):
                after = sampler(new_replicas, rank, seed=0)
                after.load_state_dict(state)
                length = len(after)
                rest = list(after)
                assert len(rest) == length, context
                taken.update(rest)
        else:  # the whole epoch was consumed
            assert stop == len(before[0]) and state["epoch"] == epoch + 1, context
            finishing = replicas
        if arguments["drop_last"]:
            assert not taken - plan and sum((plan - taken).values()) < finishing, context
        else:
            assert not plan - taken and sum((taken - plan).values()) < finishing, context


def test_sampler_epoch_advances_only_after_a_finished_iteration():
    sampler = ts.DistributedSampler(range(20), 1, 0, seed=1)
    first = list(sampler)
    partial = iter(sampler)
    next(partial)
    again = list(sampler)  # the unfinished epoch 1 again, from its start
    assert sampler.epoch == 1 and again != first
    assert list(sampler) != again and sampler.epoch == 2


def test_stateful_dataloader_with_the_sampler_resumes_exactly():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    rows = list(range(45))
    full = [
        b.tolist()
        for b in stateful.StatefulDataLoader(rows, batch_size=4, sampler=ts.DistributedSampler(rows, 1, 0, seed=2))
    ]
    loader = stateful.StatefulDataLoader(rows, batch_size=4, sampler=ts.DistributedSampler(rows, 1, 0, seed=2))
    iterator = iter(loader)
    taken = [next(iterator).tolist() for _ in range(5)]
    state = loader.state_dict()
    resumed = stateful.StatefulDataLoader(rows, batch_size=4, sampler=ts.DistributedSampler(rows, 1, 0, seed=2))
    resumed.load_state_dict(state)
    assert taken + [b.tolist() for b in resumed] == full


def test_sampler_state_counts_the_indices_the_loop_took(tmp_path):
    sampler = ts.DistributedSampler(range(200_000), 2, 1, seed=5)
    iterator = iter(sampler)
    taken = [next(iterator) for _ in range(70_000)]  # more than one native chunk
    state = sampler.state_dict()
    assert state["offset"] == 140_000
    torch.save(state, tmp_path / "s.pt")
    resumed = ts.DistributedSampler(range(200_000), 2, 1, seed=5)
    resumed.load_state_dict(torch.load(tmp_path / "s.pt"))
    assert taken + list(resumed) == sampler_epoch_long()


def sampler_epoch_long():
    return list(ts.DistributedSampler(range(200_000), 2, 1, seed=5))


def test_sampler_state_mismatch_is_refused():
    state = ts.DistributedSampler(range(30), 1, 0, seed=2).state_dict()
    with pytest.raises(ValueError, match="taken on a dataset of 30 rows, this one has 31"):
        ts.DistributedSampler(range(31), 1, 0).load_state_dict(state)
    with pytest.raises(ValueError, match="another strategy"):
        ts.DistributedSampler(range(30), 1, 0, shuffle=False).load_state_dict(state)
