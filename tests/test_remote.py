"""Sources read from URLs: a plain HTTP server with Range support and an S3-compatible server
(moto), both started by the tests on 127.0.0.1, a fault-injecting proxy in front of them, and every
read compared with the same read of the local files."""

import gc
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import torch
import zarr
from conftest import RANDOM_OBS_COLUMNS, random_anndata, write_anndata
from remote_servers import FAULT_KINDS, FaultProxy, RangeHTTPServer, S3Server
from torch.utils.data import DataLoader

import torch_shards as ts

pytestmark = pytest.mark.timeout(180)

# moto's keys (it checks no signature unless asked to, but refuses unsigned requests), set when this module
# is collected: a DataLoader forkserver started later by any test has them, as a user's would.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")

ROWS = 600
COLLECTION = Path(__file__).parent / "data" / "anndata" / "annbatch-0.3.1" / "collection.zarr"
STORES = ["cells.h5ad", "cells_v2.zarr", "cells_v3.zarr", "sharded.zarr", "chunks_v2.zarr", "plain.h5"]


def put_collection_in_bucket(root):
    """The test collection as s3://public/collection.zarr of a server serving root."""
    shutil.copytree(COLLECTION, root / "public" / "collection.zarr")


def dense(value):
    return value.to_dense() if value.is_sparse_csr else value


