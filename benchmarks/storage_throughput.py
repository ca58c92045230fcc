"""Reading throughput side by side: torch_shards against the loaders users would
pick instead, on the same files, block sizes and core count, in one run.

    python -m benchmarks.storage_throughput                 # 1e6 x 2000 CSR .h5ad + dense HDF5
    python -m benchmarks.storage_throughput --rows 200000   # quicker

Files (written once, cached in /dev/shm/torch_shards_benchmark when it has room, else benchmarks/data/):
  csr.h5ad   AnnData, X CSR float32, --rows x 2000, ~5% non-zeros (anndata's default layout)
  dense.h5   one float32 dataset, --dense-rows x 2000, contiguous

For each block size, every method reads --seconds worth of batches of 256 rows, epoch after epoch
(fetch_factor 16) in the block-shuffled order and reports samples/s and MB/s
(bytes of the rows as stored: values + column indices for CSR):

  torch_shards threads ShardedDataset(AnnDataSource / HDF5Source) iterated in-process: the native
                       prefetch pipeline on --cores threads; sparse CSR batches
  torch_shards workers the same through torch's DataLoader(num_workers=--cores), one thread per worker
                       (each batch crosses as one recycled shared storage)
  ts.DataLoader        the same through ts.DataLoader: workers send whole fetches, split back into
                       batches in the main process
  worker ceiling       torch's DataLoader(num_workers=--cores) over a dataset that makes batches of the
                       same shapes and reads nothing: the most torch's worker transfer delivers
  torch_shards dense   threads, with dense=True (dense rows, what the others return)
  scDataset            scDataset over backed AnnData with adata_to_mindex (its documented setup)
  map-style h5py       DataLoader(Dataset reading one row per __getitem__ through h5py, batch_size=256)
  raw page cache       the same bytes read sequentially with large preads (the limit for Streaming)

Every method gets the same cores: threads for "torch_shards threads", DataLoader worker
processes otherwise.
annbatch needs Python >= 3.12 and is reported as not installed where it cannot be; annbatch's own
format (a DatasetCollection), annbatch itself and the decode limit of its chunks are measured by
benchmarks/annbatch_format.py.

Writes benchmarks/results/storage_throughput.{txt,json} and, with matplotlib, storage_throughput.png:
samples/s per block size, a panel per file, beside the raw page cache rate.
"""

import sys
import warnings

import numpy as np
import torch

try:
    from benchmarks.harness import cli, data, limits, page_cache, results, timing
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, data, limits, page_cache, results, timing

COLUMNS = data.COLUMNS
BATCH_SIZE = 256
FETCH_FACTOR = 16


def block_order(num_rows, block_size, seed=0):
    """The row order every method follows: torch_shards' BlockShuffling plan."""
    import torch_shards as ts

    return ts.BlockShuffling(block_size).plan(num_rows, seed=seed, epoch=0).numpy()


def run_for(iterable, seconds, rows_of=timing.index_rows):
    """(samples, seconds) read within the budget, epoch after epoch (timing.run_for)."""
    timed = timing.run_for(iterable, seconds, rows_of)
    return timed.rows, timed.seconds


def torch_shards_reader(source, block_size, cores, seconds, workers=0, loader_class=None):
    """In-process (native threads, workers=0) or through DataLoader worker processes (torch's
    DataLoader, or loader_class)."""
    import torch_shards as ts

    strategy = ts.Streaming() if block_size is None else ts.BlockShuffling(block_size)
    dataset = ts.ShardedDataset(
        source,
        strategy,
        batch_size=BATCH_SIZE,
        fetch_factor=FETCH_FACTOR,
        seed=0,
        num_threads=cores if workers == 0 else max(1, cores // workers),
        rank=0,
        world_size=1,
    )
    if workers == 0:
        return run_for(dataset, seconds)
    loader_class = loader_class or torch.utils.data.DataLoader
    loader = loader_class(dataset, batch_size=None, num_workers=workers, persistent_workers=True)
    return run_for(loader, seconds)


def read_anndata(path, options, block_size, args, workers=0, loader_class=None):
    import torch_shards as ts

    source = ts.AnnDataSource(path, **options)
    return torch_shards_reader(source, block_size, args.cores, args.seconds, workers, loader_class)


def read_hdf5(path, block_size, args, workers=0, loader_class=None):
    import torch_shards as ts

    return torch_shards_reader(ts.HDF5Source(path, "X"), block_size, args.cores, args.seconds, workers, loader_class)


def worker_ceiling(kind, nnz_per_row, cores, seconds):
    dataset = limits.SameShapes(kind, BATCH_SIZE, COLUMNS, nnz_per_row)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=cores, persistent_workers=True)
    return run_for(loader, seconds)


class H5adRows(torch.utils.data.Dataset):
    """What users write by hand: one CSR row per __getitem__, densified, via h5py."""

    def __init__(self, path):
        self.path = path
        self.file = None

    def __len__(self):
        import h5py

        with h5py.File(self.path, "r") as f:
            return len(f["X/indptr"]) - 1

    def __getitem__(self, i):
        import h5py

        if self.file is None:  # opened in the worker, never before fork
            self.file = h5py.File(self.path, "r")
        group = self.file["X"]
        start, end = group["indptr"][i : i + 2]
        row = np.zeros(COLUMNS, dtype=np.float32)
        row[group["indices"][start:end]] = group["data"][start:end]
        return torch.from_numpy(row)


