"""Reading annbatch's own format side by side with annbatch, against the decode limit.

    python -m benchmarks.annbatch_format                          # 1e6 x 2000 CSR, ~5% non-zeros
    python -m benchmarks.annbatch_format --rows 200000 --rounds 2 # quicker
    python -m benchmarks.annbatch_format --datasets 4             # the rows in 4 datasets, as in a
                                                                  # large collection (annbatch's
                                                                  # dataset_size)

The file: a CSR .h5ad (the harness's data writer, as benchmarks/storage_throughput.py's) turned into an annbatch
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

Writes benchmarks/results/annbatch_format[_<n>_datasets].{txt,json} and, with matplotlib, a .png: rows/s
of every method per block size against the decode limit.
"""

import json
import os
import subprocess
import warnings

try:
    from benchmarks.harness import annbatch, cli, data, limits, machine, native, page_cache, results, rounds, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import annbatch, cli, data, limits, machine, native, page_cache, results, rounds, timing

BATCH_SIZE = 256
PRELOAD_NCHUNKS = 32
CONFIGS = [64, 512]  # chunk size (annbatch) = block size (torch_shards)


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


def x_width_and_density(collection):
    """X's width and its share of stored values (the dense write limit writes rows as sparse)."""
    import torch_shards as ts

    stored = cells = 0
    width = None
    for source in ts.open(collection).sources:
        array = os.path.join(source.path, "X", "data")
        meta = os.path.join(array, "zarr.json") if os.path.exists(os.path.join(array, "zarr.json")) else None
        with open(meta or os.path.join(array, ".zarray")) as f:
            stored += json.load(f)["shape"][0]
        cells += source.n_obs * source.n_vars
        width = source.n_vars
    return width, stored / cells


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
    timed = timing.run_for(dataset, args.seconds)
    return timed.rows / timed.seconds, timed.rows / timed.cpu_seconds


def cpp_rate(program, collection, block, args):
    ff = block * PRELOAD_NCHUNKS // BATCH_SIZE
    command = [program, "annbatch", collection, str(block), str(args.cores), str(args.seconds), str(ff)]
    done = subprocess.run(machine.taskset(args.cpu_list, command), check=True, capture_output=True, text=True)
    wall, cpu = map(float, done.stdout.split())
    return wall, cpu


def annbatch_rate(collection, block, args):
    result = annbatch.read(
        args.annbatch_python, collection, block, PRELOAD_NCHUNKS, BATCH_SIZE, args.seconds, cpu_list=args.cpu_list
    )
    return result["rows"] / result["seconds"], result["rows"] / result["cpu_seconds"]


def print_per_round(walls, say):
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
            (f"block {block} of the decode limit", sparse, "decode limit", ""),
            (f"block {block} C++ of the decode limit", cpp, "decode limit", ""),
            (f"block {block} dense/CSR time per row", sparse, dense, "x"),
        ]
        for label, numerator, denominator, unit in pairs:
            if numerator in walls and denominator in walls:
                lines.append(f"  {label}: " + rounds.spread(rounds.ratios(walls[numerator], walls[denominator]), unit))
    if lines:
        say("\nPer round (each ratio within one round):\n" + "\n".join(lines))


def method_list(collection, binary, program, rows, status, args):
    """(name, block or None, measure) of every method, the limits first."""
    specs, datasets = x_arrays(collection), anndata_specs(collection)
    width, density = x_width_and_density(collection)
    on = dict(cores=args.cores, seconds=args.seconds, cpu_list=args.cpu_list)
    methods = [
        ("decode limit", None, lambda: limits.decode(binary, specs, rows, **on)),
        ("dense write limit", None, lambda: limits.dense_write(binary, width, density, **on)),
    ]
    for block in CONFIGS:
        ff = block * PRELOAD_NCHUNKS // BATCH_SIZE
        fetch = block * PRELOAD_NCHUNKS
        methods += [
            (
                f"io floor block {block}",
                block,
                lambda b=block, f=fetch: limits.io_floor(binary, datasets, rows, b, f, False, **on),
            ),
            (
                f"io floor shuffled block {block}",
                block,
                lambda b=block, f=fetch: limits.io_floor(binary, datasets, rows, b, f, True, **on),
            ),
            (
                f"torch_shards block {block} ff {ff}",
                block,
                lambda b=block: torch_shards_rate(collection, b, False, args),
            ),
            (f"torch_shards C++ block {block} ff {ff}", block, lambda b=block: cpp_rate(program, collection, b, args)),
            (f"torch_shards dense block {block}", block, lambda b=block: torch_shards_rate(collection, b, True, args)),
        ]
        if status is None:
            methods.append(
                (
                    f"annbatch chunk {block} x {PRELOAD_NCHUNKS}",
                    block,
                    lambda b=block: annbatch_rate(collection, b, args),
                )
            )
    return [m for m in methods if m[0].split(" block")[0].split(" chunk")[0] not in args.skip]


