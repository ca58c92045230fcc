"""Batches delivered into GPU memory (ShardedDataset(device="cuda")) next to
the physical limit measured in the same run: a pinned host-to-device copy of
the same bytes, measured after each round. Dense (TensorSource) batches at
each batch size, sparse CSR (an .h5ad) batches against the same dataset read
on the host only, then the loop's wait fraction with a synthetic training
step of fixed GPU duration: in an epoch after the first (the table's main
columns; the first epoch, while pools and threads start, beside them).

    python -m benchmarks.device_throughput    # table + benchmarks/results/device_throughput_<gpu>.{txt,json}
    python -m benchmarks.device_throughput --batch-sizes 1024 4096 --steps 5 1 --rounds 5

A round is --epochs-per-round epochs after one warm-up epoch; each round
reports its delivered GB/s, the pinned copy limit measured right after it and
their ratio (min / median / max over the rounds), the memory faulted in per
delivered byte and the CPU seconds per delivered GB (the host's work per byte).
The GPU's NUMA node and the CPUs this process may run on are recorded beside.

Targets (issue 48): dense >= 0.8 of the pinned copy limit in every round at
batch 1024 and 4096; CSR rows/s on the device >= 0.9 of the host-only CSR
rows/s; waiting < 2% of a 5 ms step. Needs a CUDA GPU (prints why not and
exits 0 without one).
"""

import os
import shutil
import statistics
import sys
import time

import torch

try:
    from benchmarks.harness import cli, data, limits, machine, results, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, limits, machine, results, timing


def _nbytes(tensor):
    if tensor.layout == torch.sparse_csr:
        return sum(_nbytes(t) for t in (tensor.crow_indices(), tensor.col_indices(), tensor.values()))
    return tensor.numel() * tensor.element_size()


def measure_round(dataset, epochs, on_device=True):
    """One round: `epochs` epochs after the first batch. Returns (bytes, rows, seconds, faulted bytes, CPU s)."""
    total = rows = 0
    if on_device:
        torch.cuda.synchronize()
    faults, cpu, start = machine.faulted_bytes(), timing.cpu_seconds(), time.perf_counter()
    for _ in range(epochs):
        for batch in dataset:
            total += sum(_nbytes(t) for t in batch.values())
            rows += batch["index"].shape[0]
    if on_device:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return total, rows, seconds, machine.faulted_bytes() - faults, timing.cpu_seconds() - cpu


def spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def dense_rounds(dataset, batch_bytes, rounds, epochs, report):
    for _ in dataset:  # warm-up epoch: the pools fill
        pass
    out = []
    for round_ in range(1, rounds + 1):
        nbytes, rows, seconds, faults, cpu = measure_round(dataset, epochs)
        gbps = nbytes / seconds / 1e9
        limit = limits.pinned_copy_gbps(batch_bytes)
        out.append(
            {
                "gbps": gbps,
                "limit_gbps": limit,
                "ratio": gbps / limit,
                "faulted_per_byte": faults / nbytes,
                "cpu_s_per_gb": cpu / (nbytes / 1e9),
            }
        )
        report(f"  round {round_}: {gbps:.2f} GB/s, pinned limit {limit:.2f} GB/s, ratio {gbps / limit:.2f}")
    return out


def csr_rounds(on_device, on_host, rounds, epochs, report):
    for dataset in (on_device, on_host):
        for _ in dataset:
            pass
    out = []
    for round_ in range(1, rounds + 1):
        nbytes, rows, seconds, faults, cpu = measure_round(on_device, epochs)
        _, host_rows, host_seconds, _, _ = measure_round(on_host, epochs, on_device=False)
        device_rate, host_rate = rows / seconds, host_rows / host_seconds
        out.append(
            {
                "rows_per_s": device_rate,
                "host_rows_per_s": host_rate,
                "ratio": device_rate / host_rate,
                "gbps": nbytes / seconds / 1e9,
                "faulted_per_byte": faults / nbytes,
                "cpu_s_per_gb": cpu / (nbytes / 1e9),
            }
        )
        report(
            f"  round {round_}: {device_rate:.3g} rows/s on the device, {host_rate:.3g} on the host, "
            f"ratio {device_rate / host_rate:.2f}"
        )
    return out


