"""The queues between ts.DataLoader's training process and its workers:
torch's own DataLoader, given a multiprocessing context whose ``Queue()``
makes a :class:`DirectQueue`.

A ``multiprocessing.Queue`` hands every item to a feeder thread, which
pickles it and writes it to the queue's pipe. torch's DataLoader puts one
index per item into a worker's queue and the worker one result per item
into the result queue: each item wakes two feeder threads. In the training
process the index queue's feeder also takes the GIL from the loop, which
torch gives up at every tensor it frees (each batch dropped). A
DirectQueue writes a small item to the pipe itself, in the thread that puts
it, when that write cannot wait (below); otherwise, and for good in that
process once it did so, it puts as ``multiprocessing.Queue`` does, so that
one process's items always arrive in the order it put them (torch counts on
it: a worker's end-of-epoch marker must not overtake its last batch).
Reading is unchanged. An item that cannot be pickled raises in the thread
that puts it, where the feeder thread printed the error and dropped the
item, and torch's DataLoader then waited for it forever.

A write to a Linux pipe waits only when the pipe lacks free page-sized
slots for it (16, 64 KiB, by default). With queued and written bytes
together at most 16 KiB, it never does: a new page is started only when a
write's bytes did not fit in the last one, so any two consecutive pages
after the first (which the reader may have emptied in part) hold more than
a page's bytes, and under 16 KiB occupy at most 8 pages; the write needs at
most 4 more. The queued bytes are read (FIONREAD) under the queue's write
lock, which every writer holds while it writes: until this write they can
only shrink. Pipes given fewer slots (a user over fs.pipe-user-pages-soft)
are written through the feeder thread.
"""

import fcntl
import multiprocessing
import multiprocessing.context
import multiprocessing.queues
import os
import queue
import struct
import termios
from multiprocessing.reduction import ForkingPickler

# Queued plus written bytes (with the 4-byte header) beyond which a put goes through the feeder thread.
_DIRECT_BYTES = 16 << 10
_SLOTS_BYTES = 64 << 10  # the pipe capacity _DIRECT_BYTES is safe for (16 pages)
_LOCK_WAIT_SECONDS = 0.05  # the most a put waits for the write lock before going through the feeder
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)  # Linux's (Python 3.9's fcntl lacks the name)


def _pipe_capacity(fd):
    """Bytes the pipe `fd` holds at most (0 where it cannot be told: another kind of file or system)."""
    try:
        return fcntl.fcntl(fd, _F_GETPIPE_SZ)
    except OSError:
        return 0


class _Pickled:
    """An item pickled already, handed to the feeder thread: it pickles as a call that unpickles it."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __reduce__(self):
        return (ForkingPickler.loads, (self.data,))


class DirectQueue(multiprocessing.queues.Queue):
    """A ``multiprocessing.Queue`` whose ``put()`` writes small items to the
    pipe in the calling thread when the write cannot wait, else (and from
    then on in that process) through the feeder thread as usual."""

    def __init__(self, maxsize=0, *, ctx):
        super().__init__(maxsize, ctx=ctx)
        self._direct_pid = None

    def __setstate__(self, state):
        super().__setstate__(state)
        self._direct_pid = None

    def _direct(self):
        """Whether this process may still write directly (checked once per process: the pipe's capacity)."""
        pid = os.getpid()
        if self._direct_pid != pid:
            self._direct_pid = pid
            self._direct_here = self._wlock is not None and _pipe_capacity(self._writer.fileno()) >= _SLOTS_BYTES
        return self._direct_here

    def put(self, obj, block=True, timeout=None):
        if self._closed or not self._direct():
            return super().put(obj, block, timeout)
        data = ForkingPickler.dumps(obj)
        if not self._sem.acquire(block, timeout):
            raise queue.Full
        # Another writer holds the lock for a write's microseconds, or a few milliseconds when the scheduler
        # preempts it there (waiting 1 ms instead sent 1 of 2 workers to their feeder thread within seconds on
        # 2 CPUs); longer only while it waits for room in a full pipe, which this write would wait for too.
        if len(data) + 4 <= _DIRECT_BYTES and self._wlock.acquire(True, _LOCK_WAIT_SECONDS):
            try:
                queued = struct.unpack("i", fcntl.ioctl(self._writer.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
                if queued + len(data) + 4 <= _DIRECT_BYTES:
                    self._writer.send_bytes(data)
                    return
            finally:
                self._wlock.release()
        # Through the feeder thread, for good in this process: what it has yet to write goes first.
        self._direct_here = False
        self._sem.release()
        super().put(_Pickled(bytes(data)), block, timeout)


class _DirectQueues:
    """A multiprocessing context whose Queue() is a DirectQueue."""

    def Queue(self, maxsize=0):
        return DirectQueue(maxsize, ctx=self.get_context())


class _Fork(_DirectQueues, multiprocessing.context.ForkContext):
    pass


class _Spawn(_DirectQueues, multiprocessing.context.SpawnContext):
    pass


class _ForkServer(_DirectQueues, multiprocessing.context.ForkServerContext):
    pass


_BY_METHOD = {"fork": _Fork, "spawn": _Spawn, "forkserver": _ForkServer}
_STANDARD = (
    multiprocessing.context.ForkContext,
    multiprocessing.context.SpawnContext,
    multiprocessing.context.ForkServerContext,
)


def direct_context(context):
    """The multiprocessing context ts.DataLoader gives torch's DataLoader for
    ``context`` (its ``multiprocessing_context`` argument): the same start
    method, with DirectQueue queues. None is the default start method, read
    now (without fixing it, as ``multiprocessing.get_context()`` would); a
    context of any other kind, or a name torch refuses, is returned as it is.
    """
    if context is None:
        context = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if isinstance(context, str):
        method = context
    elif type(context) in _STANDARD:
        method = context.get_start_method()
    else:
        return context
    if method not in _BY_METHOD or method not in multiprocessing.get_all_start_methods():
        return context
    return _BY_METHOD[method]()


__all__ = ["DirectQueue", "direct_context"]
