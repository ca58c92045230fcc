"""DataLoader workers against the same dataset iterated in the training process.

    python -m benchmarks.workers                 # the issue's sources, batches 256 and 4096, 5 rounds
    python -m benchmarks.workers --rounds 3      # quicker

Sources: TensorSource 400,000 x 64 float32 and an .h5ad, X CSR 200,000 x 2,000 at 5% (anndata's layout,
in /dev/shm when it has room), both ShardedDataset(source, BlockShuffling(64), batch_size=b) with the
default fetch_factor (16). For each source and batch size, every round measures each way of reading,
one after the other (alternated, so that the machine's noise falls on all alike), over consecutive
epochs lasting 0.25 s (an epoch of these sources takes 10-20 ms in-process, and one alone is mostly
its start):

  in-process          the dataset iterated in this process (its native reader threads only)
  torch DataLoader k  torch.utils.data.DataLoader(ds, batch_size=None, num_workers=k), k = 1, 2:
                      batches cross one by one, each as a handle to the worker's slabs (the default
                      worker_transport="handles")
  ts.DataLoader k     ts.DataLoader(ds, num_workers=k): several fetches cross as one handle
  torch, old way k    torch's DataLoader with worker_transport="torch": each batch crosses as torch
                      sends tensors (a shared-memory segment per fetch, a descriptor per storage):
                      what every batch cost before the handles (only at batch 256: it is slow)
  queue floor k       torch's DataLoader over a plain IterableDataset whose workers yield a small int
                      per batch (as many as the dataset's batches): what torch's queue alone allows,
                      whatever crosses it (the physical limit of one item per batch)

with workers persistent (persistent_workers=True: the steady state of a training job) and, in a second
table, started afresh every epoch (torch's default), where each epoch also pays for starting the
worker processes. rows/s are the median over the rounds, after a warm-up epoch; "vs in-process" is the
ratio of medians, "vs floor" the ratio to the queue floor at the same k.

Memory (one more epoch of each worker row, sampled every 10 ms): the bytes of the slabs that exist
(held by the row's workers, /proc/<pid>/fd, or mapped by the training process, /proc/self/maps,
among those workers' slabs; each counted once), at most, against prefetch_bytes per worker; the slabs
made (distinct files) per 1,000 batches after the warm-up epoch (0: none made per batch; all
recycled); and /dev/shm's growth (slabs never appear there). A last table does the same for 2
persistent workers with prefetch_bytes of 4, 16 and 64 MB.

Writes benchmarks/results/workers.txt and .json (--out names another prefix), and with matplotlib
workers.png: rows/s against the number of workers, a panel per source and batch size (persistent
workers), beside the in-process rate and the queue floor.
"""

import os
import threading
import time

import torch
from torch.utils.data import DataLoader

import torch_shards as ts

try:
    from benchmarks.harness import cli, data, limits, results, rounds, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, limits, results, rounds, timing

BLOCK = 64


def rows_of(item):
    return item["index"].shape[0] if isinstance(item, dict) else 0


# A measurement runs whole epochs, one after the other as a training job does, until this long: an epoch of
# these sources takes 10-20 ms in-process on 2 CPUs, and one alone is mostly its start.
MEASURE_SECONDS = 0.25


def epoch_rate(iterable, rows_per_item=None, min_seconds=MEASURE_SECONDS):
    """rows/s over consecutive epochs (at least one) lasting min_seconds."""
    count = rows_of if rows_per_item is None else lambda _: rows_per_item
    total_rows = total_seconds = 0
    while total_seconds == 0 or total_seconds < min_seconds:
        rows, seconds = timing.epoch(iterable, count)
        total_rows, total_seconds = total_rows + rows, total_seconds + seconds
    return total_rows / total_seconds


def slab_files(pid):
    """{inode: bytes} of the slabs a process holds open."""
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            if os.readlink(path).startswith("/memfd:torch_shards_slab"):
                status = os.stat(path)
                out[status.st_ino] = status.st_size
        except OSError:
            pass
    return out


