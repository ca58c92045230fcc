"""HDF5Source against files written by h5py: every dtype, layout and filter,
value by value; and every bad input named precisely."""

import os
import random
import re
import shutil
import subprocess
import sys

import h5py
import hdf5plugin
import numpy as np
import pytest
import torch
from conftest import DTYPES as NATIVE_DTYPES
from conftest import expected_tensor, values_of
from torch.utils.data import DataLoader

import torch_shards as ts

DTYPES = NATIVE_DTYPES + [  # and big-endian ones
    ">i4",
    ">f8",
    ">u2",
    ">c8",
]

LAYOUTS = {
    "contiguous": {},
    "chunked": {"chunks": (7, 5)},
    "gzip": {"chunks": (16, 13), "compression": "gzip", "compression_opts": 4},
    "shuffle+gzip": {"chunks": (10, 13), "compression": "gzip", "shuffle": True},
    "blosc-lz4": {"chunks": (9, 13), **hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)},
    "blosc-zstd-bitshuffle": {
        "chunks": (9, 4),
        **hdf5plugin.Blosc(cname="zstd", clevel=3, shuffle=hdf5plugin.Blosc.BITSHUFFLE),
    },
    "zstd": {"chunks": (8, 13), **hdf5plugin.Zstd(clevel=3)},
    # h5py's LZF (anndata's write_h5ad(compression="lzf")): decoded natively, no HDF5 plugin.
    "lzf": {"chunks": (11, 13), "compression": "lzf"},
    "shuffle+lzf": {"chunks": (11, 13), "compression": "lzf", "shuffle": True},
    # Fletcher-32: HDF5's own read path; scale-offset on integers: decoded natively.
    "fletcher32": {"chunks": (8, 13), "fletcher32": True},
    "scaleoffset": {"chunks": (8, 13), "scaleoffset": 0},
}


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(1)
    return np.concatenate([rng.integers(0, 53, size=40), [0, 52, 52, 17, 18, 19, 20]])


def valid_combinations():
    for dtype in DTYPES:
        for layout in LAYOUTS:
            native_integer = np.dtype(dtype).kind in "iu" and np.dtype(dtype).byteorder != ">"
            if layout != "scaleoffset" or native_integer:  # scale-offset applies to native integers
                yield dtype, layout


@pytest.mark.parametrize("dtype,layout", list(valid_combinations()))
def test_rows_match_h5py(tmp_path, rows, dtype, layout):
    kwargs = LAYOUTS[layout]
    data = values_of(dtype, (53, 13))
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("group/values", data=data, **kwargs)
    source = ts.HDF5Source(path, "/group/values")
    assert len(source) == 53
    got = source.read(rows, num_threads=3)["X"]
    want = expected_tensor(data[rows])
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


@pytest.mark.parametrize("chunks", [(4, 3, 2), (40, 1, 5), (1, 6, 5)])
def test_three_dimensional_chunks_split_along_every_axis(tmp_path, chunks):
    data = np.arange(40 * 6 * 5, dtype=np.float32).reshape(40, 6, 5)
    path = tmp_path / "cube.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("cube", data=data, chunks=chunks, compression="gzip")
    rows = [39, 0, 5, 5, 20, 21, 22, 3]
    got = ts.HDF5Source(path, "cube").read(rows, num_threads=2)["X"]
    assert torch.equal(got, torch.from_numpy(data[rows]))


