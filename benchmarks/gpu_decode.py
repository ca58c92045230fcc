"""Compressed chunks decoded on the GPU (torch.classes.torch_shards.ZarrDeviceDecoder, issue 49) against the
host path that decodes on the CPU and copies (ShardedDataset(..., device="cuda")) and against the pinned
host-to-device copy limit of the same batch bytes, all in one run, in alternated rounds.

    python -m benchmarks.gpu_decode              # table + benchmarks/results/gpu_decode_<gpu>.{txt,json}
    python -m benchmarks.gpu_decode --device cpu --rows 8192 --csr-rows 4096 --rounds 1   # the CPU steps

Dense: float32 counts (85% zeros, small integers), rows x --width, chunks of 64 rows, blosc lz4 with byte
shuffle (annbatch's default codec); batches of --batch-size rows in random blocks of 64 rows, the same rows
for both paths; the device path reads fetches of --fetch-factor batches at once (read_batches: each chunk
decoded once per fetch, as the host path's fetches do), --in-flight of them at a time. CSR: an AnnData
zarr store (anndata's writer) whose X (--csr-width columns, 2% non-zeros) has its data and indices
rewritten as blosc lz4 with byte shuffle in chunks of 32768 values.

Each round reports, per path, delivered GB/s (uncompressed bytes of the batches on the device), rows/s and
the process's CPU seconds per delivered GB; the pinned H2D limit is measured within each round. Targets
(issue 49): dense device decode >= 1.5x the pinned H2D limit; CSR rows/s >= 3x the host path's; CPU seconds
per GB <= 1/4 of the host path's. --device cpu runs the decoder's CPU path against the host path without a
GPU (nothing there measures the targets).
"""

import concurrent.futures
import os
import shutil
import site
import sys
import threading
import time

import numpy as np
import torch

try:
    from benchmarks.harness import cli, data, limits, machine, results, rounds, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, limits, machine, results, rounds, timing

BLOCK = 64


def write_dense(path, rows, width, seed=0):
    import zarr
    from zarr.codecs import BloscCodec

    rng = np.random.default_rng(seed)
    z = zarr.create_array(
        path,
        shape=(rows, width),
        chunks=(BLOCK, width),
        dtype="float32",
        compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        zarr_format=3,
    )
    for start in range(0, rows, 8192):
        count = min(8192, rows - start)
        counts = rng.integers(1, 20, (count, width)).astype(np.float32)
        z[start : start + count] = np.where(rng.random((count, width)) < 0.15, counts, np.float32(0))


