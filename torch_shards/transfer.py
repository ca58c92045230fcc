"""How a ShardedDataset's batches cross from DataLoader workers to the main
process (worker_transport="handles", the default).

A worker assembles its batches in recycled shared-memory slabs
(csrc/loader/shared_slab.h) and yields each one as a :class:`Batch`: an
ordinary dict of tensors that, when torch pickles it onto its queue, becomes
a few bytes describing the slabs it views (csrc/loader/transfer.h). The main
process maps each slab once and rebuilds the batch as a plain dict of tensor
views, no copy; a slab is reused only once every view of it there is gone
(leases), so a batch the loop keeps is never overwritten.

The decision is explicit: the Batch type, made by the dataset in a worker.
torch's DataLoader passes it through unchanged (``batch_size=None``, whose
``default_convert`` copies the dict, type and all); whatever a custom
``collate_fn`` or a wrapping dataset makes of it crosses the torch way
(torch then copies the slab's memory out, and the worker never reuses it).
Auto-collation (a DataLoader ``batch_size``) is refused through
``default_collate``'s documented extension table."""

import functools

from torch.utils.data import get_worker_info
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from ._library import direct

_BATCH_SIZE_NONE = (
    "ShardedDataset yields whole batches: create the DataLoader with batch_size=None, e.g. "
    "DataLoader(dataset, batch_size=None, num_workers=k) (the dataset's batch_size= sets the batch size); "
    "with DataLoader's default batch_size=1 every batch would come wrapped in a batch of one"
)


def refuse_auto_collation():
    """The ValueError DataLoader's auto-collation (batch_size not None) of our batches gets."""
    return ValueError(_BATCH_SIZE_NONE)


class Batch(dict):
    """A batch as the dataset yields it: a dict of tensors. Made in a
    DataLoader worker, its tensors view a recycled slab and it crosses to the
    main process as a handle; the main process receives a plain dict.
    ``last``: the worker's iteration sends nothing after it."""

    last = False

    def __copy__(self):
        # DataLoader's default_convert (batch_size=None) copies the dict: the copy still crosses as a handle.
        copied = Batch(self)
        if self.last:
            copied.last = True
        return copied

    def __reduce__(self):
        # Outside a DataLoader worker (torch.save, deepcopy in the training process): a plain dict.
        packed = direct.pack((self,), -1, (), self.last) if get_worker_info() is not None else None
        if packed is None:  # or a value that is not a plain CPU tensor (a batch_transform's): the torch way
            return (dict, (dict(self),))
        return (_unpack_batch, packed)


direct.set_batch_type(Batch)


def _unpack_batch(description, names, others):
    batches, _, _ = direct.unpack(description, names, others)
    return batches[0]


class PackedUnits:
    """What a worker of ts.DataLoader yields: the batches of one or more units
    (fetches), packed already in the worker (``direct.poll_packed``), crossing
    as one handle; the main process receives a :class:`Unit`. Made only where
    ts.DataLoader sends it straight to torch's queue: if it were dropped
    instead, its slabs would never be reused (safe, never overwritten)."""

    __slots__ = ("packed", "endless")

    def __init__(self, packed, endless):
        self.packed, self.endless = packed, endless

    def __reduce__(self):
        return (_unpack_unit, (*self.packed, self.endless))


def _unpack_unit(description, names, others, endless):
    batches, worker, worker_batches = direct.unpack_lazy(description, names, others)
    return Unit(functools.partial(direct.take, batches), worker, None if endless else worker_batches)


class Unit:
    """Every batch of one unit (a fetch) as one DataLoader item: what
    ts.DataLoader's workers send. ``take()`` gives its next batch (a dict of
    tensors), None after the last: each is made when it is taken, so that a
    unit of many batches makes no more Python objects than the one in the
    loop. ``worker`` sent it; ``worker_batches`` are the batches each worker
    delivers this epoch (None for an endless stream)."""

    __slots__ = ("take", "worker", "worker_batches")

    def __init__(self, take, worker, worker_batches):
        self.take, self.worker, self.worker_batches = take, worker, worker_batches

    def pin_memory(self, device=None):
        """DataLoader(pin_memory=True) pins every batch (its pin-memory thread calls this)."""
        pinned = [_pin_memory(batch, device) for batch in iter(self.take, None)]
        return Unit(functools.partial(next, iter(pinned), None), self.worker, self.worker_batches)


def _refuse_collating(batch, *, collate_fn_map=None):
    raise refuse_auto_collation()


def _register_collation_refusal():
    """default_collate (DataLoader's batch_size not None) finds our Batch in its documented table of
    per-type collate functions: it raises in the worker, and torch re-raises it in the loop."""
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # a torch without the table: the worker's collation fails on its own
        return
    default_collate_fn_map[Batch] = _refuse_collating


_register_collation_refusal()


def mapped_slabs():
    """{"maps", "mapped", "mapped_bytes"}: slabs of DataLoader workers this process has mapped so far, and
    those it keeps mapped now (their bytes)."""
    return direct.mapped_slabs()


def forget_dead_workers():
    """Unmaps the slabs of DataLoader workers that have exited (done by itself the next time a worker's slab
    is first mapped, and by ts.DataLoader once its persistent workers are gone)."""
    direct.forget_dead_workers()


__all__ = ["Batch", "PackedUnits", "Unit", "mapped_slabs", "forget_dead_workers", "refuse_auto_collation"]
