"""Argument checks and conversions shared by the Python wrappers.

Every check raises ValueError (or TypeError for a wrong kind of object) naming
the parameter and the value, before anything reaches the native core.
"""

import numbers

import numpy as np
import torch


def check_int(name, value, minimum=None):
    """An int the native side can hold (int64), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name} must be < 2**63 (a 64-bit integer), got {value}")
    return value


def check_bool(name, value):
    """A bool (numpy's too), as a Python bool; not an int that happens to be 0 or 1."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def optional_int(name, value, minimum=None):
    return None if value is None else check_int(name, value, minimum)


def optional_seed(name, value):
    """A seed as the native int64: any int in [-2**63, 2**64), values from
    2**63 on wrapping around (so unsigned 64-bit seeds work)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{name} must fit in 64 bits, got {value}")
    return value - 2**64 if value >= 2**63 else value


def plan_seed(name, value):
    """A plan's seed: what a dataset or sampler takes (optional_seed), not None."""
    if value is None:
        raise TypeError(f"{name} must be an int, got None")
    return optional_seed(name, value)


def native_text(who, what, text):
    """A path or name as the native side takes it: a str of valid UTF-8 without NUL characters.

    torch hands str arguments to C++ as UTF-8 and rejects a str holding surrogate escapes (what
    os.fsdecode and os.listdir give for a file name that is not UTF-8) with a bare schema error; the
    C library would cut a path at its first NUL character. Other types are left to the caller's checks."""
    if not isinstance(text, str):
        return text
    if "\0" in text:
        raise ValueError(f"{who}: {what} contains a NUL character: {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        remedy = {
            "path": "rename it, or point a symlink with a UTF-8 name at it and pass that",
            "field name": "use a UTF-8 field name",
        }.get(what, "rename it in the file or store")
        raise ValueError(
            f"{who}: {what} is not valid UTF-8: {text!r} (its \\udcXX characters stand for bytes of a name that is "
            f"not UTF-8, as os.fsdecode and os.listdir give them); torch passes string arguments to native code only "
            f"as valid UTF-8: {remedy}"
        ) from None
    return text


def _as_array(name, values):
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.bfloat16:  # numpy has no bfloat16; every value is a float32 exactly
            values = values.float()
        return values.detach().cpu().numpy()
    try:
        return np.asarray(values)
    except Exception as error:  # e.g. ragged lists
        raise ValueError(f"{name} must be a 1-D array of numbers, got {type(values).__name__}") from error


def index_tensor(name, values):
    """A 1-D int64 tensor from a tensor, array or sequence of integers (not
    bools: numpy would read those as a mask)."""
    array = _as_array(name, values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(array.shape)}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must contain integers, got dtype {array.dtype}")
    if array.size and array.dtype.kind == "u" and array.max() >= 2**63:
        raise ValueError(f"{name} must be < 2**63, got {array.max()}")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))


def optional_index_tensor(name, values):
    return None if values is None else index_tensor(name, values)


def weight_tensor(name, values):
    """A 1-D float64 tensor; negative, NaN and infinite entries are rejected by the core."""
    array = _as_array(name, values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(array.shape)}")
    if np.iscomplexobj(array):
        raise TypeError(f"{name} must be real numbers, got dtype {array.dtype}")
    if array.size and not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise ValueError(f"{name} must contain numbers, got dtype {array.dtype}")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))


def _kind(value):
    if isinstance(value, (str, np.str_)):
        return "str"
    if isinstance(value, (bytes, np.bytes_)):
        return "bytes"
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Number):
        return "number"
    return type(value).__name__


def _check_one_kind(name, labels):
    """Labels of one kind: numpy would turn [1, "a"] into strings silently."""
    if isinstance(labels, torch.Tensor) or (isinstance(labels, np.ndarray) and labels.dtype != object):
        return
    try:
        values = list(labels)
    except TypeError:
        return  # not a sequence: _as_array reports it
    kinds = sorted({_kind(value) for value in values})
    if len(kinds) > 1:
        raise TypeError(f"{name} must all be of one kind (ints or strings), got a mix of {', '.join(kinds)}")


def label_codes(name, labels):
    """Integer class codes and the class values, from ints, strings or a pandas column."""
    codes = getattr(labels, "cat", None)
    if codes is not None and hasattr(codes, "codes"):  # pandas categorical Series
        values = np.asarray(codes.codes, dtype=np.int64)
        return torch.from_numpy(values), list(codes.categories)
    _check_one_kind(name, labels)
    array = _as_array(name, labels)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(array.shape)}")
    if array.size == 0:
        raise ValueError(f"{name} must not be empty")
    if np.issubdtype(array.dtype, np.integer):
        if array.dtype.kind == "u" and array.max() >= 2**63:  # would wrap to a negative code: "missing"
            raise ValueError(f"{name} must be < 2**63, got {array.max()}")
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)), None
    if np.issubdtype(array.dtype, np.floating):
        if np.isnan(array).any():
            raise ValueError(f"{name} must not contain NaN")
    try:
        classes, inverse = np.unique(array, return_inverse=True)
    except TypeError as error:
        raise ValueError(f"{name} must hold comparable values (ints or strings), got {array.dtype}") from error
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64)), list(classes)
