"""Reading an annbatch collection from object storage, side by side with the same bytes on local disk.

The collection (annbatch's add_adatas, written as benchmarks/annbatch_format.py writes it) is served
by the tests' HTTP server as an unsigned, path-style S3 endpoint on 127.0.0.1 (ListObjectsV2 and
ranged GETs over keep-alive HTTP/1.1), with --latency seconds added to every request: what a
bucket in another building costs. Alternated rounds, each in a fresh process (its peak memory
measured), the clock started at the first batch:

    local            torch_shards on the local collection (the reference of every ratio)
    local, epoch 1 from disk
                     torch_shards on the local collection with its files' pages evicted from the
                     kernel's page cache first (posix_fadvise DONTNEED; mincore checks): one whole
                     first epoch read from the disk, start-up included, as "remote, cache epoch 1"
                     is timed (the files are read back into memory afterwards, for the server)
    remote           torch_shards on s3://, no cache: every epoch from the server
    remote, cache epoch 1
                     torch_shards on s3:// with cache_dir= empty (a fresh one each round): one
                     whole first epoch, start-up included (the clock started before the first
                     batch), each object fetched whole into the cache (cache_whole_bytes)
    remote, cache epoch 2
                     torch_shards on s3:// with cache_dir= filled by one epoch before the rounds:
                     a later epoch, in a fresh process (each entry mapped and verified once)
    annbatch local   annbatch's Loader on the local collection
    annbatch remote  annbatch's Loader on s3:// through zarr-python's ObjectStore over obstore
                     (annbatch's documented cloud setup), same server, same latency

The limits, measured in the same run: what the server delivers (curl, 16 whole objects at once) and
answers (requests/s), and the cold limit: the collection's bytes at the server's rate (two round trips
first) followed by a local epoch. A shuffled first epoch needs nearly every object before its first
fetch decodes, so downloading and decoding cannot overlap there.

BlockShuffling(block 64) / annbatch chunk_size 64, batch 256, 32 chunks per fetch, X only; torch_shards
with its default threads (the CPUs locally, 32 reader threads for URLs), annbatch with its defaults.

    python -m benchmarks.remote [--rows 200000] [--latency 0.02] [--seconds 6] [--rounds 3]

Writes benchmarks/results/remote.{txt,json}; --report prints the table of the .json again.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    from benchmarks.harness import annbatch, cli, data, page_cache, results, rounds, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import annbatch, cli, data, page_cache, results, rounds, timing

BLOCK = 64
BATCH = 256
PRELOAD_NCHUNKS = 32
METHODS = [
    "local",
    "local, epoch 1 from disk",
    "remote",
    "remote, cache epoch 1",
    "remote, cache epoch 2",
    "annbatch local",
    "annbatch remote",
]


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
    if args.whole_epoch:  # one epoch, start-up (the first fetch) included
        rows, seconds = timing.epoch(dataset)
    else:
        timed = timing.run_for(dataset, args.seconds)  # --seconds 0: one epoch
        rows, seconds = timed.rows, timed.seconds
    print(json.dumps({"rows": rows, "seconds": seconds, "peak_rss": timing.peak_rss_bytes()}))


def run_torch_shards(path, args, cache_dir=None, seconds=None, whole_epoch=False):
    command = [sys.executable, __file__, "--child", path, "--endpoint", args.endpoint, "--cores", str(args.cores)]
    command += ["--seconds", str(args.seconds if seconds is None else seconds)]
    if whole_epoch:
        command.append("--whole-epoch")
    if cache_dir:
        command += ["--cache-dir", cache_dir]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_annbatch(path, args):
    result = annbatch.read(
        args.annbatch_python, path, BLOCK, PRELOAD_NCHUNKS, BATCH, args.seconds, endpoint=args.endpoint
    )
    result["peak_rss"] = None
    return result


def served_bytes(requests):
    """Bytes the server sent for ranged GETs in its log (whole-object GETs of metadata are small)."""
    total = 0
    for method, _, range_header in requests:
        if method == "GET" and range_header and range_header.startswith("bytes="):
            first, _, last = range_header[len("bytes=") :].partition("-")
            if first and last:
                total += int(last) - int(first) + 1
    return total


def curl_many(urls, parallel, extra=()):
    """Fetches every URL with one curl process, `parallel` transfers at once (the list in a config
    file); returns the bytes downloaded and the seconds it took."""
    with tempfile.NamedTemporaryFile("w", suffix=".curl") as config:
        for url in urls:
            config.write(f'url = "{url}"\noutput = "/dev/null"\n')
        config.flush()
        command = ["curl", "-sf", "--parallel", "--parallel-max", str(parallel), "-w", "%{size_download}\n"]
        start = time.perf_counter()
        done = subprocess.run(command + list(extra) + ["-K", config.name], capture_output=True, text=True)
        elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"curl failed ({done.returncode}) fetching {urls[0]} and others: {done.stderr.strip()}")
    return sum(int(line) for line in done.stdout.split()), elapsed


def collection_objects(collection):
    """(size, path relative to the collection) of every object, largest first."""
    objects = []
    for directory, _, names in os.walk(collection):
        for name in names:
            path = os.path.join(directory, name)
            objects.append((os.path.getsize(path), os.path.relpath(path, collection)))
    return sorted(objects, reverse=True)


def server_limit(url, collection, parallel=16):
    """What the server delivers (bytes/s): the collection's largest objects fetched whole, 16 at once."""
    largest = [f"{url}/{relative}" for _, relative in collection_objects(collection)[:parallel]]
    total, elapsed = curl_many(largest * 8, parallel)
    return total / elapsed


