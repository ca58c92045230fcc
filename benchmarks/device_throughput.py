"""Batches delivered into GPU memory (ShardedDataset(device="cuda")) next to
the physical limit measured in the same run: a pinned host-to-device copy of
the same bytes. Dense (TensorSource) and sparse CSR (an .h5ad) batches, then
the loop's wait fraction with a synthetic training step of fixed duration.

    python -m benchmarks.device_throughput    # table + benchmarks/results/device_throughput_<gpu>.{txt,json}

Expected: dense >= 0.8 of the pinned copy limit; wait fraction near 0 once the
step is longer than reading and copying a batch. Needs a CUDA GPU (prints why
not and exits 0 without one).
"""

import os
import sys
import tempfile
import time

import torch

try:
    from benchmarks.harness import cli, data, limits, machine, results
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, limits, machine, results


def delivered_gbps(dataset, epochs=3):
    total, start = 0, None
    for epoch in range(epochs + 1):  # epoch 0 warms the pools
        if epoch == 1:
            torch.cuda.synchronize()
            start = time.perf_counter()
        for batch in dataset:
            if epoch:
                total += sum(_nbytes(t) for t in batch.values())
    torch.cuda.synchronize()
    return total / (time.perf_counter() - start) / 1e9


def _nbytes(tensor):
    if tensor.layout == torch.sparse_csr:
        return sum(_nbytes(t) for t in (tensor.crow_indices(), tensor.col_indices(), tensor.values()))
    return tensor.numel() * tensor.element_size()


def wait_fraction(dataset, step_ms):
    cycles = int(step_ms * 1e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    waited = 0.0
    torch.cuda.synchronize()
    start = time.perf_counter()
    iterator = iter(dataset)
    while True:
        before = time.perf_counter()
        batch = next(iterator, None)
        waited += time.perf_counter() - before
        if batch is None:
            break
        torch.cuda._sleep(cycles)  # the training step: fixed GPU time
        batch["X"].sum()
        torch.cuda.synchronize()  # a step's end (loss.item())
    return waited / (time.perf_counter() - start)


def main():
    parser = cli.parser(
        __doc__,
        lambda args: f"device_throughput_{machine.gpu_slug(torch.cuda.get_device_name(0))}",
        rounds=3,
        rounds_aliases=("--epochs",),
        rounds_help="epochs measured after a warm-up epoch (their rate is reported)",
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=2048, help="float32 values per dense row (8 KB)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--out-dir", default=None, help="a directory for the default names (the older --out)")
    if not torch.cuda.is_available():
        parser.parse_args()
        print("device_throughput: needs a CUDA GPU; none here (nothing measured)")
        return 0
    args = cli.parse(parser)
    if args.out_dir:
        args.out = os.path.join(args.out_dir, os.path.basename(args.out))
    import anndata as ad

    import torch_shards as ts

    if hasattr(ad.settings, "allow_write_nullable_strings"):  # pandas 3's string index, anndata < 0.13
        ad.settings.allow_write_nullable_strings = True

    gpu = torch.cuda.get_device_name(0)
    x = torch.randn(args.rows, args.width)
    dense = ts.ShardedDataset(
        ts.TensorSource(x), ts.BlockShuffling(64), batch_size=args.batch_size, seed=0, device="cuda"
    )
    batch_bytes = args.batch_size * args.width * 4
    rows = []
    limit = limits.pinned_copy_gbps(batch_bytes)
    ours = delivered_gbps(dense, args.rounds)
    rows.append(("dense float32", ours, limit))
    print(f"dense: {ours:.2f} GB/s, pinned copy limit {limit:.2f} GB/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "csr.h5ad")
        ad.AnnData(data.sparse_rows(args.rows, 20_000, 400)).write_h5ad(path)
        print("written", path, flush=True)
        csr = ts.ShardedDataset(
            ts.AnnDataSource(path), ts.BlockShuffling(64), batch_size=args.batch_size, seed=0, device="cuda"
        )
        rows.append(("CSR (.h5ad, 2% dense)", delivered_gbps(csr, args.rounds), limit))
    waits = [(ms, wait_fraction(dense, ms)) for ms in (1, 5, 20)]
    text = "\n\n".join(
        [
            f"GPU: {gpu}; torch {torch.__version__}",
            results.markdown(
                ["batches", "delivered GB/s", "pinned H2D limit GB/s", "ratio"],
                [(name, f"{gbps:.2f}", f"{lim:.2f}", f"{gbps / lim:.2f}") for name, gbps, lim in rows],
            ),
            results.markdown(["synthetic step", "wait fraction"], [(f"{ms} ms", f"{f:.3f}") for ms, f in waits]),
        ]
    )
    print(text)
    results.write(args.out, text, {"gpu": gpu, "rows": rows, "wait_fraction": waits})
    return 0


if __name__ == "__main__":
    sys.exit(main())
