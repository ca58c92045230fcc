"""ZarrSource against arrays written by zarr-python (v2 and v3, sharded or not,
every compressor), value by value; bad stores named precisely."""

import json
import os
import random
import re
import subprocess
import sys
import textwrap

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from conftest import DTYPES, expected_tensor, values_of
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, TransposeCodec, ZstdCodec

import torch_shards as ts

ROWS = [44, 0, 3, 3, 17, 18, 19, 43, 20]

V2_COMPRESSORS = {
    "none": None,
    "blosc-lz4-shuffle": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
    "blosc-zstd-bitshuffle": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
    "blosc-blosclz": numcodecs.Blosc(cname="blosclz", shuffle=numcodecs.Blosc.NOSHUFFLE),
    "blosc-lz4hc": numcodecs.Blosc(cname="lz4hc"),
    "blosc-zlib": numcodecs.Blosc(cname="zlib"),
    "zstd": numcodecs.Zstd(level=3),
    "zlib": numcodecs.Zlib(level=5),
    "gzip": numcodecs.GZip(level=5),
}

V3_CODECS = {
    "none": [],
    "blosc": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
    "blosc-zstd-bitshuffle": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
    "zstd": [ZstdCodec(level=3)],
    "zstd-checksum": [ZstdCodec(level=3, checksum=True)],
    "gzip": [GzipCodec(level=5)],
}


def check(path, data, array="/"):
    got = ts.ZarrSource(path, array).read(ROWS, num_threads=3)["X"]
    want = expected_tensor(data[ROWS])
    assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("compressor", list(V2_COMPRESSORS))
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint16", "bool", "complex64"])
def test_zarr_v2_compressors(tmp_path, compressor, dtype):
    data = values_of(dtype, (45, 11))
    path = tmp_path / "a.zarr"
    z = zarr.create_array(
        path, shape=data.shape, chunks=(8, 4), dtype=data.dtype, zarr_format=2, compressors=V2_COMPRESSORS[compressor]
    )
    z[:] = data
    check(path, data)