def server_request_limit(url, collection, parallel=32, count=1000, size=48 << 10):
    """Requests/s the server answers: `count` ranged GETs of `size` bytes (about an inner chunk) of the
    collection's largest object, `parallel` at once."""
    largest = f"{url}/{collection_objects(collection)[0][1]}"
    _, elapsed = curl_many([largest] * count, parallel, ["-r", f"0-{size - 1}"])
    return count / elapsed


def main():
    parser = cli.parser(__doc__, "remote", rounds=3, seconds=6.0)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to every request")
    cli.add_cores(parser)
    parser.add_argument("--data-dir", default=cli.DATA)
    parser.add_argument("--annbatch-python", default=None)
    parser.add_argument("--child", dest="child_path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--whole-epoch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", action="store_true", help="print the table of the .json again, measuring nothing")
    args = cli.parse(parser)
    if args.child_path:
        return child(args)
    if args.report:
        saved = results.read_json(args.out)
        keep = ("json", "report", "out", "results_name")
        args.__dict__.update({k: v for k, v in saved["args"].items() if k not in keep})
        return report(
            args,
            saved["results"],
            saved["server_limit_bytes_per_s"],
            saved["server_limit_requests_per_s"],
            saved.get("collection_bytes"),
        )

    sys.path.insert(0, os.path.join(cli.ROOT, "tests"))  # the tests' servers, not a package
    from remote_servers import RangeHTTPServer

    args.annbatch_python = args.annbatch_python or annbatch.default_python()
    os.makedirs(args.data_dir, exist_ok=True)
    collection = data.annbatch_collection(args.data_dir, args.rows, 1, args.annbatch_python)
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
            limits, request_limits = [], []
            measured = {method: [] for method in METHODS}
            for round_ in range(args.rounds):
                served_url = f"{server.url}/bench/collection.zarr"
                limits.append(server_limit(served_url, collection))
                request_limits.append(server_request_limit(served_url, collection))
                rates = f"{limits[-1] / 1e6:7.1f} MB/s, {request_limits[-1]:.0f} requests/s"
                print(f"  round {round_ + 1} server limits    {rates}", flush=True)
                for method in METHODS:
                    if method == "remote":
                        server.reset_log()
                    if method == "local":
                        result = run_torch_shards(collection, args)
                    elif method == "local, epoch 1 from disk":
                        page_cache.evict(collection)
                        resident = page_cache.resident_fraction(collection)
                        try:
                            result = run_torch_shards(collection, args, whole_epoch=True)
                        finally:
                            page_cache.warm(collection)  # the server reads the same files (hard links)
                        result["resident_before"] = resident
                    elif method == "remote":
                        result = run_torch_shards(url, args)
                    elif method == "remote, cache epoch 1":
                        cold = tempfile.mkdtemp(prefix="torch_shards_cold_cache_")
                        try:
                            result = run_torch_shards(url, args, cache_dir=cold, whole_epoch=True)
                        finally:
                            shutil.rmtree(cold, ignore_errors=True)
                    elif method == "remote, cache epoch 2":
                        result = run_torch_shards(url, args, cache_dir=cache)
                    elif method == "annbatch local":
                        result = run_annbatch(collection, args)
                    else:
                        result = run_annbatch(url, args)
                    result["rate"] = result["rows"] / result["seconds"]
                    measured[method].append(result)
                    if method == "remote":
                        result["served_bytes"] = served_bytes(server.requests)
                        result["requests"] = len(server.requests)
                    print(f"  round {round_ + 1} {method:21s} {result['rate'] / 1e6:7.3f}M rows/s", flush=True)
    finally:
        shutil.rmtree(served, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)

    report(args, measured, limits, request_limits, sum(size for size, _ in collection_objects(collection)))


