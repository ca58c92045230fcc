"""DistributedSampler: a drop-in for torch.utils.data.distributed.DistributedSampler
that also partitions any torch_shards strategy (weighted ones included).

A thin door onto torch.classes.torch_shards.DistributedSampler (``sampler.native``),
which produces the indices natively, in chunks.
"""

import itertools
import warnings

from torch.utils.data import Sampler

from . import _convert
from ._library import ops
from ._native import NativeBacked
from .distributed import boxed, rank_from_dist_info, resolve_group
from .strategies import Strategy

# Indices are produced natively in chunks of this many, then yielded as ints.
_CHUNK = 1 << 16


class DistributedSampler(Sampler, NativeBacked):
    """Same arguments and layout as torch's DistributedSampler: the epoch's plan
    is padded by wrapping around (or trimmed, with ``drop_last``) to a multiple
    of ``num_replicas`` and rank ``r`` takes every ``num_replicas``-th entry
    from position ``r``.

    Without ``strategy`` the plan is ``range(len(dataset))`` (``shuffle=False``,
    identical to torch's output) or a pseudo-random permutation of it computed
    in O(1) memory (``shuffle=True``). With ``strategy=`` the plan is that
    strategy's (``shuffle`` is then unused).

    The epoch advances by itself once an iteration was exhausted (an
    iteration broken out of, or restarted by a ``StatefulDataLoader``, replays
    its epoch); ``set_epoch(e)`` pins the next one, so code that calls it every
    epoch, as torch requires, keeps working. That is the one intended
    difference from torch's sampler, which repeats epoch 0 without set_epoch.
    ``num_replicas``/``rank`` default to the process group, then the
    RANK/WORLD_SIZE environment variables, then 1 and 0 (``num_replicas``
    above 1 with no rank from any of them is refused, as torch's sampler
    does). With a process group
    (``process_group=``, default: the default group) the ranks check at
    construction that they sample the same dataset length, strategy and seed.
    ``dist_info`` (annbatch's argument): "torch" (the default above), "jax" or
    a callable returning (rank, num_replicas).

    Args:
        dataset: anything with ``len()`` (a map-style dataset); its length is
            read once, here.
        num_replicas: the number of ranks, in [1, 2**20]. Default None: the
            process group's, else WORLD_SIZE, else 1.
        rank: this process's rank, in [0, num_replicas). Default None: the
            process group's, else RANK, else 0.
        shuffle: without ``strategy``, a pseudo-random permutation (True) or
            ``range(len(dataset))`` (False). Default True.
        seed: the seed, the same on every rank (an int that fits in 64 bits).
            Default 0.
        drop_last: trim the plan to a multiple of ``num_replicas`` instead of
            padding it. Default False.
        strategy: a torch_shards strategy whose plan is sampled instead.
            Default None.
        process_group: the torch.distributed group the ranks belong to.
            Default None: the default group, when initialised.
        dist_info: "torch", "jax" or a callable returning (rank, num_replicas);
            not together with ``num_replicas`` or ``rank``. Default None:
            "torch".

    Raises:
        TypeError: ``dataset`` has no ``len()``; ``strategy`` is not a
            torch_shards strategy; ``seed`` is None or not an int;
            ``num_replicas`` or ``rank`` is not an int; ``process_group`` is
            not a ProcessGroup.
        ValueError: ``num_replicas`` out of range; ``rank`` outside
            [0, num_replicas); ``num_replicas`` above 1 without a rank; a bad
            ``dist_info``; the strategy does not fit ``len(dataset)`` rows;
            over a process group, ranks that disagree on the length, the
            strategy or the seed.

    Example:
        ```python
        import torch_shards as ts

        sampler = ts.DistributedSampler(range(10), num_replicas=2, rank=1, shuffle=False)
        assert list(sampler) == [1, 3, 5, 7, 9]
        ```
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
        dist_info=None,
    ):
        if strategy is not None and not isinstance(strategy, Strategy):
            raise TypeError(
                f"DistributedSampler: strategy must be a torch_shards strategy, got {type(strategy).__name__}"
            )
        self.dataset = dataset
        self.num_rows = len(dataset)
        rank, num_replicas = rank_from_dist_info("DistributedSampler", dist_info, rank, num_replicas)
        self.num_replicas = _convert.optional_int("DistributedSampler: num_replicas", num_replicas)
        self.rank = _convert.optional_int("DistributedSampler: rank", rank)
        self.shuffle = bool(shuffle)
        if seed is None:  # torch's sampler needs one as well: every replica must draw the same permutation
            raise TypeError("DistributedSampler: seed must be an int (the same on every replica), got None")
        self.seed = _convert.optional_seed("DistributedSampler: seed", seed)
        self.drop_last = bool(drop_last)
        # A plan function's strategy learns its plans' size from the dataset's length.
        self.strategy = None if strategy is None else strategy._for_collection(dataset)._for_rows(self.num_rows)
        self._progress = None
        native = self._native_object = self._build(process_group=resolve_group(process_group, "DistributedSampler"))
        self.num_replicas, self.rank = native.num_replicas(), native.rank()
        if native.topology_source() == "environment" and self.num_replicas > 1:
            _warn_once_without_group(self.num_replicas)
        self.num_samples = native.num_samples()
        self.total_size = native.total_size()
        self.plan_size = native.plan_size()

    def _build(self, process_group=None):
        return ops.distributed_sampler(
            self.num_rows,
            num_replicas=self.num_replicas,
            rank=self.rank,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
            strategy=None if self.strategy is None else self.strategy.native,
            process_group=boxed(process_group),
        )

    @property
    def epoch(self):
        """int: The epoch of the current (or last) iteration; assigning it calls ``set_epoch``."""
        return self.native.epoch()

    @epoch.setter
    def epoch(self, epoch):  # code written for torch's sampler may assign it
        self.set_epoch(epoch)

    def __iter__(self):
        iterator = self.native.iter()
        if self.strategy is not None:  # a plan computed in Python is handed over before the epoch is read
            self.strategy._provide(self.num_rows, self.native.seed(), iterator.epoch())
        progress = self._progress = _Progress(iterator)
        # Chained list iterators: the per-index cost is C-level, like iterating a list.
        return itertools.chain.from_iterable(progress.chunks())

    def __len__(self):
        """Indices the next iteration yields (a loaded checkpoint's rest, or a whole epoch)."""
        return self.native.length()

    def state_dict(self, consumed_samples=None):
        """A checkpoint (a dict of ints): epoch, seed and the plan entries all
        ranks consumed this epoch. Under DDP any one rank's state is enough:
        ranks consume in lockstep.

        Args:
            consumed_samples: the indices this rank's loop consumed in the
                current iteration. Default None: those its iterator yielded
                (with DataLoader workers they run ahead by the prefetched
                batches, so pass the loop's count).

        Returns:
            dict[str, int]: the checkpoint.

        Raises:
            TypeError: ``consumed_samples`` is not an int.
            ValueError: ``consumed_samples`` is negative or more than the iteration yields.
        """
        if consumed_samples is None:
            consumed_samples = 0 if self._progress is None else self._progress.yielded()
        consumed = _convert.check_int("DistributedSampler.state_dict: consumed_samples", consumed_samples)
        return dict(self.native.state_dict(consumed))

    def load_state_dict(self, state):
        """Resumes from ``state_dict()`` with any ``num_replicas``: the next
        iteration yields the plan entries not consumed yet, in torch's layout
        over them. The sampler takes the state's seed.

        Args:
            state: a ``state_dict()`` of a DistributedSampler.

        Raises:
            TypeError: ``state`` is not a dict, or a value is not an int.
            ValueError: ``state`` is not a DistributedSampler state, or it was
                taken on another dataset length, plan or strategy.
        """
        if not isinstance(state, dict):
            raise TypeError(f"DistributedSampler.load_state_dict: expected a dict, got {type(state).__name__}")
        who = "DistributedSampler.load_state_dict"
        self.native.load_state_dict({key: _convert.check_int(f"{who}: {key}", value) for key, value in state.items()})
        self.seed = self.native.seed()
        self._progress = None

    def set_epoch(self, epoch):
        """Pins the epoch of the next iteration; later ones count on from it.

        Args:
            epoch: the epoch, in [0, 2**62].

        Raises:
            TypeError: ``epoch`` is not an int.
            ValueError: ``epoch`` is out of range.
        """
        self.native.set_epoch(_convert.check_int("DistributedSampler: epoch", epoch))

    def __getstate__(self):
        """A copy (deepcopy, pickle) carries this sampler's position as its checkpoint: the epoch, the
        seed and what the current iteration yielded, so that the copy's next iteration goes on from
        there as a resumed one would (the native object itself is rebuilt, never copied)."""
        state = super().__getstate__()
        state["_progress"] = None
        state["_position"] = self.state_dict()
        return state

    def __setstate__(self, state):
        position = state.pop("_position", None)
        self.__dict__.update(state)
        if position is not None:
            self.native.load_state_dict(position)


_warned_without_group = False


def _warn_once_without_group(num_replicas):
    """torch's sampler raises without a process group; this one reads RANK / WORLD_SIZE, and says so once."""
    global _warned_without_group
    if not _warned_without_group:
        _warned_without_group = True
        warnings.warn(
            f"DistributedSampler: num_replicas={num_replicas} and rank come from the RANK / WORLD_SIZE environment "
            "variables, but no torch.distributed process group is initialised, so the ranks cannot check that they "
            "sample the same dataset with the same arguments (torch's DistributedSampler raises here). Initialise "
            "the process group first, or pass num_replicas and rank.",
            stacklevel=3,
        )


class _Progress:
    """An iteration's chunks, and how many indices of them were taken."""

    def __init__(self, iterator):
        self.iterator = iterator
        self.before = 0  # indices of the chunks before the current one
        self.current = iter(())
        self.length = 0

    def chunks(self):
        while (indices := self.iterator.next(_CHUNK)) is not None:
            self.before += self.length
            chunk = indices.tolist()
            self.current, self.length = iter(chunk), len(chunk)
            yield self.current

    def yielded(self):
        return self.before + self.length - self.current.__length_hint__()
