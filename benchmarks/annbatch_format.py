"""Reading annbatch's own format side by side with annbatch, against the decode limit.

    python benchmarks/annbatch_format.py                          # 1e6 x 2000 CSR, ~5% non-zeros
    python benchmarks/annbatch_format.py --rows 200000 --rounds 2 # quicker

The file: a CSR .h5ad (benchmarks/storage_throughput.py writes it) turned into an annbatch
DatasetCollection by annbatch's own add_adatas with its defaults (zarr v3, sharded, blosc lz4
clevel 3 with byte shuffle, 64-row chunks), in --data-dir (benchmarks/data). Writing it and
reading with annbatch need a Python with annbatch (>= 3.12, no torch): --annbatch-python (default:
/work/venv313/bin/python when it exists); without one, annbatch is reported as not installed and
the collection must exist already.

Measured, rows/s and rows per CPU-second (of the measuring process, every thread: steadier where
other work shares the cores), every method on the same --cores (each process pinned to them), page
cache warm, batch 256, epoch after epoch for --seconds each, in alternated rounds (medians):

  decode limit          every chunk of X (data, indices, indptr) decoded in order by --cores threads
                        from the page cache, nothing else (benchmarks/decode_limit.cpp, the same io
                        code): what no read of these chunks can beat on these cores
  torch_shards          ShardedDataset(ts.open(collection), BlockShuffling(block)), sparse CSR
                        batches, native threads; fetch_factor = chunk x preload / batch (annbatch's
                        rows in memory at once)
  torch_shards dense    the same with dense=True
  annbatch              annbatch's Loader(chunk_size, preload_nchunks, batch_size=256, shuffle=True)
                        over the collection (scipy CSR batches), in its own process

Configurations: block 64 with fetch_factor 8 against annbatch's chunk 64 x preload 32, and annbatch's
default 512-row chunks (block 512, fetch_factor 64 against chunk 512 x preload 32).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH_SIZE = 256
PRELOAD_NCHUNKS = 32
CONFIGS = [64, 512]  # chunk size (annbatch) = block size (torch_shards)


def default_annbatch_python():
    candidate = "/work/venv313/bin/python"
    return candidate if os.path.exists(candidate) else None


def ensure_collection(args):
    import storage_throughput

    h5ad = os.path.join(args.data_dir, f"csr_{args.rows}.h5ad")
    collection = os.path.join(args.data_dir, f"annbatch_{args.rows}.zarr")
    if os.path.exists(os.path.join(collection, "zarr.json")):
        return collection
    if not args.annbatch_python:
        return None
    if not os.path.exists(h5ad):
        print(f"writing {h5ad} ...", flush=True)
        storage_throughput.write_csr_h5ad(h5ad, args.rows)
    print(f"writing {collection} with annbatch's add_adatas ...", flush=True)
    shutil.rmtree(collection, ignore_errors=True)
    subprocess.run(
        [args.annbatch_python, os.path.join(HERE, "annbatch_side.py"), "write", h5ad, collection], check=True
    )
    return collection


def x_arrays(collection):
    """STORE:ARRAY specs of every array of X in the collection, dataset by dataset."""
    import torch_shards as ts

    specs = []
    for source in ts.open(collection).sources:
        for part in ("data", "indices", "indptr"):
            specs.append(f"{collection}:/{os.path.relpath(source.path, collection)}/X/{part}")
    return specs


def decode_ceiling(collection, block):
    """The share of the decode limit block reads can reach at best: a random block of `block` rows
    decodes every chunk of data and indices it touches, whole (blosc blocks span the chunk), so
    with chunks of ~64 rows a 64-row block decodes ~2 chunks for one chunk's worth of rows."""
    import numpy as np

    import torch_shards as ts

    touched = needed = 0.0
    for source in ts.open(collection).sources:
        x = os.path.join(source.path, "X")
        with open(os.path.join(x, "data", "zarr.json")) as f:
            meta = json.load(f)
        codec = meta["codecs"][0]
        chunk = (
            codec["configuration"]["chunk_shape"][0]
            if codec["name"] == "sharding_indexed"
            else meta["chunk_grid"]["configuration"]["chunk_shape"][0]
        )
        indptr_source = ts.ZarrSource(collection, "/" + os.path.relpath(os.path.join(x, "indptr"), collection))
        indptr = indptr_source.read(range(len(indptr_source)))["X"].numpy().astype(np.int64)
        starts = indptr[:-1:block]
        ends = indptr[np.minimum(np.arange(block, len(indptr) - 1 + block, block), len(indptr) - 1)]
        nonempty = ends > starts
        touched += float(((ends - 1) // chunk - starts // chunk + 1)[nonempty].sum())
        needed += indptr[-1] / chunk
    return needed / touched


def shown_path(path):
    """Relative to the repository when inside it, else as given."""
    relative = os.path.relpath(path, ROOT)
    return path if relative.startswith("..") else relative


def build_decode_limit(args):
    # In the project's build directory (configured by `make setup`), with the library's flags.
    build = os.path.join(ROOT, "build", "native")
    subprocess.run(["cmake", "--build", build, "--target", "decode_limit"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(build, "decode_limit")


def warm(collection):
    for directory, _, files in os.walk(collection):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                while f.read(64 << 20):
                    pass


def decode_limit(binary, specs, rows, args):
    done = subprocess.run(
        ["taskset", "-c", args.cpu_list, binary, "--threads", str(args.cores), "--seconds", str(args.seconds)] + specs,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout)
    return rows * result["passes"] / result["seconds"], rows * result["passes"] / result["cpu_seconds"]


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def torch_shards_rate(collection, block, dense, args):
    import torch_shards as ts

    dataset = ts.ShardedDataset(
        ts.open(collection, dense=dense),
        ts.BlockShuffling(block),
        batch_size=BATCH_SIZE,
        fetch_factor=block * PRELOAD_NCHUNKS // BATCH_SIZE,
        seed=0,
        num_threads=args.cores,
        rank=0,
        world_size=1,
    )
    rows, start, cpu_start = 0, None, None
    while True:
        for batch in dataset:
            if start is None:
                start, cpu_start = time.perf_counter(), cpu_seconds()
                continue
            rows += batch["index"].shape[0]
            if time.perf_counter() - start > args.seconds:
                return rows / (time.perf_counter() - start), rows / (cpu_seconds() - cpu_start)


def annbatch_rate(collection, block, args):
    done = subprocess.run(
        ["taskset", "-c", args.cpu_list, args.annbatch_python, os.path.join(HERE, "annbatch_side.py"), "read"]
        + [collection, "--chunk-size", str(block), "--preload-nchunks", str(PRELOAD_NCHUNKS)]
        + ["--batch-size", str(BATCH_SIZE), "--seconds", str(args.seconds)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["rows"] / result["seconds"], result["rows"] / result["cpu_seconds"]


def annbatch_status(python):
    if not python:
        return "not installed (needs a Python >= 3.12 with annbatch: --annbatch-python)"
    done = subprocess.run(
        [python, "-c", "import annbatch, importlib.metadata as m; print(m.version('annbatch'))"],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"not importable by {python}"


def main():
    warnings.filterwarnings("ignore", message=".*[Ss]parse")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds; medians are reported")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--annbatch-python", default=default_annbatch_python())
    parser.add_argument("--skip", default="", help="comma-separated methods to leave out")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "annbatch_format.json"))
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    os.makedirs(args.data_dir, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))[: args.cores]
    args.cpu_list = ",".join(map(str, cpus))
    os.sched_setaffinity(0, cpus)  # torch_shards runs in this process: the same cores as the others

    status = annbatch_status(args.annbatch_python)
    collection = ensure_collection(args)
    if collection is None:
        print(f"annbatch: {status}; no collection in {args.data_dir} to read, nothing measured")
        return
    binary = build_decode_limit(args)
    specs = x_arrays(collection)
    warm(collection)
    import torch_shards as ts

    rows = len(ts.open(collection))
    skip = set(filter(None, args.skip.split(",")))
    methods = [("decode limit", None, lambda: decode_limit(binary, specs, rows, args))]
    for block in CONFIGS:
        ff = block * PRELOAD_NCHUNKS // BATCH_SIZE
        methods.append(
            (
                f"torch_shards block {block} ff {ff}",
                block,
                lambda b=block: torch_shards_rate(collection, b, False, args),
            )
        )
        methods.append(
            (f"torch_shards dense block {block}", block, lambda b=block: torch_shards_rate(collection, b, True, args))
        )
        if status is None:
            methods.append(
                (
                    f"annbatch chunk {block} x {PRELOAD_NCHUNKS}",
                    block,
                    lambda b=block: annbatch_rate(collection, b, args),
                )
            )
    methods = [m for m in methods if m[0].split(" block")[0].split(" chunk")[0] not in skip]
    ceilings = {block: decode_ceiling(collection, block) for block in CONFIGS}
    print(
        f"{shown_path(collection)}: {rows} rows; {args.cores} cores (cpus {args.cpu_list}); "
        f"batch {BATCH_SIZE}; "
        f"{args.seconds:.0f} s per measurement, {args.rounds} alternated rounds (median)"
    )
    if status:
        print(f"annbatch: {status}")
    walls = {name: [] for name, _, _ in methods}
    cpus = {name: [] for name, _, _ in methods}
    for round_ in range(args.rounds):
        for name, _, measure in methods:
            wall, cpu = measure()
            walls[name].append(wall)
            cpus[name].append(cpu)
            print(f"  round {round_ + 1}: {name:<36} {wall:>12,.0f} rows/s {cpu:>12,.0f} rows/CPU-s", flush=True)
    wall = {name: statistics.median(values) for name, values in walls.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    header = (
        f"{'method':<36} {'rows/s':>11} {'of limit':>9} {'vs annbatch':>12} {'rows/CPU-s':>11} {'of limit':>9} "
        f"{'vs annbatch':>12} {'ceiling':>8}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    results = []
    for name, block, _ in methods:
        reference = f"annbatch chunk {block} x {PRELOAD_NCHUNKS}"
        ours = not name.startswith("annbatch") and block is not None

        def versus(values, name=name, reference=reference, ours=ours):
            return f"{values[name] / values[reference]:.2f}x" if ours and reference in values else ""

        ceiling = f"{ceilings[block]:.2f}" if ours else ""
        print(
            f"{name:<36} {wall[name]:>11,.0f} {wall[name] / wall['decode limit']:>9.2f} {versus(wall):>12} "
            f"{cpu[name]:>11,.0f} {cpu[name] / cpu['decode limit']:>9.2f} {versus(cpu):>12} {ceiling:>8}"
        )
        results.append(
            {
                "method": name,
                "rows_per_s": wall[name],
                "rows_per_cpu_s": cpu[name],
                "rounds_rows_per_s": walls[name],
                "rounds_rows_per_cpu_s": cpus[name],
                "of_limit": wall[name] / wall["decode limit"],
                "of_limit_cpu": cpu[name] / cpu["decode limit"],
                "ceiling": ceilings.get(block),
            }
        )
    print(
        "\nrows/CPU-s: rows per second of the process's CPU time (all its threads), steadier than rows/s where "
        "other work shares the cores.\nceiling: the share of the decode limit reads of random blocks can reach "
        "when each block decodes every chunk it touches whole (c-blosc's way; decoding part of a frame passes it)."
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "cores": args.cores, "batch_size": BATCH_SIZE, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
