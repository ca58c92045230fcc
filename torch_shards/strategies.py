"""Sampling strategies: the order of rows in an epoch.

Each strategy maps (number of rows, seed, epoch) to the epoch's plan, a
sequence of row indices that never depends on ranks or workers. The plans
come from the native core (counter-based random numbers and keyed
permutations), so they are identical on every machine.

``indices=`` restricts any strategy to a set of rows (e.g. a train split); the
set is visited in ascending row order, for I/O locality.
"""

from . import _convert
from ._library import ops
from ._native import NativeBacked


class Strategy(NativeBacked):
    """Base class: the parameters of a strategy; its native object
    (torch.classes.torch_shards.Strategy) is built from them."""

    def plan(self, num_rows, seed=0, epoch=0):
        """The whole plan of one epoch for a source of ``num_rows`` rows, as an int64 tensor."""
        return self.native.plan(_convert.check_int("num_rows", num_rows, 1), _convert.check_int("seed", seed), epoch)

    def plan_size(self, num_rows):
        """Number of plan entries per epoch for ``num_rows`` rows."""
        return self.native.plan_size(_convert.check_int("num_rows", num_rows, 1))

    def __repr__(self):
        return self.native.describe()


class Streaming(Strategy):
    """Rows in order. ``shuffle=True`` permutes the samples inside each fetch
    (a shuffle buffer of ``batch_size * fetch_factor`` rows); the fetches stay
    in order."""

    def __init__(self, shuffle=False, indices=None):
        if not isinstance(shuffle, bool):
            raise TypeError(f"Streaming: shuffle must be a bool, got {shuffle!r}")
        self.shuffle = shuffle
        self.indices = _convert.optional_index_tensor("Streaming: indices", indices)
        self._build_now()

    def _build(self):
        return ops.streaming(self.shuffle, self.indices)


class BlockShuffling(Strategy):
    """Contiguous blocks of ``block_size`` rows in a pseudo-random block order
    that changes every epoch; the short final block takes part like any other.
    Samples are also permuted inside each fetch."""

    def __init__(self, block_size=8, indices=None):
        self.block_size = _convert.check_int("BlockShuffling: block_size", block_size)
        self.indices = _convert.optional_index_tensor("BlockShuffling: indices", indices)
        self._build_now()

    def _build(self):
        return ops.block_shuffling(self.block_size, self.indices)


class BlockWeightedSampling(Strategy):
    """Draws ``total_size`` rows (default: the number of rows sampled from) with
    probability proportional to ``weights``.

    ``weights`` has one entry per row of the source, or one per entry of
    ``indices``. With ``block_size > 1`` each group of ``block_size``
    consecutive draws picks one block of ``block_size`` neighbouring rows by
    its total weight, then rows inside it by their weights: reads stay local
    and every draw keeps exactly the target probability.
    ``replacement=False`` draws distinct rows (successive sampling, like
    ``torch.multinomial(replacement=False)``), visited in block order.
    """

    def __init__(self, weights, total_size=None, block_size=1, indices=None, replacement=True):
        self.weights = _convert.weight_tensor("BlockWeightedSampling: weights", weights)
        self.total_size = _convert.optional_int("BlockWeightedSampling: total_size", total_size)
        self.block_size = _convert.check_int("BlockWeightedSampling: block_size", block_size)
        self.indices = _convert.optional_index_tensor("BlockWeightedSampling: indices", indices)
        if not isinstance(replacement, bool):
            raise TypeError(f"BlockWeightedSampling: replacement must be a bool, got {replacement!r}")
        self.replacement = replacement
        self._build_now()

    def _build(self):
        return ops.block_weighted_sampling(
            self.weights, self.total_size, self.block_size, self.indices, self.replacement
        )


class ClassBalancedSampling(Strategy):
    """Weighted sampling with weights inversely proportional to class
    frequency, so every class is drawn equally often in expectation.

    ``labels`` (ints, strings or a pandas categorical) has one entry per row
    of the source, or one per entry of ``indices``; frequencies are counted
    over the rows sampled from. ``classes`` lists the class values when the
    labels were not integers.
    """

    def __init__(self, labels, total_size=None, block_size=1, indices=None):
        self.labels, self.classes = _convert.label_codes("ClassBalancedSampling: labels", labels)
        self.total_size = _convert.optional_int("ClassBalancedSampling: total_size", total_size)
        self.block_size = _convert.check_int("ClassBalancedSampling: block_size", block_size)
        self.indices = _convert.optional_index_tensor("ClassBalancedSampling: indices", indices)
        self._build_now()

    def _build(self):
        return ops.class_balanced_sampling(self.labels, self.total_size, self.block_size, self.indices)