def test_random_datasets_match_h5py(tmp_path):
    # Shapes, chunks and filters the tests above fix, drawn at random (seeded): 1 to 3 dimensions, chunks
    # that do not divide the shape (along rows also larger than it: a resizable dataset), contiguous
    # datasets, datasets written in part (unwritten chunks read as the fill value), rows unsorted with
    # repeats, 1-3 threads.
    rng = random.Random(0)
    for trial in range(120):
        rows = rng.choice([1, 2, 5, 31, 100])
        shape = (rows,) + tuple(rng.choice([1, 2, 3, 7, 16]) for _ in range(rng.choice([0, 1, 1, 2])))
        dtype, layout = rng.choice(DTYPES), rng.choice(list(LAYOUTS))
        if layout == "scaleoffset" and (np.dtype(dtype).kind not in "iu" or np.dtype(dtype).byteorder == ">"):
            layout = "gzip"  # scale-offset applies to native integers
        kwargs = dict(LAYOUTS[layout])
        if "chunks" in kwargs:
            kwargs["chunks"] = (rng.choice([1, 2, 3, 5, 8, 64]),) + tuple(
                min(size, rng.choice([1, 2, 3, 5, 8, 64])) for size in shape[1:]
            )
            kwargs["maxshape"] = (None,) + shape[1:]
        data = values_of(dtype, shape, seed=trial)
        path = tmp_path / f"{trial}.h5"
        with h5py.File(path, "w") as f:
            dataset = f.create_dataset("X", shape=shape, dtype=data.dtype, **kwargs)
            written = rng.randint(0, rows) if "chunks" in kwargs and rng.random() < 0.3 else rows
            dataset[:written] = data[:written]
            expected = dataset[...]
        wanted = [rng.randrange(rows) for _ in range(rng.choice([1, 3, 17, 64]))]
        got = ts.HDF5Source(path, "X").read(wanted, num_threads=rng.randint(1, 3))["X"]
        want = expected_tensor(expected[wanted])
        assert got.dtype == want.dtype and torch.equal(got, want), (trial, layout, dtype, shape, kwargs)


def test_unwritten_chunks_read_as_the_fill_value(tmp_path):
    path = tmp_path / "sparse.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(100, 4), dtype="f4", chunks=(10, 4), fillvalue=-7.5, compression="gzip")
        d[20:30] = 1.0
    got = ts.HDF5Source(path, "x").read([0, 25, 99])["X"]
    assert got.tolist() == [[-7.5] * 4, [1.0] * 4, [-7.5] * 4]


def test_one_dimensional_and_multi_field_sources(tmp_path):
    path = tmp_path / "multi.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.arange(30 * 4, dtype=np.uint8).reshape(30, 4)
        f.create_dataset("labels", data=np.arange(30, dtype=np.int64) * 3, chunks=(7,), compression="gzip")
    source = ts.HDF5Source(path, {"X": "images", "y": "/labels"})
    batch = source.read([29, 3])
    assert batch["X"].tolist() == [list(range(116, 120)), list(range(12, 16))]
    assert batch["y"].tolist() == [87, 9]
    assert source.fields == ["X", "y"]


def test_incompressible_chunks_stored_raw_are_read(tmp_path):
    # H5Pset_deflate is optional: chunks it cannot shrink are stored raw (filter mask set).
    data = np.random.default_rng(0).integers(0, 2**63, size=(64, 32), dtype=np.uint64)
    path = tmp_path / "raw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(8, 32), compression="gzip", compression_opts=9)
    got = ts.HDF5Source(path, "x").read(range(64))["X"]
    assert torch.equal(got, torch.from_numpy(data))


def test_streams_through_dataloader_workers_under_fork_and_spawn(tmp_path):
    data = np.random.default_rng(3).standard_normal((301, 8)).astype(np.float32)
    path = tmp_path / "stream.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(32, 8), compression="gzip", shuffle=True)
        f["y"] = data.sum(axis=1)
    for context in ("fork", "spawn"):
        source = ts.HDF5Source(path, {"X": "x", "y": "y"})
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(16), batch_size=20, seed=2)
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
        seen = []
        for batch in loader:
            index = batch["index"]
            assert torch.equal(batch["X"], torch.from_numpy(data[index.numpy()]))
            assert torch.equal(batch["y"], torch.from_numpy(data[index.numpy()].sum(axis=1)))
            seen.extend(index.tolist())
        assert sorted(seen) == list(range(301))


