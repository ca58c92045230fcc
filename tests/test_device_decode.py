"""Rows of zarr arrays with their chunks decoded on a device
(torch.classes.torch_shards.ZarrDeviceDecoder, issue 49): the host fetches and
plans, the device decompresses, unshuffles and assembles with torch ops. On
the CPU (everywhere) the pieces are decompressed by the CPU codecs; on a CUDA
GPU by nvCOMP (the nvidia-libnvcomp-cu13 wheel). Every codec, shuffle, dtype
and layout zarr-python writes, bit for bit against zarr-python's own read."""

import pathlib
import site
import subprocess
import sys

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from conftest import values_of
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

import torch_shards  # noqa: F401  (registers torch.classes.torch_shards)

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = ["uint8", "int16", "float32", "float64", "int64", "bool", "complex64"]
SHUFFLES = {"noshuffle": numcodecs.Blosc.NOSHUFFLE, "shuffle": numcodecs.Blosc.SHUFFLE, "bitshuffle": 2}
BLOSC = [(cname, shuffle) for cname in ("lz4", "lz4hc", "zstd", "zlib") for shuffle in SHUFFLES]
CODECS = ["none", "zstd", "gzip", "zlib", "blosc-blosclz"] + [f"blosc-{c}-{s}" for c, s in BLOSC]


def decoder(path, array="/", trust_unverified=False):
    """The decoder, looking for nvCOMP where pip installs it (site-packages and sys.path)."""
    dirs = site.getsitepackages() + sys.path
    return torch.classes.torch_shards.ZarrDeviceDecoder(str(path), array, dirs, 3, trust_unverified)


def compressors(codec, zarr_format):
    """zarr-python's compressors for a codec name, or None where the format has no such codec."""
    if codec == "none":
        return None
    if codec.startswith("blosc-"):
        _, cname, *shuffle = codec.split("-")
        shuffle = shuffle[0] if shuffle else "noshuffle"
        if zarr_format == 2:
            return numcodecs.Blosc(cname=cname, clevel=5, shuffle=SHUFFLES[shuffle])
        return [BloscCodec(cname=cname, clevel=5, shuffle=shuffle)]
    if codec == "zlib":
        return numcodecs.Zlib(level=5) if zarr_format == 2 else "skip"
    if zarr_format == 2:
        return {"zstd": numcodecs.Zstd(level=3), "gzip": numcodecs.GZip(level=5)}[codec]
    return [{"zstd": ZstdCodec(level=3), "gzip": GzipCodec(level=5)}[codec]]


def write(path, data, codec, layout, chunks=(40, 8), **kwargs):
    zarr_format = 2 if layout == "v2" else 3
    found = compressors(codec, zarr_format)
    if found == "skip":
        pytest.skip(f"{codec} is a zarr v2 codec")
    if layout == "sharded":
        kwargs["shards"] = tuple(c * 2 for c in chunks)
    z = zarr.create_array(
        path,
        shape=data.shape,
        chunks=chunks,
        dtype=data.dtype,
        zarr_format=zarr_format,
        compressors=found,
        fill_value=0,
        **kwargs,
    )
    z[:] = data
    return z