class H5Rows(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path = path
        self.file = None

    def __len__(self):
        import h5py

        with h5py.File(self.path, "r") as f:
            return len(f["X"])

    def __getitem__(self, i):
        import h5py

        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return torch.from_numpy(self.file["X"][i])


def map_style_reader(dataset, order, cores, seconds):
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH_SIZE, sampler=order.tolist(), num_workers=cores, persistent_workers=True
    )
    return run_for(loader, seconds, lambda b: b.shape[0])


def scdataset_reader(path, block_size, cores, seconds, kind):
    import anndata as ad
    import h5py
    import scdataset
    from scdataset.transforms import adata_to_mindex

    strategy = scdataset.Streaming() if block_size is None else scdataset.BlockShuffling(block_size=block_size)
    if kind == "csr":
        backed = ad.read_h5ad(path, backed="r")
        dataset = scdataset.scDataset(
            backed, strategy, batch_size=BATCH_SIZE, fetch_factor=FETCH_FACTOR, fetch_transform=adata_to_mindex
        )
    else:
        backed = h5py.File(path, "r")["X"]
        dataset = scdataset.scDataset(backed, strategy, batch_size=BATCH_SIZE, fetch_factor=FETCH_FACTOR)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=cores, persistent_workers=True)
    return run_for(loader, seconds, len)


def annbatch_status():
    try:
        import annbatch  # noqa: F401
    except ImportError:
        return "not installed" + (
            " (needs Python >= 3.12; benchmarks/annbatch_format.py runs it in its own Python)"
            if sys.version_info < (3, 12)
            else ""
        )
    return None


def main():
    # torch notes that sparse CSR tensors are beta and that worker processes skip their invariant checks
    warnings.filterwarnings("ignore", message=".*[Ss]parse")
    parser = cli.parser(__doc__, "storage_throughput", seconds=8.0, replot=True)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the CSR .h5ad")
    parser.add_argument("--dense-rows", type=int, default=200_000, help="rows of the dense HDF5 dataset")
    parser.add_argument("--block-sizes", default="1,16,64,256")
    cli.add_cores(parser)
    parser.add_argument(
        "--data-dir",
        default=data.memory_dir(),
        help="where the files are written (default: /dev/shm when it has room, so the page cache "
        "holding them is not reclaimed between measurements, else benchmarks/data)",
    )
    parser.add_argument("--plot", default=None, help="the plot's file (default: the results' prefix + .png)")
    cli.add_skip(parser)
    args = cli.parse(parser)
    args.plot = args.plot or args.out + ".png"
    if args.replot:
        return plot([tuple(r) for r in results.read_json(args.out)], args.plot)

    import h5py

    csr_path = data.csr_h5ad(args.data_dir, args.rows)
    dense_path = data.dense_h5(args.data_dir, args.dense_rows)
    for path in (csr_path, dense_path):
        page_cache.warm(path)

    with h5py.File(csr_path, "r") as f:
        nnz = f["X/data"].shape[0]
        csr_ranges = limits.stored_ranges(f["X/data"]) + limits.stored_ranges(f["X/indices"])
    with h5py.File(dense_path, "r") as f:
        dense_ranges = limits.stored_ranges(f["X"])
    files = {
        "csr": dict(path=csr_path, rows=args.rows, bytes_per_row=nnz * 8 / args.rows, ranges=csr_ranges),
        "dense": dict(path=dense_path, rows=args.dense_rows, bytes_per_row=COLUMNS * 4, ranges=dense_ranges),
    }
    have_scdataset = True
    try:
        import scdataset  # noqa: F401
    except ImportError:
        have_scdataset = False
    skip = args.skip
    say = results.Report()
    block_sizes = [None] + [int(b) for b in args.block_sizes.split(",")]

    say(
        f"{args.cores} cores each; batch_size={BATCH_SIZE}, fetch_factor={FETCH_FACTOR}, {args.seconds:.0f} s "
        f"per measurement; CSR: {args.rows} x {COLUMNS}, {nnz / args.rows:.0f} non-zeros/row; dense: "
        f"{args.dense_rows} x {COLUMNS} float32"
    )
    status = annbatch_status()
    if status:
        say(f"annbatch: {status}")
    if not have_scdataset:
        say("scDataset: not installed (pip install scdataset)")
    header = (
        f"{'file':<6} {'order':<10} {'method':<20} {'samples/s':>11} {'MB/s':>8} {'vs scDataset':>13} {'of raw':>7}"
    )
    say("\n" + header + "\n" + "-" * len(header))

    import torch_shards as ts

    found = []
    for kind, info in files.items():
        raw_bytes, raw_seconds = limits.page_cache_read(info["path"], info["ranges"], args.seconds)
        raw_rate = raw_bytes / raw_seconds / info["bytes_per_row"]
        found.append((kind, "sequential", "raw page cache", raw_rate, info["bytes_per_row"]))
        say(
            f"{kind:<6} {'sequential':<10} {'raw page cache':<20} {raw_rate:>11.0f} "
            f"{raw_rate * info['bytes_per_row'] / 1e6:>8.0f} {'':>13}",
        )
        if "worker ceiling" not in skip:
            samples, seconds = worker_ceiling(kind, nnz / args.rows, args.cores, args.seconds)
            rate = samples / seconds
            found.append((kind, "any", "worker ceiling", rate, info["bytes_per_row"]))
            say(f"{kind:<6} {'any':<10} {'worker ceiling':<20} {rate:>11.0f}")
        for block_size in block_sizes:
            order_name = "Streaming" if block_size is None else f"block {block_size}"
            order = None if block_size is None else block_order(info["rows"], block_size)
            if kind == "csr":
                methods = [
                    ("torch_shards threads", read_anndata, (info["path"], {}, block_size, args)),
                    ("torch_shards workers", read_anndata, (info["path"], {}, block_size, args, args.cores)),
                    (
                        "ts.DataLoader",
                        read_anndata,
                        (info["path"], {}, block_size, args, args.cores, ts.DataLoader),
                    ),
                    ("torch_shards dense", read_anndata, (info["path"], {"dense": True}, block_size, args)),
                ]
                map_style = H5adRows(info["path"])
            else:
                methods = [
                    ("torch_shards threads", read_hdf5, (info["path"], block_size, args)),
                    ("torch_shards workers", read_hdf5, (info["path"], block_size, args, args.cores)),
                    ("ts.DataLoader", read_hdf5, (info["path"], block_size, args, args.cores, ts.DataLoader)),
                ]
                map_style = H5Rows(info["path"])
            if have_scdataset:
                methods.append(
                    ("scDataset", scdataset_reader, (info["path"], block_size, args.cores, args.seconds, kind))
                )
            if order is not None:
                methods.append(("map-style h5py", map_style_reader, (map_style, order, args.cores, args.seconds)))
            rates = {}
            for name, function, arguments in methods:
                if name in skip:
                    continue
                samples, seconds = function(*arguments)
                rates[name] = samples / seconds if seconds else 0.0
            for name, rate in rates.items():
                ratio = f"{rate / rates['scDataset']:.1f}x" if rates.get("scDataset") else "-"
                found.append((kind, order_name, name, rate, info["bytes_per_row"]))
                say(
                    f"{kind:<6} {order_name:<10} {name:<20} {rate:>11.0f} {rate * info['bytes_per_row'] / 1e6:>8.0f} "
                    f"{ratio:>13} {rate / raw_rate:>7.2f}",
                )
    print_worker_ratios(found, say)
    results.write(args.out, say.text(), found)
    plot(found, args.plot)


