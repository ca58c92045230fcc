"""Plan throughput and memory: how fast each tool decides which rows one rank
reads in one epoch, and what that costs in memory, for N = 1e6 .. 1e9 rows.

    python -m benchmarks.plan_throughput                  # N = 1e6, 1e8, 1e9
    python -m benchmarks.plan_throughput --sizes 1e6,1e7  # quicker

Every measurement runs in a fresh subprocess (peak RSS is its own) and covers
one whole epoch of one rank (world size 1 unless --world-size), no data read:

  torch_shards planner      native units (fetches) of ShardedDataset, indices in int64 tensors
  torch_shards dataset      ShardedDataset batches as Python sees them (zero-width source)
  torch_shards sampler      ts.DistributedSampler, Python ints
  torch sampler             torch.utils.data.DistributedSampler(shuffle=True), Python ints
  scDataset                 scDataset's own __iter__ over a no-I/O collection (if installed)

Configurations whose memory would not fit (e.g. torch's sampler at 1e9 needs
randperm(N) plus N Python ints, about 44 GB) are reported as skipped. With
--rounds above 1 every N's measurements alternate round by round and the
round of the median rate is reported. Writes benchmarks/results/plan_throughput.{txt,json}
and, with matplotlib, a plot of indices/s and peak memory against N (.png).
"""

import argparse
import json
import os
import subprocess
import sys
import time

try:
    from benchmarks.harness import cli, machine, results, rounds
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, machine, results, rounds

STRATEGIES = ["Streaming", "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling"]
BATCH_SIZE = 256
FETCH_FACTOR = 16
BLOCK_SIZE = 64

# Bytes per row each method holds at its peak (a conservative estimate used
# only to skip configurations that cannot fit in this machine's memory).
BYTES_PER_ROW = {
    ("torch sampler", None): 8 + 8 + 36,  # randperm int64, list of Python ints
    ("scDataset", "Streaming"): 16,
    ("scDataset", "BlockShuffling"): 40,
    ("scDataset", "BlockWeightedSampling"): 48,
    ("scDataset", "ClassBalancedSampling"): 56,
    ("torch_shards planner", "BlockWeightedSampling"): 24,  # user weights + cumulative sums
    ("torch_shards planner", "ClassBalancedSampling"): 40,  # labels + weights + cumulative sums
}


def child(method, strategy_name, num_rows, world_size):
    """Runs in the subprocess: builds the method, times one epoch of rank 0."""
    import resource

    import torch

    def rss_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def user_inputs():
        # Weights and labels are the user's data; they are built before the baseline.
        if strategy_name == "BlockWeightedSampling":
            return {"weights": torch.rand(num_rows, dtype=torch.float64)}
        if strategy_name == "ClassBalancedSampling":
            return {"labels": torch.randint(0, 50, (num_rows,))}
        return {}

    if method.startswith("torch_shards"):
        import torch_shards as ts

        inputs = user_inputs()
        baseline = rss_mb()
        start = time.perf_counter()
        strategy = {
            "Streaming": lambda: ts.Streaming(),
            "BlockShuffling": lambda: ts.BlockShuffling(BLOCK_SIZE),
            "BlockWeightedSampling": lambda: ts.BlockWeightedSampling(inputs["weights"], block_size=BLOCK_SIZE),
            "ClassBalancedSampling": lambda: ts.ClassBalancedSampling(inputs["labels"], block_size=BLOCK_SIZE),
            None: lambda: None,
        }[strategy_name]()
        count = 0
        if method == "torch_shards sampler":
            sampler = ts.DistributedSampler(range(num_rows), world_size, 0, shuffle=True, seed=0, strategy=strategy)
            for _ in sampler:
                count += 1
        else:
            source = ts.TensorSource(torch.empty(num_rows, 0))  # rows without bytes: no I/O
            dataset = ts.ShardedDataset(
                source,
                strategy,
                batch_size=BATCH_SIZE,
                fetch_factor=FETCH_FACTOR,
                seed=0,
                rank=0,
                world_size=world_size,
            )
            if method == "torch_shards planner":
                # The native iterator alone, no Python per batch beyond next().
                iterator = dataset.native.iter_epoch(0, 0, 1)
                for batch in iter(iterator.next, None):
                    count += batch["index"].shape[0]
            else:
                for batch in dataset:
                    count += batch["index"].shape[0]
    elif method == "torch sampler":
        from torch.utils.data.distributed import DistributedSampler

        baseline = rss_mb()
        start = time.perf_counter()
        sampler = DistributedSampler(range(num_rows), world_size, 0, shuffle=True, seed=0)
        count = 0
        for _ in sampler:
            count += 1
    elif method == "scDataset":
        import scdataset

        inputs = {key: value.numpy() for key, value in user_inputs().items()}

        class Rows:  # a collection that costs nothing to read
            def __len__(self):
                return num_rows

        strategy = {
            "Streaming": lambda: scdataset.Streaming(),
            "BlockShuffling": lambda: scdataset.BlockShuffling(block_size=BLOCK_SIZE),
            "BlockWeightedSampling": lambda: scdataset.BlockWeightedSampling(
                block_size=BLOCK_SIZE, weights=inputs["weights"]
            ),
            "ClassBalancedSampling": lambda: scdataset.ClassBalancedSampling(inputs["labels"], block_size=BLOCK_SIZE),
        }[strategy_name]()
        baseline = rss_mb()
        start = time.perf_counter()
        dataset = scdataset.scDataset(
            Rows(),
            strategy,
            batch_size=BATCH_SIZE,
            fetch_factor=FETCH_FACTOR,
            fetch_callback=lambda collection, indices: indices,
            rank=0,
            world_size=world_size,
            seed=0,
        )
        count = 0
        for batch in dataset:
            count += len(batch)
    else:
        raise SystemExit(f"unknown method {method}")
    seconds = time.perf_counter() - start
    print(json.dumps({"indices": count, "seconds": seconds, "peak_mb": max(rss_mb() - baseline, 0.0)}))