@pytest.mark.parametrize("codecs", list(V3_CODECS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_zarr_v3_codecs(tmp_path, codecs, dtype):
    data = values_of(dtype, (45, 11))
    path = tmp_path / "a.zarr"
    z = zarr.create_array(
        path, shape=data.shape, chunks=(8, 4), dtype=data.dtype, zarr_format=3, compressors=V3_CODECS[codecs]
    )
    z[:] = data
    check(path, data)


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("codecs", ["none", "blosc", "zstd"])
def test_zarr_v3_sharding(tmp_path, codecs, index_location):
    data = values_of("float32", (45, 11))
    path = tmp_path / "a.zarr"
    z = zarr.create_array(
        path,
        shape=data.shape,
        shards=(16, 8),
        chunks=(4, 4),
        dtype=data.dtype,
        zarr_format=3,
        compressors=V3_CODECS[codecs],
    )
    z[:] = data
    if index_location == "start":  # rewrite the metadata's index location and every shard's layout
        z = zarr.create_array(
            tmp_path / "b.zarr",
            shape=data.shape,
            dtype=data.dtype,
            zarr_format=3,
            serializer=zarr.codecs.ShardingCodec(
                chunk_shape=(4, 4), codecs=[BytesCodec()] + V3_CODECS[codecs], index_location="start"
            ),
            chunks=(16, 8),
            compressors=None,
        )
        z[:] = data
        path = tmp_path / "b.zarr"
    check(path, data)


def test_zarr_v2_fortran_order_and_big_endian(tmp_path):
    data = values_of("float64", (45, 11))
    path = tmp_path / "f.zarr"
    z = zarr.create_array(
        path, shape=data.shape, chunks=(8, 4), dtype=">f8", zarr_format=2, order="F", compressors=numcodecs.Zlib()
    )
    z[:] = data
    check(path, data.astype(">f8"))


def test_zarr_v2_metadata_without_order_is_refused_as_zarr_python_refuses_it(tmp_path):
    # Read as C order, an F-order array whose "order" was lost came back with its rows permuted.
    data = values_of("int32", (6, 5))
    path = tmp_path / "f.zarr"
    z = zarr.create_array(path, shape=data.shape, chunks=(4, 5), dtype="i4", zarr_format=2, order="F")
    z[:] = data
    metadata = json.loads((path / ".zarray").read_text())
    del metadata["order"]
    (path / ".zarray").write_text(json.dumps(metadata))
    with pytest.raises(TypeError, match="order"):
        zarr.open_array(path, mode="r")
    with pytest.raises(RuntimeError, match=r"f.zarr:/: .zarray: missing \"order\""):
        ts.ZarrSource(path)


def test_zarr_v3_big_endian_and_transpose(tmp_path):
    data = values_of("int32", (45, 11))
    path = tmp_path / "t.zarr"
    z = zarr.create_array(
        path,
        shape=data.shape,
        chunks=(8, 4),
        dtype=data.dtype,
        zarr_format=3,
        filters=[TransposeCodec(order=(1, 0))],
        serializer=BytesCodec(endian="big"),
        compressors=[ZstdCodec()],
    )
    z[:] = data
    check(path, data)


def test_random_arrays_match_zarr_python(tmp_path):
    # Shapes, chunks, shards and codecs the tests above fix, drawn at random (seeded): 1 to 3 dimensions,
    # chunks that do not divide the shape or exceed it, shards of 1-3 chunks a side, arrays written in
    # part (unwritten chunks read as the fill value), rows unsorted with repeats, 1-3 threads.
    rng = random.Random(0)
    for trial in range(120):
        rows = rng.choice([1, 2, 5, 31, 100])
        shape = (rows,) + tuple(rng.choice([1, 2, 3, 7, 16]) for _ in range(rng.choice([0, 1, 1, 2])))
        chunks = tuple(rng.choice([1, 2, 3, 5, 8, 64, size]) for size in shape)
        dtype, layout = rng.choice(DTYPES + ["complex64"]), rng.choice(["v2", "v3", "v3 sharded"])
        data = values_of(dtype, shape, seed=trial)
        path = tmp_path / f"{trial}.zarr"
        if layout == "v2":
            compressor = V2_COMPRESSORS[rng.choice(list(V2_COMPRESSORS))]
            kwargs = dict(zarr_format=2, compressors=compressor, order=rng.choice(["C", "F"]))
        else:
            kwargs = dict(zarr_format=3, compressors=V3_CODECS[rng.choice(list(V3_CODECS))])
            if layout == "v3 sharded":
                kwargs["shards"] = tuple(chunk * rng.randint(1, 3) for chunk in chunks)
        z = zarr.create_array(path, shape=shape, chunks=chunks, dtype=data.dtype, **kwargs)
        written = rng.randint(0, rows) if rng.random() < 0.3 else rows
        z[:written] = data[:written]
        expected = np.asarray(z[:])
        wanted = [rng.randrange(rows) for _ in range(rng.choice([1, 3, 17, 64]))]
        got = ts.ZarrSource(path).read(wanted, num_threads=rng.randint(1, 3))["X"]
        want = expected_tensor(expected[wanted])
        assert got.dtype == want.dtype and torch.equal(got, want), (trial, layout, dtype, shape, chunks, kwargs)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_missing_chunks_read_as_fill_value(tmp_path, zarr_format):
    path = tmp_path / "fill.zarr"
    z = zarr.create_array(path, shape=(50, 3), chunks=(10, 3), dtype="f4", zarr_format=zarr_format, fill_value=np.nan)
    z[20:30] = 1.5
    got = ts.ZarrSource(path).read([0, 25, 49])["X"]
    assert torch.isnan(got[0]).all() and torch.isnan(got[2]).all() and (got[1] == 1.5).all()


def test_three_dimensional_arrays_with_chunks_on_every_axis(tmp_path):
    data = np.arange(40 * 6 * 5, dtype=np.int32).reshape(40, 6, 5)
    path = tmp_path / "cube.zarr"
    z = zarr.create_array(path, shape=data.shape, chunks=(7, 4, 2), dtype=data.dtype, zarr_format=3)
    z[:] = data
    got = ts.ZarrSource(path).read([39, 0, 5, 5, 20])["X"]
    assert torch.equal(got, torch.from_numpy(data[[39, 0, 5, 5, 20]]))


def test_arrays_inside_a_group_store(tmp_path):
    root = zarr.open_group(tmp_path / "g.zarr", mode="w", zarr_format=3)
    x = root.create_array("x", shape=(30, 2), chunks=(7, 2), dtype="f8")
    y = root.create_array("labels/y", shape=(30,), chunks=(9,), dtype="i8")
    x[:] = np.arange(60.0).reshape(30, 2)
    y[:] = np.arange(30) * 2
    source = ts.ZarrSource(tmp_path / "g.zarr", {"X": "/x", "y": "/labels/y"})
    batch = source.read([29, 0])
    assert batch["X"].tolist() == [[58.0, 59.0], [0.0, 1.0]] and batch["y"].tolist() == [58, 0]


# ---- bad input ------------------------------------------------------------------------------------------


def test_missing_store_and_non_zarr_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="ZarrSource: No such file or directory") as caught:
        ts.ZarrSource(tmp_path / "nope.zarr")
    assert caught.value.filename == str(tmp_path / "nope.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RuntimeError, match="plain"):
        ts.ZarrSource(tmp_path / "plain")


@pytest.mark.parametrize(
    "name, arguments, message",
    [
        ("lz4", dict(dtype="f4", compressors=numcodecs.LZ4()), "unsupported zarr compressor 'lz4'"),
        ("bz2", dict(dtype="i4", compressors=numcodecs.BZ2()), "unsupported zarr compressor 'bz2'"),
        ("delta", dict(dtype="i4", filters=[numcodecs.Delta(dtype="i4")]), "unsupported zarr filter 'delta'"),
        ("datetime", dict(dtype="M8[s]"), "unsupported zarr dtype '<M8\\[s\\]'"),
        ("text", dict(dtype="<U3"), "'<U3' is a string type"),
    ],
)
def test_what_is_not_read_is_a_value_error_naming_the_array(tmp_path, name, arguments, message):
    # docs/guide/sources.md, Errors: ValueError for what torch_shards does not read, RuntimeError for what
    # is wrong on disk.
    path = tmp_path / f"{name}.zarr"
    zarr.create_array(path, shape=(10,), chunks=(5,), zarr_format=2, **arguments)
    with pytest.raises(ValueError, match=f"{name}.zarr.*{message}|{message}.*{name}.zarr"):
        ts.ZarrSource(path).read([0])


def test_truncated_and_corrupt_chunks_are_named(tmp_path):
    path = tmp_path / "c.zarr"
    z = zarr.create_array(path, shape=(40, 8), chunks=(10, 8), dtype="f4", zarr_format=3, compressors=[ZstdCodec()])
    z[:] = np.random.default_rng(0).standard_normal((40, 8)).astype("f4")
    chunk = path / "c" / "1" / "0"
    raw = chunk.read_bytes()
    chunk.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(RuntimeError, match=r"c.zarr.*chunk \(1, 0\)"):
        ts.ZarrSource(path).read(range(40))
    chunk.write_bytes(bytes(b ^ 0x5A for b in raw))
    with pytest.raises(RuntimeError, match=r"c.zarr.*chunk \(1, 0\)"):
        ts.ZarrSource(path).read(range(40))


def test_corrupt_shard_index_is_named(tmp_path):
    path = tmp_path / "s.zarr"
    z = zarr.create_array(path, shape=(32, 4), shards=(16, 4), chunks=(4, 4), dtype="f4", zarr_format=3)
    z[:] = 1.0
    shard = path / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-20:-4] = (2**40).to_bytes(8, "little") * 2  # an entry pointing far past the end
    shard.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match="s.zarr"):
        ts.ZarrSource(path).read(range(16))