def same_batches(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(dense(a[key]), dense(b[key])), key


def read_as_local(batches, local, rows, checked=3):
    """Asserts that an epoch's batches hold every row of `rows` once, and that the first `checked` hold
    what `local` (the same store on disk) reads for their rows."""
    seen = torch.cat([batch["index"] for batch in batches])
    assert sorted(seen.tolist()) == list(range(rows))
    for batch in batches[:checked]:
        same_batches({k: v for k, v in batch.items() if k != "index"}, local.read(batch["index"]))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One of each kind of store users keep in object storage."""
    root = tmp_path_factory.mktemp("remote")
    rng = np.random.default_rng(0)
    X = sp.random(ROWS, 50, density=0.1, format="csr", dtype=np.float32, random_state=1)
    adata = ad.AnnData(X=X)
    adata.obs["cell_type"] = pd_categorical(rng)
    adata.write_h5ad(root / "cells.h5ad")
    with ad.settings.override(zarr_write_format=2):
        adata.write_zarr(root / "cells_v2.zarr")
    with ad.settings.override(zarr_write_format=3):
        adata.write_zarr(root / "cells_v3.zarr")
    values = rng.standard_normal((ROWS, 12)).astype(np.float32)
    sharded = zarr.create_array(
        root / "sharded.zarr", shape=values.shape, chunks=(16, 12), shards=(128, 12), dtype="float32"
    )
    sharded[:] = values
    chunks = zarr.create_array(
        root / "chunks_v2.zarr", shape=values.shape, chunks=(32, 12), dtype="float32", zarr_format=2
    )
    chunks[:] = values
    with h5py.File(root / "plain.h5", "w") as f:
        f.create_dataset("values", data=values, chunks=(40, 12), compression="gzip", shuffle=True)
        f.create_dataset("contiguous", data=values)
    shutil.copytree(COLLECTION, root / "collection.zarr")  # written by annbatch 0.3.1
    return root


def pd_categorical(rng):
    import pandas as pd

    return pd.Categorical(rng.choice(["B", "T", "NK"], ROWS))


def source_of(location, name, **storage):
    if name == "plain.h5":
        return ts.open(f"{location}/{name}", dataset={"X": "/values", "c": "/contiguous"}, **storage)
    if name.endswith("cells.h5ad") or name.startswith("cells"):
        return ts.open(f"{location}/{name}", obs=["cell_type"], **storage)
    return ts.open(f"{location}/{name}", **storage)


@pytest.fixture(scope="module")
def http(data_dir):
    with RangeHTTPServer(data_dir) as server:
        yield server


@pytest.fixture(scope="module")
def s3(data_dir):
    with S3Server() as server:
        server.create_bucket("cells")
        server.put_tree("cells", "stores", data_dir)
        server.local_copy = data_dir
        yield server


@pytest.fixture
def s3_credentials(s3, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))


ROW_SETS = [torch.arange(ROWS), torch.tensor([5, 3, 590, 3, 128, 127, 400]), torch.arange(ROWS - 1, -1, -7)]


@pytest.mark.parametrize("name", STORES)
def test_http_reads_equal_local_reads(data_dir, http, name):
    local, remote = source_of(data_dir, name), source_of(http.url, name)
    assert len(local) == len(remote) == ROWS
    for rows in ROW_SETS:
        same_batches(local.read(rows, num_threads=2), remote.read(rows, num_threads=2))


@pytest.mark.parametrize("name", STORES)
def test_s3_reads_equal_local_reads(data_dir, s3, s3_credentials, name):
    local, remote = source_of(data_dir, name), source_of("s3://cells/stores", name)
    assert len(local) == len(remote) == ROWS
    for rows in ROW_SETS:
        same_batches(local.read(rows, num_threads=2), remote.read(rows, num_threads=2))


def test_random_anndata_behind_a_url_reads_as_on_disk(tmp_path):
    # Random AnnData (conftest.random_anndata: dtypes, densities, dense or CSR X and layer, every obs
    # encoding with missing values; .h5ad, zarr v2 or v3) served over HTTP, with consolidated metadata or
    # each node's own files, with a node-local cache or none: the same batches and categories as on disk.
    rng = random.Random(2)
    columns = RANDOM_OBS_COLUMNS
    with RangeHTTPServer(tmp_path) as server:
        for trial in range(24):
            n_obs = rng.choice([1, 2, 7, 64, 300])
            name = f"{trial}/" + rng.choice(["a.h5ad", "a.zarr2.zarr", "a.zarr"])
            (tmp_path / str(trial)).mkdir()
            write_anndata(random_anndata(rng, n_obs), tmp_path / name)
            options = dict(obs=columns, dense=rng.random() < 0.3, fields={"counts": "layers/counts", "pca": "obsm/pca"})
            storage = {"consolidated": rng.random() < 0.5}
            if rng.random() < 0.3:
                storage["cache_dir"] = str(tmp_path / f"cache{trial}")
            local = ts.AnnDataSource(str(tmp_path / name), **options)
            remote = ts.AnnDataSource(f"{server.url}/{name}", storage=storage, **options)
            rows = [rng.randrange(n_obs) for _ in range(rng.choice([1, 5, 40]))]
            expected, got = local.read(rows), remote.read(rows, num_threads=rng.randint(1, 3))
            context = (trial, name, options["dense"], storage)
            assert sorted(expected) == sorted(got), context
            for key in expected:
                assert expected[key].dtype == got[key].dtype, (key, context)
                assert torch.equal(dense(expected[key]), dense(got[key])), (key, context)
            for column in ("category", "string"):
                assert local.categories(column) == remote.categories(column), (column, context)


def test_an_annbatch_collection_on_s3_reads_as_its_local_copy(data_dir, s3, s3_credentials):
    local, remote = ts.open(data_dir / "collection.zarr"), ts.open("s3://cells/stores/collection.zarr")
    assert len(remote.sources) == len(local.sources) > 1
    rows = torch.randperm(len(local))[:200]
    same_batches(local.read(rows), remote.read(rows))


def test_an_unsigned_s3_endpoint_lists_a_collection(data_dir, tmp_path):
    # Anonymous (unsigned) requests to an S3-compatible endpoint: the HTTP server answering ListObjectsV2.
    put_collection_in_bucket(tmp_path)
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        remote = ts.open("s3://public/collection.zarr", endpoint_url=server.url, anonymous=True)
        local = ts.open(COLLECTION)
        same_batches(local.read(torch.arange(len(local))), remote.read(torch.arange(len(local))))
        assert not any("Authorization" in str(entry) for entry in server.requests)


def test_the_same_s3_url_at_two_endpoints_is_two_objects(tmp_path):
    # s3://public/a.zarr at two endpoints, one after the other in one process: what was learnt opening the
    # first (its objects' ETags, its small objects) is never used for the second.
    for name, rows in (("one", 40), ("two", 56)):
        (tmp_path / name / "public").mkdir(parents=True)
        values = np.full((rows, 3), rows, dtype=np.float32)
        store = tmp_path / name / "public" / "a.zarr"
        zarr.create_array(store, shape=values.shape, chunks=(8, 3), dtype="float32")[:] = values
    with (
        RangeHTTPServer(tmp_path / "one", s3_listing=True) as one,
        RangeHTTPServer(tmp_path / "two", s3_listing=True) as two,
    ):
        for server, rows in ((one, 40), (two, 56)):
            source = ts.open("s3://public/a.zarr", endpoint_url=server.url, anonymous=True)
            assert len(source) == rows
            assert torch.equal(source.read(torch.arange(rows))["X"], torch.full((rows, 3), float(rows)))


def test_the_cache_keeps_the_same_s3_url_at_two_endpoints_apart(tmp_path):
    # One node-local cache, s3://public/a.zarr at two endpoints whose objects carry the same ETags (here one
    # directory served twice, its shard rewritten in place between the reads: same size, inode and mtime, so
    # the same ETag): what the first endpoint's bytes filled is never served for the second's.
    def sharded(root, value):
        array = zarr.create_array(
            root / "a.zarr", shape=(16, 3), chunks=(8, 3), shards=(16, 3), dtype="float32", compressors=None
        )
        array[:] = np.full((16, 3), value, np.float32)
        (shard,) = [path for path in (root / "a.zarr" / "c").rglob("*") if path.is_file()]
        return shard

    (tmp_path / "public").mkdir()
    shard = sharded(tmp_path / "public", 1)
    cache = tmp_path / "cache"
    with (
        RangeHTTPServer(tmp_path, s3_listing=True) as one,
        RangeHTTPServer(tmp_path, s3_listing=True) as two,
    ):
        first = ts.open("s3://public/a.zarr", endpoint_url=one.url, anonymous=True, cache_dir=cache)
        assert torch.equal(first.read(torch.arange(16))["X"], torch.ones(16, 3))
        twos = sharded(tmp_path / "elsewhere", 2).read_bytes()
        before = shard.stat()
        assert len(twos) == before.st_size
        with open(shard, "r+b") as file:  # the same file, the same size
            file.write(twos)
        os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (shard.stat().st_ino, shard.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        second = ts.open("s3://public/a.zarr", endpoint_url=two.url, anonymous=True, cache_dir=cache)
        assert torch.equal(second.read(torch.arange(16))["X"], torch.full((16, 3), 2.0))


def test_a_store_rewritten_and_opened_again_at_once_is_read_as_it_is_now(tmp_path):
    # What opening learns of objects (zarr.json's bytes, stamps) is reused within that opening only: a store
    # rewritten and opened again a moment later in the same process (before, within the 10 s such things
    # were kept, it read as 40 rows of the old store) reads as it is now, metadata and chunks alike.
    (tmp_path / "public").mkdir()
    store = tmp_path / "public" / "a.zarr"
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        for rows in (40, 56, 24):
            shutil.rmtree(store, ignore_errors=True)
            values = np.full((rows, 3), rows, dtype=np.float32)
            zarr.create_array(store, shape=values.shape, chunks=(8, 3), dtype="float32")[:] = values
            for url, options in (
                ("s3://public/a.zarr", {"endpoint_url": server.url, "anonymous": True}),
                (f"{server.url}/public/a.zarr", {}),
            ):
                source = ts.open(url, **options)
                assert len(source) == rows, url
                assert torch.equal(source.read(torch.arange(rows))["X"], torch.full((rows, 3), float(rows))), url


def test_opening_a_collection_asks_for_nothing_twice(tmp_path):
    # Opening walks the store's metadata node by node, each request a round trip (4.7 s for an annbatch
    # collection at 20 ms a request before this held): none is repeated, no v3 node is probed for v2 files
    # first, and a metadata object read whole is not asked for its stamp again (HEAD).
    put_collection_in_bucket(tmp_path)
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        local = ts.open(COLLECTION)
        remote = ts.open("s3://public/collection.zarr", endpoint_url=server.url, anonymous=True)
        assert len(remote) == len(local)
        requests = list(server.requests)
        assert len(requests) == len(set(requests)), [r for r in requests if requests.count(r) > 1]
        read_whole = {path for method, path, byte_range in requests if method == "GET" and byte_range is None}
        assert not [path for method, path, _ in requests if method == "HEAD" and path in read_whole]
        assert not [path for _, path, _ in requests if path.endswith((".zgroup", ".zarray"))]


def test_opening_a_collection_over_s3_lists_it_once_and_asks_for_its_metadata_together(tmp_path):
    # One listing of everything below the store answers which objects and "directories" exist (no HEAD,
    # no max-keys=1 listing per node) and names the zarr metadata, fetched together: the collection opens
    # in 6 round trips instead of 19 (0.48 s -> 0.20 s at 20 ms a request). The listing's sizes and ETags
    # stamp the shards too: reading them asks for no HEAD. A path of its own: other tests' openings of
    # s3://public/collection.zarr registered options for its datasets (their servers' endpoints), under
    # which what this opening learns would be kept apart from what its reads look up (they then ask).
    shutil.copytree(COLLECTION, tmp_path / "public" / "listed.zarr")
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        remote = ts.open("s3://public/listed.zarr", endpoint_url=server.url, anonymous=True)
        listings = [path for _, path, _ in server.requests if "list-type=2" in path]
        assert listings == ["/public/?list-type=2&prefix=listed.zarr%2F"]  # recursive: no delimiter
        heads = [path for method, path, _ in server.requests if method == "HEAD"]
        assert heads == ["/public/listed.zarr"]  # an object (an .h5ad) is not listed; shards are
        metadata = {path for method, path, _ in server.requests if method == "GET" and path.endswith("zarr.json")}
        assert metadata == {
            "/public/listed.zarr/" + str(path.relative_to(COLLECTION)) for path in COLLECTION.rglob("zarr.json")
        }
        rows = torch.arange(len(remote))
        same_batches(ts.open(COLLECTION).read(rows), remote.read(rows))
        assert [path for method, path, _ in server.requests if method == "HEAD"] == heads


def test_a_shard_rewritten_after_its_store_was_listed_is_refused(tmp_path):
    # The listing's ETag is the shard's stamp at open: a shard rewritten before it is read is refused
    # (If-Match), as one stamped by a HEAD would be.
    # A path of its own: other tests' openings of s3://public/collection.zarr registered options for its
    # datasets (their servers' endpoints), under which this opening's stamps would be learnt apart from
    # what its reads look up (then they ask with a HEAD, after the rewrite).
    shutil.copytree(COLLECTION, tmp_path / "public" / "relisted.zarr")
    shard = next((tmp_path / "public" / "relisted.zarr").rglob("X/data/c/0"))
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        remote = ts.open("s3://public/relisted.zarr", endpoint_url=server.url, anonymous=True)
        time.sleep(0.01)
        shard.write_bytes(shard.read_bytes())  # the same bytes, another ETag (mtime)
        with pytest.raises(RuntimeError, match="changed since the dataset opened it"):
            remote.read(torch.arange(len(remote)))


class _RefusingFullListings(RangeHTTPServer.handler_class):
    """S3's answer to a caller that may list a prefix's children but not all that lies below it."""

    def _list_objects(self, files, query):
        if "delimiter" not in query and "max-keys" not in query:
            return self.send_complete(403, b"<Error><Code>AccessDenied</Code></Error>")
        return super()._list_objects(files, query)


def read_collection_served_by(tmp_path, handler_class):
    """Opens the test collection from a bucket of a server whose requests handler_class answers, checks
    every row against the local collection, and returns the server (its log of requests)."""
    put_collection_in_bucket(tmp_path)
    with type("Server", (RangeHTTPServer,), {"handler_class": handler_class})(tmp_path, s3_listing=True) as server:
        remote = ts.open("s3://public/collection.zarr", endpoint_url=server.url, anonymous=True)
        rows = torch.arange(len(remote))
        same_batches(ts.open(COLLECTION).read(rows), remote.read(rows))
        return server


def test_a_store_whose_listing_is_refused_opens_asking_for_each_thing(tmp_path):
    # Public buckets often refuse listings: opening then asks for each object and directory as it goes.
    server = read_collection_served_by(tmp_path, _RefusingFullListings)
    assert "/public/?list-type=2&prefix=collection.zarr%2F" in [path for _, path, _ in server.requests]
    assert [method for method, _, _ in server.requests].count("HEAD") > 4  # asked for one by one


class _RefusingUns(RangeHTTPServer.handler_class):
    """Refuses (403) every dataset's uns metadata, which opening its X and obs does not read."""

    def _serve(self):
        if self.path.endswith("/uns/zarr.json"):
            self.server.owner.record(self.command, self.path, None)
            return self.send_complete(403, b"<Error><Code>AccessDenied</Code></Error>")
        return super()._serve()


def test_a_listed_metadata_object_that_cannot_be_read_fails_only_an_opening_that_needs_it(tmp_path):
    # The listing names every zarr.json below the store, and opening fetches them all at once: one refused
    # to this caller is left for the opening to ask for, which does not need uns.
    server = read_collection_served_by(tmp_path, _RefusingUns)
    assert "/public/collection.zarr/dataset_0/uns/zarr.json" in [path for _, path, _ in server.requests]


def test_endpoint_url_option_overrides_the_environment(data_dir, s3, s3_credentials, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    remote = ts.open("s3://cells/stores/sharded.zarr", endpoint_url=s3.endpoint_url)
    same_batches(ts.open(data_dir / "sharded.zarr").read(ROW_SETS[1]), remote.read(ROW_SETS[1]))


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_s3_dataloader_workers_deliver_every_row_once(s3, s3_credentials, context, tmp_path):
    # The workers share one node-local cache: two epochs, the second from it. The endpoint is passed, not
    # left to AWS_ENDPOINT_URL: a forkserver started by an earlier test has the environment of then.
    source = ts.open(
        "s3://cells/stores/cells_v3.zarr", obs=["cell_type"], cache_dir=tmp_path / "cache", endpoint_url=s3.endpoint_url
    )
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=16), batch_size=32)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    local = ts.open(s3.local_copy / "cells_v3.zarr", obs=["cell_type"])
    for _ in range(2):
        read_as_local(list(loader), local, ROWS)
    assert any(path.is_file() for path in (tmp_path / "cache").rglob("*"))


