"""The host path: how close the reader gets to a hand-written torch gather of the same rows.

    python -m benchmarks.host_path                  # 100,000 rows of 8 KB (float32 x 2048), 5 epochs
    python -m benchmarks.host_path --rows 40000     # quicker

For each source (TensorSource over an in-memory tensor, HDF5 contiguous, HDF5 chunked (64-row chunks,
uncompressed); the files live in /dev/shm when it has room, so in memory) and each batch size (256 and
4096, default fetch_factor 16), epochs alternate between

  torch_shards  ShardedDataset(source, BlockShuffling(64), batch_size=b, num_threads=T) iterated
                in-process (the loop only counts rows)
  torch gather  torch.index_select(X, 0, rows, out=buf) into one reused buffer, batch after batch, with
                the rows of the same epoch's plan (the same rows in the same block order), from the
                in-memory tensor, torch.set_num_threads(T)
  fresh memory  the same gather, each batch into the next slot of a 512 MB ring instead of one buffer:
                what torch pays to read ahead (its batches land in memory past the caches, as ours
                must, where the reused buffer of the torch loop stays in cache)
  copy limit    the same copy with nothing else (benchmarks/decode_limit.cpp --gather-rows: C++, T
                threads, the rows of block-shuffled fetches of batch x 16 rows, each fetch's rows
                shuffled, copied in source order to their places with the stores the sources use,
                into recycled buffers; its own epochs of an equal source, between ours): the
                physical limit of any reader delivering these rows in this order

and reports rows/s (median over the epochs after the first), the ratios torch_shards / torch gather,
torch_shards / fresh memory and torch_shards / copy limit,
and the memory faulted in per epoch as a fraction of the epoch's bytes (1.0: every byte delivered was
faulted in): minor page faults of the whole process (getrusage), those that made a transparent huge page
(/proc/vmstat, machine-wide) counted as 2 MB, the others as a page; in the first epoch, and the mean and
largest after it. T is the machine's core count unless --threads says otherwise.

Writes benchmarks/results/host_path.txt and .json (--out names another prefix), and with matplotlib
host_path.png: rows/s against the batch size, a panel per source, beside the torch loops and the copy limit.
"""

import os
import statistics
import time

import h5py
import torch

import torch_shards as ts

try:
    from benchmarks.harness import cli, data, limits, native, results
    from benchmarks.harness.machine import faulted_bytes
except ImportError:  # run as a file, or imported with benchmarks/ on sys.path (tests/test_host_path.py)
    from harness import cli, data, limits, native, results
    from harness.machine import faulted_bytes

BLOCK = 64
SOURCES = ("TensorSource", "HDF5 contiguous", "HDF5 chunked")


def ours_epoch(dataset):
    rows = 0
    faults = faulted_bytes()
    start = time.perf_counter()
    for batch in dataset:
        rows += batch["index"].numel()
    seconds = time.perf_counter() - start
    return rows, seconds, faulted_bytes() - faults


def torch_epoch(x, plan, batch_size, buffer):
    faults = faulted_bytes()
    start = time.perf_counter()
    for begin in range(0, plan.numel(), batch_size):
        rows = plan[begin : begin + batch_size]
        out = buffer[: rows.numel()]
        torch.index_select(x, 0, rows, out=out)
    seconds = time.perf_counter() - start
    return plan.numel(), seconds, faulted_bytes() - faults


RING_BYTES = 512 << 20


def fresh_epoch(x, plan, batch_size, ring):
    faults = faulted_bytes()
    start = time.perf_counter()
    slot = 0
    for begin in range(0, plan.numel(), batch_size):
        rows = plan[begin : begin + batch_size]
        if slot + rows.numel() > ring.shape[0]:
            slot = 0
        torch.index_select(x, 0, rows, out=ring[slot : slot + rows.numel()])
        slot += rows.numel()
    seconds = time.perf_counter() - start
    return plan.numel(), seconds, faulted_bytes() - faults


