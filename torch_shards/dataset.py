"""ShardedDataset: the IterableDataset that streams a source through a strategy,
partitioned exactly once across ranks and DataLoader workers."""

import os
import warnings

import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _convert
from ._library import classes
from ._native import NativeBacked
from .distributed import covers, resolve_group, resolve_rank_and_world_size, resolve_seed
from .epochs import EpochCounter
from .monitor import DeliveryCounters
from .sources import Source, TensorSource
from .strategies import Strategy

_EVEN_BATCHES = {"pad": "pad", "drop": "drop", None: "none"}
_POLL_MS = 100


def _slice_rows(data, start, stop):
    if isinstance(data, dict):
        return {key: _slice_rows(value, start, stop) for key, value in data.items()}
    if isinstance(data, torch.Tensor) and data.layout == torch.sparse_csr:
        stop = min(stop, data.shape[0])
        offsets = data.crow_indices()
        first, last = int(offsets[start]), int(offsets[stop])
        return torch.sparse_csr_tensor(
            offsets[start : stop + 1] - first,
            data.col_indices()[first:last],
            data.values()[first:last],
            (stop - start, data.shape[1]),
            check_invariants=False,  # checked natively when read
        )
    return data[start:stop]


def _output_memory(in_worker, pin_memory):
    """Where a reader assembles its batches. A DataLoader worker's batches go to
    the main process: shared memory that torch sends by file descriptor as it is
    (with the "file_system" strategy torch copies into its own segments, so plain
    memory). In-process: pinned when asked for, else recycled pageable memory."""
    if in_worker:
        return "shared" if torch.multiprocessing.get_sharing_strategy() == "file_descriptor" else "pageable"
    return "pinned" if pin_memory else "pageable"


