"""Sampling strategies: the order of rows in an epoch.

Each strategy maps (number of rows, seed, epoch) to the epoch's plan, a
sequence of row indices that never depends on ranks or workers. The plans
come from the native core (counter-based random numbers and keyed
permutations), so they are identical on every machine.

``indices=`` restricts any strategy to a set of rows (e.g. a train split); the
set is visited in ascending row order, for I/O locality.
"""

import numbers
import warnings

import torch

from . import _convert
from ._library import ops
from ._native import NativeBacked


def _indices(who, values):
    """A strategy's ``indices=``: any order is accepted; they are visited in
    ascending row order (for I/O locality), which the warning says when they
    were not sorted (as scDataset warns)."""
    indices = _convert.optional_index_tensor(f"{who}: indices", values)
    if indices is not None and indices.numel() > 1 and bool((indices[1:] < indices[:-1]).any()):
        warnings.warn(
            f"{who}: indices are not sorted; they are visited in ascending row order (sorted reads are what "
            "makes on-disk loading fast), so the order you gave them in is not kept",
            UserWarning,
            stacklevel=3,
        )
    return indices


class Strategy(NativeBacked):
    """Base class of the sampling strategies: the order of rows in an epoch.

    A strategy holds its parameters; its native object
    (``torch.classes.torch_shards.Strategy``, ``strategy.native``) is built from
    them in the constructor, so bad arguments fail there. Give it to a
    ``ShardedDataset`` or a ``DistributedSampler``; ``plan()`` shows what it
    plans. Arguments that depend on the number of rows (``weights``, ``labels``,
    ``indices``) are checked against it when the strategy is given rows.
    """

    def plan(self, num_rows, seed=0, epoch=0):
        """The whole plan of one epoch, for inspection and tests (O(plan size) memory).

        Args:
            num_rows: the number of rows of the source, at least 1.
            seed: the seed, any int that fits in 64 bits. Default 0.
            epoch: the epoch, at least 0. Default 0.

        Returns:
            torch.Tensor: the epoch's row indices in plan order (1-D int64), the
            same on every machine, before it is split among ranks and workers.

        Raises:
            TypeError: an argument is not an int.
            ValueError: ``num_rows`` < 1 or ``epoch`` < 0; the strategy does not
                fit ``num_rows`` rows (e.g. ``weights`` with another length).
        """
        num_rows, seed = _convert.check_int("num_rows", num_rows, 1), _convert.plan_seed("seed", seed)
        return self.native.plan(num_rows, seed, _convert.check_int("epoch", epoch, 0))

    def plan_size(self, num_rows):
        """The number of plan entries per epoch for a source of ``num_rows`` rows.

        Args:
            num_rows: the number of rows of the source, at least 1.

        Raises:
            ValueError: ``num_rows`` < 1, or the strategy does not fit ``num_rows`` rows.
        """
        return self.native.plan_size(_convert.check_int("num_rows", num_rows, 1))

    def __repr__(self):
        return self.native.describe()

    def _for_rows(self, num_rows):
        """This strategy ready for a source of ``num_rows`` rows (a dataset or
        sampler holds what this returns)."""
        return self

    def _for_collection(self, collection):
        """This strategy ready for a collection read in Python (not a torch_shards source)."""
        return self

    def _provide(self, num_rows, seed, epoch):
        """Hands the native strategy what it needs from Python before ``epoch`` is read."""


class Streaming(Strategy):
    """Rows in order.

    Args:
        shuffle: permute the samples inside each fetch (a shuffle buffer of
            ``batch_size * fetch_factor`` rows); the fetches stay in order.
            Default False.
        indices: restrict the strategy to these rows (e.g. a train split): a 1-D
            sequence, numpy array or tensor of distinct row indices, visited in
            ascending row order (a ``UserWarning`` says so when they were not
            sorted). Default None: every row.

    Raises:
        TypeError: ``shuffle`` is not a bool.
        ValueError: ``indices`` empty, not 1-D integers, negative or repeated
            (or, once the strategy is given rows, not below their number).
    """

    def __init__(self, shuffle=False, indices=None):
        self.shuffle = _convert.check_bool("Streaming: shuffle", shuffle)
        self.indices = _indices("Streaming", indices)
        self._build_now()

    def _build(self):
        return ops.streaming(self.shuffle, self.indices)


