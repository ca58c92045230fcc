"""Reading annbatch's own format side by side with annbatch, against the decode limit.

    python benchmarks/annbatch_format.py                          # 1e6 x 2000 CSR, ~5% non-zeros
    python benchmarks/annbatch_format.py --rows 200000 --rounds 2 # quicker
    python benchmarks/annbatch_format.py --datasets 4              # the rows in 4 datasets, as in a
                                                                   # large collection (annbatch's
                                                                   # dataset_size)

The file: a CSR .h5ad (benchmarks/storage_throughput.py writes it) turned into an annbatch
DatasetCollection by annbatch's own add_adatas with its defaults (zarr v3, sharded, blosc lz4
clevel 3 with byte shuffle, 64-row chunks), in --data-dir (benchmarks/data). Writing it and
reading with annbatch need a Python with annbatch (>= 3.12, no torch): --annbatch-python (default:
.venv-annbatch, which `make bench` makes, when it exists); without one, annbatch is reported as not installed and
the collection must exist already.

Measured, rows/s and rows per CPU-second (of the measuring process, every thread: steadier where
other work shares the cores), every method on the same --cores (each process pinned to them), page
cache warm, batch 256, epoch after epoch for --seconds each, in alternated rounds (medians):

  decode limit          every chunk of X (data, indices, indptr) decoded in order by --cores threads
                        from the page cache, nothing else (benchmarks/decode_limit.cpp, the same io
                        code): what no read of these chunks can beat on these cores
  io floor block B      the same program reading random blocks of B rows, fetch by fetch (B x 32
                        rows), with the io code the sources use (CSR plan, then only the parts of
                        the chunks the rows need) into reused buffers: no loader, no tensors, no
                        Python. What any reader of these random blocks pays at least
  io floor shuffled     the same with each fetch's rows shuffled (decode_limit --shuffle-rows), as
                        BlockShuffling delivers them: each row copied to its own place (the io
                        code reads them in source order first). The floor of what torch_shards
                        does ('of floor')
  dense write limit     writing dense float32 rows of X's width and density into memory with the
                        stores the dense scatter uses (decode_limit --write-rows, --cores threads):
                        with dense=True every row costs reading its CSR row (in source order: each
                        dense row goes to its own place anyway) plus this write
  torch_shards          ShardedDataset(ts.open(collection), BlockShuffling(block)), sparse CSR
                        batches, native threads; fetch_factor = chunk x preload / batch (annbatch's
                        rows in memory at once)
  torch_shards dense    the same with dense=True
  torch_shards C++      the same dataset read by a C++ program through the CMake package
                        (torch_shards::AnnbatchCollection, benchmarks/cpp/iterate.cpp), in its own
                        process: the native reader without the Python door's per-batch cost
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
    """The Makefile's annbatch venv (make bench makes it), else the one this VM's sessions used."""
    for candidate in (os.path.join(HERE, "..", ".venv-annbatch", "bin", "python"), "/work/venv313/bin/python"):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    return None


def datasets_suffix(args):
    """Of the collection's and the results' names: "" for annbatch's default, one dataset here."""
    return "" if args.datasets == 1 else f"_{args.datasets}_datasets"