# ---- bad input -------------------------------------------------------------------------------------------


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"HDF5Source: No such file or directory: '{tmp_path}/nope.h5'"):
        ts.HDF5Source(tmp_path / "nope.h5", "x")


def test_a_file_that_is_not_hdf5_is_named(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("hello")
    with pytest.raises(RuntimeError, match="text.h5: not an HDF5 file"):
        ts.HDF5Source(path, "x")


def test_missing_dataset_and_group_paths_are_named(tmp_path):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["a/b"] = np.zeros((3, 2))
    with pytest.raises(RuntimeError, match="d.h5:/a/c: no such dataset"):
        ts.HDF5Source(path, "/a/c")
    with pytest.raises(RuntimeError, match="d.h5:/a: is not a dataset"):
        ts.HDF5Source(path, "/a")
    with pytest.raises(RuntimeError, match="d.h5:/zz/b: no such dataset"):
        ts.HDF5Source(path, "/zz/b")


def test_unsupported_element_types_are_named(tmp_path):
    path = tmp_path / "types.h5"
    with h5py.File(path, "w") as f:
        f["strings"] = np.array([b"a", b"b"])
        f["compound"] = np.zeros(3, dtype=[("a", "i4"), ("b", "f4"), ("c", "i1")])
        f["scalar"] = 3.0
    with pytest.raises(ValueError, match=r"types.h5:/strings: unsupported element type \(HDF5 string"):
        ts.HDF5Source(path, "strings")
    with pytest.raises(ValueError, match=r"types.h5:/compound: unsupported element type \(HDF5 compound"):
        ts.HDF5Source(path, "compound")
    with pytest.raises(ValueError, match="types.h5:/scalar: is a scalar"):
        ts.HDF5Source(path, "scalar")


def test_an_empty_dataset_is_a_source_with_no_rows_and_no_dataset(tmp_path):
    path = tmp_path / "empty.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(0, 3), dtype="f4")
    source = ts.HDF5Source(path, "x")
    assert len(source) == 0 and source.read([])["X"].shape == (0, 3)
    with pytest.raises(ValueError, match=r"row 0 out of range \[0, 0\)"):
        source.read([0])
    with pytest.raises(ValueError, match=r"ShardedDataset: the source has no rows \(HDF5Source\(.*empty.h5"):
        ts.ShardedDataset(source, ts.Streaming(), batch_size=2)


def test_filter_hdf5_lacks_is_named_when_the_source_is_made(tmp_path):
    path = tmp_path / "lz4.h5"
    with h5py.File(path, "w") as f:  # hdf5plugin registers its filters with h5py's HDF5 only
        f.create_dataset("x", data=np.zeros((10, 3), "f4"), chunks=(5, 3), **hdf5plugin.LZ4())
    with pytest.raises(ValueError, match=r"lz4.h5:/x: uses HDF5 filter '.*' \(32004\), which this HDF5 library"):
        ts.HDF5Source(path, "x")


def test_lzf_chunks_stored_raw_are_read(tmp_path):
    # h5py's LZF filter is optional: a chunk it cannot shrink is stored as is, its filter marked skipped.
    path = tmp_path / "mixed.h5"
    rng = np.random.default_rng(3)
    data = np.zeros((40, 64), "f8")
    data[20:] = rng.standard_normal((20, 64))  # incompressible chunks after compressible ones
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(10, 64), compression="lzf")
    with h5py.File(path) as f:
        masks = [f["x"].id.get_chunk_info(i).filter_mask for i in range(4)]
    assert masks[:2] == [0, 0] and masks[2:] == [1, 1]
    assert torch.equal(ts.HDF5Source(path, "x").read(list(range(40)))["X"], torch.from_numpy(data))


