"""Epoch numbering shared by a dataset and all its DataLoader workers.

The state is a shared-memory int64 tensor: fork children map the same pages,
and spawn/forkserver children receive it through torch's multiprocessing
pickler, so ``set_epoch`` in the main process reaches persistent workers too.
The protocol itself (csrc/core/epoch_state.h) runs natively under a lock.
"""

import torch
from torch.utils.data import get_worker_info

from . import _convert
from ._library import ops

_STATE_WORDS = 128


class EpochCounter:
    def __init__(self):
        self.state = torch.zeros(_STATE_WORDS, dtype=torch.int64).share_memory_()
        ops.epoch_state_init(self.state)
        # Iterations started by this process's copy: with DataLoader's base
        # seed it names the generation of workers this iteration belongs to.
        self.local_iterations = 0

    def claim(self):
        """The epoch of the iteration starting now in this process."""
        info = get_worker_info()
        iteration = self.local_iterations
        self.local_iterations += 1
        if info is None:
            return ops.epoch_state_claim_main(self.state)
        return ops.epoch_state_claim_worker(self.state, info.seed - info.id, iteration, info.num_workers, info.id)

    def set_next(self, epoch):
        ops.epoch_state_set_next(self.state, _convert.check_int("epoch", epoch, 0))

    @property
    def next(self):
        return ops.epoch_state_next(self.state)

    @property
    def last(self):
        """The most recently started epoch, or -1."""
        return ops.epoch_state_last(self.state)