def measure(method, strategy_name, num_rows, world_size, timeout):
    need = BYTES_PER_ROW.get((method, strategy_name), 0) * num_rows
    if need > 0.7 * machine.available_bytes():
        return {"skipped": f"needs ~{need / 2**30:.0f} GB"}
    command = [sys.executable, __file__, "--child", method, str(strategy_name), str(num_rows), str(world_size)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"> {timeout} s"}
    if done.returncode != 0:
        return {"skipped": "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:60]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def have_scdataset():
    try:
        import scdataset  # noqa: F401
    except ImportError:
        return False
    return True


def median_round(measured):
    """The round of the median rate (a skipped round where every round was skipped)."""
    done = [r for r in measured if "skipped" not in r]
    if not done:
        return measured[0]
    done.sort(key=lambda r: r["indices"] / r["seconds"])
    return {**done[(len(done) - 1) // 2], "rounds": measured} if len(measured) > 1 else done[0]


def plot(found, path):
    """indices/s and peak memory against N, a line per method and strategy."""
    speed, memory = {}, {}
    for r in found:
        if "skipped" in r:
            continue
        label = f"{r['method']}, {r['strategy']}"
        speed.setdefault(label, ([], []))
        memory.setdefault(label, ([], []))
        for series, value in ((speed, r["indices"] / r["seconds"]), (memory, max(r["peak_mb"], 1.0))):
            series[label][0].append(r["rows"])
            series[label][1].append(value)
    results.line_plots(
        path,
        {
            "one epoch's plan: indices/s": {"lines": speed},
            "peak memory (MB above the baseline)": {"lines": memory, "ylabel": "MB"},
        },
        "N (rows)",
        "indices / s",
        ncols=2,
    )


def main():
    parser = cli.parser(__doc__, "plan_throughput", rounds=1, replot=True)
    parser.add_argument("--sizes", default="1e6,1e8,1e9")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = cli.parse(parser)
    if args.child:
        method, strategy_name, num_rows, world_size = args.child
        child(method, None if strategy_name == "None" else strategy_name, int(num_rows), int(world_size))
        return
    if args.replot:
        return plot(results.read_json(args.out), args.out + ".png")

    sizes = [int(float(size)) for size in args.sizes.split(",")]
    runs = [("torch sampler", None)]
    runs += [("torch_shards sampler", None)]
    runs += [("torch_shards planner", name) for name in STRATEGIES]
    runs += [("torch_shards dataset", name) for name in ("Streaming", "BlockShuffling")]
    lines = []
    if have_scdataset():
        runs += [("scDataset", name) for name in STRATEGIES]
    else:
        lines += ["scDataset is not installed (pip install scdataset): its rows are left out", ""]

    lines.append(
        f"One epoch of rank 0 of {args.world_size}; batch_size={BATCH_SIZE}, fetch_factor={FETCH_FACTOR}, "
        f"block_size={BLOCK_SIZE}; {os.cpu_count()} CPUs"
        + (f"; median of {args.rounds} alternated rounds" if args.rounds > 1 else "")
    )
    header = f"{'N':>6} {'method':<22} {'strategy':<22} {'seconds':>9} {'indices/s':>12} {'peak MB':>9} {'vs torch':>9}"
    lines += ["", header, "-" * len(header)]
    print("\n".join(lines), flush=True)
    found = []
    for num_rows in sizes:
        measured = rounds.alternate(
            {
                (method, strategy_name): lambda m=method, s=strategy_name, n=num_rows: measure(
                    m, s, n, args.world_size, args.timeout
                )
                for method, strategy_name in runs
            },
            args.rounds,
        )
        torch_rate = None
        for method, strategy_name in runs:
            result = median_round(measured[(method, strategy_name)])
            result.update(method=method, strategy=strategy_name or "shuffle=True", rows=num_rows)
            found.append(result)
            label = f"1e{len(str(num_rows)) - 1}"
            if "skipped" in result:
                lines.append(f"{label:>6} {method:<22} {result['strategy']:<22} {'skipped: ' + result['skipped']:>42}")
                print(lines[-1], flush=True)
                continue
            rate = result["indices"] / result["seconds"]
            if method == "torch sampler":
                torch_rate = rate
            ratio = f"{rate / torch_rate:.1f}x" if torch_rate else "-"
            lines.append(
                f"{label:>6} {method:<22} {result['strategy']:<22} {result['seconds']:>9.2f} {rate:>12.3g} "
                f"{result['peak_mb']:>9.0f} {ratio:>9}"
            )
            print(lines[-1], flush=True)
    results.write(args.out, "\n".join(lines), found)
    plot(found, args.out + ".png")


if __name__ == "__main__":
    main()