@pytest.mark.parametrize("codecs", ["blosc", "zstd"])
def test_shard_that_shrinks_while_mapped_is_reported_not_crashed(tmp_path, codecs):
    """Inner chunks are decoded straight from the shard file's mapping: a shard cut short after the
    source read it once (the mapping made, its pages past the new end gone) raises naming the file,
    where the decoder would otherwise fault (SIGBUS)."""
    data = np.random.default_rng(1).standard_normal((64, 32)).astype("f4")  # noise: chunks stay large
    path = tmp_path / "shrinks.zarr"
    z = zarr.create_array(
        path,
        shape=data.shape,
        shards=(64, 32),
        chunks=(8, 32),
        dtype="f4",
        zarr_format=3,
        compressors=V3_CODECS[codecs],
    )
    z[:] = data
    source = ts.ZarrSource(path)
    assert torch.equal(source.read(range(64))["X"], torch.from_numpy(data))
    shard = path / "c" / "0" / "0"
    os.truncate(shard, 4096)  # the first chunks stay whole; the index and the rest are gone
    with pytest.raises(RuntimeError, match="shrinks.zarr"):
        source.read(range(64))
    with pytest.raises(RuntimeError, match="shrinks.zarr"):  # opened again: the index is gone
        ts.ZarrSource(path).read(range(64))


