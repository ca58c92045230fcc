"""DistributedSampler: a drop-in for torch.utils.data.distributed.DistributedSampler
that also partitions any torch_shards strategy (weighted ones included)."""

import itertools
import math

from torch.utils.data import Sampler

from . import _convert
from .distributed import check_same_on_all_ranks, covers, resolve_group, resolve_rank_and_world_size
from .strategies import BlockShuffling, Strategy, Streaming

# Indices are produced natively in chunks of this many, then yielded as ints.
_CHUNK = 1 << 16


class DistributedSampler(Sampler):
    """Same arguments and layout as torch's DistributedSampler: the epoch's plan
    is padded by wrapping around (or trimmed, with ``drop_last``) to a multiple
    of ``num_replicas`` and rank ``r`` takes every ``num_replicas``-th entry
    from position ``r``.

    Without ``strategy`` the plan is ``range(len(dataset))`` (``shuffle=False``,
    identical to torch's output) or a pseudo-random permutation of it computed
    in O(1) memory (``shuffle=True``). With ``strategy=`` the plan is that
    strategy's (``shuffle`` is then unused).

    The epoch advances at every ``__iter__``; ``set_epoch(e)`` pins the next one
    (so code that calls it every epoch, as torch requires, keeps working).
    ``num_replicas``/``rank`` default to the process group, then the
    RANK/WORLD_SIZE environment variables, then 1 and 0. With a process group
    (``process_group=``, default: the default group) the ranks check at
    construction that they sample the same dataset length, strategy and seed.
    """

    def __init__(
        self,
        dataset,
        num_replicas=None,
        rank=None,
        shuffle=True,
        seed=0,
        drop_last=False,
        *,
        strategy=None,
        process_group=None,
    ):
        group = resolve_group(process_group)
        rank, num_replicas = resolve_rank_and_world_size(rank, num_replicas, who="DistributedSampler", group=group)
        if strategy is not None and not isinstance(strategy, Strategy):
            raise TypeError(
                f"DistributedSampler: strategy must be a torch_shards strategy, got {type(strategy).__name__}"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.seed = _convert.check_int("DistributedSampler: seed", seed)
        self.drop_last = bool(drop_last)
        self.num_rows = len(dataset)
        if self.num_rows < 1:
            raise ValueError("DistributedSampler: the dataset is empty (len(dataset) == 0)")
        if strategy is None:
            strategy = BlockShuffling(block_size=1) if self.shuffle else Streaming()
        self.strategy = strategy
        self.plan_size = strategy.plan_size(self.num_rows)
        if self.drop_last and self.plan_size % self.num_replicas != 0:
            self.num_samples = math.ceil((self.plan_size - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(self.plan_size / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.epoch = 0
        self._next_epoch = 0
        if covers(group, rank, num_replicas) and num_replicas > 1:
            check_same_on_all_ranks(self._fingerprint(), group, "DistributedSampler")

    def _fingerprint(self):
        return (
            f"rows: {self.num_rows}\nstrategy: {self.strategy!r}\nplan entries: {self.plan_size}\n"
            f"num_replicas: {self.num_replicas}\nseed: {self.seed}\ndrop_last: {self.drop_last}"
        )

    def __iter__(self):
        self.epoch = self._next_epoch
        self._next_epoch += 1
        # Chained list iterators: the per-index cost is C-level, like iterating a list.
        return itertools.chain.from_iterable(self._chunks(self.epoch))

    def _chunks(self, epoch):
        native = self.strategy.native
        for first in range(0, self.num_samples, _CHUNK):
            count = min(_CHUNK, self.num_samples - first)
            start = self.rank + first * self.num_replicas
            yield native.strided(self.num_rows, self.seed, epoch, start, self.num_replicas, count).tolist()

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self._next_epoch = _convert.check_int("DistributedSampler: epoch", epoch, 0)
        self.epoch = self._next_epoch
