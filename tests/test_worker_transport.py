"""Batches crossing from DataLoader workers as handles to recycled slabs
(torch_shards/transfer.py, csrc/loader/shared_slab.h): the decision is
explicit, kept batches are never overwritten, no slab is made per batch, and
nothing is left behind however the loop or a worker ends."""

import copy
import gc
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader

import torch_shards as ts

ROWS, WIDTH = 1200, 6
CONTEXTS = ["fork", "spawn", "forkserver"]
HERE = os.path.dirname(os.path.abspath(__file__))


def values():
    # Row r holds r * 10 + column: any batch can be checked against its index.
    return torch.arange(ROWS * WIDTH, dtype=torch.float32).reshape(ROWS, WIDTH) // WIDTH * 10 + torch.arange(WIDTH)


def dataset(**kwargs):
    arguments = dict(batch_size=16, fetch_factor=4, seed=5, num_threads=1)
    arguments.update(kwargs)
    return ts.ShardedDataset(ts.TensorSource(values()), ts.BlockShuffling(8), **arguments)


def intact(batch):
    expected = batch["index"].double().unsqueeze(1) * 10 + torch.arange(WIDTH)
    return torch.equal(batch["X"].double(), expected)


def rows(batches):
    return sorted(i for batch in batches for i in batch["index"].tolist())


def dev_shm():
    """/dev/shm's entries but torch's own segments (torch_<pid>_...: other processes on the machine, such as a
    test of worker_transport="torch" running beside, make and unlink them at any time)."""
    try:
        return {name for name in os.listdir("/dev/shm") if not name.startswith("torch_")}
    except OSError:
        return set()