def ensure_collection(args):
    import storage_throughput

    h5ad = os.path.join(args.data_dir, f"csr_{args.rows}.h5ad")
    collection = os.path.join(args.data_dir, f"annbatch_{args.rows}{datasets_suffix(args)}.zarr")
    if os.path.exists(os.path.join(collection, "zarr.json")):
        return collection
    if not args.annbatch_python:
        return None
    if not os.path.exists(h5ad):
        print(f"writing {h5ad} ...", flush=True)
        storage_throughput.write_csr_h5ad(h5ad, args.rows)
    print(f"writing {collection} with annbatch's add_adatas ...", flush=True)
    shutil.rmtree(collection, ignore_errors=True)
    sizes = [] if args.datasets == 1 else ["--dataset-size", str(-(-args.rows // args.datasets))]
    subprocess.run(
        [args.annbatch_python, os.path.join(HERE, "annbatch_side.py"), "write", h5ad, collection] + sizes, check=True
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


def anndata_specs(collection):
    """STORE:PATH of every dataset (an AnnData) of the collection."""
    import torch_shards as ts

    return [f"{collection}:/{os.path.relpath(source.path, collection)}" for source in ts.open(collection).sources]


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


def io_floor(binary, specs, rows, block, shuffle_rows, args):
    done = subprocess.run(
        ["taskset", "-c", args.cpu_list, binary, "--threads", str(args.cores), "--seconds", str(args.seconds)]
        + ["--csr-blocks", str(block), "--fetch-rows", str(block * PRELOAD_NCHUNKS)]
        + (["--shuffle-rows"] if shuffle_rows else [])
        + specs,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout)
    return rows * result["passes"] / result["seconds"], rows * result["passes"] / result["cpu_seconds"]


def dense_write_limit(binary, collection, args):
    """Rows/s of writing dense float32 rows of X's width, as sparse as X's (the share of all-zero
    cache lines changes the rate), into memory with the dense scatter's stores, on --cores threads."""
    import torch_shards as ts

    stored = cells = 0
    width = None
    for source in ts.open(collection).sources:
        data = os.path.join(source.path, "X", "data")
        meta = os.path.join(data, "zarr.json") if os.path.exists(os.path.join(data, "zarr.json")) else None
        with open(meta or os.path.join(data, ".zarray")) as f:
            stored += json.load(f)["shape"][0]
        cells += source.n_obs * source.n_vars
        width = source.n_vars
    done = subprocess.run(
        ["taskset", "-c", args.cpu_list, binary, "--threads", str(args.cores), "--seconds", str(args.seconds)]
        + ["--write-rows", str(width), "--write-density", str(stored / cells)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout)
    rows = result["written_rows"] * result["passes"]
    return rows / result["seconds"], rows / result["cpu_seconds"]


def cpu_description():
    """The CPU's model and the widest vectors the library's hot loops use on it: results differ by CPU."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {vectors}"


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


def cpp_rate(program, collection, block, args):
    ff = block * PRELOAD_NCHUNKS // BATCH_SIZE
    command = [program, "annbatch", collection, str(block), str(args.cores), str(args.seconds), str(ff)]
    done = subprocess.run(["taskset", "-c", args.cpu_list] + command, check=True, capture_output=True, text=True)
    wall, cpu = map(float, done.stdout.split())
    return wall, cpu


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


def print_per_round(walls):
    """The targets' ratios taken round by round (each against the same round's decode limit or CSR
    rate, measured minutes apart in the VM's same phase), their median and range: steadier than the
    ratios of the medians above, whose numerators and denominators come from different rounds."""
    lines = []
    for block in CONFIGS:
        ff = block * PRELOAD_NCHUNKS // BATCH_SIZE
        sparse, cpp, dense = (
            f"torch_shards block {block} ff {ff}",
            f"torch_shards C++ block {block} ff {ff}",
            f"torch_shards dense block {block}",
        )
        pairs = [
            (f"block {block} of the decode limit", sparse, "decode limit", False),
            (f"block {block} C++ of the decode limit", cpp, "decode limit", False),
            (f"block {block} dense/CSR time per row", sparse, dense, True),
        ]
        for label, numerator, denominator, times in pairs:
            if numerator not in walls or denominator not in walls:
                continue
            ratios = [n / d for n, d in zip(walls[numerator], walls[denominator])]
            unit = "x" if times else ""
            lines.append(
                f"  {label}: median {statistics.median(ratios):.3f}{unit} (rounds "
                + ", ".join(f"{r:.3f}" for r in ratios)
                + ")"
            )
    if lines:
        print("\nPer round (each ratio within one round):\n" + "\n".join(lines))


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
    parser.add_argument(
        "--datasets", type=int, default=1, help="datasets annbatch cuts the rows into (1: its default, here)"
    )
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds; medians are reported")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--annbatch-python", default=default_annbatch_python())
    parser.add_argument("--skip", default="", help="comma-separated methods to leave out")
    parser.add_argument("--json", default=None, help="default: results/annbatch_format[_<n>_datasets].json")
    args = parser.parse_args()
    if args.json is None:
        args.json = os.path.join(HERE, "results", f"annbatch_format{datasets_suffix(args)}.json")
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
    from cpp_iteration import build_cpp

    program = build_cpp()
    specs = x_arrays(collection)
    warm(collection)
    import torch_shards as ts

    rows = len(ts.open(collection))
    skip = set(filter(None, args.skip.split(",")))
    datasets = anndata_specs(collection)
    methods = [
        ("decode limit", None, lambda: decode_limit(binary, specs, rows, args)),
        ("dense write limit", None, lambda: dense_write_limit(binary, collection, args)),
    ]
    for block in CONFIGS:
        ff = block * PRELOAD_NCHUNKS // BATCH_SIZE
        methods.append(
            (f"io floor block {block}", block, lambda b=block: io_floor(binary, datasets, rows, b, False, args))
        )
        methods.append(
            (f"io floor shuffled block {block}", block, lambda b=block: io_floor(binary, datasets, rows, b, True, args))
        )
        methods.append(
            (
                f"torch_shards block {block} ff {ff}",
                block,
                lambda b=block: torch_shards_rate(collection, b, False, args),
            )
        )
        methods.append(
            (f"torch_shards C++ block {block} ff {ff}", block, lambda b=block: cpp_rate(program, collection, b, args))
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
    print(
        f"{shown_path(collection)}: {rows} rows; {args.cores} cores (cpus {args.cpu_list}); "
        f"batch {BATCH_SIZE}; "
        f"{args.seconds:.0f} s per measurement, {args.rounds} alternated rounds (median); {cpu_description()}"
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
        f"{'method':<36} {'rows/s':>11} {'of limit':>9} {'of floor':>9} {'vs annbatch':>12} {'rows/CPU-s':>11} "
        f"{'of limit':>9} {'of floor':>9} {'vs annbatch':>12}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    results = []
    for name, block, _ in methods:
        reference = f"annbatch chunk {block} x {PRELOAD_NCHUNKS}"
        floor = f"io floor shuffled block {block}"
        ours = name.startswith("torch_shards")

        def versus(values, name=name, reference=reference, ours=ours):
            return f"{values[name] / values[reference]:.2f}x" if ours and reference in values else ""

        def of_floor(values, name=name, floor=floor, ours=ours):
            return f"{values[name] / values[floor]:.2f}" if ours and floor in values else ""

        def of_limit(values, name=name):  # None when the decode limit was skipped
            return values[name] / values["decode limit"] if "decode limit" in values else None

        def shown(fraction):
            return "" if fraction is None else f"{fraction:.2f}"

        print(
            f"{name:<36} {wall[name]:>11,.0f} {shown(of_limit(wall)):>9} {of_floor(wall):>9} "
            f"{versus(wall):>12} {cpu[name]:>11,.0f} {shown(of_limit(cpu)):>9} {of_floor(cpu):>9} "
            f"{versus(cpu):>12}"
        )
        results.append(
            {
                "method": name,
                "rows_per_s": wall[name],
                "rows_per_cpu_s": cpu[name],
                "rounds_rows_per_s": walls[name],
                "rounds_rows_per_cpu_s": cpus[name],
                "of_limit": of_limit(wall),
                "of_limit_cpu": of_limit(cpu),
            }
        )
    print(
        "\ndense=True against CSR (time per row; a dense row costs reading its CSR row, in source order since each "
        "dense row is written to its own place, plus writing it):"
    )
    for block in CONFIGS:
        sparse = f"torch_shards block {block} ff {block * PRELOAD_NCHUNKS // BATCH_SIZE}"
        dense = f"torch_shards dense block {block}"
        if sparse not in wall or dense not in wall or "dense write limit" not in wall:
            continue
        model = 1 / (1 / wall[sparse] + 1 / wall["dense write limit"])
        print(
            f"  block {block}: dense/CSR {wall[sparse] / wall[dense]:.2f}x (per CPU-second "
            f"{cpu[sparse] / cpu[dense]:.2f}x); CSR time + writing the rows at the "
            f"write limit: {model:,.0f} rows/s = {wall[sparse] / model:.2f}x the CSR time, ours at "
            f"{wall[dense] / model:.2f} of that"
        )
    print_per_round(walls)
    print(
        "\nrows/CPU-s: rows per second of the process's CPU time (all its threads), steadier than rows/s where "
        "other work shares the cores.\nio floor: random blocks read by the io code alone (see the top of this file); "
        "io floor shuffled: the same with each fetch's rows shuffled, as ours delivers them; 'of floor' compares "
        "ours with the shuffled floor of the same block size."
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": rows,
                    "cores": args.cores,
                    "cpu": cpu_description(),
                    "batch_size": BATCH_SIZE,
                    "results": results,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
