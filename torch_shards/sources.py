"""Sources: row-addressable datasets read by the native core.

A source pickles by its parameters and builds its native object lazily in
each process, so no handle ever crosses a fork.
"""

import abc

import torch

from ._library import ops


class Source(abc.ABC):
    def __init__(self):
        self._native_object = None

    @abc.abstractmethod
    def _build(self):
        """Builds the native source (torch.classes.torch_shards.Source)."""

    def _build_now(self):
        """Builds the native object in the constructor, so bad arguments fail there."""
        self._native_object = self._build()

    @property
    def native(self):
        if self._native_object is None:
            self._native_object = self._build()
        return self._native_object

    def __len__(self):
        return self.native.num_rows()

    @property
    def fields(self):
        """Names of the fields each batch carries (besides "index")."""
        return list(self.native.field_names())

    def read(self, rows):
        """The given rows, in the given order, as a dict of tensors."""
        return dict(self.native.read(torch.as_tensor(rows, dtype=torch.int64).reshape(-1)))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_native_object"] = None
        return state

    def __repr__(self):
        return self.native.describe()


class TensorSource(Source):
    """Rows of in-memory tensors: ``TensorSource(x)`` gives field ``"X"``;
    ``TensorSource({"X": x, "y": y})`` one field per key. All tensors need the
    same first dimension (the rows); rows are gathered with ATen."""

    def __init__(self, tensors):
        super().__init__()
        if isinstance(tensors, torch.Tensor):
            tensors = {"X": tensors}
        if not isinstance(tensors, dict):
            raise TypeError(f"TensorSource: expected a tensor or a dict of tensors, got {type(tensors).__name__}")
        for name, value in tensors.items():
            if not isinstance(name, str):
                raise TypeError(f"TensorSource: field names must be str, got {name!r}")
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"TensorSource: field {name!r} must be a tensor, got {type(value).__name__}")
        self.tensors = dict(tensors)
        self._build_now()

    def _build(self):
        return ops.tensor_source(self.tensors)
