"""Ways a batch of rows in random blocks reaches the GPU, side by side in one run with the pinned
host-to-device copy limit measured in each round (issue 48: which design can deliver >= 0.8 of it).

    python -m benchmarks.h2d_paths          # table + benchmarks/results/h2d_paths_<gpu>.{txt,json}

The source: --rows x --width float32 (8 KB rows) in host memory; an epoch's batches of --batch-size rows
in random blocks of 64 consecutive rows (BlockShuffling(64)'s shape). Per batch size, each round runs:

  pinned H2D limit         one contiguous pinned batch copied, again and again (the copy engine's rate)
  gather + copy            the rows gathered on the host (torch.index_select, every core) into one of two
                           pinned buffers, copied while the next batch is gathered (the host path's shape)
  gather + copy, ring 16   the same through 16 pinned buffers in turn (a working set beyond the caches, as a
                           reader's prefetched batches are)
  GPU gather, pinned       no host work: a GPU kernel (torch.index_select) reads the rows straight from the
                           pinned source over the bus (unified addressing: a CUDA tensor over host memory)
  GPU gather, registered   the same from the registered file mapping
  blocks, pinned source    the source itself pinned: each block copied straight into the device batch,
                           no host gather (one cudaMemcpyAsync per block)
  blocks, registered map   the source a file mapping (tmpfs) registered with cudaHostRegister: the same
                           block copies from page-cache memory
  blocks, pageable source  the block copies from ordinary memory (CUDA stages them itself)

Each reports delivered GB/s and its ratio to the limit of the same round; each way's last batch of its
warm-up epoch is checked against the source's rows first.
"""

import ctypes
import mmap
import os
import sys
import tempfile
import time

import numpy as np
import torch

try:
    from benchmarks.harness import cli, machine, results, rounds
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, machine, results, rounds

BLOCK = 64


def epoch_blocks(rows, batch_size, seed=0):
    """Each batch as the first rows of its blocks: random blocks of BLOCK rows, batch_size rows a batch."""
    starts = np.random.default_rng(seed).permutation(rows // BLOCK) * BLOCK
    per = batch_size // BLOCK
    return [starts[i : i + per].tolist() for i in range(0, len(starts) - per + 1, per)]


def timed(run):
    torch.cuda.synchronize()
    began = time.perf_counter()
    moved = run()
    torch.cuda.synchronize()
    return moved / (time.perf_counter() - began) / 1e9


def block_copies(source, batches, outs):
    """Every block of every batch copied from `source` into the device batch (two device batches in turn)."""

    def run():
        moved = 0
        for k, starts in enumerate(batches):
            out = outs[k % 2]
            for j, start in enumerate(starts):
                out[j * BLOCK : (j + 1) * BLOCK].copy_(source[start : start + BLOCK], non_blocking=True)
            moved += len(starts) * BLOCK * source.shape[1] * source.element_size()
        return moved

    return lambda: timed(run)


def gather_copy(source, batches, outs, ring=2):
    """Rows gathered on the host into `ring` pinned buffers in turn, each copied while the next is gathered."""
    width = source.shape[1]
    pinned = [torch.empty((len(batches[0]) * BLOCK, width), dtype=source.dtype).pin_memory() for _ in range(ring)]
    done = [None] * ring
    within = torch.arange(BLOCK)

    def run():
        moved = 0
        for k, starts in enumerate(batches):
            slot = k % ring
            if done[slot] is not None:
                done[slot].synchronize()  # the copy that read this buffer has ended
            index = (torch.tensor(starts)[:, None] + within).reshape(-1)
            torch.index_select(source, 0, index, out=pinned[slot])
            outs[k % 2].copy_(pinned[slot], non_blocking=True)
            done[slot] = torch.cuda.Event()
            done[slot].record()
            moved += pinned[slot].numel() * pinned[slot].element_size()
        return moved

    return lambda: timed(run)


def gpu_gather(on_gpu, batches, outs):
    """Rows gathered by a GPU kernel from `on_gpu` (a CUDA tensor over pinned host memory)."""
    within = torch.arange(BLOCK, device="cuda")
    indexes = [(torch.tensor(starts, device="cuda")[:, None] + within).reshape(-1) for starts in batches]

    def run():
        moved = 0
        for k, index in enumerate(indexes):
            torch.index_select(on_gpu, 0, index, out=outs[k % 2])
            moved += outs[k % 2].numel() * outs[k % 2].element_size()
        return moved

    return lambda: timed(run)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManaged(ctypes.Structure):
    pass


_DLDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManaged))
_DLManaged._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DLDeleter)]
_ALIASES = []  # what each alias's DLPack structure points to, kept for the process's life