def mapped_here():
    """{inode: bytes} of the slabs this process maps (/proc/self/maps)."""
    out = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "torch_shards_slab" in line:
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out[int(fields[4])] = out.get(int(fields[4]), 0) + end - start
    return out


def dev_shm_bytes():
    try:
        stat = os.statvfs("/dev/shm")
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    except OSError:
        return 0


def memory_epoch(loader, batches):
    """One epoch with the workers' slabs sampled: (peak bytes of the slabs that exist, held by the workers or
    mapped here (each counted once), slabs made per 1,000 batches, /dev/shm growth)."""
    iterator = iter(loader)
    pids = [w.pid for w in getattr(iterator, "_items", iterator)._workers]  # ts.DataLoader's wraps torch's
    seen_before = set()
    for pid in pids:
        seen_before |= set(slab_files(pid))
    peak, seen, done = [0], set(), threading.Event()
    shm_start = dev_shm_bytes()
    shm_peak = [0]

    def sample():
        while not done.is_set():
            slabs = {}
            for pid in pids:
                files = slab_files(pid)
                seen.update(files)
                slabs.update(files)
            # Mapped here and made by these workers (other loaders' persistent workers stay mapped too).
            ours = seen | seen_before
            slabs.update({inode: size for inode, size in mapped_here().items() if inode in ours})
            peak[0] = max(peak[0], sum(slabs.values()))
            shm_peak[0] = max(shm_peak[0], dev_shm_bytes() - shm_start)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for _ in iterator:
        pass
    done.set()
    sampler.join()
    return peak[0], 1000 * len(seen - seen_before) / batches, shm_peak[0]


def sources(data_dir):
    torch.manual_seed(0)
    dense = torch.randn(400_000, 64)
    h5ad = data.csr_h5ad(data_dir, 200_000, name="workers_csr_200000.h5ad")
    return [
        ("TensorSource 400k x 64 f32", lambda: ts.TensorSource({"X": dense})),
        (".h5ad CSR 200k x 2000, 5%", lambda: ts.open(h5ad)),
    ]


def measure(make_source, batch_size, rounds_, persistent, workers, old_way):
    dataset = ts.ShardedDataset(make_source(), ts.BlockShuffling(BLOCK), batch_size=batch_size)
    old = ts.ShardedDataset(make_source(), ts.BlockShuffling(BLOCK), batch_size=batch_size, worker_transport="torch")
    batches = len(dataset)
    ways = {"in-process": (dataset, None)}
    for k in workers:
        options = dict(num_workers=k, persistent_workers=persistent)
        ways[f"torch DataLoader {k}"] = (DataLoader(dataset, batch_size=None, **options), None)
        ways[f"ts.DataLoader {k}"] = (ts.DataLoader(dataset, **options), None)
        if old_way:
            ways[f"torch, old way {k}"] = (DataLoader(old, batch_size=None, **options), None)
        ways[f"queue floor {k}"] = (DataLoader(limits.QueueFloor(batches), batch_size=None, **options), batch_size)
    for loader, per_item in ways.values():  # warm-up: worker pools, slabs, page cache
        epoch_rate(loader, per_item)
    rates = rounds.alternate({name: lambda w=way: epoch_rate(*w) for name, way in ways.items()}, rounds_)
    memory = {}
    if persistent:
        for name, (loader, _) in ways.items():
            if name.startswith(("torch DataLoader", "ts.DataLoader")):
                memory[name] = memory_epoch(loader, batches)
    return rounds.medians(rates), memory, dataset.prefetch_bytes


def memory_bound(make_source, budgets=(4 << 20, 16 << 20, 64 << 20)):
    """Peak slab bytes per worker against small prefetch_bytes (TensorSource, batch 256, 2 persistent workers)."""
    lines = [
        "| prefetch_bytes | way | peak slab MB | per worker, of prefetch_bytes | slabs made / 1,000 batches |",
        "|---|---|---|---|---|",
    ]
    for budget in budgets:
        dataset = ts.ShardedDataset(make_source(), ts.BlockShuffling(BLOCK), batch_size=256, prefetch_bytes=budget)
        for name, cls in (("torch DataLoader 2", DataLoader), ("ts.DataLoader 2", ts.DataLoader)):
            loader = cls(dataset, batch_size=None, num_workers=2, persistent_workers=True)
            epoch_rate(loader)
            peak, made, _ = memory_epoch(loader, len(dataset))
            lines.append(
                f"| {budget >> 20} MB | {name} | {peak / 2**20:.1f} | {peak / (2 * budget):.2f} | {made:.1f} |"
            )
    return "\n".join(lines)


