"""The kernel's page cache of a dataset's files: evicting them (a first epoch read from the disk, not from
memory) and measuring how much of them is held in memory, without privileges (posix_fadvise, mincore)."""

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))


def files(root):
    """Every regular file under root (root itself if it is a file)."""
    if os.path.isfile(root):
        return [root]
    return [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in sorted(names)]


def evict(root):
    """Drops the page cache's pages of every file under root (POSIX_FADV_DONTNEED drops clean pages only:
    a file written moments ago is written back first)."""
    for path in files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(root):
    """Reads every file under root (root itself if it is a file) into the page cache."""
    for path in files(root):
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def resident_fraction(root):
    """The fraction of the bytes of the files under root whose pages are in memory now (mincore)."""
    page = mmap.PAGESIZE
    resident = total = 0
    for path in files(root):
        size = os.path.getsize(path)
        if size == 0:
            continue
        pages = (size + page - 1) // page
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
            first = ctypes.c_char.from_buffer(mapped)  # the mapping's address (released before it closes)
            vector = (ctypes.c_ubyte * pages)()
            failed = _libc.mincore(ctypes.addressof(first), size, vector) != 0
            del first
            if failed:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            resident += sum(1 for v in vector if v & 1) * page
        total += pages * page
    return resident / total if total else 1.0