def on_device(host, device_type=2):
    """A tensor of DLPack device type `device_type` (2: CUDA, 1: the CPU) over a 2-D float32 host tensor's
    memory, which must be pinned or registered for CUDA (unified addressing: the GPU reads it over the bus)."""
    shape = (ctypes.c_int64 * 2)(*host.shape)
    strides = (ctypes.c_int64 * 2)(*host.stride())
    managed = _DLManaged()
    device = _DLDevice(device_type, torch.cuda.current_device() if device_type == 2 else 0)
    managed.dl_tensor = _DLTensor(host.data_ptr(), device, 2, _DLDataType(2, 32, 1), shape, strides, 0)
    managed.deleter = _DLDeleter(0)
    _ALIASES.append((managed, shape, strides, host))
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return torch.utils.dlpack.from_dlpack(capsule_new(ctypes.addressof(managed), b"dltensor", None))


def limit(nbytes):
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def run():
        for _ in range(20):
            device.copy_(host, non_blocking=True)
        return 20 * nbytes

    return lambda: timed(run)


def registered_mapping(path, shape):
    """The file at path mapped (shared, read-write) and registered with CUDA: (tensor, unregister) or
    (None, why)."""
    nbytes = int(np.prod(shape)) * 4
    with open(path, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), nbytes)
    array = np.frombuffer(mapped, dtype=np.float32).reshape(shape)
    pointer = array.ctypes.data
    cudart = torch.cuda.cudart()
    status = cudart.cudaHostRegister(pointer, nbytes, 0)
    if int(status) != 0:
        return None, f"cudaHostRegister of a tmpfs mapping: {status}"
    tensor = torch.from_numpy(array)

    def unregister():
        cudart.cudaHostUnregister(pointer)

    return (tensor, unregister), None


def main():
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    parser = cli.parser(__doc__, lambda args: "h2d_paths_" + machine.gpu_slug(gpu or "cpu"), rounds=3)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=2048, help="float32 values per row (8 KB)")
    parser.add_argument("--batch-sizes", default="1024,4096")
    args = cli.parse(parser)
    if not gpu:
        print("h2d_paths: needs a CUDA GPU; none here (nothing measured)")
        return 0
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    report = results.Report()
    shape = (args.rows // BLOCK * BLOCK, args.width)
    source = torch.from_numpy(np.random.default_rng(0).random(shape, dtype=np.float32))
    began = time.perf_counter()
    pinned_source = source.pin_memory()
    report(f"pinned the {source.numel() * 4 / 1e9:.2f} GB source in {time.perf_counter() - began:.2f} s")
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    mapped_file = tempfile.NamedTemporaryFile(dir=directory, suffix=".f32")
    source.numpy().tofile(mapped_file.name)
    registered, why = registered_mapping(mapped_file.name, shape)
    if why:
        report(f"registered mapping: not measured ({why})")
    measured = {"gpu": gpu, "torch": torch.__version__, "rows": shape[0], "width": args.width, "batches": {}}
    tables = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        batches = epoch_blocks(shape[0], batch_size)
        assert all(pinned_source[s : s + BLOCK].is_pinned() for s in batches[0][:1])
        outs = [torch.empty((batch_size, args.width), device="cuda") for _ in range(2)]
        measures = {
            "pinned H2D limit": limit(batch_size * args.width * 4),
            "gather + copy": gather_copy(source, batches, outs),
            "gather + copy, ring 16": gather_copy(source, batches, outs, ring=16),
            "GPU gather, pinned": gpu_gather(on_device(pinned_source), batches, outs),
            "blocks, pinned source": block_copies(pinned_source, batches, outs),
            "blocks, pageable source": block_copies(source, batches, outs),
        }
        if registered:
            measures["blocks, registered map"] = block_copies(registered[0], batches, outs)
            measures["GPU gather, registered"] = gpu_gather(on_device(registered[0]), batches, outs)
        last = torch.cat([source[start : start + BLOCK] for start in batches[-1]])
        for name, measure in measures.items():
            measure()  # warm-up; then the epoch's last batch, on the device, checked against the source
            if name != "pinned H2D limit" and not torch.equal(outs[(len(batches) - 1) % 2].cpu(), last):
                raise RuntimeError(f"h2d_paths: {name} delivered other rows than the source's")
        per_round = rounds.alternate(
            measures, args.rounds, lambda r, m, v, b=batch_size: report(f"batch {b} round {r}: {m} {v:.2f} GB/s")
        )
        cells = []
        for name, values in per_round.items():
            ratio = rounds.ratios(values, per_round["pinned H2D limit"])
            cells.append((name, rounds.spread(values, digits=2), rounds.spread(ratio, digits=2)))
        measured["batches"][batch_size] = per_round
        tables.append(
            f"batch {batch_size} ({len(batches)} batches an epoch):\n\n"
            + results.markdown(["path", "GB/s", "of the pinned limit"], cells)
        )
    if registered:
        registered[1]()
    header = (
        f"GPU: {gpu}; torch {torch.__version__}; {shape[0]} rows x {args.width} float32 in blocks of {BLOCK} "
        f"rows; {args.rounds} alternated rounds after a warm-up; {torch.get_num_threads()} host threads"
    )
    results.publish(args.out, header, tables, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