def test_truncated_file_is_reported_not_crashed(tmp_path):
    path = tmp_path / "full.h5"
    data = np.arange(1000 * 20, dtype=np.float32).reshape(1000, 20)
    with h5py.File(path, "w") as f:
        f.create_dataset("contiguous", data=data)
        f.create_dataset("chunked", data=data, chunks=(100, 20), compression="gzip")
    for name in ("contiguous", "chunked"):
        truncated = tmp_path / f"truncated-{name}.h5"
        shutil.copy(path, truncated)
        source = ts.HDF5Source(truncated, name)
        os.truncate(truncated, os.path.getsize(path) - 30_000)
        with pytest.raises(RuntimeError, match=f"truncated-{name}.h5"):
            source.read(range(1000))
        with pytest.raises(RuntimeError, match=f"truncated-{name}.h5"):
            ts.HDF5Source(truncated, name).read(range(1000))


_SHRINKS_UNDER_WORKERS = """
import os, sys
import h5py, numpy as np
from torch.utils.data import DataLoader
import torch_shards as ts

path, context = sys.argv[1], sys.argv[2]
with h5py.File(path, "w") as f:
    f.create_dataset("X", data=np.ones((20000, 16), np.float32))
source = ts.HDF5Source(path, "X")
source.read([0])
dataset = ts.ShardedDataset(source, ts.Streaming(), batch_size=512, seed=0)
os.truncate(path, os.path.getsize(path) // 2)
try:
    for _ in DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context=context):
        pass
except RuntimeError as error:
    print(str(error).splitlines()[-1])
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("checks", ["1", "0"])
def test_a_file_that_shrinks_under_dataloader_workers_is_reported_not_a_bus_error(tmp_path, context, checks):
    # Mapped before the fork (the source read once), the file then shrinks. A forked worker opening
    # it again finds it changed (io/file.h); with that check off (TORCH_SHARDS_CHECK_FILES=0), its read
    # of the vanished pages faults. torch's worker replaces the process's SIGBUS handler with one that
    # exits; the reader installs its own again in each process, so the fault is an error naming the
    # file. Spawned workers open the file anew and find it too short.
    env = dict(os.environ, TORCH_SHARDS_CHECK_FILES=checks)
    path = tmp_path / "shrinks.h5"
    run = subprocess.run(
        [sys.executable, "-c", _SHRINKS_UNDER_WORKERS, str(path), context],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    expected = (
        r"shrinks.h5: the file changed since the dataset opened it \(size \d+ -> \d+ bytes\)"
        if context == "fork" and checks == "1"
        else r"shrinks.h5.*(shrank or its storage failed|past the end|truncated)"
    )
    assert re.search(expected, run.stdout), run.stdout + run.stderr


def test_corrupt_chunks_raise_instead_of_returning_wrong_data(tmp_path):
    data = np.random.default_rng(5).standard_normal((64, 16)).astype(np.float32)
    compressions = {
        "gzip": {"compression": "gzip"},
        "blosc": hdf5plugin.Blosc(cname="lz4"),
        "zstd": hdf5plugin.Zstd(),
    }
    rng = np.random.default_rng(0)
    for name, kwargs in compressions.items():
        path = tmp_path / f"{name}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=(16, 16), **kwargs)
            info = f["x"].id.get_chunk_info(1)
        raw = bytearray(path.read_bytes())
        for trial in range(20):
            corrupt = bytearray(raw)
            for position in rng.integers(info.byte_offset, info.byte_offset + info.size, size=1 + trial % 4):
                corrupt[position] ^= 0xFF
            broken = tmp_path / f"{name}-{trial}.h5"
            broken.write_bytes(bytes(corrupt))
            try:
                got = ts.HDF5Source(broken, "x").read(range(64))["X"]
            except RuntimeError as error:
                assert f"{name}-{trial}.h5:/x" in str(error) and "chunk (1, 0)" in str(error)
            else:
                # A flip the codec cannot detect (e.g. inside a literal run) still only touches chunk 1.
                assert torch.equal(got[:16], torch.from_numpy(data[:16]))
                assert torch.equal(got[32:], torch.from_numpy(data[32:]))


def test_files_with_a_user_block_are_read(tmp_path):
    path = tmp_path / "userblock.h5"
    data = np.arange(40, dtype=np.int64).reshape(10, 4)
    with h5py.File(path, "w", userblock_size=1024) as f:
        f["contiguous"] = data
        f.create_dataset("chunked", data=data, chunks=(3, 4), compression="gzip")
    source = ts.HDF5Source(path, {"c": "contiguous", "g": "chunked"})
    batch = source.read([9, 0])
    assert batch["c"].tolist() == batch["g"].tolist() == data[[9, 0]].tolist()


def test_a_row_too_wide_to_allocate_is_refused_naming_the_dataset_and_the_row(tmp_path):
    # Rows of 2^42 bytes, no chunk written: torch's allocator refused them without naming the file.
    path = tmp_path / "wide.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(10, 2**40), dtype="f4", chunks=(1, 2**20))
    with pytest.raises(RuntimeError, match=r"X=.*wide.h5:/x .*: a read of 3 rows of 4398046511104 bytes: cannot alloc"):
        ts.HDF5Source(path, "x").read([0, 5, 9])


def _vlen_descriptor_offset(path, dataset, element):
    """File offset of element `element`'s variable-length descriptor (length, heap address, index)."""
    with h5py.File(path, "r") as f:
        return f[dataset].id.get_offset() + 16 * element