def measure(name, make_source, x, batch_size, epochs, threads, prefetch, limit_binary, seed=0):
    strategy = ts.BlockShuffling(BLOCK)
    options = {} if prefetch is None else {"prefetch": prefetch}
    dataset = ts.ShardedDataset(
        make_source(), strategy, batch_size=batch_size, seed=seed, num_threads=threads, **options
    )
    row_bytes = x[0].numel() * x.element_size()
    buffer = torch.empty((batch_size, *x.shape[1:]), dtype=x.dtype)
    ring = torch.zeros((max(batch_size, RING_BYTES // row_bytes), *x.shape[1:]), dtype=x.dtype)  # faulted in
    ours, theirs, fresh, copies = [], [], [], []
    for epoch in range(epochs):
        if epoch % 2 == 1:  # between our epochs, as often as the machine's memory changes pace
            copy = limits.gather_copy(
                limit_binary, x.shape[0], row_bytes, BLOCK, batch_size * dataset.fetch_factor, threads, 0.5
            )
            copies.append(copy)
        plan = strategy.plan(x.shape[0], seed, epoch)  # the rows of ours' epoch, in block order
        rows, seconds, faults = ours_epoch(dataset)
        assert rows == x.shape[0], (rows, x.shape[0])
        ours.append((rows / seconds, faults / (rows * row_bytes)))
        rows, seconds, faults = torch_epoch(x, plan, batch_size, buffer)
        theirs.append((rows / seconds, faults / (rows * row_bytes)))
        rows, seconds, faults = fresh_epoch(x, plan, batch_size, ring)
        fresh.append((rows / seconds, faults / (rows * row_bytes)))
    steady = slice(1, None)
    result = {
        "source": name,
        "batch_size": batch_size,
        "torch_shards_rows_per_s": statistics.median(r for r, _ in ours[steady]),
        "torch_rows_per_s": statistics.median(r for r, _ in theirs[steady]),
        "fresh_rows_per_s": statistics.median(r for r, _ in fresh[steady]),
        "copy_limit_rows_per_s": statistics.median(copies),
        "torch_shards_faults_first": ours[0][1],
        "torch_shards_faults_after": statistics.mean(f for _, f in ours[steady]),
        "torch_shards_faults_after_max": max(f for _, f in ours[steady]),
        "torch_faults_after": max(f for _, f in theirs[steady]),
        "epochs": {"torch_shards": ours, "torch": theirs, "fresh": fresh},
        "copy_limits": copies,
    }
    result["ratio"] = result["torch_shards_rows_per_s"] / result["torch_rows_per_s"]
    result["ratio_fresh"] = result["torch_shards_rows_per_s"] / result["fresh_rows_per_s"]
    result["ratio_limit"] = result["torch_shards_rows_per_s"] / result["copy_limit_rows_per_s"]
    return result


def main():
    parser = cli.parser(
        __doc__,
        "host_path",
        rounds=5,
        rounds_aliases=("--epochs",),
        rounds_help="alternated epochs per method and configuration (the first is warm-up)",
        replot=True,
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--columns", type=int, default=2048, help="float32 values per row (2048: 8 KB)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--prefetch", type=int, default=None, help="ShardedDataset's prefetch (default: its default)")
    parser.add_argument(
        "--sources",
        nargs="+",
        choices=list(SOURCES),
        default=list(SOURCES),
        help="the sources measured (default: all three)",
    )
    args = cli.parse(parser)
    if args.replot:
        return plot(results.read_json(args.out)["results"], args.out + ".png")
    if args.rounds < 2:
        parser.error("--epochs must be >= 2 (the first is the warm-up)")
    torch.set_num_threads(args.threads)
    limit_binary = native.build_decode_limit()

    x = torch.randn(args.rows, args.columns)
    directory = data.scratch_dir(x.numel() * x.element_size(), "torch_shards_host_path_")
    contiguous, chunked = os.path.join(directory, "contiguous.h5"), os.path.join(directory, "chunked.h5")
    if "HDF5 contiguous" in args.sources:
        with h5py.File(contiguous, "w") as f:
            f.create_dataset("X", data=x.numpy())
    if "HDF5 chunked" in args.sources:
        with h5py.File(chunked, "w") as f:
            f.create_dataset("X", data=x.numpy(), chunks=(BLOCK, args.columns))
    sources = {
        "TensorSource": lambda: ts.TensorSource({"X": x}),
        "HDF5 contiguous": lambda: ts.HDF5Source(contiguous, "X"),
        "HDF5 chunked": lambda: ts.HDF5Source(chunked, "X"),
    }
    sources = {name: make for name, make in sources.items() if name in args.sources}
    found = []
    try:
        for name, make_source in sources.items():
            for batch_size in args.batch_sizes:
                result = measure(
                    name, make_source, x, batch_size, args.rounds, args.threads, args.prefetch, limit_binary
                )
                found.append(result)
                print(
                    f"{name:16s} b={batch_size:5d}  ours {result['torch_shards_rows_per_s']:.3g} rows/s  "
                    f"torch {result['torch_rows_per_s']:.3g} rows/s  ratio {result['ratio']:.2f}  "
                    f"fresh memory {result['fresh_rows_per_s']:.3g} rows/s  ratio {result['ratio_fresh']:.2f}  "
                    f"copy limit {result['copy_limit_rows_per_s']:.3g} rows/s  ratio {result['ratio_limit']:.2f}  "
                    f"faults {result['torch_shards_faults_first']:.2f} -> {result['torch_shards_faults_after']:.3f}",
                    flush=True,
                )
    finally:
        for path in (contiguous, chunked):
            if os.path.exists(path):
                os.remove(path)
        os.rmdir(directory)

    gigabytes = args.rows * args.columns * 4 / 1e9
    lines = [
        f"host path: {args.rows} rows x {args.columns} float32 ({gigabytes:.2f} GB), BlockShuffling({BLOCK}), "
        f"fetch_factor 16, {args.threads} threads, "
        f"prefetch {'default' if args.prefetch is None else args.prefetch}, {args.rounds} alternated epochs "
        "(first = warm-up), "
        f"torch {torch.__version__}",
        "",
        "| source | batch | torch_shards rows/s | torch gather rows/s | ratio | fresh memory rows/s | ratio |"
        " copy limit rows/s | ratio | faults epoch 1 | faults after (mean / max) | time per row vs smallest batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {r["source"]: r["torch_shards_rows_per_s"] for r in found if r["batch_size"] == min(args.batch_sizes)}
    for r in found:
        slowdown = base[r["source"]] / r["torch_shards_rows_per_s"]
        r["slowdown_vs_smallest_batch"] = slowdown
        lines.append(
            f"| {r['source']} | {r['batch_size']} | {r['torch_shards_rows_per_s']:.3g} | {r['torch_rows_per_s']:.3g} "
            f"| {r['ratio']:.2f} | {r['fresh_rows_per_s']:.3g} | {r['ratio_fresh']:.2f} "
            f"| {r['copy_limit_rows_per_s']:.3g} | {r['ratio_limit']:.2f} "
            f"| {r['torch_shards_faults_first']:.1%} | {r['torch_shards_faults_after']:.2%} / "
            f"{r['torch_shards_faults_after_max']:.2%} "
            f"| {slowdown:.2f}x |"
        )
    text = "\n".join(lines)
    print()
    print(text)
    results.write(
        args.out,
        text,
        {
            "rows": args.rows,
            "columns": args.columns,
            "threads": args.threads,
            "epochs": args.rounds,
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "results": found,
        },
    )
    plot(found, args.out + ".png")


def plot(found, path):
    """rows/s against the batch size, a panel per source: ours, the two torch loops, the copy limit."""
    panels = {}
    for source in dict.fromkeys(r["source"] for r in found):
        rows = [r for r in found if r["source"] == source]
        batches = [r["batch_size"] for r in rows]
        lines = {
            label: (batches, [r[key] for r in rows])
            for label, key in (
                ("torch_shards", "torch_shards_rows_per_s"),
                ("torch gather (one buffer)", "torch_rows_per_s"),
                ("fresh memory (512 MB ring)", "fresh_rows_per_s"),
                ("copy limit (decode_limit --gather-rows)", "copy_limit_rows_per_s"),
            )
            if key in rows[0]  # runs before the copy limit have none
        }
        panels[source] = {"lines": lines}
    results.line_plots(path, panels, "batch size", "rows / s", logx=2, logy=False)


if __name__ == "__main__":
    main()
