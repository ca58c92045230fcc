"""Zarr chunks decompressed on the GPU: ZarrDeviceDecoder, the Python door of
torch.classes.torch_shards.ZarrDeviceDecoder (csrc/loader/zarr_device_decoder.h).

The host fetches a read's compressed chunks and plans it (which compressed
pieces, where each lands, which blosc blocks to unshuffle); the GPU
decompresses them with NVIDIA's nvCOMP (loaded at run time from the
nvidia-libnvcomp-cu13 / -cu12 wheel: ``pip install "torch_shards[gpu]"``),
unshuffles and assembles the rows with torch ops on a stream of the decoder's
own. docs/guide/gpu.md has the details and the numbers."""

import os
import site
import sys

import torch

from ._library import LIBRARY_PATH  # noqa: F401  (loads the native classes)


def nvcomp_search_dirs():
    """The folders nvCOMP's wheels install into: site-packages (the user's too) and sys.path, in order."""
    dirs = []
    for found in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
        if found and found not in dirs and os.path.isdir(found):
            dirs.append(found)
    return dirs


class ZarrDeviceDecoder:
    """Rows of one zarr array, or of a CSR matrix group (AnnData's ``X`` of a
    zarr store, an annbatch dataset's), with their chunks decompressed on the
    device they are read to: nvCOMP on a CUDA GPU, the CPU codecs with
    ``device="cpu"``. Every codec zarr writes is read; blosc lz4 (annbatch's
    default) and, under a crc32c, zstd and deflate are decoded on the GPU, the
    rest on the host (``host_reason()`` says why). Results are bit for bit what
    zarr-python reads.

    Args:
        store: the zarr store (v2 or v3, sharded or not), a path.
        path: the array or CSR group inside it ("/" for a store that is one
            array; "X" for AnnData's X).
        num_threads: host threads that fetch and plan a read (4).
        trust_unverified: hand zstd and deflate streams to the GPU without a
            crc32c over them (False: nvCOMP's zstd and deflate decoders can
            fault the GPU on damaged data, which loses the process's CUDA
            context, so such chunks are decoded on the host).

    Raises:
        RuntimeError: the store or the path cannot be read (naming them).
        ValueError: ``num_threads`` < 1; a group that is not a CSR matrix.
    """

    def __init__(self, store, path="/", num_threads=4, trust_unverified=False):
        self._native = torch.classes.torch_shards.ZarrDeviceDecoder(
            os.fspath(store), path, nvcomp_search_dirs(), int(num_threads), bool(trust_unverified)
        )

    def read(self, rows, device="cuda"):
        """The rows, in the order given (repeats allowed).

        Args:
            rows: row numbers: a sequence of ints, a numpy array or an integer tensor.
            device: "cuda", "cuda:N", a torch.device, or "cpu" ("cuda").

        Returns:
            torch.Tensor: an array's rows, ``[len(rows), *shape[1:]]`` of its
            dtype; a CSR matrix's, a ``torch.sparse_csr_tensor`` of
            ``[len(rows), columns]``; on ``device``, ready for the current stream.

        Raises:
            RuntimeError: rows outside the array, or a chunk that cannot be
                read or decoded (naming the store, the array and the chunk);
                nvCOMP not found (naming the wheel to install).
            ValueError: a device that is neither the CPU nor CUDA (or CUDA
                where torch has none).
            TypeError: rows that are not integers.
        """
        return self._native.read(self._rows(rows), str(device))

    def read_batches(self, batches, device="cuda"):
        """Several batches' rows read as one: their chunks fetched and decoded once (as a dataset's fetch of
        several batches is read), one tensor per batch as ``read`` would give it.

        Args:
            batches: a sequence of row sequences (each as ``read`` takes them).
            device: as for ``read``.

        Returns:
            list[torch.Tensor]: one per batch, views of one output (a CSR batch's row pointer is its own).

        Raises:
            RuntimeError: as for ``read``.
            ValueError: as for ``read``.
            TypeError: as for ``read``.
        """
        return list(self._native.read_batches([self._rows(rows) for rows in batches], str(device)))

    @staticmethod
    def _rows(rows):
        rows = torch.as_tensor(rows)
        if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
            raise TypeError(f"ZarrDeviceDecoder.read: rows must be integers, got {rows.dtype}")
        return rows.reshape(-1).to(torch.int64).cpu()

    def stats(self):
        """What the last read did: ``pieces``, ``uploaded_bytes``, ``operations``,
        ``host_chunks``, ``chunks``, ``input_bytes``, and where its time went
        (``plan_us``, ``prepare_us``, ``enqueue_us``, ``wait_us``)."""
        return dict(self._native.stats())

    def host_reason(self):
        """Why the last read decoded chunks on the host ("" if it decoded none there)."""
        return self._native.host_reason()

    def nvcomp_library(self):
        """The nvCOMP library loaded and its version ("" before the first read on a GPU)."""
        return self._native.nvcomp_library()