def test_the_torchscript_door_reads_urls(data_dir, http):
    ops = torch.ops.torch_shards
    ops.set_storage_options(http.url, '{"max_requests": 4, "retries": 2}')
    source = ops.zarr_source(f"{http.url}/sharded.zarr", {"X": "/"})
    same_batches(ts.open(data_dir / "sharded.zarr").read(ROW_SETS[1]), dict(source.read(ROW_SETS[1], 2)))
    with pytest.raises(ValueError, match="unknown storage option colour"):
        ops.set_storage_options(http.url, '{"colour": 1}')


@pytest.mark.parametrize("fault", ["status_503", "status_500", "status_429", "reset", "drop_mid_body", "truncate"])
def test_transient_faults_are_retried(data_dir, http, fault):
    with FaultProxy(http.url) as proxy:
        remote = source_of(proxy.url, "sharded.zarr", retries=6)
        proxy.inject(fault, count=3)
        same_batches(source_of(data_dir, "sharded.zarr").read(ROW_SETS[0]), remote.read(ROW_SETS[0]))
        assert proxy.pending() == 0 and len(proxy.fired) == 3


def test_whole_objects_cached_through_faults_are_stored_intact(data_dir, http, tmp_path):
    # A part of a shard's download cut off mid-body is fetched again from its start; the entry's CRC,
    # taken as the bytes arrived, is that of the bytes stored: another process maps the entries (each
    # checked against its CRC; a mismatch would be a miss, fetched again) without asking for a shard.
    cache = tmp_path / "cache"
    check = (
        "import sys, torch, torch_shards as ts\n"
        "source = ts.open(sys.argv[1], cache_dir=sys.argv[2])\n"
        "source.read(torch.arange(len(source)))\n"
    )
    with FaultProxy(http.url) as proxy:
        remote = source_of(proxy.url, "sharded.zarr", cache_dir=cache)
        proxy.inject("drop_mid_body", count=3, path_contains="sharded.zarr/c/", method="GET")
        same_batches(source_of(data_dir, "sharded.zarr").read(ROW_SETS[0]), remote.read(ROW_SETS[0]))
        assert len(proxy.fired) == 3
        assert len(ranged_gets(proxy, "sharded.zarr/c/")) == 5 + 3  # each shard whole, 3 of them twice
        proxy.reset_log()
        command = [sys.executable, "-c", check, f"{proxy.url}/sharded.zarr", str(cache)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ranged_gets(proxy, "sharded.zarr/c/") == []


def test_faults_past_the_retries_raise_naming_the_url(http):
    with FaultProxy(http.url) as proxy:
        remote = source_of(proxy.url, "plain.h5", retries=1)
        proxy.inject("status_503", count=10, path_contains="plain.h5")
        # The two fields are read together: whichever asks first names itself.
        expected = r"plain\.h5: (dataset /values chunk .*|/contiguous: )HTTP 503 .*after 2 attempts"
        with pytest.raises(RuntimeError, match=expected):
            remote.read(torch.arange(ROWS))


def test_a_file_of_another_format_behind_a_url_is_refused_as_on_disk(tmp_path):
    (tmp_path / "notes.txt").write_text("neither HDF5 nor zarr\n" * 40)
    with RangeHTTPServer(tmp_path) as server:
        for location in (tmp_path, server.url):
            with pytest.raises(ValueError, match=f"{location}/notes.txt is neither an HDF5 file nor a zarr store"):
                ts.open(f"{location}/notes.txt")


PROBED = [("cells.h5ad", "cells.h5ad", True), ("cells_v3.zarr", "cells_v3.zarr/zarr.json", True)]
PROBED += [("cells_v3.zarr", "cells_v3.zarr/zarr.json", False), ("cells_v2.zarr", "cells_v2.zarr/.zgroup", False)]


@pytest.mark.parametrize(("name", "asked", "consolidated"), PROBED)
def test_a_request_failing_while_the_format_is_probed_raises_naming_the_url(http, name, asked, consolidated):
    # The store's first bytes or its metadata not read (503 past the retries): the failure, not a verdict
    # on the format ("neither an HDF5 file nor a zarr store" before). Without consolidated metadata the
    # probe itself is the first to ask for a zarr store's metadata.
    with FaultProxy(http.url) as proxy:
        proxy.inject("status_503", count=2, path_contains=asked, method="GET")
        with pytest.raises(RuntimeError, match=f"{proxy.url}/{asked}: .*HTTP 503 .*after 2 attempts"):
            source_of(proxy.url, name, retries=1, consolidated=consolidated)
        assert len(proxy.fired) == 2


def inject_faults(proxy, faults):
    """Injects each (kind, count, path_contains) of faults into proxy ("slow": 2 s)."""
    for kind, count, where in faults:
        proxy.inject(kind, count=count, path_contains=where, seconds=2.0 if kind == "slow" else None)


def open_behind(proxy, name, storage):
    """The store `name` opened through proxy: collection.zarr as s3://public/ of an unsigned S3 endpoint."""
    if name == "collection.zarr":
        return ts.open("s3://public/collection.zarr", endpoint_url=proxy.url, anonymous=True, **storage)
    return source_of(proxy.url, name, **storage)


def test_random_faults_give_the_local_rows_or_an_error_naming_the_store(data_dir, http, tmp_path):
    # Faults of every kind drawn at random (seeded): 1-3 injections of 1-3 requests each, matching any
    # request, the store's metadata or its chunks, injected before or after the store is opened, with 0-4
    # retries and a node-local cache or none, over every kind of store (an annbatch collection through an
    # unsigned S3 endpoint). A read returns what the local store reads for the same rows (and so does a
    # second read from what the cache kept), or, only where more faults fired than retries were allowed,
    # raises naming the store; never other values, never past the timeouts.
    # Collected now, not by one of the servers' threads mid-test: a DataLoader iterator that an earlier
    # test's failure left in a reference cycle (the exception's frames) shuts its workers down from
    # __del__, holding that thread for seconds (requests to it timed out in stress runs).
    gc.collect()
    put_collection_in_bucket(tmp_path)
    rng = random.Random(0)
    with RangeHTTPServer(tmp_path, s3_listing=True) as bucket:
        for trial in range(40):
            name = rng.choice(STORES + ["collection.zarr"])
            collection = name == "collection.zarr"
            local = ts.open(COLLECTION) if collection else source_of(data_dir, name)
            rows = torch.tensor(rng.sample(range(len(local)), rng.randint(1, len(local))))
            retries = rng.randint(0, 4)
            storage = {"retries": retries, "timeout": 1.5}
            if rng.random() < 0.3:
                storage["cache_dir"] = tmp_path / f"cache{trial}"
            places = [None, name, "/c/", ".zarray", "zarr.json", "/X/"]
            faults = [
                (rng.choice(FAULT_KINDS), rng.randint(1, 3), rng.choice(places)) for _ in range(rng.randint(1, 3))
            ]
            before_open = rng.random() < 0.5
            threads = rng.randint(1, 3)
            started = time.monotonic()
            with FaultProxy(bucket.url if collection else http.url) as proxy:
                what = (trial, name, retries, faults, before_open)
                try:
                    if before_open:
                        inject_faults(proxy, faults)
                    source = open_behind(proxy, name, storage)
                    if not before_open:
                        inject_faults(proxy, faults)
                    same_batches(local.read(rows), source.read(rows, num_threads=threads))
                    if "cache_dir" in storage:
                        same_batches(
                            local.read(rows), open_behind(proxy, name, storage).read(rows, num_threads=threads)
                        )
                except (RuntimeError, OSError) as error:
                    assert len(proxy.fired) > retries, (what, proxy.fired, error)
                    store = "s3://public/collection.zarr" if collection else f"{proxy.url}/{name}"
                    assert store in str(error), (what, error)
            assert time.monotonic() - started < 30, what


@pytest.mark.parametrize("kind", ["ts.DataLoader", "torch"])
def test_faults_in_dataloader_workers_are_retried_or_reach_the_loop_naming_the_url(data_dir, http, kind):
    def loader(source):
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=16), batch_size=32)
        if kind == "torch":
            return DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
        return ts.DataLoader(dataset, num_workers=2, multiprocessing_context="fork")

    with FaultProxy(http.url) as proxy:
        # Within the retries: every row once, as the local store reads them.
        retried = source_of(proxy.url, "sharded.zarr", retries=3)
        proxy.inject("status_503", count=2, path_contains="/c/")
        proxy.inject("drop_mid_body", count=1, path_contains="/c/")
        read_as_local(list(loader(retried)), source_of(data_dir, "sharded.zarr"), ROWS)
        assert proxy.pending() == 0
        # Past them: a worker's error reaches the training loop, naming the shard's URL.
        failing = source_of(proxy.url, "sharded.zarr", retries=0)
        proxy.inject("status_503", count=1000, path_contains="/c/")
        with pytest.raises(RuntimeError, match=rf"{proxy.url}/sharded\.zarr/c/.*HTTP 503") as caught:
            list(loader(failing))
    del caught
    gc.collect()  # the failed iterator (held by the exception's frames) shuts its other worker down now