class BlockShuffling(Strategy):
    """Contiguous blocks of ``block_size`` rows in a pseudo-random block order
    that changes every epoch; the short final block takes part like any other.
    Samples are also permuted inside each fetch.

    Args:
        block_size: rows per block, at least 1. Default 8.
        indices: restrict the strategy to these rows (e.g. a train split): a 1-D
            sequence, numpy array or tensor of distinct row indices, visited in
            ascending row order (a ``UserWarning`` says so when they were not
            sorted). Default None: every row.

    Raises:
        TypeError: ``block_size`` is not an int.
        ValueError: ``block_size`` < 1; ``indices`` empty, not 1-D integers,
            negative or repeated (or, once the strategy is given rows, not
            below their number).
    """

    def __init__(self, block_size=8, indices=None):
        self.block_size = _convert.check_int("BlockShuffling: block_size", block_size)
        self.indices = _indices("BlockShuffling", indices)
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

    Args:
        weights: 1-D non-negative finite weights (a sequence, numpy array or
            tensor), one per row of the source or one per entry of ``indices``;
            not all zero.
        total_size: draws per epoch, at least 1. Default None: the number of
            rows sampled from (all rows, or ``len(indices)``).
        block_size: consecutive draws that share one block of neighbouring
            rows, at least 1. Default 1: every draw independent.
        indices: restrict the strategy to these rows (e.g. a train split): a 1-D
            sequence, numpy array or tensor of distinct row indices, visited in
            ascending row order (a ``UserWarning`` says so when they were not
            sorted). Default None: every row.
        replacement: draw with replacement. Default True. Without, ``total_size``
            must not exceed the number of rows with a positive weight.

    Raises:
        TypeError: ``weights`` are complex; ``total_size`` or ``block_size`` is
            not an int; ``replacement`` is not a bool.
        ValueError: ``weights`` not 1-D numbers, negative, NaN or infinite, all
            zero, or (once given rows) not one per row or per index;
            ``total_size`` or ``block_size`` < 1; ``total_size`` above the rows
            with positive weight when ``replacement=False``; ``indices``
            empty, not 1-D integers, negative or repeated (or, once the
            strategy is given rows, not below their number).
    """

    def __init__(self, weights, total_size=None, block_size=1, indices=None, replacement=True):
        self.weights = _convert.weight_tensor("BlockWeightedSampling: weights", weights)
        self.total_size = _convert.optional_int("BlockWeightedSampling: total_size", total_size)
        self.block_size = _convert.check_int("BlockWeightedSampling: block_size", block_size)
        self.indices = _indices("BlockWeightedSampling", indices)
        self.replacement = _convert.check_bool("BlockWeightedSampling: replacement", replacement)
        self._build_now()

    def _build(self):
        return ops.block_weighted_sampling(
            self.weights, self.total_size, self.block_size, self.indices, self.replacement
        )


class ClassBalancedSampling(Strategy):
    """Weighted sampling with weights inversely proportional to class
    frequency, so every class is drawn equally often in expectation.

    ``labels`` (ints, strings or a pandas categorical) has one entry per row
    of the source, or one per entry of ``indices``. Or ``label_key=`` names a
    field of the dataset's source (for an AnnData source, any obs column:
    categorical, string, integer or boolean), read when the strategy is given
    to a ``ShardedDataset``. ``classes`` lists the class values when the
    labels were not integers.

    Class sizes are counted over every row when the labels cover the whole
    source, even when ``indices`` restricts the draws to a subset (scDataset's
    global balancing: a class keeps its weight in the whole dataset), and
    over the subset when the labels are one per entry of ``indices``. Rows
    whose label is missing (-1: pandas' and anndata's code for a missing
    category) are never drawn; integer labels are otherwise codes >= 0 (a
    label below -1 is refused: it would silently be a class of its own).

    ``smoothing`` in [0, 1] draws each class with probability
    ``(1 - smoothing) / classes + smoothing * class_size / labeled_rows``: 0
    balances the classes, 1 keeps their natural frequencies.

    Args:
        labels: one label per row of the source, or one per entry of
            ``indices``: ints (class codes >= 0, -1 for missing), strings,
            another comparable kind, or a pandas categorical. Exactly one of
            ``labels`` and ``label_key`` is given.
        total_size: draws per epoch, at least 1. Default None: the number of
            rows sampled from (all rows, or ``len(indices)``).
        block_size: consecutive draws that share one block of neighbouring
            rows, at least 1. Default 1.
        indices: restrict the strategy to these rows (e.g. a train split): a 1-D
            sequence, numpy array or tensor of distinct row indices, visited in
            ascending row order (a ``UserWarning`` says so when they were not
            sorted). Default None: every row.
        label_key: the name of a 1-D field of the dataset's source (for an
            AnnData source, an obs column) to read the labels from, or, for a
            collection read in Python, an obs column of that AnnData object.
            Default None.
        smoothing: a number in [0, 1]. Default 0.0 (balanced classes).

    Raises:
        TypeError: ``label_key`` is not a str; ``smoothing`` is not a number;
            ``labels`` mix kinds (ints and strings); ``total_size`` or
            ``block_size`` is not an int.
        ValueError: both or neither of ``labels`` and ``label_key``; ``labels``
            empty, not 1-D, holding NaN or a code below -1, or (once given rows)
            not one per row or per index; every label missing; ``smoothing``
            outside [0, 1]; ``total_size`` or ``block_size`` < 1; a
            ``label_key`` the source has no 1-D field for; ``indices`` empty,
            not 1-D integers, negative or repeated (or, once the strategy is
            given rows, not below their number).
    """

    def __init__(self, labels=None, total_size=None, block_size=1, indices=None, *, label_key=None, smoothing=0.0):
        who = "ClassBalancedSampling"
        if (labels is None) == (label_key is None):
            given = "both" if labels is not None else "neither"
            raise ValueError(
                f"{who}: pass labels= or label_key= (a field or obs column of the source): one of them, got {given}"
            )
        if label_key is not None and not isinstance(label_key, str):
            raise TypeError(f"{who}: label_key must be a str, got {label_key!r}")
        _convert.native_text(who, "label_key", label_key)
        if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real):
            raise TypeError(f"{who}: smoothing must be a number in [0, 1], got {smoothing!r}")
        if not 0.0 <= float(smoothing) <= 1.0:
            raise ValueError(f"{who}: smoothing must be in [0, 1], got {smoothing!r}")
        self.labels, self.classes = (None, None) if labels is None else _convert.label_codes(f"{who}: labels", labels)
        self.label_key = label_key
        self.smoothing = float(smoothing)
        self.total_size = _convert.optional_int(f"{who}: total_size", total_size)
        self.block_size = _convert.check_int(f"{who}: block_size", block_size)
        self.indices = _indices(who, indices)
        self._build_now()

    def _build(self):
        return ops.class_balanced_sampling(
            self.labels, self.total_size, self.block_size, self.indices, self.smoothing, self.label_key
        )

    def _for_collection(self, collection):
        # An AnnData object (in memory or backed) as scDataset's collection: its obs column.
        if self.label_key is None:
            return self
        obs = getattr(collection, "obs", None)
        if obs is None or not hasattr(obs, "columns"):
            raise ValueError(
                f"ClassBalancedSampling: label_key={self.label_key!r} reads a field of a torch_shards source or an obs "
                f"column of an AnnData collection; {type(collection).__name__} has no obs: pass labels="
            )
        if self.label_key not in obs.columns:
            raise ValueError(
                f"ClassBalancedSampling: label_key={self.label_key!r} is not an obs column (columns: "
                f"{list(obs.columns)})"
            )
        return ClassBalancedSampling(
            obs[self.label_key],
            self.total_size,
            self.block_size,
            None if self.indices is None else self.indices.numpy(),
            smoothing=self.smoothing,
        )


class CustomStrategy(Strategy):
    """A plan you compute (scDataset's custom strategies), partitioned across
    ranks and workers, batched, checkpointed and resumed like any other.

    ``plan`` is either the rows of every epoch (a tensor, array or sequence of
    row indices, repeats allowed), or a function ``plan(num_rows, seed, epoch)``
    returning one epoch's rows. The function runs in every process that reads
    (each rank, each DataLoader worker), before the epoch is read, so it must
    depend on its arguments only: draw from a generator seeded with ``seed``
    and ``epoch``. Two calls with the same arguments are compared once, and
    differing plans raise. Every epoch's plan has as many rows as epoch 0's
    (or ``size``, when given).

    ``shuffle=True`` permutes the rows inside each fetch, as the built-in
    strategies do; the plan's order is otherwise kept.

    Args:
        plan: the rows of every epoch (a 1-D tensor, numpy array or sequence of
            row indices, at least one, repeats allowed), or a function
            ``plan(num_rows, seed, epoch)`` returning one epoch's rows.
        shuffle: permute the rows inside each fetch. Default False.
        size: for a plan function, the number of rows each epoch's plan has
            (at least 1). Default None: the length of epoch 0's plan, known once
            the strategy is given rows (a ``ShardedDataset`` or
            ``DistributedSampler``).

    Raises:
        TypeError: ``shuffle`` is not a bool; ``size`` is not an int.
        ValueError: a fixed plan that is empty, not 1-D integers, or (once
            given rows) holds a row outside the source; ``size`` with a fixed
            plan, or ``size`` < 1; a plan function that returns different rows
            for the same arguments, or no rows.

    Example:
        ```python
        import numpy as np
        import torch_shards as ts


        def every_other_row(num_rows, seed, epoch):
            rng = np.random.default_rng([seed, epoch])
            return rng.permutation(np.arange(0, num_rows, 2))


        strategy = ts.CustomStrategy(every_other_row)
        assert strategy.plan_size(10) == 5
        ```
    """

    def __init__(self, plan, *, shuffle=False, size=None):
        who = "CustomStrategy"
        self.shuffle = _convert.check_bool(f"{who}: shuffle", shuffle)
        if callable(plan) and not isinstance(plan, torch.Tensor):
            self.function, self.rows = plan, None
            self.size = _convert.optional_int(f"{who}: size", size, 1)
            self.description = getattr(plan, "__qualname__", type(plan).__qualname__)
        else:
            if size is not None:
                raise ValueError(f"{who}: size= is for a plan function; a fixed plan has its own length")
            self.function, self.rows, self.size = None, _convert.index_tensor(f"{who}: plan", plan), None
            self.description = ""
        if self.function is None or self.size is not None:
            self._build_now()

    def _build(self):
        if self.function is not None and self.size is None:
            raise ValueError(
                "CustomStrategy: the size of a plan function's plans is known once it is given rows: use it in a "
                "ShardedDataset or DistributedSampler, or pass size="
            )
        return ops.custom_strategy(self.rows, self.size, self.shuffle, self.description)

    def _rows_of(self, num_rows, seed, epoch):
        rows = self.function(num_rows, seed, epoch)
        return _convert.index_tensor(f"CustomStrategy: the plan {self.description}({num_rows}, {seed}, {epoch})", rows)

    def _for_rows(self, num_rows):
        if self.function is None or self.size is not None:
            return self
        first, again = self._rows_of(num_rows, 0, 0), self._rows_of(num_rows, 0, 0)
        if not torch.equal(first, again):
            raise ValueError(
                f"CustomStrategy: {self.description}({num_rows}, 0, 0) returned different rows when called twice: "
                "every rank and DataLoader worker calls it, so it must depend on (num_rows, seed, epoch) only (draw "
                "from e.g. numpy.random.default_rng([seed, epoch]), not from global random state)"
            )
        if len(first) == 0:
            raise ValueError(f"CustomStrategy: {self.description}({num_rows}, 0, 0) returned no rows")
        return CustomStrategy(self.function, shuffle=self.shuffle, size=len(first))

    def _provide(self, num_rows, seed, epoch):
        if self.function is not None:
            self.native.provide(epoch, self._rows_of(num_rows, seed, epoch), num_rows)

    def plan(self, num_rows, seed=0, epoch=0):
        """The whole plan of one epoch, as ``Strategy.plan``; a plan function is called for it
        (first twice with ``(num_rows, 0, 0)``, to check that it depends on its arguments only).

        Args:
            num_rows: the number of rows of the source, at least 1.
            seed: the seed, any int that fits in 64 bits. Default 0.
            epoch: the epoch. Default 0.

        Raises:
            TypeError: an argument is not an int.
            ValueError: ``num_rows`` < 1; the plan holds a row outside ``[0, num_rows)``; a plan
                function returns no rows, different rows for the same arguments, or a plan of
                another size than epoch 0's.
        """
        strategy = self._for_rows(_convert.check_int("num_rows", num_rows, 1))
        seed = _convert.plan_seed("seed", seed)
        strategy._provide(num_rows, seed, _convert.check_int("epoch", epoch))
        return strategy.native.plan(num_rows, seed, epoch)

    def plan_size(self, num_rows):
        """The number of plan entries per epoch: the fixed plan's length, ``size``, or the length
        of what a plan function returns for ``(num_rows, 0, 0)``.

        Args:
            num_rows: the number of rows of the source, at least 1.
        """
        return self._for_rows(_convert.check_int("num_rows", num_rows, 1)).native.plan_size(num_rows)
