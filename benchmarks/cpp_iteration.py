"""C++ iteration next to Python in-process iteration: the same native dataset
(same file, strategy, batch size, fetch factor, threads), read epoch after
epoch for --seconds by a C++ program built through the CMake package
(benchmarks/cpp/iterate.cpp) and by a Python loop, in alternated rounds.

    python -m benchmarks.cpp_iteration    # prints a table, writes benchmarks/results/cpp_iteration.{txt,json}

Expected: within 5% of each other (one native path; Python only hands over batches).
"""

import os
import subprocess

try:
    from benchmarks.harness import cli, data, native, page_cache, results, rounds, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, native, page_cache, results, rounds, timing


def python_rows_per_second(kind, path, block_size, threads, seconds):
    import torch_shards as ts

    source = ts.AnnDataSource(path) if kind == "h5ad" else ts.HDF5Source(path, "X")
    dataset = ts.ShardedDataset(
        source, ts.BlockShuffling(block_size), batch_size=256, fetch_factor=16, seed=0, num_threads=threads
    )
    timed = timing.run_for(dataset, seconds)  # the clock starts at the first batch, as the C++ program's does
    return timed.rows / timed.seconds


def cpp_rows_per_second(program, kind, path, block_size, threads, seconds):
    done = subprocess.run(
        [program, kind, path, str(block_size), str(threads), str(seconds)], check=True, capture_output=True, text=True
    )
    return float(done.stdout.split()[0])  # rows/s (then rows per CPU-second)


def main():
    parser = cli.parser(__doc__, "cpp_iteration", rounds=3, seconds=4.0)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the CSR .h5ad (x 2000, 5%% non-zeros)")
    parser.add_argument("--dense-rows", type=int, default=50_000, help="rows of the dense HDF5 file (x 2000 float32)")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = cli.parse(parser)

    files = {
        "csr.h5ad": ("h5ad", data.csr_h5ad(cli.DATA, args.rows)),
        "dense.h5": ("hdf5", data.dense_h5(cli.DATA, args.dense_rows)),
    }
    for _, path in files.values():
        page_cache.warm(path)
    program = native.build_iterate()

    found = []
    for name, (kind, path) in files.items():
        measured = rounds.alternate(  # alternated: the machine's noise hits both alike
            {
                "python": lambda k=kind, p=path: python_rows_per_second(
                    k, p, args.block_size, args.threads, args.seconds
                ),
                "cpp": lambda k=kind, p=path: cpp_rows_per_second(
                    program, k, p, args.block_size, args.threads, args.seconds
                ),
            },
            args.rounds,
        )
        ratios = sorted(rounds.ratios(measured["cpp"], measured["python"]))  # each round's pair ran back to back
        found.append(
            {
                "file": name,
                "python": rounds.median(measured["python"]),
                "cpp": rounds.median(measured["cpp"]),
                "ratio": rounds.median(ratios),
                "ratio_range": [ratios[0], ratios[-1]],
                "python_rounds": measured["python"],
                "cpp_rounds": measured["cpp"],
            }
        )

    lines = [
        f"BlockShuffling({args.block_size}), batch 256, fetch_factor 16, {args.threads} threads, "
        f"{args.seconds:g} s x {args.rounds} alternated rounds (medians; the ratio is the median of each round's pair)",
        "",
        f"{'file':<10} {'Python rows/s':>14} {'C++ rows/s':>12} {'C++ / Python':>13} {'pair range':>14}",
        "-" * 67,
    ]
    for r in found:
        spread = f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}"
        lines.append(f"{r['file']:<10} {r['python']:>14.3g} {r['cpp']:>12.3g} {r['ratio']:>13.3f} {spread:>14}")
    text = "\n".join(lines)
    print(text)
    arguments = {k: v for k, v in vars(args).items() if k not in ("results_name", "json")}
    results.write(args.out, text, {"arguments": arguments, "results": found})


if __name__ == "__main__":
    main()