def main():
    warnings.filterwarnings("ignore", message=".*[Ss]parse")
    parser = cli.parser(
        __doc__,
        lambda args: f"annbatch_format{data.datasets_suffix(args.datasets)}",
        rounds=3,
        seconds=8.0,
        replot=True,
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--datasets", type=int, default=1, help="datasets annbatch cuts the rows into (1: its default, here)"
    )
    cli.add_cores(parser)
    parser.add_argument("--data-dir", default=cli.DATA)
    parser.add_argument("--annbatch-python", default=annbatch.default_python())
    cli.add_skip(parser)
    args = cli.parse(parser)
    if args.replot:
        return plot(results.read_json(args.out)["results"], args.out + ".png")
    os.makedirs(args.data_dir, exist_ok=True)
    args.cpu_list = machine.pin(args.cores)  # torch_shards runs in this process: the same cores as the others

    status = annbatch.status(args.annbatch_python)
    collection = data.annbatch_collection(args.data_dir, args.rows, args.datasets, args.annbatch_python)
    if collection is None:
        print(f"annbatch: {status}; no collection in {args.data_dir} to read, nothing measured")
        return
    binary = native.build_decode_limit()
    program = native.build_iterate()
    page_cache.warm(collection)
    import torch_shards as ts

    rows = len(ts.open(collection))
    methods = method_list(collection, binary, program, rows, status, args)
    say = results.Report()
    say(
        f"{cli.shown_path(collection)}: {rows} rows; {args.cores} cores (cpus {args.cpu_list}); "
        f"batch {BATCH_SIZE}; "
        f"{args.seconds:.0f} s per measurement, {args.rounds} alternated rounds (median); {machine.cpu_description()}"
    )
    if status:
        say(f"annbatch: {status}")

    def report(round_, name, result):
        say(f"  round {round_}: {name:<36} {result[0]:>12,.0f} rows/s {result[1]:>12,.0f} rows/CPU-s")

    measured = rounds.alternate({name: measure for name, _, measure in methods}, args.rounds, report)
    walls, cpus = rounds.column(measured, 0), rounds.column(measured, 1)
    wall, cpu = rounds.medians(walls), rounds.medians(cpus)
    header = (
        f"{'method':<36} {'rows/s':>11} {'of limit':>9} {'of floor':>9} {'vs annbatch':>12} {'rows/CPU-s':>11} "
        f"{'of limit':>9} {'of floor':>9} {'vs annbatch':>12}"
    )
    say("\n" + header + "\n" + "-" * len(header))
    found = []
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

        say(
            f"{name:<36} {wall[name]:>11,.0f} {shown(of_limit(wall)):>9} {of_floor(wall):>9} "
            f"{versus(wall):>12} {cpu[name]:>11,.0f} {shown(of_limit(cpu)):>9} {of_floor(cpu):>9} "
            f"{versus(cpu):>12}"
        )
        found.append(
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
    say(
        "\ndense=True against CSR (time per row; a dense row costs reading its CSR row, in source order since each "
        "dense row is written to its own place, plus writing it):"
    )
    for block in CONFIGS:
        sparse = f"torch_shards block {block} ff {block * PRELOAD_NCHUNKS // BATCH_SIZE}"
        dense = f"torch_shards dense block {block}"
        if sparse not in wall or dense not in wall or "dense write limit" not in wall:
            continue
        model = 1 / (1 / wall[sparse] + 1 / wall["dense write limit"])
        say(
            f"  block {block}: dense/CSR {wall[sparse] / wall[dense]:.2f}x (per CPU-second "
            f"{cpu[sparse] / cpu[dense]:.2f}x); CSR time + writing the rows at the "
            f"write limit: {model:,.0f} rows/s = {wall[sparse] / model:.2f}x the CSR time, ours at "
            f"{wall[dense] / model:.2f} of that"
        )
    print_per_round(walls, say)
    say(
        "\nrows/CPU-s: rows per second of the process's CPU time (all its threads), steadier than rows/s where "
        "other work shares the cores.\nio floor: random blocks read by the io code alone (see the top of this file); "
        "io floor shuffled: the same with each fetch's rows shuffled, as ours delivers them; 'of floor' compares "
        "ours with the shuffled floor of the same block size."
    )
    summary = {
        "rows": rows,
        "cores": args.cores,
        "cpu": machine.cpu_description(),
        "batch_size": BATCH_SIZE,
        "results": found,
    }
    results.write(args.out, say.text(), summary)
    plot(found, args.out + ".png")


def plot(found, path):
    """rows/s of every method per block size (bars), the decode and dense write limits as levels."""
    wall = {r["method"]: r["rows_per_s"] for r in found}
    groups = [f"block {block}" for block in CONFIGS]
    kinds = {
        "io floor": "io floor block {b}",
        "io floor shuffled": "io floor shuffled block {b}",
        "torch_shards": "torch_shards block {b} ff {ff}",
        "torch_shards C++": "torch_shards C++ block {b} ff {ff}",
        "torch_shards dense": "torch_shards dense block {b}",
        "annbatch": "annbatch chunk {b} x " + str(PRELOAD_NCHUNKS),
    }
    bars = {}
    for label, pattern in kinds.items():
        names = [pattern.format(b=b, ff=b * PRELOAD_NCHUNKS // BATCH_SIZE) for b in CONFIGS]
        if any(name in wall for name in names):
            bars[label] = [wall.get(name, 0) for name in names]
    levels = {name: wall[name] for name in ("decode limit", "dense write limit") if name in wall}
    results.bar_plots(
        path, {"rows/s against the limits": {"groups": groups, "bars": bars, "levels": levels}}, "rows / s"
    )


if __name__ == "__main__":
    main()