def _minimal_h5ad(path, names):
    """An .h5ad with dense X and `names` (bytes) as its obs index."""
    with h5py.File(path, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        obs = f.create_group("obs")
        obs.attrs.update({"_index": "_index", "encoding-type": "dataframe", "encoding-version": "0.2.0"})
        obs["_index"] = np.array(names, dtype=object).astype(h5py.string_dtype(encoding="ascii"))
        obs["_index"].attrs["encoding-type"] = "string-array"
        f["X"] = np.zeros((len(names), 3), dtype="f4")


def test_strings_under_a_filter_read_natively_or_refused_naming_it(tmp_path):
    names = [f"cell{i}".encode() for i in range(300)]
    for filters, readable in (({"compression": "lzf"}, True), (hdf5plugin.LZ4(), False)):
        path = tmp_path / "names.h5ad"
        with h5py.File(path, "w") as f:
            f.attrs["encoding-type"] = "anndata"
            obs = f.create_group("obs")
            obs.attrs.update({"_index": "_index", "encoding-type": "dataframe", "encoding-version": "0.2.0"})
            string = h5py.string_dtype(encoding="ascii")
            obs.create_dataset("_index", data=np.array(names, dtype=object), dtype=string, chunks=(64,), **filters)
            obs["_index"].attrs["encoding-type"] = "string-array"
            f["X"] = np.zeros((len(names), 3), dtype="f4")
        if readable:
            assert ts.AnnDataSource(path).obs_names == [name.decode() for name in names]
        else:
            source = ts.AnnDataSource(path)  # opens: n_obs is the index's length, its names read when asked for
            assert len(source) == len(names)
            with pytest.raises(ValueError, match=r"names.h5ad:/obs/_index: its filters \(.*32004.*rewrite it with"):
                _ = source.obs_names


def test_a_string_pointing_past_its_heap_collection_is_an_error_not_a_crash(tmp_path):
    # HDF5 1.10 reads heap object 60000 of a collection that holds a few: SIGSEGV.
    path = tmp_path / "names.h5ad"
    _minimal_h5ad(path, [b"alpha", b"beta", b"gamma"])
    assert ts.AnnDataSource(path).obs_names == ["alpha", "beta", "gamma"]
    with h5py.File(path, "r") as f:
        offset = f["obs/_index"].id.get_offset() + 16 * 1  # descriptor of string 1: length, heap address, index
    raw = bytearray(path.read_bytes())
    raw[offset + 12 : offset + 16] = (60000).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"names.h5ad:/obs/_index: corrupt strings: string 1 refers to global heap"):
        _ = ts.AnnDataSource(path).obs_names


