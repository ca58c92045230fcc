"""The annbatch half of benchmarks/annbatch_format.py, run by a Python that has annbatch
(annbatch needs Python >= 3.12 and no torch; the project's environment may be older):

    python annbatch_side.py write INPUT.h5ad COLLECTION.zarr      # annbatch's add_adatas, its defaults
    python annbatch_side.py write INPUT.h5ad COLLECTION.zarr --dataset-size 250000   # datasets of that many rows
    python annbatch_side.py read COLLECTION.zarr --chunk-size 64 --preload-nchunks 32 --seconds 8
    python annbatch_side.py read s3://bucket/COLLECTION.zarr --endpoint http://127.0.0.1:PORT   # through obstore

`read` prints one JSON line: rows, seconds, cpu_seconds (the process's, every thread), batches.
It reads X only (annbatch's documented load_adata for X), epoch after epoch as a training loop
would, with annbatch's RandomSampler (shuffle=True), batches of --batch-size, no GPU preload, and
zarrs' codec pipeline when zarrs is installed (annbatch's documented configuration; --no-zarrs for
zarr-python's own).
"""

import argparse
import json
import sys
import warnings

try:
    from benchmarks.harness import timing
except ImportError:  # run as a file (as annbatch's Python runs it): benchmarks/ is on sys.path
    from harness import timing


def write(args):
    import numpy as np
    import zarr
    from annbatch import DatasetCollection

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sizes = {} if args.dataset_size is None else {"dataset_size": args.dataset_size}
        DatasetCollection(zarr.open_group(args.collection, mode="w")).add_adatas(
            [args.input], rng=np.random.default_rng(0), **sizes
        )


def use_zarrs():
    """annbatch's documented setup: zarrs' codec pipeline when it is installed."""
    import zarr

    try:
        import zarrs  # noqa: F401
    except ImportError:
        return False
    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    return True


def open_store(args):
    """The collection's store: a local path, or s3://bucket/prefix through obstore (annbatch's documented
    cloud setup: zarr-python's ObjectStore over an obstore S3Store), unsigned, at --endpoint."""
    if not args.collection.startswith("s3://"):
        return args.collection
    import zarr
    from obstore.store import S3Store

    bucket, _, prefix = args.collection[len("s3://") :].partition("/")
    store = S3Store(
        bucket,
        prefix=prefix,
        endpoint=args.endpoint,
        skip_signature=True,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )
    return zarr.storage.ObjectStore(store, read_only=True)


def read(args):
    import anndata as ad
    import zarr
    from annbatch import DatasetCollection, Loader

    warnings.filterwarnings("ignore")
    zarrs = use_zarrs() if args.zarrs else False
    collection = DatasetCollection(zarr.open_group(open_store(args), mode="r"))
    loader = Loader(
        chunk_size=args.chunk_size,
        preload_nchunks=args.preload_nchunks,
        batch_size=args.batch_size,
        shuffle=True,
        preload_to_gpu=False,
    ).use_collection(collection, load_adata=lambda group: ad.AnnData(X=ad.io.sparse_dataset(group["X"])))
    # the clock starts at the first batch: start-up is not counted; CPU time of every thread (zarrs decodes on
    # its own)
    timed = timing.run_for(loader, args.seconds, lambda batch: batch["X"].shape[0])
    print(
        json.dumps(
            {
                "rows": timed.rows,
                "seconds": timed.seconds,
                "cpu_seconds": timed.cpu_seconds,
                "batches": timed.batches,
                "zarrs": zarrs,
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write")
    writing.add_argument("input")
    writing.add_argument("collection")
    writing.add_argument("--dataset-size", type=int, default=None, help="rows per dataset (annbatch's default: 20GB)")
    reading = commands.add_parser("read")
    reading.add_argument("collection")
    reading.add_argument("--chunk-size", type=int, default=64)
    reading.add_argument("--preload-nchunks", type=int, default=32)
    reading.add_argument("--batch-size", type=int, default=256)
    reading.add_argument("--seconds", type=float, default=8.0)
    reading.add_argument("--no-zarrs", dest="zarrs", action="store_false", help="zarr-python's own codec pipeline")
    reading.add_argument("--endpoint", default=None, help="the S3 endpoint of an s3:// collection")
    args = parser.parse_args()
    {"write": write, "read": read}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