def table(results, persistent):
    lines = [
        "| source | batch | way | rows/s | vs in-process | vs floor | peak slab MB "
        "| of prefetch_bytes per worker | slabs made / 1,000 batches | /dev/shm growth MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        if row["persistent"] != persistent:
            continue
        base = row["rates"]["in-process"]
        for way, rate in row["rates"].items():
            k = way.rsplit(" ", 1)[-1]
            floor = row["rates"].get(f"queue floor {k}")
            vs_floor = f"{rate / floor:.2f}" if floor and not way.startswith(("in-process", "queue")) else ""
            memory = row["memory"].get(way)
            if memory:
                peak, made, shm = memory
                k_workers = int(k)
                mem = f"{peak / 2**20:.0f} | {peak / (k_workers * row['prefetch_bytes']):.3f} | {made:.1f} | "
                mem += f"{shm / 2**20:.1f}"
            else:
                mem = " |  |  | "
            lines.append(
                f"| {row['source']} | {row['batch']} | {way} | {rate:.3g} | {rate / base:.2f} | {vs_floor} | {mem} |"
            )
    return "\n".join(lines)


def main():
    parser = cli.parser(__doc__, "workers", rounds=5, replot=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--data-dir", default=None, help="where the .h5ad is written (default: /dev/shm, else tmp)")
    args = cli.parse(parser)
    if args.replot:
        return plot(results.read_json(args.out), args.out + ".png")
    found = []
    all_sources = sources(args.data_dir or data.shm_or_tmp())
    for persistent in (True, False):
        for source_name, make_source in all_sources:
            for batch_size in args.batch_sizes:
                print(f"{source_name}, batch {batch_size}, persistent={persistent} ...", flush=True)
                rates, memory, prefetch_bytes = measure(
                    make_source, batch_size, args.rounds, persistent, args.workers, old_way=batch_size == 256
                )
                row = {"source": source_name, "batch": batch_size, "persistent": persistent}
                found.append({**row, "rates": rates, "memory": memory, "prefetch_bytes": prefetch_bytes})
    header = (
        f"DataLoader workers vs in-process: BlockShuffling({BLOCK}), fetch_factor 16, {args.rounds} alternated "
        f"rounds (median rows/s after a warm-up epoch; each over consecutive epochs lasting {MEASURE_SECONDS} s), "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    text = "\n\n".join(
        [
            header,
            "Persistent workers (persistent_workers=True):",
            table(found, True),
            "Workers started afresh every epoch (torch's default; each epoch pays for starting them):",
            table(found, False),
            f"Slab memory against small prefetch_bytes ({all_sources[0][0]}, batch 256, 2 persistent workers):",
            memory_bound(all_sources[0][1]),
        ]
    )
    print("\n" + text)
    results.write(args.out, text, found)
    plot(found, args.out + ".png")


def plot(found, path):
    """rows/s against the number of workers (persistent), per source and batch size: torch's DataLoader,
    ts.DataLoader, the old transport; the in-process rate a level, the queue floor a line."""
    panels = {}
    for row in found:
        if not row["persistent"]:
            continue
        lines = {}
        for way, rate in row["rates"].items():
            if way == "in-process":
                continue
            label, k = way.rsplit(" ", 1)
            xs, ys = lines.setdefault(label, ([], []))
            xs.append(int(k))
            ys.append(rate)
        panels[f"{row['source']}, batch {row['batch']}"] = {
            "lines": lines,
            "levels": {"in-process": row["rates"]["in-process"]},
        }
    results.line_plots(path, panels, "workers", "rows / s", logx=False, ncols=2)


if __name__ == "__main__":
    main()
