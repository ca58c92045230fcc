"""Reading throughput side by side: torch_shards against the loaders users would
pick instead, on the same files, block sizes and core count, in one run.

    python benchmarks/storage_throughput.py                 # 1e6 x 2000 CSR .h5ad + dense HDF5
    python benchmarks/storage_throughput.py --rows 200000   # quicker

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
"""

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
COLUMNS = 2000
DENSITY = 0.05
BATCH_SIZE = 256
FETCH_FACTOR = 16


def write_csr_h5ad(path, rows, seed=0):
    import anndata as ad
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    pieces = []
    for start in range(0, rows, 20_000):
        count = min(20_000, rows - start)
        mask = rng.random((count, COLUMNS), dtype=np.float32) < DENSITY
        values = rng.random(int(mask.sum()), dtype=np.float32) * 10
        row, col = np.nonzero(mask)
        pieces.append(sp.csr_matrix((values, (row, col)), shape=(count, COLUMNS), dtype=np.float32))
    matrix = sp.vstack(pieces, format="csr")
    matrix.indices = matrix.indices.astype(np.int32)
    ad.AnnData(X=matrix).write_h5ad(path)


def write_dense_h5(path, rows, seed=0):
    import h5py

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        dataset = f.create_dataset("X", shape=(rows, COLUMNS), dtype="f4")
        for start in range(0, rows, 20_000):
            count = min(20_000, rows - start)
            dataset[start : start + count] = rng.standard_normal((count, COLUMNS), dtype=np.float32)


def warm_page_cache(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def block_order(num_rows, block_size, seed=0):
    """The row order every method follows: torch_shards' BlockShuffling plan."""
    import torch_shards as ts

    return ts.BlockShuffling(block_size).plan(num_rows, seed=seed, epoch=0).numpy()


def run_for(iterable, seconds, rows_of):
    """(samples, seconds) read from an iterable of batches within the budget, epoch after
    epoch as a training loop would (the clock starts at the first batch, so start-up is not
    counted; every later epoch's is)."""
    samples, start = 0, None
    while True:
        for batch in iterable:
            if start is None:
                start = time.perf_counter()
                continue
            samples += rows_of(batch)
            if time.perf_counter() - start > seconds:
                return samples, time.perf_counter() - start
        if start is None:
            return 0, 0.0


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
        return run_for(dataset, seconds, lambda b: b["index"].shape[0])
    loader_class = loader_class or torch.utils.data.DataLoader
    loader = loader_class(dataset, batch_size=None, num_workers=workers, persistent_workers=True)
    return run_for(loader, seconds, lambda b: b["index"].shape[0])


def read_anndata(path, options, block_size, args, workers=0, loader_class=None):
    import torch_shards as ts

    source = ts.AnnDataSource(path, **options)
    return torch_shards_reader(source, block_size, args.cores, args.seconds, workers, loader_class)


def read_hdf5(path, block_size, args, workers=0, loader_class=None):
    import torch_shards as ts

    return torch_shards_reader(ts.HDF5Source(path, "X"), block_size, args.cores, args.seconds, workers, loader_class)


class SameShapes(torch.utils.data.IterableDataset):
    """torch's own ceiling for worker processes: batches of the benchmark's shapes (dense rows, or
    CSR rows with the file's non-zeros per row, plus "index"), made anew each time as any dataset
    makes them, without reading anything."""

    def __init__(self, kind, nnz_per_row):
        self.kind, self.nnz_per_row = kind, nnz_per_row

    def __iter__(self):
        nnz = int(BATCH_SIZE * self.nnz_per_row)
        offsets = torch.arange(BATCH_SIZE + 1, dtype=torch.int64) * int(self.nnz_per_row)
        while True:
            if self.kind == "dense":
                x = torch.empty(BATCH_SIZE, COLUMNS)
            else:
                x = torch.sparse_csr_tensor(
                    offsets.clone(), torch.zeros(nnz, dtype=torch.int32), torch.empty(nnz), (BATCH_SIZE, COLUMNS)
                )
            yield {"X": x, "index": torch.empty(BATCH_SIZE, dtype=torch.int64)}


def worker_ceiling(kind, nnz_per_row, cores, seconds):
    loader = torch.utils.data.DataLoader(
        SameShapes(kind, nnz_per_row), batch_size=None, num_workers=cores, persistent_workers=True
    )
    return run_for(loader, seconds, lambda b: b["index"].shape[0])


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
        data = ad.read_h5ad(path, backed="r")
        dataset = scdataset.scDataset(
            data, strategy, batch_size=BATCH_SIZE, fetch_factor=FETCH_FACTOR, fetch_transform=adata_to_mindex
        )
    else:
        data = h5py.File(path, "r")["X"]
        dataset = scdataset.scDataset(data, strategy, batch_size=BATCH_SIZE, fetch_factor=FETCH_FACTOR)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=cores, persistent_workers=True)
    return run_for(loader, seconds, len)


