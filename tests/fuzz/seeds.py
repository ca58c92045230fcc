"""Seed files of the fuzzing harness, written by the reference libraries
(h5py, anndata, zarr) with fixed random seeds: every layout, codec and read
path torch_shards has, each kept to a few kilobytes so thousands of mutated
copies read quickly.

A seed is described by a JSON-serialisable dict:
  name      unique name
  kind      "hdf5", "zarr" or "anndata"
  path      file or store directory, relative to the seed directory
  fields    {field: dataset/array path} (hdf5, zarr)
  obs       obs columns read (anndata)
  regions   [[offset, size], ...]: bytes of an HDF5 file that hold array data
            (chunks, contiguous storage); the rest is metadata
"""

import json
import os
import warnings

import anndata as ad
import h5py
import hdf5plugin
import numcodecs
import numpy as np
import pandas as pd
import scipy.sparse as sp
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec


def _values(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(low, high, size=shape).astype(dtype)


def _data_regions(path):
    """Byte ranges holding array data (chunks, contiguous storage) of every dataset."""
    regions = []

    def visit(name, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        dsid = obj.id
        layout = dsid.get_create_plist().get_layout()
        if layout == h5py.h5d.CONTIGUOUS:
            offset = dsid.get_offset()
            if offset is not None:
                regions.append([int(offset), int(dsid.get_storage_size())])
        elif layout == h5py.h5d.CHUNKED:
            for i in range(dsid.get_num_chunks()):
                info = dsid.get_chunk_info(i)
                regions.append([int(info.byte_offset), int(info.size)])

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return sorted(regions)


def _hdf5_seeds(directory, rng):
    seeds = []

    def seed(name, fields, writer, libver=None):
        path = f"{name}.h5"
        with h5py.File(os.path.join(directory, path), "w", libver=libver) as f:
            writer(f)
        seeds.append(
            dict(
                name=name,
                kind="hdf5",
                path=path,
                fields=fields,
                regions=_data_regions(os.path.join(directory, path)),
            )
        )

    def contiguous(f):
        f["x"] = _values(rng, "f4", (40, 6))
        f["labels"] = _values(rng, ">i2", (40,))
        f["mask"] = _values(rng, "bool", (40,))
        f["z"] = _values(rng, "c8", (40, 2))

    seed("h5_contiguous", {"X": "/x", "y": "/labels", "m": "/mask", "z": "/z"}, contiguous)

    def gzip_shuffle(f):
        f.create_dataset("g/x", data=_values(rng, "f8", (50, 5)), chunks=(8, 5), compression="gzip", shuffle=True)
        f.create_dataset("g/raw", data=_values(rng, "u1", (50, 3)), chunks=(7, 2))
        f.create_dataset("g/y", data=_values(rng, "<u4", (50,)), chunks=(16,), compression="gzip")

    seed("h5_gzip", {"X": "/g/x", "raw": "/g/raw", "y": "/g/y"}, gzip_shuffle)

    def blosc(f):
        f.create_dataset(
            "x", data=_values(rng, "i4", (60, 4)), chunks=(16, 4), **hdf5plugin.Blosc(cname="lz4", clevel=5)
        )
        f.create_dataset(
            "y",
            data=_values(rng, "f4", (60, 3)),
            chunks=(10, 3),
            **hdf5plugin.Blosc(cname="zstd", clevel=3, shuffle=hdf5plugin.Blosc.BITSHUFFLE),
        )

    seed("h5_blosc", {"X": "/x", "y": "/y"}, blosc)

    def zstd(f):
        f.create_dataset("x", data=_values(rng, "f4", (60, 4)), chunks=(10, 4), **hdf5plugin.Zstd(clevel=3))
        f.create_dataset("y", data=_values(rng, ">i8", (60,)), chunks=(25,), **hdf5plugin.Zstd(clevel=1))

    seed("h5_zstd", {"X": "/x", "y": "/y"}, zstd)

    def library_filters(f):
        f.create_dataset("fletcher", data=_values(rng, "i4", (30, 4)), chunks=(10, 4), fletcher32=True)
        f.create_dataset("scaleoffset", data=_values(rng, "i4", (30, 4)), chunks=(8, 4), scaleoffset=0)
        space = h5py.h5s.create_simple((30, 3))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        h5py.h5d.create(f.id, b"compact", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
        f["compact"][...] = _values(rng, "f4", (30, 3))

    seed("h5_library_filters", {"X": "/fletcher", "s": "/scaleoffset", "c": "/compact"}, library_filters)

    def cube(f):
        f.create_dataset("cube", data=_values(rng, "f4", (20, 3, 4)), chunks=(5, 2, 3), compression="gzip")

    seed("h5_cube", {"X": "/cube"}, cube)

    def latest(f):
        # libver v110: object headers and chunk indexes with checksums
        # (fixed array, extensible array, v2 B-tree).
        f.create_dataset("fixed", data=_values(rng, "f4", (40, 4)), chunks=(8, 4), compression="gzip")
        ext = f.create_dataset("ext", shape=(40, 4), maxshape=(None, 4), chunks=(8, 4), dtype="i2")
        ext[...] = _values(rng, "i2", (40, 4))
        both = f.create_dataset("btree", shape=(40, 4), maxshape=(None, None), chunks=(8, 2), dtype="f8")
        both[...] = _values(rng, "f8", (40, 4))

    # The newest format HDF5 1.10 reads (HDF5 2.0's "latest" writes layout messages 1.10 cannot).
    seed("h5_latest", {"X": "/fixed", "e": "/ext", "b": "/btree"}, latest, libver=("earliest", "v110"))

    def fill(f):
        d = f.create_dataset("x", shape=(64, 4), dtype="f4", chunks=(8, 4), fillvalue=-7.5, compression="gzip")
        d[16:32] = _values(rng, "f4", (16, 4))
        e = f.create_dataset("u", shape=(64,), dtype="u2", chunks=(16,), fillvalue=9)
        e[40:48] = 3

    seed("h5_fill", {"X": "/x", "u": "/u"}, fill)
    return seeds


def _adata(rng, n_obs, n_vars, x_format):
    dense = (rng.standard_normal((n_obs, n_vars)) * 10).astype(np.float32)
    dense[rng.random((n_obs, n_vars)) > 0.25] = 0
    x = sp.csr_matrix(dense) if x_format == "csr" else dense.astype(np.float64)
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["T", "B", "NK", "Mono"], size=n_obs)),
            "batch": pd.Categorical(rng.choice([3, 1, 2], size=n_obs)),
            "n_counts": rng.integers(0, 1000, size=n_obs).astype(np.int32),
            "score": rng.standard_normal(n_obs),
        },
        index=[f"cell{i}" for i in range(n_obs)],
    )
    var = pd.DataFrame(index=[f"gene{j}" for j in range(n_vars)])
    return ad.AnnData(X=x, obs=obs, var=var)


