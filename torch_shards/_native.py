"""The pattern every Python wrapper of a native object follows."""

import abc


class NativeBacked(abc.ABC):
    """Holds the user's parameters and builds its torch.classes.torch_shards
    object from them: in the constructor (so bad arguments fail there), and
    again, lazily, in any process it is pickled to (native objects never
    cross processes; DataLoader workers rebuild their own)."""

    _native_object = None

    @abc.abstractmethod
    def _build(self):
        """Builds the native object from the parameters."""

    def _build_now(self):
        self._native_object = self._build()

    @property
    def native(self):
        """The native object of this process."""
        if self._native_object is None:
            self._native_object = self._build()
        return self._native_object

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_native_object"] = None
        return state