def raw_reader(path, byte_ranges, seconds):
    """Sequential large reads of the bytes the rows occupy, straight from the page cache."""
    chunk = 16 << 20
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    total, start = 0, time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while time.perf_counter() - start < seconds:
            for offset, size in byte_ranges:
                done = 0
                while done < size:
                    got = os.preadv(fd, [view[: min(chunk, size - done)]], offset + done)
                    done += got
                    total += got
    finally:
        os.close(fd)
    return total, time.perf_counter() - start


def stored_ranges(dataset):
    """(offset, size) of the bytes a dataset occupies in its file (anndata writes CSR arrays chunked)."""
    offset = dataset.id.get_offset()
    if offset is not None:
        return [(offset, dataset.id.get_storage_size())]
    chunks = [dataset.id.get_chunk_info(i) for i in range(dataset.id.get_num_chunks())]
    return [(chunk.byte_offset, chunk.size) for chunk in chunks]


def default_data_dir(needed_bytes=6 << 30):
    shm = "/dev/shm"
    if os.path.isdir(shm):
        stats = os.statvfs(shm)
        if stats.f_bavail * stats.f_frsize > needed_bytes:
            return os.path.join(shm, "torch_shards_benchmark")
    return os.path.join(HERE, "data")


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the CSR .h5ad")
    parser.add_argument("--dense-rows", type=int, default=200_000, help="rows of the dense HDF5 dataset")
    parser.add_argument("--block-sizes", default="1,16,64,256")
    parser.add_argument("--seconds", type=float, default=8.0, help="time budget per measurement")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--data-dir",
        default=default_data_dir(),
        help="where the files are written (default: /dev/shm when it has room, so the page cache "
        "holding them is not reclaimed between measurements, else benchmarks/data)",
    )
    parser.add_argument("--plot", default=os.path.join(HERE, "results", "storage_throughput.png"))
    parser.add_argument("--skip", default="", help="comma-separated methods to leave out")
    parser.add_argument(
        "--json", default=os.path.join(HERE, "results", "storage_throughput.json"), help="where the results are saved"
    )
    parser.add_argument("--replot", action="store_true", help="redraw the plot from --json, measure nothing")
    args = parser.parse_args()
    if args.replot:
        with open(args.json) as f:
            plot([tuple(r) for r in json.load(f)], args.plot)
        return

    import h5py

    os.makedirs(args.data_dir, exist_ok=True)
    csr_path = os.path.join(args.data_dir, f"csr_{args.rows}.h5ad")
    dense_path = os.path.join(args.data_dir, f"dense_{args.dense_rows}.h5")
    if not os.path.exists(csr_path):
        print(f"writing {csr_path} ...", flush=True)
        write_csr_h5ad(csr_path, args.rows)
    if not os.path.exists(dense_path):
        print(f"writing {dense_path} ...", flush=True)
        write_dense_h5(dense_path, args.dense_rows)
    for path in (csr_path, dense_path):
        warm_page_cache(path)

    with h5py.File(csr_path, "r") as f:
        nnz = f["X/data"].shape[0]
        csr_ranges = stored_ranges(f["X/data"]) + stored_ranges(f["X/indices"])
    with h5py.File(dense_path, "r") as f:
        dense_ranges = stored_ranges(f["X"])
    files = {
        "csr": dict(path=csr_path, rows=args.rows, bytes_per_row=nnz * 8 / args.rows, ranges=csr_ranges),
        "dense": dict(path=dense_path, rows=args.dense_rows, bytes_per_row=COLUMNS * 4, ranges=dense_ranges),
    }
    have_scdataset = True
    try:
        import scdataset  # noqa: F401
    except ImportError:
        have_scdataset = False
    skip = set(filter(None, args.skip.split(",")))
    block_sizes = [None] + [int(b) for b in args.block_sizes.split(",")]

    print(
        f"\n{args.cores} cores each; batch_size={BATCH_SIZE}, fetch_factor={FETCH_FACTOR}, {args.seconds:.0f} s "
        f"per measurement; CSR: {args.rows} x {COLUMNS}, {nnz / args.rows:.0f} non-zeros/row; dense: "
        f"{args.dense_rows} x {COLUMNS} float32"
    )
    status = annbatch_status()
    if status:
        print(f"annbatch: {status}")
    if not have_scdataset:
        print("scDataset: not installed (pip install scdataset)")
    header = (
        f"{'file':<6} {'order':<10} {'method':<20} {'samples/s':>11} {'MB/s':>8} {'vs scDataset':>13} {'of raw':>7}"
    )
    print("\n" + header + "\n" + "-" * len(header), flush=True)

    import torch_shards as ts

    results = []
    for kind, info in files.items():
        raw_bytes, raw_seconds = raw_reader(info["path"], info["ranges"], args.seconds)
        raw_rate = raw_bytes / raw_seconds / info["bytes_per_row"]
        results.append((kind, "sequential", "raw page cache", raw_rate, info["bytes_per_row"]))
        print(
            f"{kind:<6} {'sequential':<10} {'raw page cache':<20} {raw_rate:>11.0f} "
            f"{raw_rate * info['bytes_per_row'] / 1e6:>8.0f} {'':>13}",
            flush=True,
        )
        if "worker ceiling" not in skip:
            samples, seconds = worker_ceiling(kind, nnz / args.rows, args.cores, args.seconds)
            rate = samples / seconds
            results.append((kind, "any", "worker ceiling", rate, info["bytes_per_row"]))
            print(f"{kind:<6} {'any':<10} {'worker ceiling':<20} {rate:>11.0f}", flush=True)
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
                results.append((kind, order_name, name, rate, info["bytes_per_row"]))
                print(
                    f"{kind:<6} {order_name:<10} {name:<20} {rate:>11.0f} {rate * info['bytes_per_row'] / 1e6:>8.0f} "
                    f"{ratio:>13} {rate / raw_rate:>7.2f}",
                    flush=True,
                )
    print_worker_ratios(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)