def test_a_slow_server_times_out_naming_the_url(http):
    with FaultProxy(http.url) as proxy:
        remote = source_of(proxy.url, "sharded.zarr", timeout=0.5, retries=0)
        proxy.inject("slow", count=5, seconds=3, path_contains="sharded.zarr/c")
        with pytest.raises(RuntimeError, match=r"sharded\.zarr.*(Timeout|timed out)"):
            remote.read(torch.arange(ROWS))


def test_missing_objects_raise_file_not_found(http, s3, s3_credentials):
    with pytest.raises(FileNotFoundError, match="nothing.h5ad"):
        ts.open(f"{http.url}/nothing.h5ad")
    with pytest.raises(FileNotFoundError, match="s3://cells/stores/nothing.zarr"):
        ts.open("s3://cells/stores/nothing.zarr")
    with pytest.raises(FileNotFoundError, match="s3://no-such-bucket/x.zarr"):
        ts.open("s3://no-such-bucket/x.zarr")


def test_reading_urls_raises_the_soft_open_files_limit_to_the_hard_one(data_dir, http):
    # Each reading thread keeps up to max_requests connections, more than a soft limit of 1024 allows for 32
    # threads: the first URL read raises it to the hard limit (as Go's runtime does); local reads leave it.
    script = (
        "import resource, sys, torch, torch_shards as ts\n"
        "soft = lambda: resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "print(soft(), resource.getrlimit(resource.RLIMIT_NOFILE)[1])\n"
        "ts.open(sys.argv[1] + '/sharded.zarr').read(torch.arange(5))\n"
        "print(soft())\n"
        "ts.open(sys.argv[2] + '/sharded.zarr').read(torch.arange(5))\n"
        "print(soft())\n"
    )
    command = 'ulimit -S -n 256 && exec "$0" -c "$1" "$2" "$3"'
    done = subprocess.run(
        ["bash", "-c", command, sys.executable, script, str(data_dir), http.url], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (start, hard), (after_local,), (after_url,) = [line.split() for line in done.stdout.split("\n")[:3]]
    assert start == after_local == "256"
    assert after_url == hard or (hard == str(resource.RLIM_INFINITY) and int(after_url) > 256), done.stdout


def test_bad_credentials_are_refused_naming_the_url(data_dir, monkeypatch, tmp_path):
    with S3Server(verify_signatures=True) as server:
        server.create_bucket("private")
        server.put_tree("private", "p", data_dir / "sharded.zarr")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
        good = ts.open("s3://private/p", endpoint_url=server.endpoint_url, max_requests=4)
        same_batches(ts.open(data_dir / "sharded.zarr").read(ROW_SETS[1]), good.read(ROW_SETS[1]))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong" + server.secret_key)
        with pytest.raises(RuntimeError, match=r"s3://private/p.*access denied.*SignatureDoesNotMatch") as error:
            ts.open("s3://private/p", endpoint_url=server.endpoint_url, max_requests=5)
        assert server.secret_key not in str(error.value)


def test_a_profiles_credential_process_signs_the_requests(data_dir, monkeypatch, tmp_path):
    # What `aws configure export-credentials --format process`, SSO helpers and vaults are set up as: the
    # program's keys sign the requests (the server checks signatures); a program that fails fails the
    # opening, naming the profile and the program, with the first line it wrote to stderr.
    with S3Server(verify_signatures=True) as server:
        server.create_bucket("private")
        server.put_tree("private", "p", data_dir / "sharded.zarr")
        program = tmp_path / "creds.py"
        program.write_text(
            "import json, sys\n"
            "print(json.dumps({'Version': 1, 'AccessKeyId': sys.argv[1], 'SecretAccessKey': sys.argv[2]}))\n"
        )
        failing = tmp_path / "expired.py"
        failing.write_text("import sys\nsys.exit('the SSO session has expired')\n")
        config = tmp_path / "config"
        config.write_text(
            f"[profile proc]\ncredential_process = {sys.executable} {program} "
            f"{server.access_key} '{server.secret_key}'\n"
            f"[profile broken]\ncredential_process = {sys.executable} {failing}\n"
        )
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        remote = ts.open("s3://private/p", endpoint_url=server.endpoint_url, profile="proc")
        same_batches(ts.open(data_dir / "sharded.zarr").read(ROW_SETS[1]), remote.read(ROW_SETS[1]))
        expected = r"AWS profile 'broken'.*credential_process .*exited with status 1: the SSO session has expired"
        with pytest.raises(RuntimeError, match=expected) as error:
            ts.open("s3://private/p2", endpoint_url=server.endpoint_url, profile="broken")
        assert server.secret_key not in str(error.value)


def write_expiring_credential_process(tmp_path, lifetime_s):
    """A credential_process program printing the keys in keys.json (rewritten by the test) with an Expiration
    lifetime_s from now; each run adds a line to runs. Returns (program, keys, runs)."""
    keys, runs, program = tmp_path / "keys.json", tmp_path / "runs", tmp_path / "expiring.py"
    program.write_text(
        "import datetime, json\n"
        f"access, secret = json.loads(open({str(keys)!r}).read())\n"
        f"open({str(runs)!r}, 'a').write('run\\n')\n"
        f"expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds={lifetime_s})\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': access, 'SecretAccessKey': secret,\n"
        "                  'Expiration': expires.strftime('%Y-%m-%dT%H:%M:%SZ')}))\n"
    )
    return program, keys, runs


@pytest.mark.parametrize("lifetime_s", [4, 3600])
def test_credentials_that_expire_are_fetched_again_before_they_do(data_dir, monkeypatch, tmp_path, lifetime_s):
    # SSO and vault credentials last an hour or so, training runs days. The program's key is rotated on the
    # server (the old one deleted) while the dataset is open: credentials that expire in 4 s are fetched again
    # (after half their lifetime) and reading goes on; ones that hold for an hour are still in use, so the
    # server refuses them (what a job without refreshing would meet at the expiry).
    with S3Server(verify_signatures=True) as server:
        server.create_bucket("private")
        server.put_tree("private", "p", data_dir / "sharded.zarr")
        program, keys, runs = write_expiring_credential_process(tmp_path, lifetime_s)
        keys.write_text(json.dumps([server.access_key, server.secret_key]))
        config = tmp_path / "config"
        config.write_text(f"[profile expiring]\ncredential_process = {sys.executable} {program}\n")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        options = {"endpoint_url": server.endpoint_url, "profile": "expiring"}
        local = ts.open(data_dir / "sharded.zarr")
        same_batches(local.read(ROW_SETS[1]), ts.open("s3://private/p", **options).read(ROW_SETS[1]))
        assert runs.read_text().count("run") == 1
        server.rotate_access_key()
        keys.write_text(json.dumps([server.access_key, server.secret_key]))
        time.sleep(2.5)
        if lifetime_s == 3600:
            with pytest.raises(RuntimeError, match="access denied"):
                ts.open("s3://private/p", **options).read(ROW_SETS[2])  # opened anew: every request goes out
            assert runs.read_text().count("run") == 1
        else:
            same_batches(local.read(ROW_SETS[2]), ts.open("s3://private/p", **options).read(ROW_SETS[2]))
            assert runs.read_text().count("run") == 2


def test_an_object_replaced_while_read_is_refused(data_dir, tmp_path):
    shutil.copy(data_dir / "plain.h5", tmp_path / "plain.h5")
    with RangeHTTPServer(tmp_path) as server:
        remote = source_of(server.url, "plain.h5")
        remote.read(torch.arange(10))
        with h5py.File(tmp_path / "rewritten.h5", "w") as f:
            f.create_dataset("values", data=np.ones((ROWS, 12), np.float32), chunks=(40, 12), compression="gzip")
            f.create_dataset("contiguous", data=np.ones((ROWS, 12), np.float32))
        os.replace(tmp_path / "rewritten.h5", tmp_path / "plain.h5")
        with pytest.raises(RuntimeError, match="plain.h5: the object changed since the dataset opened it"):
            remote.read(torch.arange(ROWS))


def test_the_cache_serves_the_second_read(data_dir, http, tmp_path):
    cache = tmp_path / "cache"
    local = source_of(data_dir, "sharded.zarr").read(ROW_SETS[0])
    first = source_of(http.url, "sharded.zarr", cache_dir=cache)
    same_batches(local, first.read(ROW_SETS[0]))
    http.reset_log()
    again = source_of(http.url, "sharded.zarr", cache_dir=cache)  # another process would open it as this does
    same_batches(local, again.read(ROW_SETS[0]))
    ranged = [entry for entry in http.requests if entry[2]]
    assert ranged == [], ranged  # every chunk from the cache: no ranged GET
    assert sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) > 0


