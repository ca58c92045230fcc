"""ShardedDataset: the IterableDataset that streams a source through a strategy,
partitioned exactly once across ranks and DataLoader workers.

A thin door onto torch.classes.torch_shards.ShardedDataset (``ds.native``),
which decides everything: epochs, rank / world size / seed, the split among
DataLoader workers, batching and read-ahead. This module only does what needs
Python: DataLoader's worker info, Python transforms, interrupt-friendly
waiting, and carrying the native object's shared state into worker processes.
"""

import multiprocessing
import numbers
import os
import sys
import warnings

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _convert
from ._library import direct, ops
from ._native import NativeBacked
from .device import device_name
from .distributed import boxed, rank_from_dist_info, resolve_group
from .sources import RowsSource, Source, TensorSource
from .strategies import Strategy
from .transfer import Batch, PackedUnits

_POLL_MS = 100
# What one item of ts.DataLoader's workers carries, units taken until it holds this much: torch's per-item
# cost (~0.5 ms of CPU over the two processes' Python: fetch, queue, pickling, its profiler hooks) is then
# small beside the batches it brings (at batch 256 of 64 float32 columns, 4 MiB items cost 0.3 of the 2
# CPUs of our test machine, 16 MiB 0.08), while an epoch of ~100 MB still crosses in several items that
# overlap reading and consuming (benchmarks/workers.py: 16 MiB read 0.67-0.71 of in-process, 4 MiB 0.56-0.61).
_ITEM_BYTES = 16 << 20
# An epoch's first item: one unit (1 MiB or less); the next ones twice as large each, up to _ITEM_BYTES. The
# loop then starts once one unit is read, not 16 MiB (TensorSource at batch 256: first batch 5 -> 1.5 ms).
_FIRST_ITEM_BYTES = 1 << 20


def _shares_by_descriptor():
    """Whether torch sends a worker's shared-memory batches by file descriptor,
    as they are (else, with the "file_system" strategy, it copies them into its
    own segments, and batches are better assembled in plain memory)."""
    return torch.multiprocessing.get_sharing_strategy() == "file_descriptor"


def _wait(iterator):
    """Waits for the iterator's next batch in short steps, so that Ctrl-C is
    handled between them."""
    while not iterator.wait(_POLL_MS):
        pass


def _closer(iterator):
    """What stops the iterator's reader threads once its generator ends, however it ends. Bound when the
    generator starts: an iterator left unfinished at interpreter exit (in a global) ends while Python
    finalizes, when a call into the native object would import torch again and fail (sys.meta_path is
    gone); then nothing is called, and the native iterator stops its threads as it is freed."""
    finalizing = sys.is_finalizing

    def close():
        if not finalizing():
            iterator.close()

    return close


def _is_array_like(value):
    return isinstance(value, (torch.Tensor, np.ndarray))


def _native_source(source, fetch_callback, batch_callback):
    """(the native-readable source, the collection fetched in Python or None)."""
    if isinstance(source, Source):
        if fetch_callback is not None or batch_callback is not None:
            raise ValueError(
                "ShardedDataset: fetch_callback and batch_callback fetch rows from a collection in Python; a "
                f"torch_shards source ({type(source).__name__}) is read natively: pass the collection (an array, "
                "AnnData, any indexable) as the source, or transform the batches with fetch_transform / "
                "batch_transform"
            )
        return source, None
    if isinstance(source, (str, bytes, os.PathLike)):
        # Else a str is a collection of its characters (len() and indexing): "cells.h5ad" read as 10 rows.
        raise TypeError(
            f"ShardedDataset: source is a path ({source!r}), not a source: did you mean torch_shards.open(path)? "
            f"e.g. ShardedDataset(torch_shards.open({os.fsdecode(source)!r}), strategy, batch_size=...)"
        )
    callbacks = fetch_callback is not None or batch_callback is not None
    if not callbacks and isinstance(source, dict):
        # A dict is read as fields (name -> rows); as a collection its len() would be its number of keys.
        for key, value in source.items():
            if not _is_array_like(value):
                raise TypeError(
                    f"ShardedDataset: source is a dict of fields, whose values must be tensors or numpy arrays with "
                    f"one row per sample (all of one length), but {key!r} is a {type(value).__name__}: pass "
                    f"np.asarray(...) or torch.as_tensor(...) of it, or give a fetch_callback that reads the dict"
                )
    if not callbacks and (_is_array_like(source) or isinstance(source, dict)):
        return TensorSource(source), None
    if not hasattr(source, "__getitem__") or not hasattr(source, "__len__"):
        raise TypeError(
            "ShardedDataset: source must be a torch_shards source, a tensor, a numpy array, a dict of them, or a "
            f"collection supporting len() and indexing by an array of rows, got {type(source).__name__}"
        )
    name = f"{type(source).__module__}.{type(source).__qualname__}"
    return RowsSource(len(source), name), source


