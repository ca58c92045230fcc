"""C++ iteration next to Python in-process iteration: the same native dataset
(same file, strategy, batch size, fetch factor, threads), read epoch after
epoch for --seconds by a C++ program built through the CMake package
(benchmarks/cpp/iterate.cpp) and by a Python loop, in alternated rounds.

    python benchmarks/cpp_iteration.py            # prints a table, writes benchmarks/results/cpp_iteration.{txt,json}

Expected: within 5% of each other (one native path; Python only hands over batches).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from storage_throughput import warm_page_cache, write_csr_h5ad, write_dense_h5  # noqa: E402


def build_cpp():
    build = os.path.join(ROOT, "build", "bench-cpp")
    prefix = subprocess.run(
        [sys.executable, "-m", "torch_shards", "--cmake-prefix-path"], check=True, capture_output=True, text=True
    ).stdout.strip()
    configure = ["cmake", "-S", os.path.join(HERE, "cpp"), "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}"]
    configure += ["-DCMAKE_BUILD_TYPE=Release"] + (["-G", "Ninja"] if shutil.which("ninja") else [])
    subprocess.run(configure, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", build], check=True, capture_output=True)
    return os.path.join(build, "iterate")


def python_rows_per_second(kind, path, block_size, threads, seconds):
    import torch_shards as ts

    source = ts.AnnDataSource(path) if kind == "h5ad" else ts.HDF5Source(path, "X")
    dataset = ts.ShardedDataset(
        source, ts.BlockShuffling(block_size), batch_size=256, fetch_factor=16, seed=0, num_threads=threads
    )
    start, rows = None, 0  # the clock starts at the first batch, as the C++ program's does
    while start is None or time.perf_counter() - start < seconds:
        for batch in dataset:
            if start is None:
                start = time.perf_counter()
                continue
            rows += batch["index"].shape[0]
            if time.perf_counter() - start >= seconds:
                break
    return rows / (time.perf_counter() - start)


def cpp_rows_per_second(program, kind, path, block_size, threads, seconds):
    done = subprocess.run(
        [program, kind, path, str(block_size), str(threads), str(seconds)], check=True, capture_output=True, text=True
    )
    return float(done.stdout.split()[0])  # rows/s (then rows per CPU-second)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the CSR .h5ad (x 2000, 5%% non-zeros)")
    parser.add_argument("--dense-rows", type=int, default=50_000, help="rows of the dense HDF5 file (x 2000 float32)")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cpp_iteration"))
    args = parser.parse_args()

    data = os.path.join(HERE, "data")
    os.makedirs(data, exist_ok=True)
    files = {
        "csr.h5ad": ("h5ad", os.path.join(data, f"csr_{args.rows}.h5ad"), write_csr_h5ad, args.rows),
        "dense.h5": ("hdf5", os.path.join(data, f"dense_{args.dense_rows}.h5"), write_dense_h5, args.dense_rows),
    }
    for _, path, write, rows in files.values():
        if not os.path.exists(path):
            write(path + ".partial", rows)
            os.replace(path + ".partial", path)
        warm_page_cache(path)
    program = build_cpp()

    results = []
    for name, (kind, path, _, _) in files.items():
        python, cpp = [], []
        for _ in range(args.rounds):  # alternated: the machine's noise hits both alike
            python.append(python_rows_per_second(kind, path, args.block_size, args.threads, args.seconds))
            cpp.append(cpp_rows_per_second(program, kind, path, args.block_size, args.threads, args.seconds))
        ratios = sorted(c / p for c, p in zip(cpp, python))  # each round's pair ran back to back
        results.append(
            {
                "file": name,
                "python": statistics.median(python),
                "cpp": statistics.median(cpp),
                "ratio": statistics.median(ratios),
                "ratio_range": [ratios[0], ratios[-1]],
                "python_rounds": python,
                "cpp_rounds": cpp,
            }
        )

    lines = [
        f"BlockShuffling({args.block_size}), batch 256, fetch_factor 16, {args.threads} threads, "
        f"{args.seconds:g} s x {args.rounds} alternated rounds (medians; the ratio is the median of each round's pair)",
        "",
        f"{'file':<10} {'Python rows/s':>14} {'C++ rows/s':>12} {'C++ / Python':>13} {'pair range':>14}",
        "-" * 67,
    ]
    for r in results:
        spread = f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}"
        lines.append(f"{r['file']:<10} {r['python']:>14.3g} {r['cpp']:>12.3g} {r['ratio']:>13.3f} {spread:>14}")
    print("\n".join(lines))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".txt", "w") as out:
        out.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as out:
        json.dump({"arguments": vars(args), "results": results}, out, indent=1)


if __name__ == "__main__":
    main()
