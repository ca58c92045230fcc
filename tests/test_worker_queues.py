"""ts.DataLoader's queues (torch_shards/worker_queues.py): torch's DataLoader
with a multiprocessing context whose queues write small items to the pipe in
the thread that puts them, in order, through the feeder thread when that
write could wait, and that raise where an item cannot be pickled."""

import fcntl
import multiprocessing
import pickle
import time

import pytest
import torch
from torch.utils.data import DataLoader

import torch_shards as ts
from torch_shards.worker_queues import DirectQueue, direct_context

CONTEXTS = ["fork", "spawn", "forkserver"]


def filled(count, size=3000):
    return [bytes([i]) * size for i in range(count)]


def test_small_items_are_written_without_a_feeder_thread_and_a_full_pipe_goes_through_it_in_order():
    queue = direct_context("fork").Queue()
    assert isinstance(queue, DirectQueue)
    items = filled(12)  # 3 kB each: five fit under the 16 KiB written directly, the rest wait for the reader
    queue.put(items[0])
    assert queue._thread is None  # no feeder thread: written by this one
    for item in items[1:]:
        queue.put(item)
    assert queue._thread is not None  # the sixth went through the feeder, and every later one after it
    assert [queue.get(timeout=10) for _ in items] == items
    queue.close()
    queue.join_thread()


def test_a_pipe_given_fewer_slots_is_written_through_the_feeder_thread():
    queue = direct_context("fork").Queue()
    fcntl.fcntl(queue._writer.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # one page, as for a user over its pipe quota
    queue.put(b"x")
    assert queue._thread is not None
    assert queue.get(timeout=10) == b"x"
    queue.close()
    queue.join_thread()


def _put_all(queue, items, received):
    for item in items:
        queue.put(item)
    queue.put(None)
    received.wait(30)  # a tensor's shared memory is handed over by this process when the reader unpickles it


@pytest.mark.parametrize("context", CONTEXTS)
def test_a_child_process_puts_directly_then_through_its_feeder_in_order(context):
    ctx = direct_context(context)
    queue = ctx.Queue()
    items = filled(40) + [{"tensor": torch.arange(5)}]  # torch's reductions still apply
    received = ctx.Event()
    child = ctx.Process(target=_put_all, args=(queue, items, received))
    child.start()
    time.sleep(0.5)  # the child fills the pipe before anything is read
    got = []
    while (item := queue.get(timeout=30)) is not None:
        got.append(item)
    received.set()
    child.join(30)
    assert child.exitcode == 0
    assert got[:-1] == items[:-1] and torch.equal(got[-1]["tensor"], torch.arange(5))


def test_an_item_that_cannot_be_pickled_raises_where_it_is_put():
    queue = direct_context("fork").Queue()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        queue.put(lambda: 0)
    queue.put(b"next")  # the queue goes on
    assert queue.get(timeout=10) == b"next"


def test_direct_context_keeps_the_start_method_and_leaves_other_contexts_alone():
    for method in CONTEXTS:
        for given in (method, multiprocessing.get_context(method)):
            context = direct_context(given)
            assert context.get_start_method() == method and isinstance(context.Queue(), DirectQueue)
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    assert direct_context(None).get_start_method() == default
    already = direct_context("spawn")
    assert direct_context(already) is already
    assert direct_context("no-such-method") == "no-such-method"  # torch names it


def dataset(**kwargs):
    return ts.ShardedDataset(
        ts.TensorSource(torch.arange(600).reshape(300, 2)), ts.BlockShuffling(4), batch_size=8, seed=3, **kwargs
    )


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("persistent", [False, True])
def test_ts_dataloader_over_direct_queues_gives_torchs_batches_in_torchs_order(context, persistent):
    options = dict(num_workers=2, multiprocessing_context=context, persistent_workers=persistent)
    loader = ts.DataLoader(dataset(), **options)
    assert loader.multiprocessing_context.get_start_method() == context
    assert isinstance(loader.multiprocessing_context.Queue(), DirectQueue)
    reference = DataLoader(dataset(), batch_size=None, **options)
    for _ in range(2):
        ours = [b["index"].tolist() for b in loader]
        assert ours == [b["index"].tolist() for b in reference]
        assert sorted(i for batch in ours for i in batch) == list(range(300))


def test_ts_dataloader_without_a_context_starts_its_workers_by_the_default_method_when_it_iterates():
    # torch's DataLoader reads the default start method when its workers start: a set_start_method
    # after the loader was made is followed, as there.
    before = multiprocessing.get_start_method(allow_none=True)
    made = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    later = "spawn" if made != "spawn" else "forkserver"
    loader = ts.DataLoader(dataset(), num_workers=2)
    assert loader.multiprocessing_context.get_start_method() == made
    try:
        multiprocessing.set_start_method(later, force=True)
        ours = [b["index"].tolist() for b in loader]
        assert loader.multiprocessing_context.get_start_method() == later
        assert isinstance(loader.multiprocessing_context.Queue(), DirectQueue)
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert ours == [b["index"].tolist() for b in DataLoader(dataset(), batch_size=None, num_workers=2)]
    assert sorted(i for batch in ours for i in batch) == list(range(300))


def _unpicklable(batch):
    return {**batch, "f": lambda: 0}


@pytest.mark.timeout(60)
def test_a_batch_that_cannot_be_pickled_fails_the_loop_instead_of_hanging_it():
    # Through a feeder thread the error is printed and the batch dropped: torch's DataLoader then waits forever.
    loader = ts.DataLoader(dataset(batch_transform=_unpicklable), num_workers=1)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(loader)
