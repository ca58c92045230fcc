"""Reading an annbatch collection from object storage, side by side with the same bytes on local disk.

The collection (annbatch's add_adatas, written as benchmarks/annbatch_format.py writes it) is served
by the tests' HTTP server as an unsigned, path-style S3 endpoint on 127.0.0.1 (ListObjectsV2 and
ranged GETs over keep-alive HTTP/1.1), with --latency seconds added to every request: what a
bucket in another building costs. Alternated rounds, each in a fresh process (its peak memory
measured), the clock started at the first batch:

    local            torch_shards on the local collection (the reference of every ratio)
    remote           torch_shards on s3://, no cache: every epoch from the server
    remote, cached   torch_shards on s3:// with cache_dir= filled by one epoch before the rounds:
                     a second epoch
    annbatch local   annbatch's Loader on the local collection
    annbatch remote  annbatch's Loader on s3:// through zarr-python's ObjectStore over obstore
                     (annbatch's documented cloud setup), same server, same latency

BlockShuffling(block 64) / annbatch chunk_size 64, batch 256, 32 chunks per fetch, X only; torch_shards
with its default threads (the CPUs locally, 32 reader threads for URLs), annbatch with its defaults.

    python benchmarks/remote.py [--rows 200000] [--latency 0.02] [--seconds 6] [--rounds 3]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BLOCK = 64
BATCH = 256
PRELOAD_NCHUNKS = 32
METHODS = ["local", "remote", "remote, cached", "annbatch local", "annbatch remote"]


def child(args):
    """One measurement in this (fresh) process: prints rows, seconds, peak RSS as JSON."""
    import torch_shards as ts

    options = {}
    if args.child_path.startswith("s3://"):
        options = {"endpoint_url": args.endpoint, "anonymous": True}
        if args.cache_dir:
            options["cache_dir"] = args.cache_dir
    dataset = ts.ShardedDataset(
        ts.open(args.child_path, **options),
        ts.BlockShuffling(BLOCK),
        batch_size=BATCH,
        fetch_factor=BLOCK * PRELOAD_NCHUNKS // BATCH,
        seed=int(time.time()),
        rank=0,
        world_size=1,
    )
    rows, start = 0, None
    while True:
        for batch in dataset:
            if start is None:
                start = time.perf_counter()
                continue
            rows += batch["index"].shape[0]
            if args.seconds and time.perf_counter() - start > args.seconds:
                break
        if not args.seconds or time.perf_counter() - start > args.seconds:
            break
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rows": rows, "seconds": elapsed, "peak_rss": peak}))


def run_torch_shards(path, args, cache_dir=None, seconds=None):
    command = [sys.executable, __file__, "--child", path, "--endpoint", args.endpoint, "--cores", str(args.cores)]
    command += ["--seconds", str(args.seconds if seconds is None else seconds)]
    if cache_dir:
        command += ["--cache-dir", cache_dir]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_annbatch(path, args):
    command = [args.annbatch_python, os.path.join(HERE, "annbatch_side.py"), "read", path]
    command += ["--chunk-size", str(BLOCK), "--preload-nchunks", str(PRELOAD_NCHUNKS), "--batch-size", str(BATCH)]
    command += ["--seconds", str(args.seconds), "--endpoint", args.endpoint]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["peak_rss"] = None
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to every request")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--annbatch-python", default=None)
    parser.add_argument("--json", default=os.path.join(HERE, "results", "remote.json"))
    parser.add_argument("--child", dest="child_path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_path:
        return child(args)

    import annbatch_format

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from remote_servers import RangeHTTPServer

    args.annbatch_python = args.annbatch_python or annbatch_format.default_annbatch_python()
    args.datasets = 1
    os.makedirs(args.data_dir, exist_ok=True)
    collection = annbatch_format.ensure_collection(args)
    if collection is None:
        sys.exit("annbatch is needed to write the collection: make .venv-annbatch/.installed (or --annbatch-python)")
    served = tempfile.mkdtemp(prefix="torch_shards_remote_")
    cache = tempfile.mkdtemp(prefix="torch_shards_cache_")
    try:
        # The bucket "bench" holds the collection (hard links: no copy).
        shutil.copytree(collection, os.path.join(served, "bench", "collection.zarr"), copy_function=os.link)
        url = "s3://bench/collection.zarr"
        with RangeHTTPServer(served, latency=args.latency, s3_listing=True) as server:
            args.endpoint = server.url
            print(
                f"{collection}: {args.rows} rows; served at {server.url} with {args.latency * 1000:.0f} ms per request"
            )
            fill = time.perf_counter()
            run_torch_shards(url, args, cache_dir=cache, seconds=0)  # one epoch fills the cache
            print(f"cache filled by one epoch in {time.perf_counter() - fill:.1f} s", flush=True)
            results = {method: [] for method in METHODS}
            for round_ in range(args.rounds):
                for method in METHODS:
                    if method == "local":
                        result = run_torch_shards(collection, args)
                    elif method == "remote":
                        result = run_torch_shards(url, args)
                    elif method == "remote, cached":
                        result = run_torch_shards(url, args, cache_dir=cache)
                    elif method == "annbatch local":
                        result = run_annbatch(collection, args)
                    else:
                        result = run_annbatch(url, args)
                    result["rate"] = result["rows"] / result["seconds"]
                    results[method].append(result)
                    print(f"  round {round_ + 1} {method:16s} {result['rate'] / 1e6:7.3f}M rows/s", flush=True)
            requests = server.count()
    finally:
        shutil.rmtree(served, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)

    local = [r["rate"] for r in results["local"]]
    lines = [
        f"annbatch collection of {args.rows} rows (CSR, 5%), block/chunk {BLOCK}, batch {BATCH}, {args.cores} cores; "
        f"S3 endpoint on 127.0.0.1 with {args.latency * 1000:.0f} ms per request; median of {args.rounds} "
        "alternated rounds",
        "",
        f"| {'method':16s} | rows/s | of local (per round) | peak RSS |",
        "|---|---|---|---|",
    ]
    for method in METHODS:
        rates = [r["rate"] for r in results[method]]
        ratios = [rate / base for rate, base in zip(rates, local)]
        peaks = [r["peak_rss"] for r in results[method] if r["peak_rss"]]
        peak = f"{max(peaks) / 2**20:.0f} MiB" if peaks else "-"
        shown = ", ".join(f"{ratio:.2f}" for ratio in ratios)
        lines.append(f"| {method:16s} | {statistics.median(rates) / 1e6:.3f}M | {shown} | {peak} |")
    remote = [r["rate"] for r in results["remote"]]
    theirs = [r["rate"] for r in results["annbatch remote"]]
    lines += [
        "",
        "torch_shards remote / annbatch remote, per round: "
        + ", ".join(f"{a / b:.1f}x" for a, b in zip(remote, theirs)),
        f"requests served in all: {requests}",
    ]
    print("\n".join(lines))
    with open(args.json, "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items() if k != "child_path"}, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