def print_worker_ratios(found, say):
    """DataLoader worker modes against torch's ceiling (same shapes, nothing read) and each other."""
    rate = {(r[0], r[1], r[2]): r[3] for r in found}
    rows = [(r[0], r[1]) for r in found if r[2] == "ts.DataLoader"]
    if not rows:
        return
    header = (
        f"{'file':<6} {'order':<10} {'workers/ceiling':>16} {'ts.DataLoader/ceiling':>22} {'ts.DataLoader/workers':>22}"
    )
    say("\nDataLoader workers (ceiling: torch's DataLoader over a dataset yielding the same shapes)")
    say(header + "\n" + "-" * len(header))
    for kind, order in rows:
        ceiling = rate.get((kind, "any", "worker ceiling"))
        workers = rate.get((kind, order, "torch_shards workers"))
        whole = rate[(kind, order, "ts.DataLoader")]

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "-"

        say(
            f"{kind:<6} {order:<10} {ratio(workers, ceiling):>16} {ratio(whole, ceiling):>22} "
            f"{ratio(whole, workers):>22}"
        )


COLORS = {
    "torch_shards threads": "tab:blue",
    "torch_shards workers": "tab:cyan",
    "torch_shards dense": "tab:purple",
    "ts.DataLoader": "tab:green",
    "worker ceiling": "tab:olive",
    "scDataset": "tab:red",
    "map-style h5py": "tab:gray",
}


def plot(found, path):
    """Grouped bars per block size, one panel per file; found holds (file, order, method, samples/s, bytes/row)."""
    panels = {}
    for kind, title in (("csr", "CSR .h5ad (sparse X)"), ("dense", "dense HDF5")):
        rows = [r for r in found if r[0] == kind and r[1] not in ("sequential", "any")]
        if not rows:
            continue
        orders = list(dict.fromkeys(r[1] for r in rows))
        methods = [m for m in COLORS if any(r[2] == m for r in rows)]
        bars = {m: [next((r[3] for r in rows if r[1] == o and r[2] == m), 0) for o in orders] for m in methods}
        levels = {f"{r[2]} ({r[1]})": r[3] for r in found if r[0] == kind and r[1] in ("sequential", "any")}
        panels[title] = {"groups": orders, "bars": bars, "levels": levels}
    results.bar_plots(path, panels, "samples / s", colors=COLORS)


if __name__ == "__main__":
    main()