OBS = ["cell_type", "batch", "n_counts", "score"]


def _anndata_seeds(directory, rng):
    seeds = []

    def seed(name, path, writer):
        writer(os.path.join(directory, path))
        entry = dict(name=name, kind="anndata", path=path, obs=OBS)
        if path.endswith(".h5ad"):
            entry["regions"] = _data_regions(os.path.join(directory, path))
        seeds.append(entry)

    seed("h5ad_csr", "csr.h5ad", lambda path: _adata(rng, 60, 20, "csr").write_h5ad(path))
    seed("h5ad_dense", "dense.h5ad", lambda path: _adata(rng, 40, 12, "dense").write_h5ad(path))
    seed(
        "h5ad_csr_gzip",
        "csr_gzip.h5ad",
        lambda path: _adata(rng, 50, 16, "csr").write_h5ad(path, compression="gzip"),
    )

    def zarr2(path, x_format):
        with ad.settings.override(zarr_write_format=2):
            _adata(rng, 48, 10, x_format).write_zarr(path)

    def zarr3(path, x_format):
        with ad.settings.override(zarr_write_format=3, auto_shard_zarr_v3=True):
            _adata(rng, 48, 10, x_format).write_zarr(path)

    seed("zarr2_anndata_csr", "ad2_csr.zarr", lambda path: zarr2(path, "csr"))
    seed("zarr3_anndata_dense", "ad3_dense.zarr", lambda path: zarr3(path, "dense"))
    seed("zarr3_anndata_csr", "ad3_csr.zarr", lambda path: zarr3(path, "csr"))
    return seeds