def print_worker_ratios(results):
    """DataLoader worker modes against torch's ceiling (same shapes, nothing read) and each other."""
    rate = {(r[0], r[1], r[2]): r[3] for r in results}
    rows = [(r[0], r[1]) for r in results if r[2] == "ts.DataLoader"]
    if not rows:
        return
    header = (
        f"{'file':<6} {'order':<10} {'workers/ceiling':>16} {'ts.DataLoader/ceiling':>22} {'ts.DataLoader/workers':>22}"
    )
    print("\nDataLoader workers (ceiling: torch's DataLoader over a dataset yielding the same shapes)")
    print(header + "\n" + "-" * len(header))
    for kind, order in rows:
        ceiling = rate.get((kind, "any", "worker ceiling"))
        workers = rate.get((kind, order, "torch_shards workers"))
        whole = rate[(kind, order, "ts.DataLoader")]

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "-"

        print(
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


def plot(results, path):
    """Grouped bars per block size, one panel per file; results are (file, order, method, samples/s, bytes/row)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for axis, kind in zip(axes, ("csr", "dense")):
        rows = [r for r in results if r[0] == kind and r[1] != "sequential"]
        orders = list(dict.fromkeys(r[1] for r in rows))
        methods = [m for m in COLORS if any(r[2] == m for r in rows)]
        width = 0.8 / len(methods)
        for m, method in enumerate(methods):
            values = [next((r[3] for r in rows if r[1] == o and r[2] == method), 0) for o in orders]
            axis.bar([i + m * width for i in range(len(orders))], values, width, label=method, color=COLORS[method])
        raw = next(r[3] for r in results if r[0] == kind and r[1] == "sequential")
        axis.axhline(raw, color="black", linestyle="--", linewidth=1, label="raw page cache (sequential)")
        axis.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(orders))], orders)
        axis.set_yscale("log")
        axis.set_ylabel("samples / s")
        axis.set_title({"csr": "CSR .h5ad (sparse X)", "dense": "dense HDF5"}[kind])
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
