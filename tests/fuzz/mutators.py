"""Mutations of seed files. Each mutator takes (seed, case directory, rng),
changes the copy of the seed in place and returns a one-line description.

Byte-level mutators work on any file: bit flips, byte runs, interesting
integers written over sizes and offsets, truncation, inserted or deleted
bytes; for HDF5 files they aim at metadata or at array data (the regions the
seed lists). zarr stores also get JSON mutations (a field of .zarray /
zarr.json / .zattrs replaced by a value of the wrong type or an extreme one,
removed, or its digits changed) and chunk mutations (garbage, empty, missing,
swapped, or a valid frame whose header lies). AnnData files get semantic
mutations written through the reference library: categorical codes out of
range, inconsistent CSR arrays, wrong shapes and encodings.
"""

import json
import os

import numpy as np

INTERESTING_INTEGERS = [
    0,
    1,
    -1,
    2,
    7,
    255,
    256,
    65535,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**48,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**31),
    -(2**63),
]
INTERESTING_JSON = [
    -1,
    0,
    1,
    3,
    2**31,
    2**32 + 1,
    2**53,
    2**63 - 1,
    2**64,
    -(2**63),
    1.5,
    -0.0,
    1e308,
    "",
    "x",
    "0",
    "NaN",
    "Infinity",
    "<f8",
    ">i2",
    "|O",
    "|b1",
    "<U3",
    "|S0",
    "C",
    "F",
    "big",
    "blosc",
    "zstd",
    "gzip",
    "bytes",
    "transpose",
    "/",
    ".",
    "\u00e9\u0000\udcff",
    None,
    True,
    False,
    [],
    [0],
    [1, 0],
    [0, 0],
    [2**62, 2**62],
    [-1],
    {},
    {"name": "bytes"},
]


# ------------------------------------------------------------------ file lists


def seed_files(root, seed):
    """Every file of a seed's copy under `root`, relative to `root`."""
    path = os.path.join(root, seed["path"])
    if os.path.isfile(path):
        return [seed["path"]]
    files = []
    for directory, _, names in os.walk(path):
        for name in names:
            files.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(files)


def is_metadata(name):
    return os.path.basename(name) in (".zarray", ".zattrs", ".zgroup", "zarr.json", ".zmetadata")


# ------------------------------------------------------------------ byte level


def _in_region(rng, size, seed, target):
    """A position in the file: inside an array-data region, outside them, or anywhere."""
    regions = [r for r in seed.get("regions", []) if r[1] > 0 and r[0] + r[1] <= size]
    if target == "data" and regions:
        offset, length = regions[rng.integers(len(regions))]
        return int(offset + rng.integers(length))
    if target == "metadata" and regions:
        covered = np.zeros(size, dtype=bool)
        for offset, length in regions:
            covered[offset : offset + length] = True
        free = np.flatnonzero(~covered)
        if len(free):
            return int(free[rng.integers(len(free))])
    return int(rng.integers(size))


def _pick_file(root, seed, rng, want=None):
    files = seed_files(root, seed)
    if want == "metadata":
        files = [f for f in files if is_metadata(f)] or files
    elif want == "data":
        files = [f for f in files if not is_metadata(f)] or files
    return files[rng.integers(len(files))]


def _target(seed, rng):
    return ["metadata", "data", "anywhere"][rng.integers(3)]


def flip_bits(root, seed, rng):
    target = _target(seed, rng)
    name = _pick_file(root, seed, rng, target)
    path = os.path.join(root, name)
    data = bytearray(open(path, "rb").read())
    if not data:
        return f"{name}: empty, nothing to flip"
    count = int(rng.integers(1, 5))
    positions = [_in_region(rng, len(data), seed, target) for _ in range(count)]
    for position in positions:
        data[position] ^= 1 << int(rng.integers(8))
    open(path, "wb").write(bytes(data))
    return f"{name}: flip {count} bit(s) ({target}) at {positions}"