EPOCHS_COUNTING_CONNECTIONS = """
import sys, torch, torch_shards as ts
ds = ts.ShardedDataset(ts.open(sys.argv[1]), ts.BlockShuffling(4), batch_size=4, fetch_factor=1)
for epoch in range(3):
    assert sorted(torch.cat([b["index"] for b in ds]).tolist()) == list(range(len(ds.source)))
    print(ts._C.native_threads()["idle"], flush=True)
    sys.stdin.readline()  # the test counts the connections of the epoch
"""


@pytest.mark.parametrize("keep", ["1", "0"])
def test_later_epochs_read_on_the_connections_of_the_first(data_dir, tmp_path, keep):
    # An epoch's reader threads are the last epoch's (csrc/core/thread_cache.h), and with them their
    # connections; TORCH_SHARDS_KEEP_THREADS=0 has threads exit as their epoch ends, connections with them.
    shutil.copytree(data_dir / "sharded.zarr", tmp_path / "sharded.zarr")
    environment = dict(os.environ, TORCH_SHARDS_KEEP_THREADS=keep, PYTHONPATH=os.pathsep.join(sys.path))
    with RangeHTTPServer(tmp_path) as server:
        command = [sys.executable, "-c", EPOCHS_COUNTING_CONNECTIONS, f"{server.url}/sharded.zarr"]
        with subprocess.Popen(
            command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as child:
            opened, idle = [], []
            before = server.connections
            try:
                for _ in range(3):
                    idle.append(int(child.stdout.readline()))
                    now = server.connections  # every connection of the epoch was accepted before it ended
                    opened.append(now - before)
                    before = now  # before the next epoch starts
                    child.stdin.write("\n")
                    child.stdin.flush()
            finally:
                child.stdin.close()
            assert child.wait(timeout=60) == 0
    assert opened[0] >= 32  # the reader threads for URLs, each on its own connection
    if keep == "1":
        assert opened[1:] == [0, 0] and min(idle) >= 32, (opened, idle)
    else:
        assert min(opened) >= 32 and idle == [0, 0, 0], (opened, idle)


def test_a_warm_cache_is_read_by_the_cpus_share_of_threads(http, tmp_path):
    # Reader threads beyond the CPUs' share (32 for URLs) are there to overlap round trips: once the objects
    # are all held whole in the cache they sit out, as for local files (32 threads on 2 CPUs read 20%
    # fewer rows/s than 2, each read waking them all).
    cpus = len(os.sched_getaffinity(0))
    if cpus >= 16:
        pytest.skip(f"{cpus} CPUs: the default reader threads for URLs are hardly more than the CPUs")
    source = source_of(http.url, "sharded.zarr", cache_dir=tmp_path / "cache")
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=4), batch_size=4, fetch_factor=1)
    assert sorted(torch.cat([batch["index"] for batch in dataset]).tolist()) == list(range(ROWS))  # fills it
    stats = None
    for number, _ in enumerate(dataset):
        if number == len(dataset) - 5:
            stats = dataset.reader_stats()[0]
    units = [stats[key] for key in stats if key.startswith("thread") and key.endswith("_units")]
    assert len(units) >= 32 and sum(units[cpus:]) <= 0.1 * sum(units), units
    # The fill epoch's last reads waited on no request: this one started the CPUs' share of threads alone.
    assert stats["threads"] == cpus, stats


def test_an_epoch_started_on_the_cpus_share_starts_the_other_threads_once_reads_wait(data_dir, http, tmp_path):
    # An epoch whose last read waited on no request has the next one start the CPUs' share of threads alone
    # (starting 32 threads and 31 helpers each epoch cost an epoch of a cached collection 4%). Here the
    # collection's second part is held whole in the cache and read last (Streaming, one unit at a time), its
    # first part (zarr v2 chunks, no cache) read first: each later epoch starts on the CPUs' share, its first
    # read waits on requests and starts the others. Every row once, every epoch.
    cpus = len(os.sched_getaffinity(0))
    if cpus >= 16:
        pytest.skip(f"{cpus} CPUs: the default reader threads for URLs are hardly more than the CPUs")
    waiting = source_of(http.url, "chunks_v2.zarr")
    whole = source_of(http.url, "sharded.zarr", cache_dir=tmp_path / "cache")
    dataset = ts.ShardedDataset(ts.Collection([waiting, whole]), ts.Streaming(), batch_size=8, prefetch=1)
    for epoch in range(3):
        rows, stats = [], None
        for batch in dataset:
            rows += batch["index"].tolist()
            stats = dataset.reader_stats()[0]
        assert rows == list(range(2 * ROWS)), epoch
        assert stats["threads"] >= 32, (epoch, stats)  # all started: at the first read that waited


def test_reads_behind_urls_keep_a_later_epochs_first_pieces_of_sparse_rows_within_the_budget(tmp_path):
    # Behind URLs every reader thread starts a piece at once, each admitted under prefetch_bytes by its
    # estimate. The bytes of a sparse row are known once one was read: carried from the last epoch's
    # reader, a later epoch's first pieces are estimated whole (from the dense fields alone, the 8 threads
    # each took a piece of CSR rows against a budget of 3 pieces: 9 read or in flight at once).
    rows, per_row = 2048, 100
    indices = np.tile(np.arange(per_row, dtype=np.int32) * 7, rows)
    values = np.random.default_rng(6).random(rows * per_row, dtype=np.float32)
    matrix = sp.csr_matrix((values, indices, np.arange(rows + 1) * per_row), shape=(rows, 1000))
    ad.AnnData(X=matrix).write_zarr(tmp_path / "sparse.zarr")  # its chunks requested at each read
    with RangeHTTPServer(tmp_path, latency=0.01) as server:
        source = ts.open(f"{server.url}/sparse.zarr")
        options = dict(batch_size=64, fetch_factor=1, seed=0, num_threads=8, prefetch=16)
        first = ts.ShardedDataset(source, ts.Streaming(), prefetch_bytes=1 << 30, **options)
        stats = None
        for _ in first:
            stats = first.reader_stats()[0] if first.reader_stats() else stats
        unit_bytes = stats["bytes"] // stats["units"]  # every unit alike: 64 rows of 100 values
        budget = 3 * unit_bytes
        dataset = ts.ShardedDataset(source, ts.Streaming(), prefetch_bytes=budget, **options)
        for epoch in range(3):
            peak, seen = 0, []
            for i, batch in enumerate(dataset):
                if i % 4 == 0:
                    time.sleep(0.02)  # a slow step: the readers run ahead until the budget stops them
                seen += batch["index"].tolist()
                for stats in dataset.reader_stats():
                    peak = max(peak, stats["queued_bytes"] + stats["in_flight"] * unit_bytes)
            assert seen == list(range(rows)), epoch
            if epoch > 0:  # the first epoch's first pieces are estimated before any was read
                assert 0 < peak <= budget + 2 * unit_bytes, (epoch, peak / unit_bytes)  # 9 units before


