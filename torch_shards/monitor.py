"""Loader monitoring: is data loading what slows training down?

``MonitoredLoader`` wraps a DataLoader (or a ShardedDataset) and measures, per
window of ``log_every`` steps, samples/s, MB/s, the fraction of the step time
spent waiting for data, how many batches are ready ahead of the loop, and how
much each DataLoader worker (or native reader thread) delivered.
"""

import numbers
import time

import torch


def _rows_and_bytes(batch):
    """(rows, bytes) of a batch: a dict of tensors, a tensor, or a sequence of them."""
    if isinstance(batch, dict):
        values = list(batch.values())
        index = batch.get("index")
        rows = int(index.shape[0]) if isinstance(index, torch.Tensor) else None
    elif isinstance(batch, (list, tuple)):
        values, rows = list(batch), None
    else:
        values, rows = [batch], None
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.layout == torch.sparse_csr:
                parts = (value.crow_indices(), value.col_indices(), value.values())
                total += sum(part.numel() * part.element_size() for part in parts)
            else:
                total += value.numel() * value.element_size()
            if rows is None and value.dim() > 0:
                rows = int(value.shape[0])
    return rows or 0, total


def _cuda_device_or_none(device):
    """The CUDA device whose memory is reported, None for none or a CPU device."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"MonitoredLoader: device must be a torch.device, str or int, got {device!r}") from error
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise ValueError(f"MonitoredLoader: device={device} but this torch has no CUDA device")
    return device


class MonitoredLoader:
    """Iterates ``loader`` and measures it.

    ``len(monitored) == len(loader)``, so ``tqdm(monitored)`` shows a real
    progress bar. Call ``mark_step(extra=None)`` once per training step: every
    ``log_every`` steps it returns a dict for your logger (with ``extra``
    merged in), else None. ``summary()`` gives the totals so far.

    Metrics (prefix ``data/``): ``samples_per_s``, ``mb_per_s``,
    ``wait_fraction`` (time blocked waiting for the next batch / step time),
    ``steps_per_s``; for a ShardedDataset also ``ready_batches`` (batches its
    DataLoader workers produced that the loop has not consumed yet),
    ``queue_depth`` (units its native reader threads hold ready), per worker
    ``worker<k>/batches`` and per reader thread ``thread<k>/units`` in the
    window.

    ``device`` (wsistream's argument): the device the training steps run on;
    for a CUDA device the metrics add ``gpu_memory_gb`` (allocated by torch)
    and ``gpu_peak_memory_gb`` on it.

    Args:
        loader: a DataLoader, a ShardedDataset, or any iterable of batches.
        log_every: steps per window, at least 1. Default 100.
        dataset: the ShardedDataset whose workers and reader threads are
            reported. Default None: ``loader`` itself or ``loader.dataset``,
            when it is one.
        device: the device the training steps run on (a torch.device, str or
            int). Default None: no GPU memory metrics.
        prefix: the prefix of every metric's name. Default ``"data/"``.

    Raises:
        ValueError: ``log_every`` is not an int >= 1; ``device`` is not a
            device, or is a CUDA device where torch has no CUDA.

    Example:
        ```python
        import torch
        import torch_shards as ts

        dataset = ts.ShardedDataset(ts.TensorSource(torch.randn(256, 4)), ts.Streaming(), batch_size=32)
        monitored = ts.MonitoredLoader(ts.DataLoader(dataset), log_every=4)
        for step, batch in enumerate(monitored):
            metrics = monitored.mark_step()
            if metrics is not None:
                assert 0.0 <= metrics["data/wait_fraction"] <= 1.0
        assert monitored.summary()["data/batches"] == 8
        ```
    """

    def __init__(self, loader, *, log_every=100, dataset=None, device=None, prefix="data/"):
        from .dataset import ShardedDataset

        if isinstance(log_every, bool) or not isinstance(log_every, numbers.Integral) or log_every < 1:
            raise ValueError(f"MonitoredLoader: log_every must be an int >= 1, got {log_every!r}")
        self.loader = loader
        self.log_every = int(log_every)  # numpy's ints too
        self.device = _cuda_device_or_none(device)
        self.prefix = prefix
        if dataset is None:
            dataset = loader if isinstance(loader, ShardedDataset) else getattr(loader, "dataset", None)
        self.dataset = dataset if isinstance(dataset, ShardedDataset) else None
        self._steps = 0
        self._total = {"samples": 0, "bytes": 0, "wait": 0.0, "batches": 0, "start": None}
        self._baseline = None  # delivery counts when monitoring began
        self._reset_window()

    def __len__(self):
        return len(self.loader)

    def _reset_window(self):
        self._window = {"samples": 0, "bytes": 0, "wait": 0.0, "batches": 0, "start": time.perf_counter()}
        self._window_counts = self.dataset.delivery_counts() if self.dataset is not None else None
        self._window_threads = self._thread_units()

    def _thread_units(self):
        units = {}
        if self.dataset is None:
            return units
        for stats in self.dataset.reader_stats():
            for key, value in stats.items():
                if key.startswith("thread") and key.endswith("_units"):
                    units[key] = units.get(key, 0) + value
        return units

    def __iter__(self):
        if self._total["start"] is None:
            self._total["start"] = time.perf_counter()
            if self.dataset is not None:
                self._baseline = self.dataset.delivery_counts()
        iterator = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            waited = time.perf_counter() - start
            rows, size = _rows_and_bytes(batch)
            for totals in (self._window, self._total):
                totals["samples"] += rows
                totals["bytes"] += size
                totals["wait"] += waited
                totals["batches"] += 1
            yield batch

    def mark_step(self, extra=None):
        """Marks the end of a training step.

        Args:
            extra: a dict of your own metrics merged into what is returned.
                Default None.

        Returns:
            dict | None: every ``log_every`` steps, the window's metrics (then
            a new window starts); None at the other steps.

        Raises:
            TypeError: ``extra`` is not a dict.
        """
        if extra is not None and not isinstance(extra, dict):
            raise TypeError(f"MonitoredLoader.mark_step: extra must be a dict of metrics, got {extra!r}")
        self._steps += 1
        if self._steps % self.log_every:
            return None
        payload = self._metrics(self._window)
        payload.update(self._workers())
        payload.update(self._device_memory())
        if extra:
            payload.update(extra)
        self._reset_window()
        return payload

    def summary(self):
        """The metrics over everything since the first batch.

        Returns:
            dict: ``samples_per_s``, ``mb_per_s``, ``wait_fraction``,
            ``steps_per_s`` and ``batches``, each with the prefix.
        """
        return self._metrics(self._total)

    def _metrics(self, totals):
        elapsed = max(time.perf_counter() - (totals["start"] or time.perf_counter()), 1e-9)
        p = self.prefix
        return {
            f"{p}samples_per_s": totals["samples"] / elapsed,
            f"{p}mb_per_s": totals["bytes"] / 1e6 / elapsed,
            f"{p}wait_fraction": min(1.0, totals["wait"] / elapsed),
            f"{p}steps_per_s": totals["batches"] / elapsed,
            f"{p}batches": totals["batches"],
        }

    def _device_memory(self):
        if self.device is None:
            return {}
        return {
            f"{self.prefix}gpu_memory_gb": torch.cuda.memory_allocated(self.device) / 2**30,
            f"{self.prefix}gpu_peak_memory_gb": torch.cuda.max_memory_allocated(self.device) / 2**30,
        }

    def _workers(self):
        p = self.prefix
        out = {}
        if self.dataset is None:
            return out
        now = self.dataset.delivery_counts()
        delivered = now - self._window_counts
        main_slot = now.shape[0] - 1  # DataLoader workers first, then the process iterating in place
        for slot in torch.nonzero(delivered[:, 0]).flatten().tolist():
            name = "main" if slot == main_slot else f"worker{slot}"
            out[f"{p}{name}/batches"] = int(delivered[slot, 0])
        # Produced by the workers since monitoring began, not consumed yet.
        produced = int((now - self._baseline)[:, 0].sum()) if self._baseline is not None else 0
        out[f"{p}ready_batches"] = max(0, produced - self._total["batches"])
        out[f"{p}queue_depth"] = sum(stats.get("queue_depth", 0) for stats in self.dataset.reader_stats())
        threads = self._thread_units()
        for key, value in sorted(threads.items()):
            out[f"{p}{key[: -len('_units')]}/units"] = value - self._window_threads.get(key, 0)
        return out