def epoch_waits(dataset, step_ms, profiled=0):
    """One epoch with a GPU step of step_ms after each batch: the fraction of the loop's time spent in
    next(), the median and largest wait of one next(), and (profiled > 0) a table of where the host's
    time went in the first `profiled` steps (torch.profiler: ATen ops and CUDA runtime calls)."""
    cycles = int(step_ms * 1e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    waits = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    iterator = iter(dataset)
    profiler = None
    if profiled:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.__enter__()
    while True:
        if profiler is not None and len(waits) == profiled:
            profiler.__exit__(None, None, None)
        before = time.perf_counter()
        batch = next(iterator, None)
        waits.append(time.perf_counter() - before)
        if batch is None:
            break
        torch.cuda._sleep(cycles)  # the training step: fixed GPU time
        batch["X"].sum()
        torch.cuda.synchronize()  # a step's end (loss.item())
    total = time.perf_counter() - start
    found = {
        "fraction": sum(waits) / total,
        "median_wait_ms": statistics.median(waits) * 1e3,
        "max_wait_ms": max(waits) * 1e3,
        "first_wait_ms": waits[0] * 1e3,
    }
    if profiler is not None:
        averages = profiler.key_averages()
        found["profile"] = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
    return found


def wait_fraction(dataset, step_ms, profiled=0):
    """epoch_waits of the dataset's first epoch (its pools and threads starting) and of the next one."""
    first = epoch_waits(dataset, step_ms)
    later = epoch_waits(dataset, step_ms, profiled)
    return {**later, "first_epoch": first}


def numa_placement():
    """The GPU's NUMA node (sysfs, from its PCI address), the machine's nodes and their CPUs, and the
    CPUs this process may run on; what cannot be read is left out."""
    out = {"process_cpus": sorted(os.sched_getaffinity(0))}
    props = torch.cuda.get_device_properties(0)
    if all(hasattr(props, name) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        out["gpu_pci"] = address
        try:
            with open(f"/sys/bus/pci/devices/{address}/numa_node") as f:
                out["gpu_numa_node"] = int(f.read())
        except (OSError, ValueError):
            pass
    out["nodes"] = machine.numa_nodes()
    return out


def main():
    parser = cli.parser(
        __doc__,
        lambda args: f"device_throughput_{machine.gpu_slug(torch.cuda.get_device_name(0))}",
        rounds=5,
        rounds_help="rounds measured after a warm-up epoch (min / median / max reported)",
    )
    parser.add_argument("--epochs", "--epochs-per-round", dest="epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=2048, help="float32 values per dense row (8 KB)")
    parser.add_argument("--batch-sizes", "--batch-size", dest="batch_sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--csr-rows", type=int, default=None, help="rows of the .h5ad (default: --rows)")
    parser.add_argument("--steps", type=float, nargs="+", default=[5, 1], help="synthetic step lengths in ms")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: dense, csr, wait")
    parser.add_argument("--num-threads", type=int, default=None, help="the dense dataset's (default: its own)")
    parser.add_argument("--fetch-factor", type=int, default=None, help="the dense dataset's (default: its own)")
    parser.add_argument(
        "--profile", action="store_true", help="a table of the host's time in next() (first batch size and step)"
    )
    parser.add_argument("--out-dir", default=None, help="a directory for the default names (the older --out)")
    if not torch.cuda.is_available():
        parser.parse_args()
        print("device_throughput: needs a CUDA GPU; none here (nothing measured)")
        return 0
    args = cli.parse(parser)
    skip = args.skip  # a set (cli.parse)
    if args.out_dir:
        args.out = os.path.join(args.out_dir, os.path.basename(args.out))
    import torch_shards as ts

    report = results.Report()
    gpu = torch.cuda.get_device_name(0)
    numa = numa_placement()
    report(f"GPU: {gpu}; torch {torch.__version__}; NUMA: {numa}")
    x = torch.randn(args.rows, args.width)
    measured = {"gpu": gpu, "torch": torch.__version__, "numa": numa, "rows": args.rows, "width": args.width}
    measured["dense"], measured["csr"], measured["wait"] = {}, [], []

    def dense(batch_size):
        strategy = ts.BlockShuffling(64)
        options = {"num_threads": args.num_threads, "fetch_factor": args.fetch_factor}
        options = {key: value for key, value in options.items() if value is not None}
        return ts.ShardedDataset(ts.TensorSource(x), strategy, batch_size=batch_size, seed=0, device="cuda", **options)

    if "dense" not in skip:
        for batch_size in args.batch_sizes:
            report(f"dense float32, batch {batch_size}:")
            measured["dense"][batch_size] = dense_rounds(
                dense(batch_size), batch_size * args.width * 4, args.rounds, args.epochs, report
            )
    if "csr" not in skip:
        import anndata as ad

        if hasattr(ad.settings, "allow_write_nullable_strings"):  # pandas 3's string index, anndata < 0.13
            ad.settings.allow_write_nullable_strings = True
        csr_rows = args.csr_rows or args.rows
        tmp = data.scratch_dir(csr_rows * 400 * 8, "torch_shards_device_")  # in memory where /dev/shm has room
        try:
            path = os.path.join(tmp, "csr.h5ad")
            ad.AnnData(data.sparse_rows(csr_rows, 20_000, 400)).write_h5ad(path)
            for batch_size in args.batch_sizes:
                report(f"CSR (.h5ad, 2% dense), batch {batch_size}:")

                def csr(device, batch_size=batch_size):
                    source, strategy = ts.AnnDataSource(path), ts.BlockShuffling(64)
                    return ts.ShardedDataset(source, strategy, batch_size=batch_size, seed=0, device=device)

                per_round = csr_rounds(csr("cuda"), csr(None), args.rounds, args.epochs, report)
                measured["csr"].append({"batch_size": batch_size, "rounds": per_round})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if "wait" not in skip:
        for batch_size in args.batch_sizes:
            for step_ms in args.steps:
                profiled = 40 if args.profile and batch_size == args.batch_sizes[0] and step_ms == args.steps[0] else 0
                found = wait_fraction(dense(batch_size), step_ms, profiled)
                if "profile" in found:
                    report(f"where next() spends the host's time, batch {batch_size}, first {profiled} steps:")
                    report(found.pop("profile"))
                measured["wait"].append({"batch_size": batch_size, "step_ms": step_ms, **found})
                report(
                    f"wait, batch {batch_size}, {step_ms:g} ms step: {found['fraction']:.4f} "
                    f"(first epoch {found['first_epoch']['fraction']:.4f})"
                )

    def cells(values, digits=2):
        s = spread(values)
        return f"{s['min']:.{digits}f} / {s['median']:.{digits}f} / {s['max']:.{digits}f}"

    tables = [
        results.markdown(
            [
                "batches",
                "delivered GB/s (min / median / max)",
                "pinned H2D limit GB/s",
                "ratio per round",
                "faulted bytes per byte",
                "CPU s per GB",
            ],
            [
                (
                    f"dense float32, batch {b}",
                    cells([r["gbps"] for r in rounds]),
                    cells([r["limit_gbps"] for r in rounds]),
                    cells([r["ratio"] for r in rounds]),
                    cells([r["faulted_per_byte"] for r in rounds], 4),
                    cells([r["cpu_s_per_gb"] for r in rounds], 3),
                )
                for b, rounds in measured["dense"].items()
            ],
        ),
        results.markdown(
            ["CSR (.h5ad, 2% dense)", "device rows/s (median)", "host-only rows/s (median)", "ratio per round"],
            [
                (
                    f"batch {c['batch_size']}",
                    f"{statistics.median(r['rows_per_s'] for r in c['rounds']):.3g}",
                    f"{statistics.median(r['host_rows_per_s'] for r in c['rounds']):.3g}",
                    cells([r["ratio"] for r in c["rounds"]]),
                )
                for c in measured["csr"]
            ],
        ),
        results.markdown(
            [
                "batch",
                "synthetic step",
                "wait fraction",
                "median / max wait of one next()",
                "first next()",
                "first epoch: wait fraction, first next()",
            ],
            [
                (
                    w["batch_size"],
                    f"{w['step_ms']:g} ms",
                    f"{w['fraction']:.4f}",
                    f"{w['median_wait_ms']:.3f} / {w['max_wait_ms']:.3f} ms",
                    f"{w['first_wait_ms']:.3f} ms",
                    f"{w['first_epoch']['fraction']:.4f}, {w['first_epoch']['first_wait_ms']:.1f} ms",
                )
                for w in measured["wait"]
            ],
        ),
    ]
    header = (
        f"GPU: {gpu}; torch {torch.__version__}; {args.rows} rows x {args.width} float32, BlockShuffling(64); "
        f"{args.rounds} rounds of {args.epochs} epochs after a warm-up epoch; GPU NUMA node "
        f"{numa.get('gpu_numa_node', 'unknown')}, {len(numa['process_cpus'])} CPUs allowed"
    )
    results.publish(args.out, header, tables, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
