"""Batches on the GPU: the device argument, and DeviceLoader for batches that
DataLoader workers hand to the main process on the host.

The copy itself is native (torch.classes.torch_shards.DeviceStage, the same
code ShardedDataset(device=) runs): pinned host memory, a side stream, an event
the current stream waits on."""

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

    Args:
        loader: any iterable of dicts of tensors.
        device: "cuda", "cuda:N", a torch.device, or "cpu" (required).

    Raises:
        ValueError: ``device`` is None, not a device name, or a CUDA device
            where torch has no CUDA.
        TypeError: ``device`` is not a str or a torch.device; when iterated, a
            batch that is not a dict of tensors.
    """

    def __init__(self, loader, device):
        self.loader = loader
        self.device = device_name("DeviceLoader", device)
        if self.device is None:
            raise ValueError("DeviceLoader: device must be given ('cuda', 'cuda:1', a torch.device or 'cpu')")
        warning = torch.classes.torch_shards.DeviceStage(self.device).warning()  # checks the device now
        if warning:
            warnings.warn(warning, stacklevel=2)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        stage = torch.classes.torch_shards.DeviceStage(self.device)  # one per iteration: its own copies
        for batch in self.loader:
            if not isinstance(batch, dict) or not all(isinstance(v, torch.Tensor) for v in batch.values()):
                raise TypeError(f"DeviceLoader: batches must be dicts of tensors, got {type(batch).__name__}")
            stage.put(batch)
            if stage.pending() > 1:
                yield dict(stage.take())
        while stage.pending():
            yield dict(stage.take())
