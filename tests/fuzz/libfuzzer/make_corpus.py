"""Writes the small seed corpora of the libFuzzer targets (committed under
corpus/; rerun after changing an input format):

    python tests/fuzz/libfuzzer/make_corpus.py
"""

import json
import os
import shutil
import struct
import tempfile
import zlib

import h5py
import numcodecs
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def save(target, name, data):
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as out:
        out.write(data)


def codecs():
    data = (np.arange(64, dtype=np.int32) % 7).tobytes()
    size = struct.pack("<I", len(data))[:3]
    gzip = numcodecs.GZip(level=5).encode(data)
    blosc = numcodecs.Blosc(cname="lz4", shuffle=1, typesize=4).encode(data)
    for selector, name, payload in [
        (0, "zlib", zlib.compress(data)),
        (1, "gzip", bytes(gzip)),
        (2, "zstd", bytes(numcodecs.Zstd(level=3).encode(data))),
        (3, "blosc", bytes(blosc)),
    ]:
        save("codecs", name, bytes([selector]) + size + payload)
    # Parts of a frame (selector bit 7) of 512 float32 in [1, 2): byte planes of noise stored raw, one lz4.
    floats = (1 + np.random.default_rng(0).random(512, dtype=np.float32)).tobytes()
    split = numcodecs.Blosc(cname="lz4", clevel=3, shuffle=1, typesize=4).encode(floats)
    save("codecs", "blosc_ranges", bytes([0x83]) + struct.pack("<I", len(floats))[:3] + bytes(split))
    # The same, trusted (bit 6): only the lz4 prefixes the parts need are decoded.
    save("codecs", "blosc_ranges_trusted", bytes([0xC3]) + struct.pack("<I", len(floats))[:3] + bytes(split))
    # Scale-offset: 4-byte elements (selector bits 3-4 = 2), minbits 3, minval 100, 8 values.
    packed = bytes([0b00000101, 0b00111001, 0b01110111])
    header = struct.pack("<I", 3) + bytes([8]) + struct.pack("<Q", 100) + bytes(8)
    save("codecs", "scaleoffset", bytes([4 | (2 << 3)]) + struct.pack("<I", 32)[:3] + header + packed)


def zarr_inputs():
    data = np.arange(8, dtype="<i4")
    v2 = {
        "zarr_format": 2,
        "shape": [8],
        "chunks": [8],
        "dtype": "<i4",
        "compressor": {"id": "zstd", "level": 3},
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
    save("zarr", "v2_zstd", b"\x01" + json.dumps(v2).encode() + b"\0" + bytes(numcodecs.Zstd().encode(data)))
    strings = dict(
        v2,
        dtype="|O",
        filters=[{"id": "vlen-utf8"}],
        compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
    )
    chunk = numcodecs.Blosc(cname="lz4").encode(numcodecs.VLenUTF8().encode(np.array(["a", "bc"] * 4, dtype=object)))
    save("zarr", "v2_strings", b"\x01" + json.dumps(strings).encode() + b"\0" + bytes(chunk))
    v3 = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [8, 2],
        "data_type": "int16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [
            {"name": "transpose", "configuration": {"order": [1, 0]}},
            {"name": "bytes", "configuration": {"endian": "big"}},
            {"name": "gzip", "configuration": {"level": 5}},
        ],
    }
    raw = np.arange(16, dtype=">i2").reshape(8, 2).T.tobytes()
    save("zarr", "v3_transpose_gzip", b"\x08" + json.dumps(v3).encode() + b"\0" + bytes(numcodecs.GZip().encode(raw)))
    sharded = dict(
        v3,
        shape=[8],
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": [8]}},
        codecs=[
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [4],
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_location": "end",
                },
            }
        ],
    )
    body = np.arange(8, dtype="<i2").tobytes()
    index = struct.pack("<QQQQ", 0, 8, 8, 8)
    save("zarr", "v3_sharded", b"\x06" + json.dumps(sharded).encode() + b"\0" + body + index)


def hdf5_inputs():
    with tempfile.TemporaryDirectory() as scratch:
        for libver in ("earliest", "v110"):
            path = os.path.join(scratch, f"{libver}.h5")
            with h5py.File(path, "w", libver=(libver, "v110") if libver != "earliest" else None) as f:
                f.create_dataset("x", data=np.arange(12, dtype="<i4"), chunks=(4,), compression="gzip")
                f["x"].attrs["name"] = "a vlen string"
                f["x"].attrs["n"] = np.int64(3)
                address = h5py.h5o.get_info(f["x"].id).addr
            raw = open(path, "rb").read()
            # The dataset's object header moved to address 0 (its continuation
            # addresses then point elsewhere: the fuzzer explores from there).
            save("hdf5_format", f"header_{libver}", raw[address : address + 512])
    shutil.rmtree(os.path.join(HERE, "corpus", "hdf5_format", "__pycache__"), ignore_errors=True)


if __name__ == "__main__":
    codecs()
    zarr_inputs()
    hdf5_inputs()