def _positions_in_sorted(rows):
    """(rows sorted, for each row its position among the sorted rows)."""
    order = torch.argsort(rows, stable=True)
    positions = torch.empty_like(order)
    positions[order] = torch.arange(len(order))
    return rows[order], positions


def _as_unit(result):
    if not isinstance(result, dict) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in result.items()
    ):
        raise TypeError(
            "ShardedDataset: fetch_transform must return a dict of tensors (field name -> tensor whose first "
            f"dimension is the unit's rows), got {type(result).__name__}"
        )
    return result


def _python_state(native):
    """The native checkpoint with its segments as one list of
    [world_size, num_workers, consumed...] entries, so that its keys never
    change (torch.distributed.checkpoint loads into the keys a fresh
    state_dict() has)."""
    flat = dict(native)
    segments = []
    for i in range(flat.pop("segments")):
        prefix = f"segment.{i}."
        world_size, num_workers = flat.pop(prefix + "world_size"), flat.pop(prefix + "num_workers")
        if prefix + "consumed" in flat:
            consumed = [flat.pop(prefix + "consumed")]
        else:
            consumed = [flat.pop(f"{prefix}consumed.{rank}") for rank in range(world_size)]
        segments.append([world_size, num_workers, *consumed])
    flat["segments"] = segments
    return flat


def flat_state_dict(state):
    """A ``ShardedDataset.state_dict()`` in the form the TorchScript and C++
    doors take and give (``torch.classes.torch_shards.ShardedDataset``'s
    ``load_state_dict``, C++ ``StateDict``): a flat dict of ints, the segments
    as ``segments`` (their number) and ``segment.<i>.*`` keys. Python's
    ``load_state_dict`` takes either form; a flat state is returned checked.

    Args:
        state: a ``ShardedDataset.state_dict()``, or a state already flat.

    Returns:
        dict[str, int]: the flat state.

    Raises:
        TypeError: ``state`` is not a dict, or a value is not an int.
        ValueError: ``state`` has no ``segments`` of either form, or a segment
            is not ``[world_size, num_workers, consumed...]``.
    """
    return _native_state(state, "flat_state_dict")


def _native_state(state, who="ShardedDataset.load_state_dict"):
    if not isinstance(state, dict):
        raise TypeError(f"{who}: expected a dict from state_dict(), got {type(state).__name__}")
    if isinstance(state.get("segments"), numbers.Integral) and not isinstance(state["segments"], bool):
        # Already flat: a state of the TorchScript or C++ door.
        return {key: _convert.check_int(f"{who}: {key}", value) for key, value in state.items()}
    if not isinstance(state.get("segments"), (list, tuple)):
        raise ValueError(
            f"{who}: the state's 'segments' must be a list of [world_size, num_workers, consumed...] (or, "
            f"flat, their number), got {state.get('segments', 'none')!r}: is it a state_dict() of a ShardedDataset?"
        )
    flat = {}
    for key, value in state.items():
        if key == "segments":
            continue
        flat[key] = _convert.check_int(f"{who}: {key}", value)
    flat["segments"] = len(state["segments"])
    for i, segment in enumerate(state["segments"]):
        if not isinstance(segment, (list, tuple)) or len(segment) < 3:
            raise ValueError(f"{who}: segments[{i}] must be [world_size, num_workers, consumed...], got {segment!r}")
        world_size, num_workers, *consumed = (_convert.check_int(f"{who}: segments[{i}]", value) for value in segment)
        flat[f"segment.{i}.world_size"], flat[f"segment.{i}.num_workers"] = world_size, num_workers
        if len(consumed) == 1:
            flat[f"segment.{i}.consumed"] = consumed[0]
        else:
            for rank, count in enumerate(consumed):
                flat[f"segment.{i}.consumed.{rank}"] = count
    return flat