def test_strings_that_are_not_utf8_are_named(tmp_path):
    path = tmp_path / "latin1.h5ad"
    _minimal_h5ad(path, [b"ok", b"caf\xe9"])
    with pytest.raises(RuntimeError, match=r"latin1.h5ad:/obs/_index: string 1 is not valid UTF-8: \"caf\\xe9\""):
        _ = ts.AnnDataSource(path).obs_names


def test_a_chunk_whose_coordinates_left_the_grid_is_an_error(tmp_path):
    # HDF5 1.10 looks chunks up by position: one moved off the grid is never found (fill values).
    path = tmp_path / "grid.h5"
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(16, 4), compression="gzip")
        address = f["x"].id.get_chunk_info(2).byte_offset
    raw = bytearray(path.read_bytes())
    # In the version 1 B-tree, a chunk's key (size, filter mask, offsets per dimension + 1)
    # precedes its address: move chunk 2's row offset far past the dataset.
    key = raw.find(address.to_bytes(8, "little")) - 3 * 8
    assert int.from_bytes(raw[key : key + 8], "little") == 32
    raw[key : key + 8] = (2**40).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"grid.h5:/x: a chunk at \(1099511627776, 0\) is not on the chunk grid"):
        ts.HDF5Source(path, "x")


def _write_nbit(group, name, data, chunks):
    # h5py has no n-bit option: the filter (5) through the dataset creation property list.
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk(chunks)
    dcpl.set_filter(h5py.h5z.FILTER_NBIT, h5py.h5z.FLAG_OPTIONAL)
    h5py.h5d.create(group.id, name.encode(), h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(data.shape), dcpl=dcpl)
    group[name][...] = data


# Pipelines torch_shards leaves to libhdf5 (H5Dread), which reads a chunk whose index entry is corrupt as
# never written: rows of zeros.
LIBRARY_FILTERS = {
    "fletcher32": lambda f, data: f.create_dataset("x", data=data, chunks=(16, 4), fletcher32=True),
    "scaleoffset-float": lambda f, data: f.create_dataset("x", data=data, chunks=(16, 4), scaleoffset=3),
    "nbit": lambda f, data: _write_nbit(f, "x", data, (16, 4)),
    "szip": lambda f, data: f.create_dataset("x", data=data, chunks=(16, 4), compression="szip"),
    "fletcher32+gzip": lambda f, data: f.create_dataset(
        "x", data=data, chunks=(16, 4), fletcher32=True, compression="gzip"
    ),
}

CHUNK_INDEX_CORRUPTIONS = {
    "coordinates-off-the-grid": r"a chunk at \(1099511627776, 0\) is not on the chunk grid",
    "coordinates-of-another-chunk": r"two chunks at the same grid position \(48, 0\)",
    "address-inside-another-chunk": r"two of its chunks overlap in the file",
}


@pytest.mark.parametrize("filters", list(LIBRARY_FILTERS))
@pytest.mark.parametrize("corruption", list(CHUNK_INDEX_CORRUPTIONS))
def test_a_corrupt_chunk_index_is_an_error_for_filters_libhdf5_decodes(tmp_path, filters, corruption):
    # Before these checks each of these read rows 32-47 (chunk 2) as zeros or as another chunk's bytes,
    # without an error (only Fletcher-32 caught a moved address, at read time).
    if filters == "szip" and not h5py.h5z.get_filter_info(h5py.h5z.FILTER_SZIP) & h5py.h5z.FILTER_CONFIG_ENCODE_ENABLED:
        pytest.skip("this h5py cannot write szip")
    path = tmp_path / "library.h5"
    data = (np.arange(64 * 4, dtype=np.float32).reshape(64, 4) + 1) / 8  # exact under scale-offset's 3 digits
    with h5py.File(path, "w") as f:
        LIBRARY_FILTERS[filters](f, data)
        first, second = (f["x"].id.get_chunk_info(i).byte_offset for i in (1, 2))
    assert torch.equal(ts.HDF5Source(path, "x").read(range(64))["X"], torch.from_numpy(data))
    raw = bytearray(path.read_bytes())
    # Version 1 B-tree: chunk 2's key (size, filter mask, offsets per dimension + 1) precedes its address.
    at = raw.find(second.to_bytes(8, "little"))
    key = at - 3 * 8
    assert int.from_bytes(raw[key : key + 8], "little") == 32
    if corruption == "coordinates-off-the-grid":
        raw[key : key + 8] = (2**40).to_bytes(8, "little")
    elif corruption == "coordinates-of-another-chunk":
        raw[key : key + 8] = (48).to_bytes(8, "little")
    else:
        raw[at : at + 8] = (first + 8).to_bytes(8, "little")
    message = CHUNK_INDEX_CORRUPTIONS[corruption]
    path.write_bytes(bytes(raw))
    with h5py.File(path, "r") as f:  # the chunk index h5py reads: entries off the grid, twice or overlapping
        assert f["x"].id.get_num_chunks() == 4
    with pytest.raises(RuntimeError, match=r"library.h5:/x: " + message + r".*corrupt chunk index"):
        ts.HDF5Source(path, "x")