def test_bad_metadata_is_named(tmp_path):
    path = tmp_path / "m.zarr"
    zarr.create_array(path, shape=(4, 2), chunks=(2, 2), dtype="f4", zarr_format=3)
    (path / "zarr.json").write_text("{ not json")
    with pytest.raises(ValueError, match="m.zarr.*invalid JSON in zarr.json"):  # as zarr-python's JSONDecodeError
        ts.ZarrSource(path)
    os.remove(path / "zarr.json")
    with pytest.raises(RuntimeError, match="m.zarr"):
        ts.ZarrSource(path)


def _rewrite_metadata(path, edit):
    metadata = json.loads((path / "zarr.json").read_text())
    edit(metadata)
    (path / "zarr.json").write_text(json.dumps(metadata))


def test_metadata_that_is_not_utf8_raises_a_readable_error(tmp_path):
    path = tmp_path / "b.zarr"
    zarr.create_array(path, shape=(4, 2), chunks=(2, 2), dtype="f4", zarr_format=2)
    raw = (path / ".zarray").read_bytes()
    (path / ".zarray").write_bytes(raw.replace(b'"<f4"', b'"<f4\xff\xfe"'))
    with pytest.raises(ValueError, match=r"b.zarr.*\\xff") as error:
        ts.ZarrSource(path)
    error.value.args[0].encode("utf-8")  # a str Python could decode, not a UnicodeDecodeError


@pytest.mark.parametrize("order", ["F", "C", [0, 0], [1], [0, 2]])
def test_v3_transpose_order_must_be_a_list_permuting_the_axes(tmp_path, order):
    path = tmp_path / "t.zarr"
    z = zarr.create_array(path, shape=(4, 2), chunks=(2, 2), dtype="i4", filters=[TransposeCodec(order=(1, 0))])
    z[:] = 1

    def set_order(metadata):
        metadata["codecs"][0]["configuration"]["order"] = order

    _rewrite_metadata(path, set_order)
    with pytest.raises(RuntimeError, match=r"t.zarr:/: zarr.json: transpose order"):
        ts.ZarrSource(path)


def test_shapes_of_two_to_the_63_bytes_are_refused_and_the_largest_valid_one_reads(tmp_path):
    path = tmp_path / "wide.zarr"
    zarr.create_array(path, shape=(4,), chunks=(2,), dtype="i4", zarr_format=3)
    _rewrite_metadata(path, lambda metadata: metadata.update(shape=[2**63 - 1]))
    with pytest.raises(RuntimeError, match=r"wide.zarr:/: .*more than 2\^63 bytes"):
        ts.ZarrSource(path)
    # 2^63 - 1 one-byte elements are addressable: the chunk grid must not overflow.
    path = tmp_path / "bytes.zarr"
    zarr.create_array(path, shape=(4,), chunks=(8,), dtype="u1", zarr_format=3, fill_value=3)
    _rewrite_metadata(path, lambda metadata: metadata.update(shape=[2**63 - 1]))
    source = ts.ZarrSource(path)
    assert len(source) == 2**63 - 1
    assert source.read([0, 2**63 - 2])["X"].tolist() == [3, 3]