def _generation_name(info):
    """What every worker of one DataLoader iterator sees alike, and workers of
    another iterator do not: torch's base seed (info.seed - info.id), which
    users fix (torch.manual_seed, generator=), mixed with where the iterator's
    worker processes start in their parent's count of processes (a worker's
    multiprocessing identity minus its id: torch creates an iterator's workers
    one after the other, under fork, spawn and forkserver alike). With the
    base seed alone, a retry after a worker failed to start, or two loaders
    with one generator, took the same name and mixed their epochs."""
    identity = multiprocessing.current_process()._identity
    start = identity[-1] - info.id if identity else 0
    name = ((info.seed - info.id) ^ (start * 0x9E3779B97F4A7C15)) & (2**64 - 1)
    return name - 2**64 if name >= 2**63 else name


class ShardedDataset(IterableDataset, NativeBacked):
    """Batches of ``source`` rows in the order ``strategy`` plans, each rank and
    DataLoader worker delivering its own share exactly once per epoch.

    Use with ``DataLoader(ds, batch_size=None, num_workers=k)``. Every batch is
    a dict of tensors with an ``"index"`` int64 tensor of global row indices.
    A native source's batches are views of one recycled storage per fetch: a
    field kept past the step keeps the whole fetch alive (``.clone()`` what you
    collect).

    Args:
        source: a torch_shards source, or a tensor, numpy array or dict of
            them (wrapped in a TensorSource), or any collection supporting
            ``len()`` and indexing by an array of rows (scDataset's
            ``data_collection``: AnnData, a list, ...), which is fetched in
            Python: each fetch as ``collection[sorted_rows]`` (or
            ``fetch_callback``), each batch as ``fetched[positions]`` (or
            ``batch_callback``); such batches are whatever the collection
            returns (no ``"index"``).
        strategy: Streaming, BlockShuffling, BlockWeightedSampling,
            ClassBalancedSampling or CustomStrategy.
        batch_size: rows per batch, at least 1 (required, keyword-only, as
            every argument after ``strategy``).
        fetch_factor: batches read together in one fetch (one sorted read,
            then shuffled across its batches for shuffling strategies), at
            least 1. Default 16.
        drop_last: drop the epoch's single short batch, if any. Default False.
        even_batches: "pad" (short ranks repeat one batch), "drop" (long ranks
            drop one) or None (uneven; for single-process or evaluation).
            Default "pad".
        seed: base seed, any int that fits in 64 bits. Default None: one is
            drawn (rank 0's, broadcast over the process group when one is
            initialised); ``ds.seed`` tells which.
        rank: this process's rank, in [0, world_size). Default None: the
            process group's, else the RANK environment variable, else 0.
        world_size: the number of ranks. Default None: the process group's,
            else the WORLD_SIZE environment variable, else 1 (a world_size
            above 1 with no rank from any of these is refused).
        process_group: the torch.distributed group the ranks belong to (default:
            the default group, when initialised). At construction the ranks
            agree on the seed and check, over this group, that they all read
            the same data with the same arguments; loading never communicates.
        num_threads: native threads reading for one process, in [1, 256].
            Default None: this process's CPUs shared among the DataLoader
            workers; at least 32 for sources reading URLs, whose threads
            mostly wait on round trips.
        prefetch: units (fetches) read ahead by the native threads while the
            training loop runs, in [0, 1024]; 0 reads each one when it is
            asked for. Default None: two per thread, so that every thread has
            a unit to read while finished ones wait their turn.
        prefetch_bytes: queued bytes beyond which no new unit is started (one
            unit is always allowed), at least 0: memory stays bounded by this
            budget plus one unit per thread, whatever the dataset's size.
            Default ``1 << 30`` (1 GiB).
        pin_memory: assemble batches in (recycled) pinned host memory, for fast
            asynchronous copies to the GPU. In the process iterating the dataset
            (num_workers=0); a no-op, with a warning, when torch has no CUDA.
            Default False.
        fetch_transform: called on each unit read at once (a fetch, or the
            batches of one fetch this worker delivers at the epoch's tail) as a
            dict of tensors; must return a dict of tensors with the same rows
            (their number and order). Default None.
        batch_transform: called on each batch before it is yielded. Default
            None.
        fetch_callback: ``fetch_callback(collection, sorted_rows)`` fetches a
            unit's rows (a sorted int64 numpy array, repeats allowed) from a
            collection source (scDataset's signature). Default None:
            ``collection[sorted_rows]``.
        batch_callback: ``batch_callback(fetched, positions)`` cuts a batch
            out of what was fetched (positions: an int64 numpy array).
            Default None: ``fetched[positions]``.
        cycle: an endless stream (wsistream's step-based training): epochs
            follow each other inside one iteration, each still exactly once
            across ranks and workers with equal batch counts per rank.
            ``len()`` then raises TypeError, as for any endless dataset.
            Default False.
        dist_info: annbatch's argument: "torch" (the defaults of ``rank`` and
            ``world_size`` above), "jax" (jax.process_index() and
            jax.process_count()) or a callable returning (rank, world_size);
            not together with ``rank`` or ``world_size``. Default None: "torch".
        device: None keeps batches on the host; "cuda", "cuda:N" or a
            torch.device delivers every field on that GPU (iterated in this
            process): assembled in pinned memory, copied on a side stream,
            and the current stream waits for the copy (no host sync).
            DataLoader workers' batches arrive on the host: wrap the loader in
            ts.DeviceLoader(loader, device). "cpu" is the host. Default None.
        worker_transport: how a DataLoader worker's batches reach the
            training process. "handles" (default): the worker assembles them
            in recycled shared-memory slabs and each batch crosses torch's
            queue as a few bytes; the training process maps each slab once
            and gets a plain dict of tensor views (no copy, no shared-memory
            segment or file descriptor per batch, nothing in /dev/shm). It
            opens the workers' memory through /proc/<pid>/fd: where that is
            not allowed (another user, a hardened kernel) the first batch
            raises, saying so. "torch": each batch crosses as torch sends
            tensors (fresh shared memory per fetch, a descriptor per
            storage): several times slower per batch. A custom collate_fn
            or a batch_transform returning other than a dict gets tensors
            that cross the torch way in either case.

    Raises:
        TypeError: ``source`` is a path (open it with ``torch_shards.open``) or
            neither a source, an array, a dict of arrays nor an indexable
            collection; ``strategy`` is not a torch_shards strategy; an integer
            argument is not an int, a flag not a bool; a transform or callback
            is not callable; ``device`` is not None, a str or a torch.device.
        ValueError: ``batch_size`` or ``fetch_factor`` < 1; ``even_batches``,
            ``worker_transport`` or ``dist_info`` not one of the values above;
            ``rank`` outside [0, world_size), or a world_size above 1 without a
            rank; ``num_threads``, ``prefetch`` or ``prefetch_bytes`` out of
            range; ``device`` "cuda" without CUDA, or not a device name;
            ``fetch_callback`` / ``batch_callback`` with a torch_shards source;
            ``process_group`` a part of the job's processes with ``seed=None``;
            the strategy does not fit the source (e.g. ``weights`` of another
            length); over a process group, ranks that disagree on the data,
            the arguments or the seed given.

    The epoch advances at every new iteration, also inside DataLoader workers
    (persistent or not, fork or spawn); ``set_epoch(e)`` pins the next one.
    ``state_dict()`` / ``load_state_dict()`` checkpoint and resume mid-epoch,
    on any topology (see their docs).
    ``ds.native`` is the script object (torch.classes.torch_shards.ShardedDataset)
    for TorchScript.

    Example:
        ```python
        import torch
        import torch_shards as ts

        source = ts.TensorSource({"X": torch.randn(1000, 16), "y": torch.arange(1000)})
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=8), batch_size=64, seed=0)
        loader = ts.DataLoader(dataset, num_workers=0)
        for batch in loader:
            assert batch["X"].shape[1] == 16 and batch["index"].dtype == torch.int64
        assert len(loader) == len(dataset) == 16
        ```
    """

    worker_transport = "handles"  # copies pickled before the option existed

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
        prefetch=None,
        prefetch_bytes=1 << 30,
        pin_memory=False,
        fetch_transform=None,
        batch_transform=None,
        fetch_callback=None,
        batch_callback=None,
        cycle=False,
        dist_info=None,
        device=None,
        worker_transport="handles",
    ):
        super().__init__()
        if not isinstance(strategy, Strategy):
            raise TypeError(f"ShardedDataset: strategy must be a torch_shards strategy, got {type(strategy).__name__}")
        if even_batches is not None and not isinstance(even_batches, str):
            raise ValueError(f"ShardedDataset: even_batches must be 'pad', 'drop' or None, got {even_batches!r}")
        drop_last = _convert.check_bool("ShardedDataset: drop_last", drop_last)
        pin_memory = _convert.check_bool("ShardedDataset: pin_memory", pin_memory)
        cycle = _convert.check_bool("ShardedDataset: cycle", cycle)
        callbacks = (
            ("fetch_transform", fetch_transform),
            ("batch_transform", batch_transform),
            ("fetch_callback", fetch_callback),
            ("batch_callback", batch_callback),
        )
        for name, function in callbacks:
            if function is not None and not callable(function):
                raise TypeError(f"ShardedDataset: {name} must be callable, got {function!r}")
        self.source, self.collection = _native_source(source, fetch_callback, batch_callback)
        # A plan function's strategy learns its plans' size from the source's rows.
        if self.collection is not None:
            strategy = strategy._for_collection(self.collection)
        self.strategy = strategy._for_rows(len(self.source))
        self.batch_size = _convert.check_int("ShardedDataset: batch_size", batch_size)
        self.fetch_factor = _convert.check_int("ShardedDataset: fetch_factor", fetch_factor)
        self.drop_last = drop_last
        self.even_batches = even_batches
        self._seed = _convert.optional_seed("ShardedDataset: seed", seed)
        rank, world_size = rank_from_dist_info("ShardedDataset", dist_info, rank, world_size)
        self.rank = _convert.optional_int("ShardedDataset: rank", rank)
        self.world_size = _convert.optional_int("ShardedDataset: world_size", world_size)
        self.num_threads = _convert.optional_int("ShardedDataset: num_threads", num_threads)
        self.prefetch = _convert.optional_int("ShardedDataset: prefetch", prefetch)
        self.prefetch_bytes = _convert.check_int("ShardedDataset: prefetch_bytes", prefetch_bytes)
        self.pin_memory = pin_memory
        self.fetch_transform = fetch_transform
        self.batch_transform = batch_transform
        self.fetch_callback = fetch_callback
        self.batch_callback = batch_callback
        self.cycle = cycle
        self.device = device_name("ShardedDataset", device)
        if worker_transport not in ("handles", "torch"):
            raise ValueError(f"ShardedDataset: worker_transport must be 'handles' or 'torch', got {worker_transport!r}")
        self.worker_transport = worker_transport
        self._shared_state = None
        # The native object resolves rank, world size and seed (agreeing over
        # the group) and checks everything; copies in worker processes are
        # rebuilt from the resolved values and share its epoch state.
        # A process_group that is a part of the job with seed=None is refused there too.
        group = resolve_group(process_group, "ShardedDataset")
        native = self._native_object = self._build(process_group=group)
        self.rank, self.world_size = native.rank(), native.world_size()
        # The seed the ranks agreed on; with seed=None and no process group yet, this process's
        # draw, which the first iteration replaces by the ranks' agreed one (or refuses, see __iter__).
        self._seed = native.seed()
        self._shared_state = native.shared_state()
        if pin_memory and not native.pin_memory():
            warnings.warn(
                "ShardedDataset: pin_memory=True has no effect: this torch has no CUDA device, batches stay in "
                "pageable memory",
                stacklevel=2,
            )
        device_warning = native.device_warning()
        if device_warning:
            warnings.warn(device_warning, stacklevel=2)

    def _build(self, process_group=None):
        return ops.sharded_dataset(
            self.source.native,
            self.strategy.native,
            self.batch_size,
            fetch_factor=self.fetch_factor,
            drop_last=self.drop_last,
            even_batches=self.even_batches,
            seed=self._seed,
            rank=self.rank,
            world_size=self.world_size,
            process_group=boxed(process_group),
            num_threads=self.num_threads,
            prefetch=self.prefetch,
            prefetch_bytes=self.prefetch_bytes,
            pin_memory=self.pin_memory,
            shared_state=self._shared_state,
            # A DataLoader worker's copy hands host batches over (ts.DeviceLoader copies them).
            device=None if get_worker_info() is not None else self.device,
        )

    def __len__(self):
        """Batches this rank yields per epoch, all DataLoader workers together.

        Raises:
            TypeError: the dataset is endless (``cycle=True``): use ``batches_per_epoch()``.
        """
        if self.cycle:
            raise TypeError(
                "ShardedDataset(cycle=True) is endless: it has no len(); batches_per_epoch() gives one epoch's"
            )
        return self.native.num_batches()

    def batches_per_epoch(self):
        """Batches this rank yields per epoch (also with cycle=True)."""
        return self.native.num_batches()

    @property
    def seed(self):
        """The seed every process reading this dataset uses: the one given, the ranks' agreed one, or
        the one of a loaded checkpoint (loaded here, or in DataLoader workers by torchdata's
        StatefulDataLoader)."""
        return self.native.seed()

    @property
    def epoch(self):
        """int: The most recently started epoch (-1 before the first iteration)."""
        return self.native.epoch()

    def set_epoch(self, epoch):
        """Pins the epoch of the next iteration; later ones count on from it.

        Calling it every epoch, as torch's ``DistributedSampler`` requires, is
        harmless: without it the epoch advances at every new iteration.

        Args:
            epoch: the epoch, in [0, 2**62].

        Raises:
            TypeError: ``epoch`` is not an int.
            ValueError: ``epoch`` is out of range.
        """
        self.native.set_epoch(_convert.check_int("ShardedDataset: epoch", epoch))

    def __iter__(self):
        # In a DataLoader worker the epoch is claimed now, not at the first
        # next(): a worker calls iter() once per generation, at start-up. In
        # the training process, at the first next() (_in_process_epochs).
        info = get_worker_info()
        if info is None:
            return self._in_process_epochs()
        generation = _generation_name(info)
        # worker_transport="handles": batches are assembled in recycled slabs and yielded as transfer.Batch,
        # which crosses to the main process as a handle (transfer.py). A collection fetched in Python
        # yields what the collection returns: it crosses the torch way.
        handles = self.worker_transport == "handles" and self.collection is None
        shared = handles or _shares_by_descriptor()
        # Whole units: asked for by ts.DataLoader (its worker_init_fn), whose loop splits them again.
        whole = getattr(self, "_whole_units", False) and self.batch_transform is None
        # A persistent worker (persistent_workers=True) sends the next epoch too: it never marks its last batch
        # as the last, so the main process keeps its slabs mapped between epochs rather than mapping them again
        # (~10% of an epoch of TensorSource at batch 256). ts.DataLoader says so at start-up; under torch's
        # DataLoader, a worker iterating the dataset again is one.
        sends_again = self.cycle or getattr(self, "_persistent_worker", False) or getattr(self, "_iterated", False)
        self._iterated = True
        crossing = (whole, self.cycle, sends_again) if handles else None

        def start(stream_start):
            # An endless loop deals each epoch as DataLoader's round robin takes it (stream_start:
            # the batches the loop took before it), so that each epoch is one run of the loop.
            return self.native.iter_worker(
                info.id, info.num_workers, generation, shared, handles, stream_start if self.cycle else None
            )

        return self._epochs(self._started(start, 0), start, crossing)

    def _in_process_epochs(self):
        """Iterated in the process that trains: the epoch is claimed at the first next(), as a
        sampler's generator starts, so that an iterator made and dropped unused takes none
        (StatefulDataLoader makes one when it restores the state of a finished epoch)."""

        # native.iter() agrees on the seed over a process group initialised since this dataset was built.
        def start(stream_start):
            return self.native.iter()

        yield from self._epochs(self._started(start, 0), start)

    def _started(self, start, stream_start):
        iterator = start(stream_start)
        # A plan computed in Python is handed over before the epoch is read.
        self.strategy._provide(len(self.source), self.native.seed(), iterator.epoch())
        return iterator

    def _epochs(self, iterator, start, crossing=None):
        """Epoch after epoch (one unless cycle=True): the first one's iterator, then each started by
        start(stream_start), the batches the rank's loop took before it. crossing: (whole units,
        endless, sends again after this iteration) for a worker whose batches cross as handles, else None."""
        stream_start = 0
        while True:
            if self.collection is not None:
                yield from self._collection_batches(iterator)
            else:
                yield from self._batches(iterator, crossing)
            if not self.cycle:
                return
            stream_start += iterator.rank_batches()
            iterator = self._started(start, stream_start)
            if iterator.rank_batches() == 0:  # a fresh epoch: so would be every one after it
                iterator.close()
                raise ValueError(
                    f"ShardedDataset(cycle=True): rank {self.native.rank()} of {self.native.world_size()} gets no "
                    f"batch in an epoch ({self.native.plan_size()} plan entries, batch_size={self.batch_size}, "
                    f"even_batches={self.even_batches!r}): the endless loop would spin without ever yielding one. "
                    "Use fewer ranks, a smaller batch_size or even_batches='pad'"
                )

    def _collection_batches(self, iterator):
        """Batches of a collection fetched in Python: the native side deals the units and cuts them
        into batches (as positions into the unit's sorted rows); Python only fetches."""
        collection, fetch_callback, batch_callback = self.collection, self.fetch_callback, self.batch_callback
        if fetch_callback is None and isinstance(collection, (list, tuple)):  # refused when iterated, as scDataset
            raise TypeError(
                f"ShardedDataset: a {type(collection).__name__} cannot be indexed by an array of rows: pass "
                "np.asarray(source) (or a tensor), or a fetch_callback(collection, rows) that gathers its items (and a "
                "batch_callback(fetched, positions) for what it returns)"
            )
        fetch_transform, batch_transform = self.fetch_transform, self.batch_transform
        close = _closer(iterator)
        handle, poll = direct.iterator_handle(iterator), direct.poll
        fetched = None
        try:
            while True:
                if iterator.pending() == 0:
                    _wait(iterator)
                    unit = iterator.next_unit()
                    if unit is None:
                        return
                    rows, positions = _positions_in_sorted(unit["index"])
                    rows = rows.numpy()
                    fetched = collection[rows] if fetch_callback is None else fetch_callback(collection, rows)
                    if fetch_transform is not None:
                        fetched = fetch_transform(fetched)
                    iterator.push_unit({"index": unit["index"], "position": positions})
                batch = poll(handle, _POLL_MS)
                if batch is None:
                    if iterator.finished():
                        return
                    continue
                positions = batch["position"].numpy()
                out = fetched[positions] if batch_callback is None else batch_callback(fetched, positions)
                if batch_transform is not None:
                    out = batch_transform(out)
                # A dict becomes a Batch, which DataLoader's auto-collation refuses (transfer.py); it crosses
                # from workers the torch way (its memory is the collection's, not a slab).
                yield Batch(out) if type(out) is dict else out
        finally:
            close()

    def _batches(self, iterator, crossing=None):
        fetch_transform, batch_transform = self.fetch_transform, self.batch_transform
        # poll: torch_shards._C's, which skips torch.classes' dispatch (~3 us a batch).
        handle, poll = direct.iterator_handle(iterator), direct.poll
        close = _closer(iterator)
        whole, endless, sends_again = crossing if crossing is not None else (False, False, False)
        left = iterator.num_batches()  # after the last one, the main process may let go of this worker's slabs
        # Items in flight (torch's prefetch_factor, one in the loop, one being packed) stay within
        # prefetch_bytes, beside the reader's own read-ahead.
        item_bytes = 0 if fetch_transform is not None else min(_ITEM_BYTES, self.prefetch_bytes // 4)
        ramp = _FIRST_ITEM_BYTES
        try:
            while True:
                if fetch_transform is not None and iterator.pending() == 0:
                    _wait(iterator)
                    unit = iterator.next_unit()
                    if unit is None:
                        return
                    iterator.push_unit(_as_unit(fetch_transform(unit)))
                if whole:
                    # The unit under way and the next ones, packed natively as one item (only the
                    # unit under way when it was transformed here: the next are not yet).
                    packed = direct.poll_packed(handle, _POLL_MS, min(ramp, item_bytes), sends_again)
                    if packed is None:
                        if iterator.finished():
                            return
                        continue
                    ramp *= 2
                    yield PackedUnits(packed, endless)
                    continue
                # Short waits: Ctrl-C is handled between them.
                batch = poll(handle, _POLL_MS)
                if batch is None:
                    if iterator.finished():
                        return
                    continue
                if crossing is None:
                    yield batch if batch_transform is None else batch_transform(batch)
                    continue
                left -= 1
                if batch_transform is not None:
                    batch = batch_transform(batch)
                    if not isinstance(batch, dict):  # anything else crosses the torch way
                        yield batch
                        continue
                    if not isinstance(batch, Batch):
                        batch = Batch(batch)
                if left == 0 and not sends_again:
                    batch.last = True
                yield batch
        finally:
            # Ended, broken out of, deleted or interrupted: stop the reader threads now.
            close()

    def state_dict(self, consumed_batches=None):
        """A checkpoint of this rank's position: a small dict of ints (epoch,
        seed, the segments the epoch ran on, the topology it was taken on, and
        fingerprints of the data, strategy and batch arguments).

        Iterated in this process, the batches the loop consumed are counted.
        With DataLoader workers, pass ``consumed_batches`` (the batches the loop
        consumed this epoch: it always knows its step; DataLoader's default
        ``in_order=True``), or use torchdata's ``StatefulDataLoader``, which
        asks each worker for its own state (after it restored them, this
        process's ``consumed_batches`` counts from where they resumed, and
        ``seed`` is theirs). With torch's DataLoader, take it
        once the epoch's first batch came: until its workers claim the new
        epoch, the count is the last epoch's (``ts.DataLoader`` says when its
        workers start, so there a state at step 0 is the new epoch's start).
        Under DDP, ranks step in lockstep: any one rank's state is enough.

        Args:
            consumed_batches: the batches the training loop consumed this epoch
                (with DataLoader workers). Default None: those this process's
                iteration delivered.

        Returns:
            dict: ints, and ``segments``, a list of ``[world_size, num_workers,
            consumed...]`` lists (``flat_state_dict`` gives the flat form of the
            C++ and TorchScript doors). Save it with ``torch.save`` or
            ``torch.distributed.checkpoint``.

        Raises:
            TypeError: ``consumed_batches`` is not an int.
            ValueError: ``consumed_batches`` is negative or more than this rank
                delivers this epoch, or is given for an endless dataset
                (``cycle=True``).
        """
        consumed = _convert.optional_int("ShardedDataset.state_dict: consumed_batches", consumed_batches)
        if self.cycle and consumed is not None:
            raise ValueError(
                "ShardedDataset.state_dict: consumed_batches counts an epoch run in DataLoader workers, but an "
                "endless loop (cycle=True) in workers has no checkpoint: its workers run into the next epoch while "
                "the loop is still in this one. Iterate in the training process (num_workers=0), where the dataset "
                "counts what the loop consumed, or use epochs (cycle=False)"
            )
        return _python_state(self.native.state_dict(consumed))

    def load_state_dict(self, state):
        """Resumes from ``state_dict()`` on this dataset's topology, whatever
        the number of ranks and workers it was taken on: the next iteration
        delivers each batch of the epoch not consumed yet exactly once across
        the ranks, then epochs go on. The dataset takes the state's seed. For
        ranks not in lockstep (``even_batches=None``), pass the list of every
        rank's state.

        Args:
            state: a ``state_dict()`` (either form, see ``flat_state_dict``), or
                the list of every rank's state.

        Raises:
            TypeError: ``state`` is not a dict (or a list of dicts), or a value
                is not an int.
            ValueError: ``state`` is not a state of a ShardedDataset, or it was
                taken on other data, another strategy or other batch arguments
                (the message names what differs).
        """
        if isinstance(state, (list, tuple)):
            native = ops.merge_state_dicts([_native_state(part) for part in state])
        else:
            native = _native_state(state)
        self.native.load_state_dict(native)

    def reader_stats(self):
        """Counters of this process's active iterations.

        Returns:
            list[dict[str, int]]: one dict per unfinished iteration: units, rows
            and bytes delivered, queue_depth, in_flight, wait_us (time the loop
            waited for data), wakes (times the reader threads woke the loop
            as units became ready), read_us, threads (started so far: an epoch after
            one whose reads ended waiting on no request starts the CPUs' share,
            and the others once a read waits) and thread<k>_units (each thread
            of the iteration), among others.
        """
        return [dict(stats) for stats in self.native.reader_stats()]

    def delivery_counts(self):
        """Batches and rows delivered, per DataLoader worker and in this process.

        Returns:
            torch.Tensor: int64 of shape [257, 2]: (batches, rows) delivered by
            DataLoader worker 0, 1, ... (fork or spawn, persistent or not; rows
            of workers that never ran are zero), the last row by the process
            iterating in place.
        """
        return self.native.delivery_counts()

    def __repr__(self):
        return self.native.describe()