def test_the_cache_never_serves_a_replaced_object(data_dir, tmp_path):
    served = tmp_path / "served"
    shutil.copytree(data_dir / "sharded.zarr", served / "a.zarr")
    with RangeHTTPServer(served) as server:
        cache = tmp_path / "cache"
        source_of(server.url, "a.zarr", cache_dir=cache).read(ROW_SETS[0])
        new = np.full((ROWS, 12), 7, np.float32)
        shutil.rmtree(served / "a.zarr")
        array = zarr.create_array(
            served / "a.zarr", shape=new.shape, chunks=(16, 12), shards=(128, 12), dtype="float32"
        )
        array[:] = new
        time.sleep(11)  # past the few seconds an open's stats are reused
        fresh = source_of(server.url, "a.zarr", cache_dir=cache).read(ROW_SETS[0])
        assert torch.equal(fresh["X"], torch.from_numpy(new))


def ranged_gets(service, name):
    """The ranged GETs a FaultProxy or RangeHTTPServer logged for paths containing `name`."""
    return [entry for entry in list(service.requests) if entry[0] == "GET" and entry[2] and name in entry[1]]


def test_s3_collection_through_the_cache_second_epoch_makes_no_request(s3, s3_credentials, tmp_path):
    # An annbatch collection on S3 (moto, behind a proxy that logs every request) read through the cache:
    # the first epoch fetches each object whole (one ranged GET per object of these sizes), the second
    # reads every range from the mapped entries: no request at all. Every row once, both epochs.
    with FaultProxy(s3.endpoint_url) as proxy:
        source = ts.open("s3://cells/stores/collection.zarr", cache_dir=tmp_path / "cache", endpoint_url=proxy.url)
        local = ts.open(s3.local_copy / "collection.zarr")
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=8), batch_size=32)
        for epoch in range(2):
            dataset.set_epoch(epoch)
            proxy.reset_log()
            read_as_local(list(dataset), local, len(source), checked=4)
            ranged = ranged_gets(proxy, "/")
            if epoch == 0:
                paths = [path for _, path, _ in ranged]
                assert ranged and len(paths) == len(set(paths)), ranged  # each object fetched once
            else:
                assert proxy.requests == [], proxy.requests[:10]
    entries = [f for f in (tmp_path / "cache").rglob("*") if f.is_file() and f.parent != tmp_path / "cache"]
    assert entries and not any(f.name.endswith(".lock") for f in entries)  # no lock file left behind


class RendezvousServer(RangeHTTPServer):
    """Holds the first ranged GET (or the first request of `method`) of each of `names` (path endings)
    until one of each has arrived, at most 5 s: a reader that requests them one after another is held
    the full 5 s, and `waited_out` names what it held that long."""

    def __init__(self, root, names, method=None):
        super().__init__(root, s3_listing=True)
        self.names, self.method, self.arrived, self.waited_out = names, method, set(), []
        self.all_arrived = threading.Condition()

    def record(self, method, path, range_header):
        super().record(method, path, range_header)
        name = next((n for n in self.names if path.endswith(n)), None)
        held = method == self.method if self.method else method == "GET" and range_header is not None
        if not held or name is None:
            return
        with self.all_arrived:
            first = name not in self.arrived
            self.arrived.add(name)
            self.all_arrived.notify_all()
            if first and not self.all_arrived.wait_for(lambda: len(self.arrived) == len(self.names), timeout=5):
                self.waited_out.append(path)


@pytest.mark.parametrize("cached", [True, False])
def test_values_and_indices_are_requested_together(tmp_path, cached):
    # A CSR matrix's values and indices behind a URL: one read requests both at once, whether their shards
    # are fetched whole into an empty cache (two downloads) or range by range (their chunks). A reader's
    # threads all wait on the first read's requests, so one after the other would double its wait.
    put_collection_in_bucket(tmp_path)
    names = ["dataset_0/X/data/c/0", "dataset_0/X/indices/c/0"]
    with RendezvousServer(tmp_path, names) as server:
        options = {"cache_dir": tmp_path / "cache"} if cached else {}
        remote = ts.open("s3://public/collection.zarr", endpoint_url=server.url, anonymous=True, **options)
        rows = torch.tensor([3, 0, 7])  # in dataset_0's first shard
        same_batches(ts.open(COLLECTION).read(rows), remote.read(rows))
        assert server.arrived == set(names) and server.waited_out == []


def ranged_bytes(service, name):
    """Bytes and count of the ranged GETs (`bytes=a-b`) of paths containing `name` (ranged_gets)."""
    sizes = []
    for _, _, range_header in ranged_gets(service, name):
        first, _, last = range_header.removeprefix("bytes=").partition("-")
        sizes.append(int(last) - int(first) + 1)
    return sum(sizes), len(sizes)


def test_chunks_far_apart_are_requested_each_alone_and_near_ones_together(tmp_path):
    # A shard of 256 chunks of 4 KiB (random values: no compression). Chunks far apart are requested each on
    # its own: a gap far larger than the bytes a request reads is not fetched (with 1 MiB gaps taken alone,
    # sparse reads of small chunks fetched 14-17 times their bytes). Neighbours, and chunks within 64 KiB of
    # each other, come in one request.
    values = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)
    store = tmp_path / "public" / "sparse.zarr"
    shape = {"shape": values.shape, "chunks": (16, 64), "shards": (4096, 64), "dtype": "float32"}
    zarr.create_array(store, **shape, compressors=None)[:] = values
    chunk = 16 * 64 * 4
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        remote = ts.open("s3://public/sparse.zarr", endpoint_url=server.url, anonymous=True)
        local = ts.open(store)
        cases = [
            (range(0, 256, 40), 7 * chunk, 7 + 1),  # 156 KiB apart; the first read asks for the shard's index too
            (range(100, 110), 10 * chunk, 1),  # neighbours
            (range(0, 64, 4), 61 * chunk, 1),  # 12 KiB apart
        ]
        for chunks, most_bytes, requests in cases:
            rows = torch.tensor([16 * index + 3 for index in chunks])
            server.reset_log()
            same_batches(local.read(rows), remote.read(rows))
            fetched, made = ranged_bytes(server, "/c/0/0")
            index_bytes = 256 * 16 + 4 if made > len(chunks) else 0  # the shard index (offset, size per chunk; crc32c)
            assert (fetched - index_bytes, made) == (most_bytes, requests), list(chunks)


def test_shards_first_needed_once_others_are_held_whole_are_still_requested_together(tmp_path):
    # Once the shards read first are held whole in the cache, a later read that needs shards not open yet
    # still opens them at once (values and indices: each a stamp and a whole download), not one after the
    # other as it decodes them: 4 round trips instead of 2 in the middle of a cold epoch.
    put_collection_in_bucket(tmp_path)
    names = ["dataset_0/X/data/c/1", "dataset_0/X/indices/c/1"]
    with RendezvousServer(tmp_path, names) as server:
        remote = ts.open(
            "s3://public/collection.zarr", endpoint_url=server.url, anonymous=True, cache_dir=tmp_path / "c"
        )
        local = ts.open(COLLECTION)
        first, later = torch.tensor([3, 0, 7]), torch.tensor([79, 2, 78])  # later: into the second shards
        same_batches(local.read(first), remote.read(first))
        assert server.arrived == set()
        same_batches(local.read(later), remote.read(later))
        assert server.arrived == set(names) and server.waited_out == []


