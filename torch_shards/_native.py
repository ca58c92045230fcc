"""The pattern every Python wrapper of a native object follows."""

import abc
import errno
import os

_NOT_FOUND = "[Errno 2] No such file or directory: '"


def native_call(who, function, *args, **kwargs):
    """Calls a native function; a missing file (the native FileNotFound,
    which reaches Python as a RuntimeError with FileNotFoundError's text)
    raises FileNotFoundError naming ``who`` and the path."""
    try:
        return function(*args, **kwargs)
    except RuntimeError as error:
        message = str(error)
        if not message.startswith(_NOT_FOUND):
            raise
        path = message[len(_NOT_FOUND) :].split("'", 1)[0]
        raise FileNotFoundError(errno.ENOENT, f"{who}: {os.strerror(errno.ENOENT)}", path) from None


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
        self._native_object = native_call(type(self).__name__, self._build)

    @property
    def native(self):
        """The native object of this process."""
        if self._native_object is None:
            self._native_object = native_call(type(self).__name__, self._build)
        return self._native_object

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_native_object"] = None
        return state