def _zarr_seeds(directory, rng):
    seeds = []

    def seed(name, fields, writer):
        path = f"{name}.zarr"
        writer(os.path.join(directory, path))
        seeds.append(dict(name=name, kind="zarr", path=path, fields=fields))

    def v2_arrays(path):
        group = zarr.open_group(path, mode="w", zarr_format=2)
        a = group.create_array(
            "blosc", shape=(50, 6), chunks=(8, 4), dtype="f4", compressors=numcodecs.Blosc(cname="lz4", shuffle=1)
        )
        a[...] = _values(rng, "f4", (50, 6))
        b = group.create_array(
            "zstd_f", shape=(50, 5), chunks=(16, 5), dtype="i8", order="F", compressors=numcodecs.Zstd(level=3)
        )
        b[...] = _values(rng, "i8", (50, 5))
        c = group.create_array("gzip_be", shape=(50,), chunks=(12,), dtype=">f8", compressors=numcodecs.GZip(level=5))
        c[...] = _values(rng, ">f8", (50,))
        d = group.create_array("sparse", shape=(50, 2), chunks=(10, 2), dtype="u2", fill_value=7, compressors=None)
        d[10:20] = 3
        e = group.create_array(
            "zlib",
            shape=(50, 3),
            chunks=(9, 3),
            dtype="i2",
            compressors=numcodecs.Zlib(level=4),
            chunk_key_encoding={"name": "v2", "separator": "/"},
        )
        e[...] = _values(rng, "i2", (50, 3))

    seed(
        "zarr2_arrays",
        {"X": "/blosc", "f": "/zstd_f", "g": "/gzip_be", "s": "/sparse", "z": "/zlib"},
        v2_arrays,
    )

    def v3_arrays(path):
        group = zarr.open_group(path, mode="w", zarr_format=3)
        a = group.create_array(
            "zstd",
            shape=(40, 5),
            chunks=(8, 5),
            dtype="i4",
            serializer=BytesCodec(),
            compressors=[ZstdCodec(level=3), Crc32cCodec()],
        )
        a[...] = _values(rng, "i4", (40, 5))
        b = group.create_array(
            "transposed",
            shape=(40, 6),
            chunks=(10, 4),
            dtype="f4",
            filters=[TransposeCodec(order=(1, 0))],
            compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
        )
        b[...] = _values(rng, "f4", (40, 6))
        c = group.create_array(
            "gzip_be",
            shape=(40,),
            chunks=(16,),
            dtype="u8",
            serializer=BytesCodec(endian="big"),
            compressors=[GzipCodec(level=5)],
            fill_value=5,
        )
        c[:24] = _values(rng, "u8", (24,))

    seed("zarr3_arrays", {"X": "/zstd", "t": "/transposed", "g": "/gzip_be"}, v3_arrays)

    def v3_sharded(path):
        group = zarr.open_group(path, mode="w", zarr_format=3)
        a = group.create_array(
            "end",
            shape=(64, 4),
            shards=(32, 4),
            chunks=(8, 4),
            dtype="f4",
            compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        )
        a[...] = _values(rng, "f4", (64, 4))
        sharding = ShardingCodec(
            chunk_shape=(5, 3),
            codecs=[BytesCodec(endian="big"), GzipCodec(level=3)],
            index_codecs=[BytesCodec(), Crc32cCodec()],
            index_location="start",
        )
        b = zarr.create_array(
            store=os.path.join(path, "start"),
            shape=(64, 3),
            chunks=(20, 3),
            dtype="i2",
            serializer=sharding,
            compressors=None,
            zarr_format=3,
            overwrite=True,
        )
        b[:55] = _values(rng, "i2", (55, 3))

    seed("zarr3_sharded", {"X": "/end", "s": "/start"}, v3_sharded)
    return seeds


def write_seeds(directory, seed=0):
    """Writes every seed file into `directory`; returns their descriptions."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seeds = _hdf5_seeds(directory, rng) + _anndata_seeds(directory, rng) + _zarr_seeds(directory, rng)
    with open(os.path.join(directory, "seeds.json"), "w") as out:
        json.dump(seeds, out, indent=1)
    return seeds


if __name__ == "__main__":
    import sys

    for entry in write_seeds(sys.argv[1]):
        print(entry["name"], entry["kind"], entry["path"])