def write_csr(path, rows, width, seed=0):
    import anndata as ad
    import zarr
    from zarr.codecs import BloscCodec

    ad.settings.zarr_write_format = 3
    ad.AnnData(data.sparse_rows(rows, width, max(1, width // 50), seed)).write_zarr(path)
    group = zarr.open_group(path, mode="r+")
    for name in ("data", "indices"):
        values = group["X"][name][:]
        zarr.create_array(
            group.store,
            name=f"X/{name}",
            shape=values.shape,
            chunks=(32768,),
            dtype=values.dtype,
            compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
            zarr_format=3,
            overwrite=True,
        )[:] = values


def epoch_batches(rows, batch_size, seed):
    """One epoch's batches: random blocks of BLOCK consecutive rows, batch_size rows each (the last dropped)."""
    blocks = np.random.default_rng(seed).permutation(rows // BLOCK)
    ordered = (blocks[:, None] * BLOCK + np.arange(BLOCK)).ravel()
    return [torch.from_numpy(ordered[s : s + batch_size]) for s in range(0, len(ordered) - batch_size + 1, batch_size)]


def nbytes(tensor):
    if tensor.layout == torch.sparse_csr:
        return sum(nbytes(t) for t in (tensor.crow_indices(), tensor.col_indices(), tensor.values()))
    return tensor.numel() * tensor.element_size()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device, loop):
    """(delivered bytes, rows, seconds, CPU seconds) of loop(), which returns (bytes, rows)."""
    sync(device)
    cpu, start = timing.cpu_seconds(), time.perf_counter()
    delivered, count = loop()
    sync(device)
    return delivered, count, time.perf_counter() - start, timing.cpu_seconds() - cpu


def device_decode(make_decoder, batches, device, in_flight, fetch_factor):
    """Fetches of `fetch_factor` batches (read_batches: their chunks decoded once, as the host path's
    fetches are), read by `in_flight` threads, each with its own decoder (reads release the GIL: one
    thread's fetching and planning overlaps another's decoding), delivered batch by batch in order."""
    local = threading.local()
    fetches = [batches[i : i + fetch_factor] for i in range(0, len(batches), fetch_factor)]

    def read(fetch):
        if not hasattr(local, "decoder"):
            local.decoder = make_decoder()
        return local.decoder.read_batches(fetch, device)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=in_flight)

    def loop():
        delivered = count = 0
        for fetch, outs in zip(fetches, pool.map(read, fetches)):
            for rows, out in zip(fetch, outs):
                delivered += nbytes(out)
                count += rows.numel()
        return delivered, count

    return lambda: timed(device, loop)


def host_decode(dataset, field, device):
    def loop():
        delivered = count = 0
        for batch in dataset:
            delivered += nbytes(batch[field])
            count += batch["index"].numel()
        return delivered, count

    return lambda: timed(device, loop)


def profile(decoder, fetch, device):
    """Where the GPU's time goes in one read of a fetch and one read of a batch (torch.profiler: every
    kernel and copy, nvCOMP's too), as a table."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    lines = []
    for name, read in (
        ("a fetch", lambda: decoder.read_batches(fetch, device)),
        ("a batch", lambda: decoder.read(fetch[0], device)),
    ):
        read()
        torch.cuda.synchronize()
        with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            began = time.perf_counter()
            read()
            torch.cuda.synchronize()
            wall = time.perf_counter() - began
        averages = prof.key_averages()
        try:
            table = averages.table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=60)
        except (AttributeError, KeyError, ValueError):
            table = averages.table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60)
        lines.append(f"profile of {name} ({wall * 1e3:.2f} ms wall, stats {dict(decoder.stats())}):\n{table}")
    return "\n".join(lines)


def summary(name, measured):
    """Per round: GB/s, rows/s, CPU s per GB."""
    return [
        {
            "gbps": b / s / 1e9,
            "rows_per_s": r / s,
            "cpu_s_per_gb": c / (b / 1e9),
        }
        for b, r, s, c in measured[name]
    ]


def main():
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    parser = cli.parser(
        __doc__,
        lambda args: "gpu_decode_" + (machine.gpu_slug(gpu) if args.device.startswith("cuda") else "cpu"),
        rounds=5,
    )
    parser.add_argument("--device", default="cuda" if gpu else "cpu", help="cuda (default with a GPU) or cpu")
    parser.add_argument("--rows", type=int, default=65536, help="dense rows")
    parser.add_argument("--width", type=int, default=2048, help="float32 values per dense row (8 KB)")
    parser.add_argument("--csr-rows", type=int, default=100_000)
    parser.add_argument("--csr-width", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="host threads, both paths")
    parser.add_argument("--in-flight", type=int, default=4, help="fetches the device path reads at once")
    parser.add_argument("--fetch-factor", type=int, default=16, help="batches per fetch (the dataset's default)")
    parser.add_argument("--profile", action="store_true", help="a table of the GPU's time per kernel of one fetch")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: dense, csr")
    args = cli.parse(parser)
    if args.device.startswith("cuda") and not gpu:
        print("gpu_decode: --device cuda needs a CUDA GPU; none here (nothing measured)")
        return 0
    import torch_shards as ts

    report = results.Report()
    device, host_device = args.device, (args.device if args.device.startswith("cuda") else None)
    dirs = site.getsitepackages() + sys.path
    report(f"GPU: {gpu or 'none'}; torch {torch.__version__}; device {device}; {args.threads} host threads")
    measured = {"gpu": gpu, "device": device, "torch": torch.__version__, "threads": args.threads}
    tmp = data.scratch_dir(args.rows * args.width * 4 // 4 + args.csr_rows * args.csr_width // 50 * 8, "ts_gpu_")
    tables = []
    try:

        def part(name, writer, rows, columns, array, source, seed, batch_bytes):
            """(name, decoder factory, the host path's dataset, its field, the batches, a batch's bytes)."""
            path = os.path.join(tmp, f"{name}.zarr")
            began = time.perf_counter()
            writer(path, rows, columns)
            report(f"{name}: wrote {rows} x {columns} in {time.perf_counter() - began:.1f} s")
            dataset = ts.ShardedDataset(
                source(path),
                ts.BlockShuffling(BLOCK),
                batch_size=args.batch_size,
                seed=0,
                drop_last=True,
                num_threads=args.threads,
                device=host_device,
            )

            def decoder():
                return torch.classes.torch_shards.ZarrDeviceDecoder(path, array, dirs, args.threads)

            return name, decoder, dataset, "X", epoch_batches(rows, args.batch_size, seed), batch_bytes

        parts = []
        if "dense" not in args.skip:
            dense_bytes = args.batch_size * args.width * 4
            parts.append(part("dense", write_dense, args.rows, args.width, "/", ts.ZarrSource, 0, dense_bytes))
        if "csr" not in args.skip:
            csr_bytes = args.batch_size * max(1, args.csr_width // 50) * 8
            parts.append(part("CSR", write_csr, args.csr_rows, args.csr_width, "X", ts.AnnDataSource, 1, csr_bytes))
        for name, decoder, dataset, field, batches, batch_bytes in parts:
            measures = {
                "device decode": device_decode(decoder, batches, device, args.in_flight, args.fetch_factor),
                "host decode": host_decode(dataset, field, device),
            }
            if device.startswith("cuda"):
                measures["pinned H2D"] = lambda n=batch_bytes: limits.pinned_copy_gbps(n)
            for measure in measures.values():  # warm-up: pools, nvCOMP's load, page cache
                measure()
            probe, seen = decoder(), []
            for rows in batches[:8]:  # one thread, one batch at a time: where a batch's time goes
                probe.read(rows, device)
                seen.append(dict(probe.stats()))
            stats = {key: rounds.median(s[key] for s in seen) for key in seen[0]}
            if probe.nvcomp_library():
                report(f"nvCOMP: {probe.nvcomp_library()}")
            report(f"  a batch read alone (median of {len(seen)}): {stats}")
            if args.profile and device.startswith("cuda"):
                report(profile(probe, batches[: args.fetch_factor], device))

            def shown(round_, method, result, name=name):
                text = f"{result:.2f} GB/s" if method == "pinned H2D" else f"{result[0] / result[2] / 1e9:.2f} GB/s"
                report(f"  {name} round {round_}: {method} {text}")

            per_round = rounds.alternate(measures, args.rounds, shown)
            dev, host = summary("device decode", per_round), summary("host decode", per_round)
            entry = {"device": dev, "host": host, "batch_read_alone": stats}
            rows_table = [
                ("device decode", dev),
                ("host decode (today's path)", host),
            ]
            cells = []
            for label, values in rows_table:
                cells.append(
                    (
                        label,
                        rounds.spread([v["gbps"] for v in values], digits=2),
                        f"{rounds.median(v['rows_per_s'] for v in values):.3g}",
                        f"{rounds.median(v['cpu_s_per_gb'] for v in values):.3f}",
                    )
                )

            def ratio(key, digits, dev=dev, host=host):
                return rounds.spread(rounds.ratios([v[key] for v in dev], [v[key] for v in host]), digits=digits)

            ratio_lines = [
                f"device / host rows/s: {ratio('rows_per_s', 2)}",
                f"device / host CPU s per GB: {ratio('cpu_s_per_gb', 3)}",
            ]
            if "pinned H2D" in per_round:
                entry["pinned_h2d_gbps"] = per_round["pinned H2D"]
                ratio_lines.insert(
                    0,
                    f"device decode / pinned H2D limit: "
                    f"{rounds.spread(rounds.ratios([v['gbps'] for v in dev], per_round['pinned H2D']), digits=2)}",
                )
                cells.append(("pinned H2D limit", rounds.spread(per_round["pinned H2D"], digits=2), "", ""))
            measured[name] = entry
            tables.append(
                f"{name}, batch {args.batch_size}:\n\n"
                + results.markdown(["path", "delivered GB/s", "rows/s (median)", "CPU s per GB (median)"], cells)
                + "\n\n"
                + "\n".join(ratio_lines)
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    header = (
        f"GPU: {gpu or 'none'}; torch {torch.__version__}; decoding on {device}; dense {args.rows} x {args.width} "
        f"float32 (85% zeros) in chunks of {BLOCK} rows, CSR {args.csr_rows} x {args.csr_width} (2% non-zeros); "
        f"blosc lz4 + byte shuffle; blocks of {BLOCK} rows; {args.rounds} alternated rounds after a warm-up; "
        f"{args.threads} host threads; the device path {args.in_flight} fetches of {args.fetch_factor} batches "
        "in flight"
    )
    results.publish(args.out, header, tables, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