def byte_run(root, seed, rng):
    target = _target(seed, rng)
    name = _pick_file(root, seed, rng, target)
    path = os.path.join(root, name)
    data = bytearray(open(path, "rb").read())
    if not data:
        return f"{name}: empty"
    start = _in_region(rng, len(data), seed, target)
    length = int(min(len(data) - start, rng.integers(2, 40)))
    fill = ["zeros", "ones", "random"][rng.integers(3)]
    run = {"zeros": b"\0" * length, "ones": b"\xff" * length, "random": rng.bytes(length)}[fill]
    data[start : start + length] = run
    open(path, "wb").write(bytes(data))
    return f"{name}: {length} {fill} bytes ({target}) at {start}"


def interesting_integer(root, seed, rng):
    """An extreme integer over a size, offset, count or dimension."""
    target = ["metadata", "anywhere"][rng.integers(2)]
    name = _pick_file(root, seed, rng, target)
    path = os.path.join(root, name)
    data = bytearray(open(path, "rb").read())
    width = [1, 2, 4, 8][rng.integers(4)]
    if len(data) < width:
        return f"{name}: too short"
    position = _in_region(rng, len(data) - width + 1, seed, target)
    if rng.random() < 0.5:
        position -= position % width  # HDF5 fields are often aligned
    value = INTERESTING_INTEGERS[rng.integers(len(INTERESTING_INTEGERS))] % (1 << (8 * width))
    order = "little" if rng.random() < 0.8 else "big"
    data[position : position + width] = value.to_bytes(width, order)
    open(path, "wb").write(bytes(data))
    return f"{name}: {width}-byte {order}-endian {value} at {position}"


def truncate(root, seed, rng):
    name = _pick_file(root, seed, rng, ["data", "anywhere"][rng.integers(2)])
    path = os.path.join(root, name)
    size = os.path.getsize(path)
    length = int(rng.integers(size)) if size else 0
    os.truncate(path, length)
    return f"{name}: truncated from {size} to {length} bytes"


def insert_or_delete(root, seed, rng):
    name = _pick_file(root, seed, rng)
    path = os.path.join(root, name)
    data = bytearray(open(path, "rb").read())
    position = int(rng.integers(len(data) + 1))
    count = int(rng.integers(1, 17))
    if rng.random() < 0.5 and len(data) > position:
        del data[position : position + count]
        what = f"deleted {count} bytes"
    else:
        data[position:position] = rng.bytes(count)
        what = f"inserted {count} bytes"
    open(path, "wb").write(bytes(data))
    return f"{name}: {what} at {position}"


# ------------------------------------------------------------------- zarr JSON


def _json_paths(value, prefix=()):
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _json_paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _json_paths(item, prefix + (i,))


def _set(document, path, value, delete=False):
    target = document
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value


def _metadata_files(root, seed):
    return [f for f in seed_files(root, seed) if is_metadata(f)]


def json_field(root, seed, rng):
    files = _metadata_files(root, seed)
    if not files:
        return flip_bits(root, seed, rng)
    name = files[rng.integers(len(files))]
    path = os.path.join(root, name)
    try:
        document = json.loads(open(path).read())
    except ValueError:
        return f"{name}: not JSON any more"
    paths = [p for p, _ in _json_paths(document) if p]
    if not paths:
        return f"{name}: no fields"
    field = paths[rng.integers(len(paths))]
    action = rng.random()
    if action < 0.15:
        _set(document, field, None, delete=True)
        what = "removed"
    else:
        value = INTERESTING_JSON[rng.integers(len(INTERESTING_JSON))]
        _set(document, field, value)
        what = f"= {json.dumps(value)}"
    open(path, "w").write(json.dumps(document, indent=1, allow_nan=True))
    return f"{name}: {'/'.join(map(str, field))} {what}"