def report(args, measured, limits, request_limits, collection_bytes=None):
    """Prints the table and writes it (txt) beside the measurements (json)."""
    local = [r["rate"] for r in measured["local"]]
    lines = [
        f"annbatch collection of {args.rows} rows (CSR, 5%), block/chunk {BLOCK}, batch {BATCH}, {args.cores} cores; "
        f"S3 endpoint on 127.0.0.1 with {args.latency * 1000:.0f} ms per request; median of {args.rounds} "
        "alternated rounds",
        "",
        f"| {'method':21s} | rows/s | of local (per round) | peak RSS |",
        "|---|---|---|---|",
    ]
    for method in METHODS:
        if method not in measured:  # results of a run before the method was measured
            continue
        rates = [r["rate"] for r in measured[method]]
        ratios = [rate / base for rate, base in zip(rates, local)]
        peaks = [r["peak_rss"] for r in measured[method] if r["peak_rss"]]
        peak = f"{max(peaks) / 2**20:.0f} MiB" if peaks else "-"
        shown = ", ".join(f"{ratio:.3f}" if ratio < 0.01 else f"{ratio:.2f}" for ratio in ratios)
        lines.append(f"| {method:21s} | {rounds.median(rates):,.0f} | {shown} | {peak} |")
    remote = [r["rate"] for r in measured["remote"]]
    theirs = [r["rate"] for r in measured["annbatch remote"]]
    bytes_per_row = rounds.median(r["served_bytes"] / max(r["rows"], 1) for r in measured["remote"])
    requests_per_row = rounds.median(r["requests"] / max(r["rows"], 1) for r in measured["remote"])
    lines += [
        "",
        f"the server (curl): {rounds.median(limits) / 1e6:,.0f} MB/s fetching 16 whole objects at once; "
        f"{rounds.median(request_limits):,.0f} requests/s for 48 KB ranges 32 at once (a new connection each)",
        f"torch_shards remote: {bytes_per_row:,.0f} bytes a row and {requests_per_row * 1000:.1f} requests per 1000 "
        f"rows, so {rounds.median(remote) * requests_per_row:,.0f} requests/s and "
        f"{rounds.median(remote) * bytes_per_row / 1e6:,.0f} MB/s answered by the server",
        "torch_shards remote / annbatch remote, per round: "
        + ", ".join(f"{a / b:.1f}x" for a, b in zip(remote, theirs)),
    ]
    if collection_bytes:
        # A shuffled first epoch needs (nearly) every object before its first fetch decodes: the download at the
        # server's rate (two round trips: HEAD, then the parts) and a local epoch, one after the other.
        cold_limits = [
            args.rows / (collection_bytes / limit + 2 * args.latency + args.rows / base)
            for limit, base in zip(limits, local)
        ]
        cold = [r["rate"] for r in measured["remote, cache epoch 1"]]
        lines.append(
            f"cold limit ({collection_bytes / 1e6:,.0f} MB at the server's rate, then a local epoch): "
            f"{rounds.median(cold_limits):,.0f} rows/s, "
            + ", ".join(f"{limit / base:.2f}" for limit, base in zip(cold_limits, local))
            + " of local; cache epoch 1 at "
            + ", ".join(f"{rate / limit:.2f}" for rate, limit in zip(cold, cold_limits))
            + " of it"
        )
    if "local, epoch 1 from disk" in measured:
        disk = measured["local, epoch 1 from disk"]
        lines.append(
            "cold first epochs, start-up included: remote, cache epoch 1 / local, epoch 1 from disk, per round: "
            + ", ".join(f"{a['rate'] / b['rate']:.2f}" for a, b in zip(measured["remote, cache epoch 1"], disk))
            + " (the collection's pages in memory before the local one: "
            + ", ".join(f"{r['resident_before']:.1%}" for r in disk)
            + ")"
        )
    text = "\n".join(lines)
    print(text)
    saved_args = {k: v for k, v in vars(args).items() if k not in ("child_path", "results_name")}
    results.write(
        args.out,
        text,
        {
            "args": saved_args,
            "server_limit_bytes_per_s": limits,
            "server_limit_requests_per_s": request_limits,
            "collection_bytes": collection_bytes,
            "results": measured,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
