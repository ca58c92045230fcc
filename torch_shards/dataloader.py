"""ts.DataLoader: torch's DataLoader, whose workers send a ShardedDataset's
batches a whole unit (fetch) at a time, split back into batches here.

Each item a worker sends costs torch's queue a round trip between processes
(~0.1-0.2 ms); a unit of fetch_factor batches crossing at once (one handle
to a recycled slab, transfer.py) costs one. The batches come out in exactly the
order torch's DataLoader gives them (round-robin over the workers, batch by
batch, skipping workers that are done), so exactly-once, len(), epochs and
state_dict(consumed_batches=...) are unchanged. Any other dataset, and
num_workers=0, behave as with torch's DataLoader."""

import collections
import inspect
import traceback
import warnings
import weakref

import torch.utils.data
from torch.utils.data import get_worker_info

from .dataset import ShardedDataset
from .transfer import Unit, forget_dead_workers
from .worker_queues import direct_context


class _WholeUnits:
    """worker_init_fn: tells the worker's copy of the dataset to send whole
    units, and whether the worker is persistent (it then keeps its slabs
    mapped here between epochs), then runs the user's worker_init_fn
    (picklable for spawn)."""

    def __init__(self, user_fn, persistent):
        self.user_fn = user_fn
        self.persistent = persistent

    def __call__(self, worker_id):
        dataset = get_worker_info().dataset
        dataset._whole_units = True
        dataset._persistent_worker = self.persistent
        if self.user_fn is not None:
            self.user_fn(worker_id)


class _Batches:
    """The loader's iterator: units split into batches, in torch's order."""

    def __init__(self, items, num_workers, length):
        self._items = items
        self._num_workers = num_workers
        self._length = length
        self._queues = [collections.deque() for _ in range(num_workers)]  # units received, per worker
        self._other = collections.deque()  # items that are not units (batch_transform's outputs): as they come
        self._left = None  # batches each worker has still to deliver (None: not known yet, or endless)
        self._total = 0  # their sum
        self._turn = 0  # the worker whose batch comes next
        self._ended = False

    def __iter__(self):
        return self

    def __len__(self):
        if self._length is None:
            raise TypeError("ts.DataLoader over ShardedDataset(cycle=True) is endless: it has no len()")
        return self._length

    def _pull(self):
        """Receives the next item; False at the end of the underlying iterator."""
        if self._ended:
            return False
        try:
            item = next(self._items)
        except StopIteration:
            self._ended = True
            return False
        except BaseException as error:
            # torch re-raises a worker's error from a frame whose local holds it: a reference cycle
            # (exception, traceback, frame) that kept torch's iterator, its workers and their slabs alive
            # until the garbage collector ran, in whichever thread and however late. The finished frames
            # are cleared: the workers stop as soon as the loop lets go of the iterator.
            traceback.clear_frames(error.__traceback__)
            raise
        if not isinstance(item, Unit):
            self._other.append(item)
        else:
            if self._left is None and item.worker_batches is not None:
                self._left = list(item.worker_batches)
                self._total = sum(self._left)
            self._queues[item.worker].append(item)
        return True

    def __next__(self):
        while True:
            if self._other:
                return self._other.popleft()
            left = self._left
            if left is not None:
                if self._total == 0:
                    while self._pull():  # the underlying iterator sees its end: workers stop, the epoch ends
                        pass
                    if self._other:
                        continue
                    raise StopIteration
                while not left[self._turn]:  # done workers are skipped, as torch skips them
                    self._turn = (self._turn + 1) % self._num_workers
            worker = self._turn
            batch = _take(self._queues[worker])
            if batch is not None:
                if left is not None:
                    left[worker] -= 1
                    self._total -= 1
                self._turn = (worker + 1) % self._num_workers
                return batch
            if not self._pull():
                # Ended with batches of other workers left (only if a worker sent fewer than planned): in order.
                for queue in self._queues:
                    batch = _take(queue)
                    if batch is not None:
                        return batch
                raise StopIteration


def _take(units):
    """The next batch of a worker's units received (a deque of transfer.Unit), or None."""
    while units:
        batch = units[0].take()
        if batch is not None:
            return batch
        units.popleft()
    return None


