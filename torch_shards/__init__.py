"""torch_shards: exactly-once, DDP-aware streaming of large datasets into PyTorch."""

from ._library import LIBRARY_PATH
from .dataloader import DataLoader
from .dataset import ShardedDataset, flat_state_dict
from .device import DeviceLoader
from .device_decode import ZarrDeviceDecoder
from .info import build_info
from .monitor import MonitoredLoader
from .sampler import DistributedSampler
from .sources import AnnDataSource, Collection, HDF5Source, RowsSource, Source, TensorSource, ZarrSource, open
from .strategies import (
    BlockShuffling,
    BlockWeightedSampling,
    ClassBalancedSampling,
    CustomStrategy,
    Strategy,
    Streaming,
)

__version__ = "0.1.0"

__all__ = [
    "LIBRARY_PATH",
    "AnnDataSource",
    "Collection",
    "HDF5Source",
    "ZarrSource",
    "ZarrDeviceDecoder",
    "open",
    "BlockShuffling",
    "BlockWeightedSampling",
    "build_info",
    "ClassBalancedSampling",
    "CustomStrategy",
    "DataLoader",
    "DeviceLoader",
    "DistributedSampler",
    "MonitoredLoader",
    "ShardedDataset",
    "flat_state_dict",
    "RowsSource",
    "Source",
    "Strategy",
    "Streaming",
    "TensorSource",
]