def json_digits(root, seed, rng):
    """Changes the digits of one number in a metadata file (a shape, a chunk size, a level)."""
    files = _metadata_files(root, seed)
    if not files:
        return flip_bits(root, seed, rng)
    name = files[rng.integers(len(files))]
    path = os.path.join(root, name)
    text = open(path).read()
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    if not digits:
        return f"{name}: no numbers"
    position = digits[rng.integers(len(digits))]
    replacement = ["0", "9", "99999999999", "18446744073709551616", "9223372036854775807", "-", "1.5", ""][
        rng.integers(8)
    ]
    text = text[:position] + replacement + text[position + 1 :]
    open(path, "w").write(text)
    return f"{name}: digit at {position} -> {replacement!r}"


# ------------------------------------------------------------------ zarr chunks


def _chunk_files(root, seed):
    return [f for f in seed_files(root, seed) if not is_metadata(f)]


def garbage_chunk(root, seed, rng):
    chunks = _chunk_files(root, seed)
    if not chunks:
        return byte_run(root, seed, rng)
    name = chunks[rng.integers(len(chunks))]
    path = os.path.join(root, name)
    original = open(path, "rb").read()
    kind = rng.integers(7)
    if kind == 0:
        data, what = rng.bytes(int(rng.integers(1, 2 * len(original) + 2))), "random bytes"
    elif kind == 1:
        data, what = b"", "empty"
    elif kind == 2:
        os.remove(path)
        return f"{name}: removed"
    elif kind == 3:
        other = chunks[rng.integers(len(chunks))]
        data, what = open(os.path.join(root, other), "rb").read(), f"replaced by {other}"
    elif kind == 4:  # a blosc header that lies about its sizes, over the original body
        header = bytearray(original[:16].ljust(16, b"\0"))
        header[0], header[1] = 2, 1
        field = [4, 8, 12][rng.integers(3)]
        value = INTERESTING_INTEGERS[rng.integers(len(INTERESTING_INTEGERS))] % 2**32
        header[field : field + 4] = value.to_bytes(4, "little")
        data, what = bytes(header) + original[16:], f"blosc header field at {field} = {value}"
    elif kind == 5:  # a zstd frame claiming a huge content size
        data = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xC0]) + (2**40).to_bytes(8, "little") + rng.bytes(20)
        what = "zstd frame claiming 2**40 bytes"
    else:
        data, what = original + rng.bytes(int(rng.integers(1, 64))), "trailing garbage"
    open(path, "wb").write(data)
    return f"{name}: {what}"


def shard_index(root, seed, rng):
    """Overwrites an entry of a shard index (the first or last bytes of a shard)."""
    chunks = [f for f in _chunk_files(root, seed) if os.path.getsize(os.path.join(root, f)) >= 16]
    if not chunks:
        return interesting_integer(root, seed, rng)
    name = chunks[rng.integers(len(chunks))]
    path = os.path.join(root, name)
    data = bytearray(open(path, "rb").read())
    at_end = rng.random() < 0.5
    window = min(len(data), 16 * 8 + 4)
    position = len(data) - window + int(rng.integers(window)) if at_end else int(rng.integers(window))
    position = min(position - position % 8, len(data) - 8)
    value = INTERESTING_INTEGERS[rng.integers(len(INTERESTING_INTEGERS))] % 2**64
    data[position : position + 8] = value.to_bytes(8, "little")
    open(path, "wb").write(bytes(data))
    return f"{name}: 8 bytes at {position} = {value} (shard index {'end' if at_end else 'start'})"


# ------------------------------------------------------------ AnnData semantics


def _open_anndata_groups(root, seed):
    """(get, set) for arrays of an AnnData file or store, through h5py or zarr."""
    path = os.path.join(root, seed["path"])
    if path.endswith(".h5ad"):
        import h5py

        handle = h5py.File(path, "r+")

        def replace(name, values, attrs=None):
            old = dict(handle[name].attrs)
            del handle[name]
            if values.dtype.kind in "OUS":
                values = np.asarray(values, dtype=h5py.string_dtype())
            handle[name] = values
            handle[name].attrs.update(old if attrs is None else attrs)

        return handle, replace, handle.close
    import zarr

    handle = zarr.open_group(path, mode="r+", use_consolidated=False)

    def replace(name, values, attrs=None):
        old = dict(handle[name].attrs)
        parent, _, leaf = name.rpartition("/")
        group = handle[parent] if parent else handle
        del group[leaf]
        dtype = str if values.dtype.kind in "OUS" else values.dtype
        array = group.create_array(leaf, shape=values.shape, dtype=dtype)
        array[...] = values
        array.attrs.update(old if attrs is None else attrs)

    return handle, replace, lambda: None