def left_in_dev_shm(before, settle=15.0):
    """What is in /dev/shm now and was not before, once entries other processes hold for a while have had
    `settle` seconds to go: a spawn or forkserver DataLoader of another test running beside makes named
    semaphores (sem.mp-...) that live as long as its loader. Whatever this test's scenario left stays and
    is returned."""
    deadline = time.monotonic() + settle
    while (extra := dev_shm() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return extra


def slab_inodes(pid):
    found = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith("/memfd:torch_shards_slab"):
                found.add(os.stat(f"/proc/{pid}/fd/{name}").st_ino)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("loader_class", [DataLoader, ts.DataLoader])
@pytest.mark.parametrize("context", CONTEXTS)
def test_a_whole_epoch_kept_stays_intact_while_later_epochs_recycle_the_slabs(loader_class, context):
    ds = dataset()
    loader = loader_class(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    kept = list(loader)  # every batch of the first epoch, held
    assert rows(kept) == list(range(ROWS)) and all(intact(b) for b in kept)
    assert all(type(b) is dict for b in kept)  # the training process gets plain dicts
    for _ in range(2):  # later epochs: dropped batches' slabs are written again, never the kept ones
        assert rows(b for b in loader if intact(b)) == list(range(ROWS))
    assert all(intact(b) for b in kept)


@pytest.mark.parametrize("loader_class", [DataLoader, ts.DataLoader])
def test_no_slab_is_made_per_batch_and_nothing_appears_in_dev_shm(loader_class):
    before = dev_shm()
    ds = dataset(batch_size=8, fetch_factor=2)  # 150 batches an epoch
    loader = loader_class(ds, batch_size=None, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    workers = [w.pid for w in getattr(iterator, "_items", iterator)._workers]
    for _ in iterator:  # warm-up: the pools fill
        pass
    made = set().union(*(slab_inodes(pid) for pid in workers))
    maps = ts.transfer.mapped_slabs()["maps"]
    for _ in range(3):
        assert rows(loader) == list(range(ROWS))
    after = set().union(*(slab_inodes(pid) for pid in workers))
    # The later epochs' slabs are the first epoch's, recycled: a pool may still grow by a slab or two when
    # the loop happens to hold more at once, never by one a batch (450 batches here).
    assert len(after - made) <= 4, (len(made), len(after - made))
    # Persistent workers' slabs stay mapped here between epochs: ts.DataLoader's workers know from the start,
    # torch's learn it when they iterate again (their second epoch, the warm-up's, is mapped once more).
    again = 0 if loader_class is ts.DataLoader else len(made)
    assert ts.transfer.mapped_slabs()["maps"] - maps <= again + len(after - made) < len(ds)
    assert left_in_dev_shm(before) == set()


@pytest.mark.parametrize("loader_class", [DataLoader, ts.DataLoader])
@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_persistent_workers_slabs_stay_mapped_between_epochs_and_go_with_the_loader(loader_class, context):
    gc.collect()
    ts.transfer.forget_dead_workers()
    baseline = ts.transfer.mapped_slabs()["mapped"]
    loader = loader_class(
        dataset(), batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=context
    )
    for _ in range(2):  # torch's workers learn they are persistent when they iterate again
        assert rows(loader) == list(range(ROWS))
    mapped = ts.transfer.mapped_slabs()
    assert mapped["mapped"] > baseline  # kept between epochs
    workers = [w.pid for w in loader._iterator._workers]  # torch's iterator, kept for persistent workers
    made = set().union(*(slab_inodes(pid) for pid in workers))
    for _ in range(3):
        assert rows(b for b in loader if intact(b)) == list(range(ROWS))
    new = set().union(*(slab_inodes(pid) for pid in workers)) - made
    # None mapped again: only slabs a pool made since (when the loop happened to hold more at once).
    assert ts.transfer.mapped_slabs()["maps"] - mapped["maps"] <= len(new), (len(made), len(new))
    del loader
    gc.collect()
    if loader_class is DataLoader:  # torch's: at the next slab mapped from any worker, or when asked
        ts.transfer.forget_dead_workers()
    assert ts.transfer.mapped_slabs()["mapped"] == baseline  # ts.DataLoader's: once its workers stopped


def test_a_worker_that_iterates_once_lets_go_of_its_slabs_at_its_last_batch():
    gc.collect()
    ts.transfer.forget_dead_workers()
    baseline = ts.transfer.mapped_slabs()["mapped"]
    loader = ts.DataLoader(dataset(), num_workers=2)  # not persistent: new workers every epoch
    for _ in range(2):
        kept = list(loader)
        assert ts.transfer.mapped_slabs()["mapped"] == baseline  # forgotten at once; the views keep the memory
        assert rows(kept) == list(range(ROWS)) and all(intact(b) for b in kept)


def test_a_batch_pickled_or_copied_in_the_training_process_is_a_plain_dict():
    batch = next(iter(dataset()))
    assert isinstance(batch, dict)
    loaded = pickle.loads(pickle.dumps(batch))  # nothing of torch_shards needed to load it
    assert type(loaded) is dict and intact(loaded)
    assert b"torch_shards" not in pickle.dumps(batch)
    assert type(copy.deepcopy(batch)) is dict and intact(copy.deepcopy(batch))


class Table:
    """A collection fetched in Python (scDataset's kind): len() and columns."""

    def __init__(self):
        self.columns = {"X": values(), "index": torch.arange(ROWS)}

    def __len__(self):
        return ROWS

    def __getitem__(self, rows):
        return fetch_rows(self, rows)


def fetch_rows(table, rows):
    return {key: column[torch.as_tensor(rows)] for key, column in table.columns.items()}


def cut_batch(fetched, positions):
    return {key: column[torch.as_tensor(positions)] for key, column in fetched.items()}


def test_batch_size_not_none_is_refused_in_workers_and_in_the_training_process():
    for workers in (0, 2):
        with pytest.raises(ValueError, match="batch_size=None"):
            next(iter(DataLoader(dataset(), num_workers=workers)))
    # A collection fetched in Python whose batches are dicts: refused the same way.
    collected = ts.ShardedDataset(
        Table(), ts.BlockShuffling(8), batch_size=16, seed=5, fetch_callback=fetch_rows, batch_callback=cut_batch
    )
    for workers in (0, 2):
        with pytest.raises(ValueError, match="batch_size=None"):
            next(iter(DataLoader(collected, num_workers=workers)))
    assert rows(DataLoader(collected, batch_size=None, num_workers=2)) == list(range(ROWS))
    with pytest.raises(ValueError, match="batch_size=4 with a ShardedDataset"):
        ts.DataLoader(dataset(), batch_size=4, num_workers=2)


def test_ts_dataloader_defaults_to_batch_size_none_for_a_sharded_dataset():
    loader = ts.DataLoader(dataset(), num_workers=2)
    assert loader.batch_size is None
    assert rows(loader) == list(range(ROWS))
    assert rows(ts.DataLoader(dataset())) == list(range(ROWS))  # in the training process too


@pytest.mark.parametrize("loader_class", [DataLoader, ts.DataLoader])
@pytest.mark.parametrize("width", [16, 25, 700, 1025])
def test_rows_streamed_into_the_slabs_or_not_arrive_intact(loader_class, width):
    # Rows that fill whole lines (64 bytes) or of 4 KB and more (4100) are written into the slabs with
    # non-temporal stores (core::streams); rows of 100 and 2800 bytes, sharing lines, with ordinary ones.
    # In source order (BlockShuffling sorts the fetch) and as listed (Streaming), kept over later epochs.
    table = torch.arange(ROWS * width, dtype=torch.float32).reshape(ROWS, width)
    for strategy in (ts.BlockShuffling(8), ts.Streaming()):
        ds = ts.ShardedDataset(ts.TensorSource({"X": table}), strategy, batch_size=16, fetch_factor=4, seed=5)
        loader = loader_class(ds, batch_size=None, num_workers=2, persistent_workers=True)
        kept = list(loader)
        for batches in (kept, list(loader)):
            assert rows(batches) == list(range(ROWS))
            assert all(torch.equal(b["X"], table[b["index"]]) for b in batches)
        assert all(torch.equal(b["X"], table[b["index"]]) for b in kept)


def test_worker_transport_torch_delivers_the_same_batches_and_bad_values_are_refused():
    expected = [tuple(b["index"].tolist()) for b in DataLoader(dataset(), batch_size=None, num_workers=2)]
    old = list(DataLoader(dataset(worker_transport="torch"), batch_size=None, num_workers=2))
    assert [tuple(b["index"].tolist()) for b in old] == expected and all(intact(b) for b in old)
    assert rows(ts.DataLoader(dataset(worker_transport="torch"), num_workers=2)) == list(range(ROWS))
    with pytest.raises(ValueError, match="worker_transport must be 'handles' or 'torch', got 'shm'"):
        dataset(worker_transport="shm")


def test_a_batch_transform_returning_other_objects_crosses_the_torch_way_and_stays_intact():
    def as_tuple(batch):
        return batch["index"], batch["X"]

    kept = list(DataLoader(dataset(batch_transform=as_tuple), batch_size=None, num_workers=2, persistent_workers=True))
    assert sorted(i for index, _ in kept for i in index.tolist()) == list(range(ROWS))
    assert all(intact({"index": index, "X": x}) for index, x in kept)


def test_a_custom_collate_fn_gets_an_ordinary_dict_and_its_output_stays_intact():
    def tag(batch):
        assert isinstance(batch, dict)
        return {"index": batch["index"], "X": batch["X"], "tag": "seen"}

    loader = DataLoader(dataset(), batch_size=None, num_workers=2, collate_fn=tag, persistent_workers=True)
    kept = list(loader)
    list(loader)  # another epoch over the same workers
    assert rows(kept) == list(range(ROWS)) and all(b["tag"] == "seen" and intact(b) for b in kept)


# Each scenario runs in a fresh interpreter, under a time limit: a hang fails it. It prints OK when its
# checks passed; the test then checks /dev/shm.
PRELUDE = """
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader
import torch_shards as ts
ROWS, WIDTH = 1200, 6
def values():
    return torch.arange(ROWS * WIDTH, dtype=torch.float32).reshape(ROWS, WIDTH) // WIDTH * 10 + torch.arange(WIDTH)
def intact(batch):
    expected = batch["index"].double().unsqueeze(1) * 10 + torch.arange(WIDTH)
    return torch.equal(batch["X"].double(), expected)
def dataset(**kwargs):
    return ts.ShardedDataset(ts.TensorSource(values()), ts.BlockShuffling(8), batch_size=16, fetch_factor=4,
                             seed=5, num_threads=1, **kwargs)
def loader(ds, **kwargs):
    cls = ts.DataLoader if LOADER == "ts" else DataLoader
    return cls(ds, batch_size=None, num_workers=2, multiprocessing_context=CONTEXT, **kwargs)
def stall_third_unit(unit):  # the first worker at its third unit says so (a file named by its pid), then sleeps
    CALLS.append(1)
    if len(CALLS) == 3:
        try:
            os.close(os.open(os.path.join(STALLED, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return unit
        open(os.path.join(STALLED, str(os.getpid())), "w").close()
        time.sleep(60)
    return unit
def slow_batch(batch):
    time.sleep(0.05)
    return batch
CALLS = []
def fail_late(batch):  # a worker's 12th batch raises
    CALLS.append(1)
    if len(CALLS) == 12:
        raise KeyError("failing on purpose")
    return batch
"""

SCENARIOS = {
    "worker_killed": """
        # Killed while it sleeps in its third unit's transform: with most of its share unsent, and
        # holding none of torch's locks (a worker killed inside one hangs torch's own shutdown:
        # tests/stress/killed_worker_hang.py).
        import threading
        def kill_the_stalled_worker():
            while not [name for name in os.listdir(STALLED) if name.isdigit()]:
                time.sleep(0.01)
            os.kill(int([name for name in os.listdir(STALLED) if name.isdigit()][0]), signal.SIGKILL)
        it = iter(loader(dataset(fetch_transform=stall_third_unit), persistent_workers=True))
        threading.Thread(target=kill_the_stalled_worker, daemon=True).start()
        held = []
        try:
            for batch in it:
                held.append(batch)
            raise SystemExit("the loop went on after a worker was killed")
        except RuntimeError as error:
            message = str(error)
        # At once: until its iterator is gone, torch's SIGCHLD handler raises for the killed worker
        # again, wherever the loop is (here it once did so inside the check below).
        del it
        assert "exited unexpectedly" in message or "killed" in message, message
        assert all(intact(b) for b in held)
        ts.transfer.forget_dead_workers()
        assert all(intact(b) for b in held)
        held.clear()
        assert ts.transfer.mapped_slabs()["mapped"] == 0, ts.transfer.mapped_slabs()
        print("OK")
    """,
    "worker_raises": """
        import gc, multiprocessing
        gc.disable()
        held = []
        try:
            for batch in loader(dataset(batch_transform=fail_late)):
                held.append(batch)
            raise SystemExit("no error came")
        except KeyError as error:
            assert "failing on purpose" in str(error)
        assert held and all(intact(b) for b in held)
        if LOADER == "ts":
            # No garbage collection needed: the workers stop once the loop lets go of the loader (torch's
            # re-raise holds its iterator in a reference cycle, which ts.DataLoader breaks).
            deadline = time.monotonic() + 30
            while multiprocessing.active_children() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not multiprocessing.active_children(), multiprocessing.active_children()
        print("OK")
    """,
    "break_and_del": """
        ds = dataset()
        for persistent in (False, True):
            it = iter(loader(ds, persistent_workers=persistent))
            held = [next(it) for _ in range(7)]
            del it  # broken out of mid-epoch: the workers stop, nothing hangs
            assert all(intact(b) for b in held)
        ds.set_epoch(10)
        got = sorted(i for b in loader(ds) for i in b["index"].tolist())
        assert got == list(range(ROWS)), "the next epoch is not exactly once"
        print("OK")
    """,
    "interrupted": """
        import threading
        it = iter(loader(dataset(batch_transform=slow_batch)))
        held = [next(it)]
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            for batch in it:
                held.append(batch)
            raise SystemExit("not interrupted")
        except KeyboardInterrupt:
            pass
        assert all(intact(b) for b in held)
        print("OK")
    """,
    "exit_with_iterator_alive": """
        ALIVE = iter(loader(dataset(), persistent_workers=True))
        HELD = [next(ALIVE) for _ in range(3)]
        print("OK")
        sys.stdout.flush()
        # the interpreter exits with the iterator, its workers and the held batches alive
    """,
}


@pytest.mark.parametrize(
    "scenario, context, loader_name",
    [
        (scenario, context, loader_name)
        for scenario in sorted(SCENARIOS)
        for context in CONTEXTS
        for loader_name in ("torch", "ts")
        if scenario != "interrupted" or context == "fork"  # Ctrl-C in the training process: one start method
    ],
)
def test_however_the_loop_or_a_worker_ends_nothing_hangs_or_is_left_behind(scenario, context, loader_name, tmp_path):
    before = dev_shm()
    # A file, not -c: spawn and forkserver workers import it to find its functions.
    script = tmp_path / "scenario.py"
    stalled = tmp_path / "stalled"
    stalled.mkdir()
    script.write_text(
        f"LOADER, CONTEXT, STALLED = {loader_name!r}, {context!r}, {str(stalled)!r}\n"
        + "import faulthandler; faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where\n"
        + PRELUDE
        + "def main():\n"
        + textwrap.indent(textwrap.dedent(SCENARIOS[scenario]), "    ")
        + "if __name__ == '__main__':\n    main()\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=HERE, env=os.environ.copy()
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), (
        f"rc={result.returncode} after {time.monotonic() - started:.1f}s\n{result.stdout}\n{result.stderr[-4000:]}"
    )
    assert left_in_dev_shm(before) == set()


def test_held_batches_keep_the_slabs_mapped_and_an_ended_epoch_lets_go_of_them():
    loader = DataLoader(dataset(), batch_size=None, num_workers=2)
    kept = list(loader)
    assert ts.transfer.mapped_slabs()["mapped"] == 0  # both workers sent their last batch: forgotten here
    assert all(intact(b) for b in kept)  # the views keep the memory