def test_a_reads_shards_not_open_yet_are_opened_together_once_others_are_held_whole(data_dir, tmp_path):
    # sharded.zarr: shards of 128 rows. Once shard 0 is held whole, a read of one row in each of
    # shards 1-4 opens the four together (each a stamp and a whole download into the cache), where
    # decoding would open them as each chunk's turn came.
    names = [f"sharded.zarr/c/{shard}/0" for shard in range(1, 5)]
    with RendezvousServer(data_dir, names) as server:
        remote = source_of(server.url, "sharded.zarr", cache_dir=tmp_path / "cache")
        local = source_of(data_dir, "sharded.zarr")
        first, later = torch.tensor([3, 100]), torch.tensor([130, 260, 390, 520])
        same_batches(local.read(first), remote.read(first))
        assert server.arrived == set()
        same_batches(local.read(later), remote.read(later))
        assert server.arrived == set(names) and server.waited_out == []


def test_opening_reads_the_lengths_of_obs_and_var_not_their_names(tmp_path):
    # n_obs and n_vars come from the indexes' metadata: a dataset of millions of cells behind a URL opens
    # without downloading its names (here 82 -> 52 requests for the collection); asked for, they are read.
    put_collection_in_bucket(tmp_path)
    with RangeHTTPServer(tmp_path, s3_listing=True) as server:
        remote = ts.open("s3://public/collection.zarr", endpoint_url=server.url, anonymous=True)
        assert len(remote) == len(ts.open(COLLECTION))
        assert not [path for _, path, _ in server.requests if "/_index/" in path and "/c/" in path]
        dataset = remote.sources[0]
        local = ts.AnnDataSource(COLLECTION / "dataset_0")
        assert dataset.obs_names == local.obs_names and dataset.var_names == local.var_names
        assert [path for _, path, _ in server.requests if "/obs/_index/values/c/" in path]


def test_a_collections_datasets_are_opened_together(tmp_path):
    # Opening an annbatch collection's dataset behind a URL is a chain of ~25 round trips; its datasets are
    # opened at once (1.8 s -> 0.7 s for this one at 20 ms a request; a hundred datasets would have taken
    # minutes). The server holds each dataset's first ranged read until all three have asked.
    put_collection_in_bucket(tmp_path)
    names = [f"dataset_{i}/X/indptr/c/0" for i in range(3)]
    with RendezvousServer(tmp_path, names) as server:
        remote = ts.open("s3://public/collection.zarr", endpoint_url=server.url, anonymous=True)
        assert server.arrived == set(names) and server.waited_out == []
        rows = torch.arange(len(remote))
        same_batches(ts.open(COLLECTION).read(rows), remote.read(rows))


def entry_sizes(cache):
    return [f.stat().st_size for f in cache.rglob("*") if f.is_file() and f.parent != cache]


@pytest.mark.parametrize("whole", [True, False])
def test_cache_whole_bytes_chooses_whole_or_ranged_entries(data_dir, http, tmp_path, whole):
    # Shards (about 6 kB each here) cached whole by default; with cache_whole_bytes below their size, range
    # by range. Either way the second read is served from the cache.
    cache = tmp_path / "cache"
    options = {"cache_dir": cache} if whole else {"cache_dir": cache, "cache_whole_bytes": 1000}
    shard = max(f.stat().st_size for f in (data_dir / "sharded.zarr" / "c").rglob("*") if f.is_file())
    local = source_of(data_dir, "sharded.zarr").read(ROW_SETS[1])
    same_batches(local, source_of(http.url, "sharded.zarr", **options).read(ROW_SETS[1]))
    assert (max(entry_sizes(cache)) > shard) == whole
    http.reset_log()
    same_batches(local, source_of(http.url, "sharded.zarr", **options).read(ROW_SETS[1]))
    assert ranged_gets(http, "/") == []


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_share_one_download_of_an_h5ad(data_dir, tmp_path, context):
    # One server per test: its log holds this test's requests only. The .h5ad is fetched whole once,
    # by whichever process reads it first; the workers map the entry.
    with RangeHTTPServer(data_dir) as server:
        source = source_of(server.url, "cells.h5ad", cache_dir=tmp_path / "cache")
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=16), batch_size=32)
        loader = DataLoader(dataset, batch_size=None, num_workers=3, multiprocessing_context=context)
        local = source_of(data_dir, "cells.h5ad")
        for _ in range(2):
            read_as_local(list(loader), local, ROWS)
        size = (data_dir / "cells.h5ad").stat().st_size
        assert ranged_gets(server, "cells.h5ad") == [("GET", "/cells.h5ad", f"bytes=0-{size - 1}")]


def sockets_to(port):
    """Inodes of this process's TCP sockets connected to 127.0.0.1:port (any state), from /proc."""
    wanted = f":{port:04X}"
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[2].endswith(wanted):  # rem_address
                inodes.add(fields[9])
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            mine.add(target[8:-1])
    return mine


class SocketsInWorker(torch.utils.data.Dataset):
    def __init__(self, port):
        self.port = port

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return sorted(sockets_to(self.port))


def test_a_forked_worker_closes_its_copies_of_the_parents_connections(data_dir):
    # The parent reads over HTTP/1.1 keep-alive: its connections stay open, cached. A worker forked then
    # used to hold a copy of each (half-open in the kernel once the parent or server closed them).
    with RangeHTTPServer(data_dir) as server:
        port = int(server.url.rsplit(":", 1)[1])
        source = source_of(server.url, "plain.h5")
        same_batches(source_of(data_dir, "plain.h5").read(ROW_SETS[0]), source.read(ROW_SETS[0]))
        held = sockets_to(port)
        assert held, "the parent keeps its connections to the server"
        (in_worker,) = DataLoader(SocketsInWorker(port), batch_size=None, num_workers=1, multiprocessing_context="fork")
        assert in_worker == []
        assert sockets_to(port) == held  # the parent's own are untouched, and still serve it
        same_batches(source_of(data_dir, "plain.h5").read(ROW_SETS[1]), source.read(ROW_SETS[1]))


def test_a_damaged_whole_entry_is_fetched_again(data_dir, tmp_path):
    # A damaged entry is a miss (removed), never wrong data: read in a spawned process (which maps the
    # entries afresh; this process keeps its own mappings).
    with RangeHTTPServer(data_dir) as server:
        cache = tmp_path / "cache"
        source = source_of(server.url, "plain.h5", cache_dir=cache)
        expected = source_of(data_dir, "plain.h5").read(ROW_SETS[0])
        same_batches(expected, source.read(ROW_SETS[0]))
        (entry,) = [f for f in cache.rglob("*") if f.is_file() and f.parent != cache]
        data = bytearray(entry.read_bytes())
        data[-100] ^= 0x5A
        replacement = entry.with_name(entry.name + ".new")
        replacement.write_bytes(bytes(data))
        os.replace(replacement, entry)  # as a bad disk would leave it; the mapping here keeps the old file
        server.reset_log()
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=16), batch_size=ROWS)
        loader = DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn")
        batches = list(loader)
        index = torch.cat([batch["index"] for batch in batches])
        values = torch.cat([batch["X"] for batch in batches])
        assert torch.equal(values[torch.argsort(index)], expected["X"])
        assert len(ranged_gets(server, "plain.h5")) == 1  # fetched again, whole


def node_metadata_gets(server, store):
    """The GETs of metadata files of nodes below a store's root."""
    names = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
    return [
        path
        for method, path, _ in server.requests
        if method == "GET" and path.startswith(f"/{store}/") and path.count("/") > 2 and path.endswith(names)
    ]


@pytest.mark.parametrize("store", ["cells_v2.zarr", "cells_v3.zarr"])
def test_a_consolidated_store_opens_without_asking_for_each_nodes_metadata(data_dir, store):
    # anndata consolidates every zarr store it writes (.zmetadata in v2, the root zarr.json's
    # consolidated_metadata in v3): behind a URL its metadata is then one request, not one per node
    # asked for one after another (at 20 ms a request, v2 opens in 170 ms instead of 960, v3 in 210 instead
    # of 460). What is left: a HEAD of each array's metadata file, which stamps it (a store rewritten
    # while read is refused), all together, and the shards or chunks of the arrays read at opening.
    with RangeHTTPServer(data_dir) as server:
        remote = source_of(server.url, store)
        opening = len(server.requests)
        assert node_metadata_gets(server, store) == []
        rows = torch.tensor([5, 3, 590, 3, 128, 127, 400])
        same_batches(source_of(data_dir, store).read(rows), remote.read(rows))
        assert remote.obs_names == source_of(data_dir, store).obs_names
        assert node_metadata_gets(server, store) == []
        before = len(server.requests)
        source_of(server.url, store, consolidated=False)  # each node's own files, as before
        assert len(node_metadata_gets(server, store)) > 5 and len(server.requests) - before > opening


