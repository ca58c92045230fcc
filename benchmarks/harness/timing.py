"""Reading epoch after epoch for a time budget, as a training loop would, and what it cost."""

import collections
import resource
import time

Timed = collections.namedtuple("Timed", "rows seconds cpu_seconds batches")


def cpu_seconds():
    """CPU time of this process, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def index_rows(batch):
    """Rows of a torch_shards batch."""
    return batch["index"].shape[0]


def run_for(iterable, seconds, rows_of=index_rows):
    """Batches of the iterable, epoch after epoch, for `seconds` (0 or None: to the end of the first
    epoch). The clock starts at the first batch, so start-up is not counted; every later epoch's is.
    Returns Timed(rows, seconds, cpu_seconds, batches) of the batches after the first."""
    rows = batches = 0
    start = cpu_start = None
    while True:
        for batch in iterable:
            if start is None:
                start, cpu_start = time.perf_counter(), cpu_seconds()
                continue
            rows += rows_of(batch)
            batches += 1
            if seconds and time.perf_counter() - start > seconds:
                return Timed(rows, time.perf_counter() - start, cpu_seconds() - cpu_start, batches)
        if start is None:  # nothing to read
            return Timed(0, 0.0, 0.0, 0)
        if not seconds:
            return Timed(rows, time.perf_counter() - start, cpu_seconds() - cpu_start, batches)


def epoch(iterable, rows_of=index_rows):
    """One whole epoch, start-up included: (rows, seconds)."""
    start = time.perf_counter()
    rows = 0
    for batch in iterable:
        rows += rows_of(batch)
    return rows, time.perf_counter() - start
