"""Batches on the GPU: the device argument, and DeviceLoader for batches that
DataLoader workers hand to the main process on the host.

The copy itself is native (torch.classes.torch_shards.DeviceStage, the same
code ShardedDataset(device=) runs): pinned host memory, a side stream, an event
the current stream waits on. Batches that are not in pinned memory (a
DataLoader's workers send theirs in shared memory) are assembled into one
pinned staging buffer from a recycled pool, copied in one transfer and cut
into the device batch; a buffer goes back to the pool only once its copy
ended."""

import warnings

import torch

from ._library import LIBRARY_PATH  # noqa: F401  (loads the native classes)


def device_name(who, device):
    """The device as the native side takes it: None, or a str such as "cuda:1"."""
    if device is None:
        return None
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, str):
        return device
    raise TypeError(f"{who}: device must be None, a str ('cuda', 'cuda:1') or a torch.device, got {device!r}")


class DeviceLoader:
    """Iterates ``loader`` (e.g. a ``DataLoader`` with workers over a
    ``ShardedDataset``) and yields each batch on ``device``: copied on a side
    stream one batch ahead, the current stream waiting for the copy when the
    batch is yielded. Batches must be dicts of tensors (dense or sparse CSR).
    ``device="cpu"`` yields them as they are. ``len()`` is the loader's.
    A sparse CSR field arrives as a ``torch.sparse_csr_tensor`` on the device.

    Batches not in pinned memory are staged through pinned buffers recycled
    once their copies ended (no pinned allocation per batch after the first
    few); the staged bytes whose copies may still run stay within
    ``prefetch_bytes`` (one batch goes even when larger).

    Args:
        loader: any iterable of dicts of tensors.
        device: "cuda", "cuda:N", a torch.device, or "cpu" (required).
        prefetch_bytes: bound on the pinned staging bytes in flight (1 GiB).

    Attributes:
        staging_stats: the last finished iteration's staging counts
            (``allocations``, ``reuses``, ``waits``, ``peak_in_flight_bytes``...).

    Raises:
        ValueError: ``device`` is None, not a device name, or a CUDA device
            where torch has no CUDA; ``prefetch_bytes`` < 0.
        TypeError: ``device`` is not a str or a torch.device, or
            ``prefetch_bytes`` not an int; when iterated, a batch that is not
            a dict of tensors.
    """

    def __init__(self, loader, device, prefetch_bytes=1 << 30):
        self.loader = loader
        self.device = device_name("DeviceLoader", device)
        if self.device is None:
            raise ValueError("DeviceLoader: device must be given ('cuda', 'cuda:1', a torch.device or 'cpu')")
        if isinstance(prefetch_bytes, bool) or not isinstance(prefetch_bytes, int):
            raise TypeError(f"DeviceLoader: prefetch_bytes must be an int, got {prefetch_bytes!r}")
        self.prefetch_bytes = prefetch_bytes
        self.staging_stats = {}
        # Checks the device (and prefetch_bytes) now.
        warning = torch.classes.torch_shards.DeviceStage(self.device, prefetch_bytes).warning()
        if warning:
            warnings.warn(warning, stacklevel=2)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        # One per iteration: its own copies and staging buffers.
        stage = torch.classes.torch_shards.DeviceStage(self.device, self.prefetch_bytes)
        try:
            for batch in self.loader:
                if not isinstance(batch, dict) or not all(isinstance(v, torch.Tensor) for v in batch.values()):
                    raise TypeError(f"DeviceLoader: batches must be dicts of tensors, got {type(batch).__name__}")
                stage.put(batch)
                if stage.pending() > 1:
                    yield dict(stage.take())
            while stage.pending():
                yield dict(stage.take())
        finally:
            # The last iteration's staging counts (allocations, reuses, waits, peak bytes in flight).
            self.staging_stats = dict(stage.stats())