def test_consolidated_metadata_nested_in_a_groups_entry_is_read_too(data_dir, tmp_path):
    # zarr-python writes every node below the root into the root's consolidated metadata; a writer may
    # instead nest a group's nodes in that group's entry (relative to it): they are found there.
    shutil.copytree(data_dir / "cells_v3.zarr", tmp_path / "cells_v3.zarr")
    root_file = tmp_path / "cells_v3.zarr" / "zarr.json"
    root = json.loads(root_file.read_text())
    nodes = root["consolidated_metadata"]["metadata"]
    below_x = {path[2:]: nodes.pop(path) for path in list(nodes) if path.startswith("X/")}
    nodes["X"]["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": below_x}
    root_file.write_text(json.dumps(root))
    with RangeHTTPServer(tmp_path) as server:
        remote = source_of(server.url, "cells_v3.zarr")
        assert node_metadata_gets(server, "cells_v3.zarr") == []
        rows = torch.tensor([5, 3, 590, 3, 128, 127, 400])
        same_batches(source_of(data_dir, "cells_v3.zarr").read(rows), remote.read(rows))


def test_a_consolidated_stores_arrays_are_stamped_together(data_dir):
    # Each array opened stamps its metadata file (a store rewritten while read is refused): asked for one
    # after another as each opens, they are asked for together as the store opens. The server holds each
    # HEAD until all three have come.
    names = ["X/data/.zarray", "X/indices/.zarray", "X/indptr/.zarray"]
    with RendezvousServer(data_dir, names, method="HEAD") as server:
        remote = source_of(server.url, "cells_v2.zarr")
        assert server.arrived == set(names) and server.waited_out == []
        rows = torch.arange(ROWS)
        same_batches(source_of(data_dir, "cells_v2.zarr").read(rows), remote.read(rows))
        heads = [path for method, path, _ in server.requests if method == "HEAD" and path.endswith(".zarray")]
        assert len(heads) == len(set(heads))  # each once


def test_an_annbatch_collection_with_consolidated_metadata_opens_over_plain_http(tmp_path):
    # Plain HTTP lists nothing, so a collection's datasets (its dataset_<i> groups) are found in its
    # consolidated metadata; without any it cannot be opened there (use S3, which lists).
    shutil.copytree(COLLECTION, tmp_path / "collection.zarr")
    with RangeHTTPServer(tmp_path) as server:
        with pytest.raises(ValueError, match="listing is not possible over HTTP"):
            ts.open(f"{server.url}/collection.zarr")
        zarr.consolidate_metadata(str(tmp_path / "collection.zarr"))
        remote = ts.open(f"{server.url}/collection.zarr")
        rows = torch.arange(len(remote))
        same_batches(ts.open(COLLECTION).read(rows), remote.read(rows))


def test_consolidated_metadata_that_cannot_be_read_is_refused_naming_it(data_dir, tmp_path):
    shutil.copytree(data_dir / "cells_v2.zarr", tmp_path / "cells_v2.zarr")
    (tmp_path / "cells_v2.zarr" / ".zmetadata").write_text('{"metadata": {"X/.zarray": [1, 2]}}')
    with RangeHTTPServer(tmp_path) as server:
        with pytest.raises(ValueError, match=r"cells_v2.zarr/.zmetadata: consolidated metadata of X/.zarray is not a "):
            source_of(server.url, "cells_v2.zarr")
        with pytest.raises(ValueError, match="consolidated=False"):
            source_of(server.url, "cells_v2.zarr")
        assert len(source_of(server.url, "cells_v2.zarr", consolidated=False)) == ROWS


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"consolidated": "yes"}, "consolidated must be true or false"),
        ({"max_requests": 0}, "max_requests"),
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"cache_whole_bytes": -1}, "cache_whole_bytes"),
        ({"timeout": "soon"}, "timeout"),
        ({"storage": {"colour": 1}}, "unknown storage option"),
        ({"endpoint_url": "http://127.0.0.1:1"}, "apply to s3:// URLs only"),
    ],
)
def test_bad_storage_options_are_refused(http, options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ts.open(f"{http.url}/sharded.zarr", **options)


def test_storage_options_apply_to_urls_only(data_dir):
    with pytest.raises(ValueError, match="apply to URLs"):
        ts.ZarrSource(data_dir / "sharded.zarr", storage={"max_requests": 4})


def test_a_bad_endpoint_url_is_refused_naming_it():
    with pytest.raises(ValueError, match="ftp://x"):
        ts.open("s3://cells/stores/sharded.zarr", endpoint_url="ftp://x")


def test_an_h5ad_opens_over_http_in_a_few_requests_none_repeated(tmp_path):
    import pandas as pd

    # HDF5's metadata is read in many small pieces, many of them again for each dataset opened: they are
    # served from 64 KiB pages of the file kept per process, keyed by its ETag (before, such a file cost
    # about 200 requests, most of them the same 8 and 64 bytes). A file rewritten is read anew under its
    # new ETag.
    rng = np.random.default_rng(3)
    X = sp.random(3000, 400, density=0.05, format="csr", dtype=np.float32, random_state=4)
    adata = ad.AnnData(X=X)
    adata.obs["cell_type"] = pd.Categorical(rng.choice(["B", "T", "NK"], 3000))
    adata.obs["batch"] = np.arange(3000) % 5
    adata.write_h5ad(tmp_path / "paged.h5ad", compression="gzip")
    with RangeHTTPServer(tmp_path) as server:
        url = f"{server.url}/paged.h5ad"
        remote = ts.open(url, obs=["cell_type", "batch"], max_requests=3)
        ranges = [(method, header) for method, _, header in server.requests]
        assert len(ranges) == len(set(ranges)), ranges
        assert len(ranges) <= 12, ranges
        local = ts.open(tmp_path / "paged.h5ad", obs=["cell_type", "batch"])
        rows = torch.tensor([5, 3, 2990, 3, 1280, 127, 400])
        same_batches(local.read(rows), remote.read(rows))
        # Opened again: only the file's stamp is asked for.
        server.reset_log()
        ts.open(url, obs=["cell_type", "batch"], max_requests=4)
        assert [method for method, _, _ in server.requests] == ["HEAD"]
        # Rewritten (another ETag): read as it is now.
        adata.obs["batch"] = np.arange(3000) % 7
        adata.write_h5ad(tmp_path / "paged.h5ad", compression="gzip")
        time.sleep(2.5)  # past the few seconds a stamp is kept outside an opening
        again = ts.open(url, obs=["cell_type", "batch"], max_requests=5)
        local = ts.open(tmp_path / "paged.h5ad", obs=["cell_type", "batch"])
        same_batches(local.read(rows), again.read(rows))


class ConcurrencyServer(RangeHTTPServer):
    """A RangeHTTPServer (with latency) counting the requests it holds at once: `most` is the largest count."""

    def __init__(self, root, latency):
        super().__init__(root, latency=latency)
        self.in_flight, self.most, self.counting = 0, 0, threading.Lock()

    def wait(self, seconds):
        with self.counting:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            super().wait(seconds)
        finally:
            with self.counting:
                self.in_flight -= 1


def test_an_hdf5_chunk_index_is_fetched_a_level_at_a_time(tmp_path):
    # libhdf5 walks a chunked dataset's index (a B-tree whose nodes lie between the chunks) one node after
    # another: behind a URL each node would cost a round trip. Its nodes are fetched ahead, each level's
    # together, so the server holds many at once.
    values = np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)
    with h5py.File(tmp_path / "chunked.h5", "w") as f:
        f.create_dataset("X", data=values, chunks=(1000,))  # 1,000 chunks of 4 KB: 16+ index leaves, 64+ KB apart
    with ConcurrencyServer(tmp_path, latency=0.02) as server:
        remote = ts.open(f"{server.url}/chunked.h5", dataset="/X")
        assert server.most >= 8, server.most
        rows = torch.tensor([0, 999_999, 123_456, 77])
        assert torch.equal(remote.read(rows)["X"], torch.from_numpy(values[rows.numpy()]))
