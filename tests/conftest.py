import collections

import anndata as ad
import numpy as np
import torch
from torch.utils.data import DataLoader

import torch_shards as ts

# With pandas 3 an AnnData's default index is a pandas StringArray, which anndata 0.11-0.12 writes
# only when asked (0.13 writes it by default): the tests' files are written as users' are.
if hasattr(ad.settings, "allow_write_nullable_strings"):
    ad.settings.allow_write_nullable_strings = True

# Every dtype the sources read, in native byte order.
DTYPES = [
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bool",
    "complex64",
    "complex128",
]


def make_strategy(name, num_rows, block_size=3):
    """One instance of each strategy, over a source of num_rows rows."""
    if name == "Streaming":
        return ts.Streaming()
    if name == "StreamingShuffle":
        return ts.Streaming(shuffle=True)
    if name == "BlockShuffling":
        return ts.BlockShuffling(block_size=block_size)
    if name == "BlockWeightedSampling":
        weights = torch.arange(num_rows, dtype=torch.float64) % 5 + 0.5
        return ts.BlockWeightedSampling(weights, total_size=num_rows + 3, block_size=block_size)
    if name == "ClassBalancedSampling":
        labels = torch.arange(num_rows) % 3
        return ts.ClassBalancedSampling(labels, block_size=block_size)
    raise ValueError(name)


STRATEGIES = ["Streaming", "StreamingShuffle", "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling"]


def rows_source(num_rows):
    """A source whose field "X" holds each row's own index, to audit reads."""
    return ts.TensorSource({"X": torch.arange(num_rows, dtype=torch.int64) * 10})


def read_rank(dataset, num_workers, **loader_kwargs):
    """Every batch one rank yields through a real DataLoader, as (worker-order) list."""
    if num_workers == 0:
        loader_kwargs.pop("multiprocessing_context", None)
        loader_kwargs.pop("persistent_workers", None)
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, **loader_kwargs)
    return [batch["index"].tolist() for batch in loader]


def read_rank_by_workers(dataset, num_workers, epoch):
    """What the DataLoader workers of one rank deliver in one epoch, without
    processes: worker w of K runs the same native reader a worker would."""
    workers = max(num_workers, 1)
    batches = []
    for worker in range(workers):
        iterator = dataset.native.iter_epoch(epoch, worker, workers)
        for batch in iter(iterator.next, None):
            batches.append(batch["index"].tolist())
    return batches


def global_batches(dataset, epoch):
    """The epoch's global batches, computed from the fetches (drop_last applied)."""
    native = dataset.native
    batches = []
    for fetch in range(
        (native.plan_size() + dataset.batch_size * dataset.fetch_factor - 1)
        // (dataset.batch_size * dataset.fetch_factor)
    ):
        rows = native.fetch_rows(epoch, fetch).tolist()
        for start in range(0, len(rows), dataset.batch_size):
            batch = rows[start : start + dataset.batch_size]
            if dataset.drop_last and len(batch) < dataset.batch_size:
                continue
            batches.append(batch)
    return batches


def multiset(batches):
    return collections.Counter(tuple(batch) for batch in batches)


def values_of(dtype, shape, seed=0):
    """Random values covering a dtype's whole range (bool, complex, float, int)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype.newbyteorder("="), endpoint=True).astype(dtype)