def test_a_chunk_whose_codec_records_another_size_is_refused_before_allocating(tmp_path):
    path = tmp_path / "c.zarr"
    z = zarr.create_array(path, shape=(8,), chunks=(8,), dtype="i4", zarr_format=3, compressors=[ZstdCodec()])
    z[:] = np.arange(8)
    _rewrite_metadata(path, lambda metadata: metadata["chunk_grid"]["configuration"].update(chunk_shape=[2**40]))
    with pytest.raises(RuntimeError, match=r"c.zarr:/: chunk \(0,\).*zstd data decompresses to 32 bytes"):
        ts.ZarrSource(path).read([0])


@pytest.mark.parametrize("layout", ["v2", "v3", "v3 sharded"])
def test_a_store_deleted_while_open_is_an_error_not_its_fill_value(tmp_path, layout):
    # A chunk file that is not there reads as never written only while the array's metadata is:
    # a store deleted (or moved) under a running job was read as zeros, every batch.
    import shutil

    path = tmp_path / "x.zarr"
    x = np.arange(1, 401, dtype=np.float32).reshape(100, 4)
    if layout == "v2":
        z = zarr.create_array(path, shape=x.shape, chunks=(10, 4), dtype=x.dtype, zarr_format=2)
    else:
        shards = (20, 4) if layout == "v3 sharded" else None
        z = zarr.create_array(path, shape=x.shape, chunks=(10, 4), shards=shards, dtype=x.dtype)
    z[:] = x
    source = ts.ZarrSource(path)
    assert torch.equal(source.read([0, 1])["X"], torch.from_numpy(x[[0, 1]]))
    shutil.rmtree(path)
    metadata = ".zarray" if layout == "v2" else "zarr.json"
    with pytest.raises(RuntimeError, match=rf"No such file or directory: '.*x.zarr/{metadata}'"):
        source.read([50, 99])


def _wide_array(path):
    """Rows of 2^42 bytes (4 TiB), no chunk written: every value reads as the fill value."""
    zarr.create_array(path, shape=(10, 2**40), chunks=(1, 2**20), dtype="f4", zarr_format=3)
    return ts.ZarrSource(path)


def test_a_row_too_wide_to_allocate_is_refused_naming_the_source_and_the_row(tmp_path):
    # torch's allocator refused it ("DefaultCPUAllocator: can't allocate memory") without naming the file; a
    # DataLoader worker's shared memory would have been mapped, and failed only as the rows were written.
    source = _wide_array(tmp_path / "wide.zarr")
    message = r"wide.zarr:/ .*float32\[10, 1099511627776\]\): a read of 2 rows of 4398046511104 bytes: cannot allocate"
    with pytest.raises(RuntimeError, match=message):
        source.read([0, 1])
    dataset = ts.ShardedDataset(source, ts.Streaming(), batch_size=2, seed=0, num_threads=2)  # reader threads
    with pytest.raises(RuntimeError, match=message):
        next(iter(dataset))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1)  # shared memory
    with pytest.raises(RuntimeError, match=message):
        next(iter(loader))


def test_a_read_whose_size_overflows_is_refused_naming_the_source(tmp_path):
    # Rows may repeat (weighted sampling): 2^22 rows of 2^42 bytes are 2^64 bytes, which wrapped.
    source = _wide_array(tmp_path / "wide.zarr")
    with pytest.raises(
        RuntimeError, match=r"wide.zarr:/ .*: a read of 4194304 rows of 4398046511104 bytes: .*2\^63 bytes or more"
    ):
        source.read(torch.zeros(2**22, dtype=torch.long))


def test_an_output_the_allocator_refuses_is_named(tmp_path):
    # Under an address-space limit, torch's allocator fails for 256 MiB (whatever the machine's memory).
    path = tmp_path / "rows.zarr"
    zarr.create_array(path, shape=(10, 2**24), chunks=(1, 2**20), dtype="f4", zarr_format=3)
    script = textwrap.dedent(
        f"""
        import resource
        import torch_shards as ts
        source = ts.ZarrSource({str(path)!r})
        source.read([0])
        vsz = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vsz + (64 << 20), resource.RLIM_INFINITY))
        try:
            source.read([0, 1, 2, 3])
        except RuntimeError as error:
            print(error)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"rows.zarr:/ .*: a read of 4 rows of 67108864 bytes: cannot allocate its output of 268435456 bytes: .*"
        r"can't allocate memory",
        result.stdout,
    ), result.stdout
