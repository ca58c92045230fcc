"""Batches crossing from a DataLoader worker to the main process as the few
shared storages they view, described by a small int64 tensor
(csrc/loader/transfer.h): packed natively in the worker, rebuilt natively
(views, no copy) when the main process unpickles them. Shared memory the
worker recycles is leased to the main process until its last view of a batch
is gone, so a batch the loop still holds is never overwritten."""

from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from ._library import ops


class Packed:
    """What a DataLoader worker yields: one batch, or every batch of a unit
    (``whole``), as packed by the native iterator. The main process unpickles
    it as that batch (a dict of tensors), or as a :class:`Unit`."""

    __slots__ = ("storages", "description", "names", "whole", "endless")

    def __init__(self, packed, whole, endless):
        self.storages, self.description, self.names = packed
        self.whole, self.endless = whole, endless

    def __reduce__(self):
        if self.whole:
            return (_unpack_unit, (self.storages, self.description, self.names, self.endless))
        return (_unpack_batch, (self.storages, self.description, self.names))


def _unpack_batch(storages, description, names):
    batches, _, _ = ops.unpack_batches(storages, description, names)
    return batches[0]


def _unpack_unit(storages, description, names, endless):
    batches, worker, worker_batches = ops.unpack_batches(storages, description, names)
    return Unit(batches, worker, None if endless else worker_batches)


class Unit:
    """Every batch of one unit (a fetch) as one DataLoader item: what
    ts.DataLoader's workers send. ``worker`` sent it; ``worker_batches`` are
    the batches each worker delivers this epoch (None for an endless
    stream)."""

    __slots__ = ("batches", "worker", "worker_batches")

    def __init__(self, batches, worker, worker_batches):
        self.batches, self.worker, self.worker_batches = batches, worker, worker_batches

    def pin_memory(self, device=None):
        """DataLoader(pin_memory=True) pins every batch (its pin-memory thread calls this)."""
        return Unit([_pin_memory(batch, device) for batch in self.batches], self.worker, self.worker_batches)