def anndata_semantics(root, seed, rng):
    if seed["kind"] != "anndata":
        return interesting_integer(root, seed, rng)
    handle, replace, close = _open_anndata_groups(root, seed)
    try:
        choice = int(rng.integers(8))
        if choice == 0:  # categorical codes outside [-1, len(categories))
            column = ["obs/cell_type", "obs/batch"][rng.integers(2)]
            codes = np.asarray(handle[column + "/codes"][...]).copy()
            n = len(handle[column + "/categories"])
            bad = [n, n + 3, -2, np.iinfo(codes.dtype).max][rng.integers(4)]
            codes[rng.integers(len(codes))] = bad
            replace(column + "/codes", codes)
            return f"{column}/codes: one code = {bad} ({n} categories)"
        if choice == 1:  # fewer categories than the codes use
            column = "obs/cell_type"
            categories = np.asarray(handle[column + "/categories"][...])
            replace(column + "/categories", np.array([str(c) for c in categories[:1]], dtype=object))
            return f"{column}/categories: cut to 1"
        if hasattr(handle["X"], "keys") and "indptr" in handle["X"]:
            indptr = np.asarray(handle["X/indptr"][...]).copy()
            indices = np.asarray(handle["X/indices"][...]).copy()
            if choice == 2:
                i = int(rng.integers(1, len(indptr) - 1))
                indptr[i] = [indptr[-1] + 5, -3, indptr[i] + 1, 2**40][rng.integers(4)]
                replace("X/indptr", indptr)
                return f"X/indptr[{i}] = {indptr[i]}"
            if choice == 3 and len(indices):
                i = int(rng.integers(len(indices)))
                indices[i] = [-1, 10**6, 2**31 - 1][rng.integers(3)]
                replace("X/indices", indices)
                return f"X/indices[{i}] = {indices[i]}"
            if choice == 4:
                shape = list(handle["X"].attrs["shape"])
                shape[rng.integers(2)] = [0, 2**40, -5, 3][rng.integers(4)]
                handle["X"].attrs["shape"] = np.array(shape, dtype=np.int64)
                return f"X shape attribute = {shape}"
            if choice == 5:
                replace("X/data", np.asarray(handle["X/data"][...])[:-1])
                return "X/data one value short"
        if choice == 6:
            column = "obs/n_counts"
            values = np.asarray(handle[column][...])
            replace(column, values[:-2])
            return f"{column}: two values short"
        handle["obs"].attrs["_index"] = ["_index", "missing", "n_counts"][rng.integers(3)]
        return f"obs _index attribute = {handle['obs'].attrs['_index']}"
    finally:
        close()


HDF5_MUTATORS = [
    (flip_bits, 4),
    (byte_run, 3),
    (interesting_integer, 4),
    (truncate, 1),
    (insert_or_delete, 1),
]
ZARR_MUTATORS = [
    (flip_bits, 2),
    (byte_run, 1),
    (interesting_integer, 1),
    (truncate, 1),
    (json_field, 4),
    (json_digits, 2),
    (garbage_chunk, 3),
    (shard_index, 1),
]


def pick_mutator(seed, rng):
    is_zarr = not seed["path"].endswith((".h5", ".h5ad"))
    table = list(ZARR_MUTATORS if is_zarr else HDF5_MUTATORS)
    if seed["kind"] == "anndata":
        table.append((anndata_semantics, 2))
    weights = np.array([w for _, w in table], dtype=float)
    return table[rng.choice(len(table), p=weights / weights.sum())][0]
