"""In-process epochs with the reader threads kept between epochs (the default) against a thread per epoch
(TORCH_SHARDS_KEEP_THREADS=0, how every epoch started its threads before csrc/core/thread_cache.*).

    python -m benchmarks.kept_threads [--rounds 5] [--epochs 40]

Sources as benchmarks/workers.py has them: TensorSource 400,000 x 64 float32 and an .h5ad, X CSR
200,000 x 2,000 at 5%, each ShardedDataset(source, BlockShuffling(64), batch_size=b) with the default
fetch_factor (16), at batch 256 and 4096. Each measurement runs in a fresh process (the setting is read
once per process): a warm-up of 5 epochs, then --epochs epochs timed one by one; it reports the median
epoch and the page faults taken in it (fresh pages: memory the threads' working lists and scratch take
from the system again). Rounds alternate the two ways; "kept / per epoch" is the median of each round's
ratio of rows/s.

Writes benchmarks/results/kept_threads.{txt,json}.
"""

import json
import os
import subprocess
import sys

try:
    from benchmarks.harness import cli, data, page_cache, results, rounds
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, page_cache, results, rounds

WAYS = {"kept (default)": "1", "thread per epoch": "0"}
CASES = [("TensorSource", 256), ("TensorSource", 4096), ("CSR .h5ad", 256), ("CSR .h5ad", 4096)]

CHILD = """
import json, resource, statistics, sys, time
import torch
import torch_shards as ts
kind, path, batch, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "TensorSource":
    source = ts.TensorSource({"x": torch.randn(400_000, 64, generator=torch.Generator().manual_seed(0))})
else:
    source = ts.open(path)
dataset = ts.ShardedDataset(source, ts.BlockShuffling(64), batch_size=batch, rank=0, world_size=1)
rows = len(source)
def epoch():
    for _ in dataset:
        pass
for _ in range(5):
    epoch()
seconds, faults = [], []
for _ in range(epochs):
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    epoch()
    seconds.append(time.perf_counter() - start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"rows_per_s": rows / statistics.median(seconds), "faults": statistics.median(faults)}))
"""


def measure(kind, path, batch, epochs, keep):
    environment = dict(os.environ, TORCH_SHARDS_KEEP_THREADS=keep)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, path, str(batch), str(epochs)],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = cli.parser(__doc__, "kept_threads", rounds=5)
    p.add_argument("--epochs", type=int, default=40, help="epochs timed per measurement")
    args = cli.parse(p, argv)
    csr = data.csr_h5ad(cli.DATA, 200_000)
    page_cache.warm(csr)
    report = results.Report()
    cpus = len(os.sched_getaffinity(0))
    report(f"in-process epochs, BlockShuffling(64), fetch_factor 16, {cpus} CPUs; {args.rounds} rounds")
    measured = {}
    for kind, batch in CASES:
        measures = {
            way: (lambda k=kind, b=batch, keep=keep: measure(k, csr, b, args.epochs, keep))
            for way, keep in WAYS.items()
        }
        per_round = rounds.alternate(
            measures,
            args.rounds,
            report=lambda r, way, got, case=f"{kind} {batch}": print(f"  {case} round {r} {way}: {got}", flush=True),
        )
        measured[f"{kind} {batch}"] = per_round
    rows = []
    for case, per_round in measured.items():
        kept, fresh = per_round["kept (default)"], per_round["thread per epoch"]
        ratio = rounds.ratios([k["rows_per_s"] for k in kept], [f["rows_per_s"] for f in fresh])
        rows.append(
            [
                case,
                f"{rounds.median(k['rows_per_s'] for k in kept):,.0f}",
                f"{rounds.median(f['rows_per_s'] for f in fresh):,.0f}",
                f"{rounds.median(ratio):.2f} ({', '.join(f'{r:.2f}' for r in ratio)})",
                f"{rounds.median(k['faults'] for k in kept):,.0f} / {rounds.median(f['faults'] for f in fresh):,.0f}",
            ]
        )
    report()
    report(
        results.markdown(
            ["source, batch", "kept rows/s", "per epoch rows/s", "kept / per epoch (rounds)", "faults an epoch"], rows
        )
    )
    results.write(args.out, report.text(), {"rounds": args.rounds, "epochs": args.epochs, "measured": measured})


if __name__ == "__main__":
    main()
