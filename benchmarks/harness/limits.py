"""The limits the readers are compared with, measured in the same run: what no reader of these bytes can
beat on these cores (decode and copy limits, benchmarks/decode_limit.cpp; the page cache read
sequentially; a pinned host-to-device copy) and what torch's DataLoader moves when nothing is read."""

import json
import os
import subprocess
import time

import torch

from .machine import taskset


def decode_limit_run(binary, options, cores, seconds, cpu_list=None):
    """decode_limit's JSON for its options on `cores` threads for `seconds`."""
    command = [binary, "--threads", str(cores), "--seconds", str(seconds)] + [str(o) for o in options]
    done = subprocess.run(taskset(cpu_list, command), check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def decode(binary, specs, rows, cores, seconds, cpu_list=None):
    """Every chunk of the arrays (STORE:ARRAY specs) decoded in order: (rows/s, rows per CPU-second)."""
    result = decode_limit_run(binary, specs, cores, seconds, cpu_list)
    return rows * result["passes"] / result["seconds"], rows * result["passes"] / result["cpu_seconds"]


def io_floor(binary, specs, rows, block, fetch_rows, shuffle_rows, cores, seconds, cpu_list=None):
    """Random blocks of CSR rows read fetch by fetch with the sources' io code into reused buffers (each
    fetch's rows shuffled with shuffle_rows): (rows/s, rows per CPU-second)."""
    options = ["--csr-blocks", block, "--fetch-rows", fetch_rows] + (["--shuffle-rows"] if shuffle_rows else [])
    result = decode_limit_run(binary, options + list(specs), cores, seconds, cpu_list)
    return rows * result["passes"] / result["seconds"], rows * result["passes"] / result["cpu_seconds"]


def dense_write(binary, width, density, cores, seconds, cpu_list=None):
    """Dense float32 rows of `width`, as sparse as `density` (the share of all-zero cache lines changes the
    rate), written into memory with the dense scatter's stores: (rows/s, rows per CPU-second)."""
    result = decode_limit_run(binary, ["--write-rows", width, "--write-density", density], cores, seconds, cpu_list)
    rows = result["written_rows"] * result["passes"]
    return rows / result["seconds"], rows / result["cpu_seconds"]


def gather_copy(binary, rows, row_bytes, block, fetch_rows, cores, seconds):
    """Rows/s of copying block-shuffled fetches' rows (each fetch's rows shuffled) in source order to their
    places, into recycled buffers, and nothing else (decode_limit --gather-rows)."""
    options = ["--gather-rows", rows, "--row-bytes", row_bytes, "--blocks", block, "--fetch-rows", fetch_rows]
    result = decode_limit_run(binary, options, cores, seconds)
    return result["gathered_rows"] * result["passes"] / result["seconds"]


def stored_ranges(dataset):
    """(offset, size) of the bytes an h5py dataset occupies in its file (anndata writes CSR arrays chunked)."""
    offset = dataset.id.get_offset()
    if offset is not None:
        return [(offset, dataset.id.get_storage_size())]
    chunks = [dataset.id.get_chunk_info(i) for i in range(dataset.id.get_num_chunks())]
    return [(chunk.byte_offset, chunk.size) for chunk in chunks]


def page_cache_read(path, byte_ranges, seconds):
    """Sequential large reads (16 MiB preads, one thread) of the byte ranges, straight from the page cache,
    over and over for `seconds`: (bytes, seconds)."""
    chunk = 16 << 20
    view = memoryview(bytearray(chunk))
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


def pinned_copy_gbps(nbytes, repeats=20):
    """GB/s of a pinned host-to-device copy of nbytes (CUDA)."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes * repeats / (time.perf_counter() - start) / 1e9


class SameShapes(torch.utils.data.IterableDataset):
    """torch's own ceiling for worker processes: batches of the benchmark's shapes (dense rows, or CSR rows
    with the file's non-zeros per row, plus "index"), made anew each time as any dataset makes them,
    without reading anything."""

    def __init__(self, kind, batch_size, columns, nnz_per_row):
        self.kind, self.batch_size, self.columns, self.nnz_per_row = kind, batch_size, columns, nnz_per_row

    def __iter__(self):
        size, columns = self.batch_size, self.columns
        nnz = int(size * self.nnz_per_row)
        offsets = torch.arange(size + 1, dtype=torch.int64) * int(self.nnz_per_row)
        while True:
            if self.kind == "dense":
                x = torch.empty(size, columns)
            else:
                x = torch.sparse_csr_tensor(
                    offsets.clone(), torch.zeros(nnz, dtype=torch.int32), torch.empty(nnz), (size, columns)
                )
            yield {"X": x, "index": torch.empty(size, dtype=torch.int64)}


class QueueFloor(torch.utils.data.IterableDataset):
    """Yields a small int per batch, split among the workers: torch's queue with nothing to carry (the
    most any dataset gets through it at one item per batch)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        return iter(range(worker, self.batches, workers))