_TORCH_SIGNATURE = inspect.signature(torch.utils.data.DataLoader.__init__)


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader, same arguments and behaviour, whose
    workers send a :class:`ShardedDataset`'s batches a whole fetch at a time
    (``fetch_factor`` batches as one handle to a recycled shared-memory
    slab), split back into batches in this process in the order torch's
    DataLoader gives them. Use it as torch's::

        loader = ts.DataLoader(dataset, num_workers=4)

    For a ShardedDataset ``batch_size`` defaults to None (the dataset makes
    the batches; any other value is refused). Each worker then sends whole
    fetches, so ``prefetch_factor`` counts fetches, not batches; with a
    ``collate_fn``, a ``batch_transform`` or ``worker_transport="torch"``
    they send batch by batch. ``loader.dataset`` is the dataset given. With
    workers, ``multiprocessing_context`` (None: the default start method as
    each iteration starts, where torch's DataLoader reads it) becomes a
    context of the same start method whose queues write small
    items in the thread that puts them, without a feeder thread; an item
    that cannot be pickled then fails the loop instead of hanging it. With
    any other dataset, or ``num_workers=0``, it is torch's DataLoader.

    Args:
        *args: torch.utils.data.DataLoader's positional arguments (``dataset``
            first).
        **kwargs: torch.utils.data.DataLoader's keyword arguments, with
            torch's defaults, except ``batch_size``: None for a ShardedDataset.
            ``in_order=False`` is not applied to a ShardedDataset (a
            ``UserWarning`` says so).

    Raises:
        ValueError: ``batch_size`` other than None with a ShardedDataset.
        TypeError: arguments that torch's DataLoader does not take.
    """

    __signature__ = _TORCH_SIGNATURE
    _kept_workers = None  # a weak reference to torch's iterator of persistent workers, once finalized

    def __init__(self, *args, **kwargs):
        bound = _TORCH_SIGNATURE.bind(None, *args, **kwargs)
        arguments = bound.arguments
        dataset = arguments.get("dataset")
        if isinstance(dataset, ShardedDataset):
            if "batch_size" not in arguments:
                arguments["batch_size"] = None
            elif arguments["batch_size"] is not None:
                raise ValueError(
                    f"ts.DataLoader: batch_size={arguments['batch_size']!r} with a ShardedDataset, which yields whole "
                    "batches (its own batch_size= sets their size): leave batch_size out (None), or every batch "
                    "would come wrapped in a batch"
                )
        self._whole_units = (
            isinstance(dataset, ShardedDataset)
            and arguments.get("num_workers", 0) > 0
            and arguments.get("collate_fn") is None
            and dataset.worker_transport == "handles"
        )
        # No multiprocessing_context: the default start method when the workers start (as torch's DataLoader
        # does), read again at each iteration: a set_start_method after this is followed.
        self._default_context = arguments.get("multiprocessing_context") is None
        if self._whole_units:
            # Small items are written to torch's queues by the thread that puts them (worker_queues.py).
            arguments["multiprocessing_context"] = direct_context(arguments.get("multiprocessing_context"))
            arguments["worker_init_fn"] = _WholeUnits(
                arguments.get("worker_init_fn"), bool(arguments.get("persistent_workers", False))
            )
            if not arguments.get("in_order", True):
                warnings.warn(
                    "ts.DataLoader: in_order=False is not applied to a ShardedDataset: its batches come in torch's "
                    "in-order sequence, which state_dict(consumed_batches=...) counts on to resume exactly once",
                    UserWarning,
                    stacklevel=2,
                )
        super().__init__(*bound.args[1:], **bound.kwargs)

    def __iter__(self):
        if not self._whole_units:
            return super().__iter__()
        length = None if self.dataset.cycle else len(self)
        if self._default_context:
            self.multiprocessing_context = direct_context(None)
        # Until a worker claims the new epoch, a checkpoint is its start (not the last epoch's, long finished).
        self.dataset.native.workers_starting()
        items = super().__iter__()
        if self.persistent_workers and (self._kept_workers is None or self._kept_workers() is not items):
            # Persistent workers keep their slabs mapped here between epochs: let go of them once torch's
            # iterator is gone (it stops its workers first).
            weakref.finalize(items, forget_dead_workers)
            self._kept_workers = weakref.ref(items)
        return _Batches(items, self.num_workers, length)