@pytest.mark.parametrize("filters", ["fletcher32", "scaleoffset-float", "fletcher32+gzip"])
def test_a_chunk_size_no_encoding_reaches_is_an_error_for_filters_libhdf5_decodes(tmp_path, filters):
    path = tmp_path / "library.h5"
    data = (np.arange(64 * 4, dtype=np.float32).reshape(64, 4) + 1) / 8
    with h5py.File(path, "w") as f:
        LIBRARY_FILTERS[filters](f, data)
        second = f["x"].id.get_chunk_info(2).byte_offset
        f["padding"] = np.zeros(4096, dtype=np.uint8)  # so that the claimed size still lies inside the file
    raw = bytearray(path.read_bytes())
    size = raw.find(second.to_bytes(8, "little")) - 4 * 8  # chunk 2's key: its stored size comes first
    raw[size : size + 4] = (2000).to_bytes(4, "little")  # chunks of 256 bytes: at most 1,000 or so stored
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"library.h5:/x: chunk \(32, 0\) claims 2000 stored bytes, more than any"):
        ts.HDF5Source(path, "x")


def test_a_corrupt_scale_offset_chunk_is_an_error(tmp_path):
    # Decoded natively: HDF5 1.10 unpacks more bits than an element holds, past the chunk's end.
    path = tmp_path / "so.h5"
    data = np.arange(40, dtype=np.int32).reshape(10, 4) * 3
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(5, 4), scaleoffset=0)
        address = f["x"].id.get_chunk_info(1).byte_offset
    source = ts.HDF5Source(path, "x")
    assert torch.equal(source.read(range(10))["X"], torch.from_numpy(data))
    raw = bytearray(path.read_bytes())
    raw[address : address + 4] = (40).to_bytes(4, "little")  # minbits above 32
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"so.h5:/x: chunk \(1, 0\).*packs 40 bits into 32-bit elements"):
        ts.HDF5Source(path, "x").read(range(10))


def test_chunks_overlapping_in_the_file_are_an_error(tmp_path):
    # Both HDF5 versions read a chunk whose address was moved into its neighbour's bytes.
    path = tmp_path / "overlap.h5"
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(16, 4))
        first, second = (f["x"].id.get_chunk_info(i).byte_offset for i in (0, 1))
    raw = bytearray(path.read_bytes())
    # The record of an unfiltered chunk's size is not needed to read it (HDF5 ignores it too)...
    key = raw.find(second.to_bytes(8, "little")) - 4 * 8
    raw[key : key + 4] = (1000).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    assert torch.equal(ts.HDF5Source(path, "x").read(range(64))["X"], torch.from_numpy(data))
    # ... but its address must not fall inside another chunk.
    at = raw.find(second.to_bytes(8, "little"))
    raw[at : at + 8] = (first + 8).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match=r"overlap.h5:/x: two of its chunks overlap in the file"):
        ts.HDF5Source(path, "x")