def _available_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ShardedDataset(IterableDataset, NativeBacked):
    """Batches of ``source`` rows in the order ``strategy`` plans, each rank and
    DataLoader worker delivering its own share exactly once per epoch.

    Use with ``DataLoader(ds, batch_size=None, num_workers=k)``. Every batch is
    a dict of tensors with an ``"index"`` int64 tensor of global row indices.

    Args:
        source: a torch_shards source, or a tensor / dict of tensors (wrapped in
            a TensorSource).
        strategy: Streaming, BlockShuffling, BlockWeightedSampling or
            ClassBalancedSampling.
        batch_size: rows per batch.
        fetch_factor: batches read together in one fetch (one sorted read,
            then shuffled across its batches for shuffling strategies).
        drop_last: drop the epoch's single short batch, if any.
        even_batches: "pad" (short ranks repeat one batch), "drop" (long ranks
            drop one) or None (uneven; for single-process or evaluation).
        seed: base seed; None draws one (rank 0's, broadcast over the process
            group when one is initialised).
        rank, world_size: explicit, else the process group, else the
            RANK/WORLD_SIZE environment variables, else 0 and 1.
        process_group: the torch.distributed group the ranks belong to (default:
            the default group, when initialised). At construction the ranks
            agree on the seed and check, over this group, that they all read
            the same data with the same arguments; loading never communicates.
        num_threads: native threads reading for one process (None: this
            process's CPUs shared among the DataLoader workers).
        prefetch: units (fetches) read ahead by the native threads while the
            training loop runs; 0 reads each one when it is asked for.
        prefetch_bytes: queued bytes beyond which no new unit is started (one
            unit is always allowed): memory stays bounded by this budget plus
            one unit per thread, whatever the dataset's size.
        pin_memory: assemble batches in (recycled) pinned host memory, for fast
            asynchronous copies to the GPU. In the process iterating the dataset
            (num_workers=0); a no-op, with a warning, when torch has no CUDA.
        fetch_transform: called on each unit read at once (a fetch, or a lone
            batch at the epoch's tail) as a dict of tensors; must keep the rows
            (their number and order) and return a dict or something sliceable.
        batch_transform: called on each batch before it is yielded.

    The epoch advances at every new iteration, also inside DataLoader workers
    (persistent or not, fork or spawn); ``set_epoch(e)`` pins the next one.
    """

    def __init__(
        self,
        source,
        strategy,
        *,
        batch_size,
        fetch_factor=16,
        drop_last=False,
        even_batches="pad",
        seed=None,
        rank=None,
        world_size=None,
        process_group=None,
        num_threads=None,
        prefetch=2,
        prefetch_bytes=1 << 30,
        pin_memory=False,
        fetch_transform=None,
        batch_transform=None,
    ):
        super().__init__()
        if isinstance(source, (torch.Tensor, dict)):
            source = TensorSource(source)
        if not isinstance(source, Source):
            raise TypeError(f"ShardedDataset: source must be a torch_shards source, got {type(source).__name__}")
        if not isinstance(strategy, Strategy):
            raise TypeError(f"ShardedDataset: strategy must be a torch_shards strategy, got {type(strategy).__name__}")
        if even_batches not in _EVEN_BATCHES:
            raise ValueError(f"ShardedDataset: even_batches must be 'pad', 'drop' or None, got {even_batches!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"ShardedDataset: drop_last must be a bool, got {drop_last!r}")
        for name, function in (("fetch_transform", fetch_transform), ("batch_transform", batch_transform)):
            if function is not None and not callable(function):
                raise TypeError(f"ShardedDataset: {name} must be callable, got {function!r}")
        self.source = source
        self.strategy = strategy
        self.batch_size = _convert.check_int("ShardedDataset: batch_size", batch_size, 1)
        self.fetch_factor = _convert.check_int("ShardedDataset: fetch_factor", fetch_factor, 1)
        self.drop_last = drop_last
        self.even_batches = even_batches
        group = resolve_group(process_group)
        self.rank, self.world_size = resolve_rank_and_world_size(rank, world_size, group=group)
        self.num_threads = _convert.optional_int("ShardedDataset: num_threads", num_threads, 1)
        self.prefetch = _convert.check_int("ShardedDataset: prefetch", prefetch, 0)
        self.prefetch_bytes = _convert.check_int("ShardedDataset: prefetch_bytes", prefetch_bytes, 0)
        if not isinstance(pin_memory, bool):
            raise TypeError(f"ShardedDataset: pin_memory must be a bool, got {pin_memory!r}")
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "ShardedDataset: pin_memory=True has no effect: this torch has no CUDA device, batches stay in "
                "pageable memory",
                stacklevel=2,
            )
            pin_memory = False
        self.pin_memory = pin_memory
        self.fetch_transform = fetch_transform
        self.batch_transform = batch_transform
        # The ranks share the group only if it is exactly their set of ranks.
        group = group if covers(group, self.rank, self.world_size) else None
        self.seed = resolve_seed(seed, group)
        self._epochs = EpochCounter()
        self._counters = DeliveryCounters()
        self._readers = []
        self._build_now()  # validates the whole configuration here
        if group is not None and self.world_size > 1:
            self._native_object.check_consistency(group.group_name)

    def _build(self):
        return classes.ShardedDataset(
            self.source.native,
            self.strategy.native,
            self.batch_size,
            self.fetch_factor,
            self.drop_last,
            _EVEN_BATCHES[self.even_batches],
            self.seed,
            self.rank,
            self.world_size,
        )

    def __len__(self):
        """Batches this rank yields per epoch, all DataLoader workers together."""
        return self.native.num_batches()

    @property
    def epoch(self):
        """The most recently started epoch (-1 before the first iteration)."""
        return self._epochs.last

    def set_epoch(self, epoch):
        """Pins the epoch of the next iteration; later ones count on from it."""
        self._epochs.set_next(epoch)

    def __iter__(self):
        # Claim the epoch now, not at the first next(): a DataLoader worker
        # calls iter() once per generation, at start-up.
        epoch = self._epochs.claim()
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        threads = self.num_threads or max(1, _available_cpus() // num_workers)
        memory = _output_memory(in_worker=info is not None, pin_memory=self.pin_memory)
        reader = self.native.reader(epoch, worker, num_workers, threads, self.prefetch, self.prefetch_bytes, memory)
        return self._batches(reader, DeliveryCounters.MAIN if info is None else worker)

    def _batches(self, reader, slot):
        transform = self.batch_transform
        counters = self._counters
        self._readers.append(reader)  # from the first next(): a generator never started has no finally
        try:
            if self.fetch_transform is None:  # batches cut natively
                while True:
                    # Short waits: a KeyboardInterrupt is handled between them.
                    batches = reader.poll_batches(_POLL_MS)
                    if batches is None:
                        continue
                    if not batches:
                        return
                    for batch in batches:
                        counters.add(slot, batch["index"].shape[0])
                        yield batch if transform is None else transform(batch)
            batch_size = self.batch_size
            while (unit := reader.next()) is not None:
                rows = unit["index"].shape[0]
                data = self.fetch_transform(unit)
                for start in range(0, rows, batch_size):
                    batch = _slice_rows(data, start, start + batch_size)
                    counters.add(slot, min(batch_size, rows - start))
                    yield batch if transform is None else transform(batch)
        finally:
            # Ended, broken out of, deleted or interrupted: stop the reader threads now.
            reader.close()
            self._readers = [active for active in self._readers if active is not reader]

    def reader_stats(self):
        """Counters of this process's active iterations, one dict each: units,
        rows and bytes delivered, queue_depth, in_flight, wait_us (time the
        loop waited for data), read_us, threads and thread<k>_units."""
        return [dict(reader.stats()) for reader in self._readers]

    def __getstate__(self):
        state = super().__getstate__()
        state["_readers"] = []
        return state

    def __repr__(self):
        return self.native.describe()