def expect_rows(path, data, device, reads=None, trust_unverified=True):
    """Every row, a block, and random rows with repeats, each compared byte for byte."""
    d = decoder(path, trust_unverified=trust_unverified)
    rows = data.shape[0]
    rng = np.random.default_rng(rows)
    reads = reads or [np.arange(rows), np.arange(rows // 3, rows // 3 + rows // 4), rng.integers(0, rows, rows // 2)]
    native = data.astype(data.dtype.newbyteorder("="))
    for wanted in reads:
        got = d.read(torch.from_numpy(wanted.astype(np.int64)), device)
        assert got.device.type == device
        want = np.ascontiguousarray(native[wanted])
        assert got.shape == want.shape and str(got.dtype) == f"torch.{torch.from_numpy(want).dtype}".replace(
            "torch.torch.", "torch."
        )
        assert got.cpu().numpy().tobytes() == want.tobytes(), f"{path}: rows {wanted[:8]}..."
    return d


def data_of(dtype, shape=(203, 11), seed=0):
    """Values with one chunk (rows 80..119, columns 8..) all zero: zarr does not write it (read as fill)."""
    data = values_of(dtype, shape, seed)
    if dtype != "bool":
        data = np.where(np.random.default_rng(seed).random(shape) < 0.7, np.zeros((), dtype), data)
    if data.ndim == 2:
        data[80:120, 8:] = 0
    return data


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("layout", ["v2", "v3", "sharded"])
def test_every_codec_shuffle_dtype_and_layout_is_read_bit_for_bit(tmp_path, layout, codec, device):
    for i, dtype in enumerate(DTYPES):
        data = data_of(dtype, seed=i)
        path = tmp_path / f"{dtype}.zarr"
        write(path, data, codec, layout)
        d = expect_rows(path, data, device)
        stats = d.stats()
        assert stats["chunks"] > 0 and (stats["host_chunks"] > 0) == (codec == "blosc-blosclz"), (dtype, stats)


@pytest.mark.parametrize("device", DEVICES)
def test_zstd_and_deflate_go_to_the_device_only_checksummed_or_trusted(tmp_path, device):
    data = data_of("float32")
    for codec, layout in [("zstd", "v3"), ("gzip", "v2"), ("blosc-zstd-shuffle", "v2"), ("blosc-lz4-shuffle", "v3")]:
        path = tmp_path / f"{codec}.zarr"
        write(path, data, codec, layout)
        d = expect_rows(path, data, device, trust_unverified=False)
        stats = d.stats()
        if "lz4" in codec:  # checked whole on the host: always the device's
            assert stats["host_chunks"] == 0 and d.host_reason() == "", (codec, stats)
        else:
            assert stats["host_chunks"] > 0 and stats["pieces"] == 0, (codec, stats)  # all but the fill chunk
            assert "streams without a checksum (a crc32c codec)" in d.host_reason()
            assert "trust_unverified=True" in d.host_reason()
        assert expect_rows(path, data, device).stats()["host_chunks"] == 0  # trusted
    checksummed = tmp_path / "crc.zarr"
    z = zarr.create_array(
        checksummed,
        shape=data.shape,
        chunks=(40, 8),
        dtype=data.dtype,
        zarr_format=3,
        compressors=[ZstdCodec(level=3), Crc32cCodec()],
    )
    z[:] = data
    assert expect_rows(checksummed, data, device, trust_unverified=False).stats()["host_chunks"] == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["v2", "sharded"])
@pytest.mark.parametrize("shuffle", ["shuffle", "bitshuffle"])
def test_large_chunks_in_many_blosc_blocks_and_a_short_last_one(tmp_path, layout, shuffle, device):
    # clevel 1 cuts chunks into 64 KiB blocks; 20003 elements leave a short last block, and element counts
    # that are not a multiple of 8 (bit shuffle leaves those bytes as they are).
    for dtype in ["float32", "int64", "int16"]:
        data = data_of(dtype, shape=(60013,), seed=3)
        path = tmp_path / f"{dtype}.zarr"
        zarr_format = 2 if layout == "v2" else 3
        found = (
            numcodecs.Blosc(cname="lz4", clevel=1, shuffle=SHUFFLES[shuffle])
            if zarr_format == 2
            else [BloscCodec(cname="lz4", clevel=1, shuffle=shuffle)]
        )
        kwargs = {"shards": (60009,)} if layout == "sharded" else {}
        z = zarr.create_array(
            path,
            shape=data.shape,
            chunks=(20003,),
            dtype=data.dtype,
            zarr_format=zarr_format,
            compressors=found,
            **kwargs,
        )
        z[:] = data
        expect_rows(path, data, device)


@pytest.mark.parametrize("device", DEVICES)
def test_three_dimensional_rows_and_big_endian_arrays(tmp_path, device):
    data = values_of("float32", (50, 6, 7), seed=5)
    write(tmp_path / "a.zarr", data, "blosc-lz4-shuffle", "v3", chunks=(16, 4, 3))
    expect_rows(tmp_path / "a.zarr", data, device)
    for i, dtype in enumerate([">f4", ">i2", ">c8", ">f8"]):
        big = data_of(
            dtype[1:]
            .replace("f4", "float32")
            .replace("i2", "int16")
            .replace("c8", "complex64")
            .replace("f8", "float64"),
            seed=i,
        ).astype(dtype)
        v2 = tmp_path / f"v2_{i}.zarr"
        z = zarr.create_array(
            v2,
            shape=big.shape,
            chunks=(40, 8),
            dtype=big.dtype,
            zarr_format=2,
            compressors=numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
        )
        z[:] = big
        expect_rows(v2, big, device)
        v3 = tmp_path / f"v3_{i}.zarr"
        z = zarr.create_array(
            v3,
            shape=big.shape,
            chunks=(40, 8),
            dtype=big.dtype.newbyteorder("="),
            zarr_format=3,
            serializer=BytesCodec(endian="big"),
            compressors=[ZstdCodec(level=3)],
        )
        z[:] = big
        expect_rows(v3, big, device)


@pytest.mark.parametrize("device", DEVICES)
def test_arrays_the_device_cannot_decode_are_decoded_on_the_host_and_say_why(tmp_path, device):
    data = values_of("int32", (45, 11))
    z = zarr.create_array(
        tmp_path / "f.zarr",
        shape=data.shape,
        chunks=(8, 4),
        dtype=data.dtype,
        zarr_format=2,
        order="F",
        compressors=numcodecs.Zstd(level=1),
    )
    z[:] = data
    d = expect_rows(tmp_path / "f.zarr", data, device)
    assert "transpose" in d.fallback_reason()
    assert d.stats()["host_chunks"] == d.stats()["chunks"]
    data = values_of("float32", (45, 11))
    write(tmp_path / "b.zarr", data, "blosc-blosclz", "v2")
    d = expect_rows(tmp_path / "b.zarr", data, device)
    assert d.fallback_reason() == ""  # chunk by chunk: blosclz chunks only


def corrupt(path, codec, where):
    """Writes a compressible float64 array (64 x 16, chunks of 32 rows) with `codec`, then overwrites chunk (1, 0):
    where="tail": from a third of its bytes to 8 before its end (block headers and lengths too); "payload": 16
    bytes in its middle. Returns the data as written."""
    data = data_of("float64", (64, 16), seed=1)  # compressible: zstd stores compressed blocks, not raw ones
    write(path, data, codec, "v3", chunks=(32, 16))
    chunk = path / "c" / "1" / "0"
    stored = bytearray(chunk.read_bytes())
    if where == "tail":
        stored[len(stored) // 3 : -8] = b"\xff" * (len(stored) - 8 - len(stored) // 3)
    else:
        middle = len(stored) // 2
        stored[middle : middle + 16] = bytes(255 - b for b in stored[middle : middle + 16])
    chunk.write_bytes(bytes(stored))
    return data


def in_a_process_of_its_own(test, *args):
    """Runs test(*args) in a new Python: a GPU fault there (a lost CUDA context) fails this test alone."""
    code = f"import sys; sys.path[:0] = {[str(p) for p in (ROOT / 'tests', ROOT)]!r}; import test_device_decode as t; "
    code += f"t.{test.__name__}(*{args!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def check_corrupt_chunk_is_named(path, codec, device):
    data = corrupt(pathlib.Path(path), codec, "tail")
    d = decoder(path)
    with pytest.raises(RuntimeError, match=r"c\.zarr.*chunk \(1, 0\)"):
        d.read(torch.arange(64), device)
    assert torch.equal(d.read(torch.arange(32), device).cpu(), torch.from_numpy(data[:32]))  # chunk (0, 0) reads


def check_corrupt_payload_keeps_the_device(path, codec, device):
    data = corrupt(pathlib.Path(path), codec, "payload")
    d = decoder(path)
    try:
        d.read(torch.arange(64), device)  # garbage or an error naming the chunk: both are the codec's to say
    except RuntimeError as error:
        assert "chunk (1, 0)" in str(error) and "CUDA error" not in str(error), error
    assert torch.equal(d.read(torch.arange(32), device).cpu(), torch.from_numpy(data[:32]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", ["zstd", "blosc-lz4-shuffle", "blosc-zstd-noshuffle", "gzip"])
def test_a_corrupt_chunk_is_an_error_naming_the_array_and_the_chunk(tmp_path, codec, device):
    if device == "cpu":
        check_corrupt_chunk_is_named(str(tmp_path / "c.zarr"), codec, device)
    else:
        in_a_process_of_its_own(check_corrupt_chunk_is_named, str(tmp_path / "c.zarr"), codec, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", ["zstd", "blosc-lz4-shuffle", "gzip"])
def test_a_corrupt_block_payload_never_costs_the_device(tmp_path, codec, device):
    if device == "cpu":
        check_corrupt_payload_keeps_the_device(str(tmp_path / "c.zarr"), codec, device)
    else:
        in_a_process_of_its_own(check_corrupt_payload_keeps_the_device, str(tmp_path / "c.zarr"), codec, device)


def test_the_python_class_reads_what_the_native_one_does(tmp_path):
    data = data_of("float32")
    write(tmp_path / "a.zarr", data, "blosc-lz4-shuffle", "v3")
    x = torch_shards.ZarrDeviceDecoder(tmp_path / "a.zarr", num_threads=2)
    rows = [202, 0, 5, 5]
    for given in (rows, np.array(rows), torch.tensor(rows, dtype=torch.int32)):
        assert torch.equal(x.read(given, "cpu"), torch.from_numpy(data[rows]))
    assert x.stats()["chunks"] == 4 and x.host_reason() == "" and x.nvcomp_library() == ""  # 2 rows x 2 columns
    with pytest.raises(TypeError, match="rows must be integers, got torch.float32"):
        x.read([1.5], "cpu")
    zstd = tmp_path / "z.zarr"
    write(zstd, data, "zstd", "v3")
    assert "without a checksum" not in torch_shards.ZarrDeviceDecoder(zstd).host_reason()  # nothing read yet
    unchecked = torch_shards.ZarrDeviceDecoder(zstd)
    assert torch.equal(unchecked.read(rows, torch.device("cpu")), torch.from_numpy(data[rows]))
    assert "without a checksum" in unchecked.host_reason()
    trusted = torch_shards.ZarrDeviceDecoder(zstd, trust_unverified=True)
    trusted.read(rows, "cpu")
    assert trusted.host_reason() == "" and trusted.stats()["host_chunks"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_batches_read_together_are_each_what_a_read_gives(tmp_path, device):
    # A fetch of several batches: their chunks fetched and decoded once, each batch as read() gives it.
    import scipy.sparse as sp

    data = data_of("float32")
    write(tmp_path / "a.zarr", data, "blosc-lz4-shuffle", "v3")
    matrix = sp.random(301, 97, density=0.07, format="csr", dtype=np.float32, random_state=4)
    write_csr_store(tmp_path / "c.zarr", matrix, "blosc-lz4-shuffle")
    rng = np.random.default_rng(5)
    for path, array, rows in [(tmp_path / "a.zarr", "/", 203), (tmp_path / "c.zarr", "X", 301)]:
        x = torch_shards.ZarrDeviceDecoder(path, array, num_threads=2)
        batches = [rng.integers(0, rows, 40), np.array([], dtype=np.int64), rng.integers(0, rows, 7), [rows - 1]]
        together = x.read_batches(batches, device)
        assert len(together) == len(batches)
        for got, rows_of in zip(together, batches):
            want = x.read(rows_of, device)
            assert got.device.type == device and got.layout == want.layout and got.shape == want.shape
            if got.layout == torch.sparse_csr:
                for part in ("crow_indices", "col_indices", "values"):
                    assert torch.equal(getattr(got, part)().cpu(), getattr(want, part)().cpu()), part
            else:
                assert torch.equal(got.cpu(), want.cpu())
    with pytest.raises(ValueError, match="read_batches: rows must be a 1-D int64 CPU tensor"):
        torch.classes.torch_shards.ZarrDeviceDecoder(str(tmp_path / "a.zarr"), "/", [], 1, False).read_batches(
            [torch.zeros(2, 2, dtype=torch.long)], "cpu"
        )


def test_bad_arguments_are_named(tmp_path):
    data = values_of("float32", (20, 3))
    write(tmp_path / "a.zarr", data, "none", "v3")
    d = decoder(tmp_path / "a.zarr")
    with pytest.raises(ValueError, match="rows must be a 1-D int64 CPU tensor, got Int"):
        d.read(torch.arange(3, dtype=torch.int32), "cpu")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda\\[:N\\]', got 'meta'"):
        d.read(torch.arange(3), "meta")
    with pytest.raises(RuntimeError, match=r"a\.zarr.*rows \[20, 21\) outside \[0, 20\)"):
        d.read(torch.tensor([20]), "cpu")
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        torch.classes.torch_shards.ZarrDeviceDecoder(str(tmp_path / "a.zarr"), "/", [], 0)
    with pytest.raises(RuntimeError, match="no.zarr"):
        decoder(tmp_path / "no.zarr")
    assert d.read(torch.zeros(0, dtype=torch.long), "cpu").shape == (0, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only torch's refusal")
def test_cuda_without_cuda_is_a_clear_error(tmp_path):
    write(tmp_path / "a.zarr", values_of("float32", (20, 3)), "zstd", "v3")
    with pytest.raises(ValueError, match="this torch has no CUDA device"):
        decoder(tmp_path / "a.zarr").read(torch.arange(3), "cuda")


def test_the_decoder_works_from_torchscript(tmp_path):
    data = values_of("int16", (30, 5))
    write(tmp_path / "a.zarr", data, "blosc-lz4-bitshuffle", "v2")

    @torch.jit.script
    def read_rows(d: torch.classes.torch_shards.ZarrDeviceDecoder, rows: torch.Tensor) -> torch.Tensor:
        return d.read(rows, "cpu")

    rows = torch.tensor([29, 0, 7, 7])
    assert torch.equal(read_rows(decoder(tmp_path / "a.zarr"), rows), torch.from_numpy(data[rows.numpy()]))


def write_csr_store(path, matrix, codec=None, zarr_format=3):
    """An AnnData zarr store (anndata's writer) whose X is `matrix`; codec: rewrite X's data and indices with it."""
    import anndata as ad

    ad.settings.zarr_write_format = zarr_format
    ad.AnnData(matrix).write_zarr(path)
    if codec is not None:
        group = zarr.open_group(path, mode="r+")
        for name in ("data", "indices"):
            values = group["X"][name][:]
            chunks = (max(1, len(values) // 7),)
            zarr.create_array(
                group["X"].store,
                name=f"X/{name}",
                shape=values.shape,
                chunks=chunks,
                dtype=values.dtype,
                compressors=compressors(codec, zarr_format),
                zarr_format=zarr_format,
                overwrite=True,
            )[:] = values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", [None, "blosc-lz4-shuffle", "blosc-zstd-bitshuffle", "zstd"])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_csr_rows_arrive_as_a_sparse_csr_tensor_on_the_device(tmp_path, codec, zarr_format, device):
    import scipy.sparse as sp

    matrix = sp.random(301, 97, density=0.07, format="csr", dtype=np.float32, random_state=1)
    matrix[5] = 0  # an empty row
    matrix.eliminate_zeros()
    path = tmp_path / "a.zarr"
    write_csr_store(path, matrix, codec, zarr_format)
    d = decoder(path, "X")
    rng = np.random.default_rng(0)
    for rows in [np.arange(301), np.array([5, 5, 300, 0, 17]), rng.integers(0, 301, 150), np.array([], dtype=int)]:
        got = d.read(torch.from_numpy(rows.astype(np.int64)), device)
        assert got.layout == torch.sparse_csr and got.device.type == device and got.shape == (len(rows), 97)
        assert got.crow_indices().dtype == torch.int32 and got.values().dtype == torch.float32
        want = matrix[rows]
        assert np.array_equal(got.crow_indices().cpu().numpy(), want.indptr)
        assert np.array_equal(got.col_indices().cpu().numpy(), want.indices)
        assert got.values().cpu().numpy().tobytes() == want.data.tobytes()


@pytest.mark.parametrize("device", DEVICES)
def test_a_column_index_outside_the_matrix_is_an_error(tmp_path, device):
    import scipy.sparse as sp

    matrix = sp.random(40, 10, density=0.3, format="csr", dtype=np.float32, random_state=2)
    path = tmp_path / "a.zarr"
    write_csr_store(path, matrix)
    group = zarr.open_group(path, mode="r+")
    indices = group["X"]["indices"][:]
    indices[3] = 10
    group["X"]["indices"][:] = indices
    with pytest.raises(RuntimeError, match=r"a\.zarr:/X/indices: a column index outside \[0, 10\)"):
        decoder(path, "X").read(torch.arange(40), device)
    with pytest.raises(ValueError, match=r"a\.zarr:/obs: a group, not an array or a CSR matrix"):
        decoder(path, "obs")
