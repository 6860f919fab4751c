"""Page-cache control, so benchmarks and measurements see cold reads without dropping every cache."""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def evict(paths: Iterable[str | os.PathLike]) -> int:
    """Drop the cached pages of exactly these files (``posix_fadvise`` DONTNEED); return how many were evicted.

    Needs no root, and leaves every other file's cache alone. Dirty pages are written back first,
    since the kernel keeps pages it has not written. Files that cannot be opened are skipped.
    """
    evicted = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            evicted += 1
        finally:
            os.close(fd)
    return evicted


def resident_bytes(path: str | os.PathLike) -> int:
    """Bytes of ``path`` now in the page cache (``mincore`` over a read-only map of the file).

    Tells whether :func:`evict` worked: file systems such as NFS, FUSE or tmpfs may ignore
    DONTNEED, and then "cold" figures are warm ones.
    """
    pages = resident_pages(path)
    return min(os.stat(path).st_size, int(np.count_nonzero(pages)) * mmap.PAGESIZE)


def resident_pages(path: str | os.PathLike) -> np.ndarray:
    """Which pages of ``path`` are in the page cache: one bool per ``mmap.PAGESIZE`` bytes."""
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return np.zeros(0, bool)
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap failed on {path}")
        try:
            vector = np.zeros(-(-size // mmap.PAGESIZE), np.uint8)
            if libc.mincore(ctypes.c_void_p(address), size, vector.ctypes.data_as(ctypes.c_void_p)) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)
    return (vector & 1).astype(bool)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def willneed(fd: int, start: int, length: int) -> None:
    """Ask the kernel to read ``length`` bytes of ``fd`` from ``start`` into the page cache, in the background.

    Linux reads at most max(read_ahead_kb, max_sectors_kb) per ``posix_fadvise(WILLNEED)`` call
    (128 KB to a few MB on most machines) and silently drops the rest of the range; a read of a
    dropped page then waits behind everything queued. So the range goes out in pieces of that size,
    up to the end of the file only: a wild range (a damaged index's) costs no more than the file.
    """
    stat = os.fstat(fd)
    step = _readahead_cap(stat.st_dev)
    end = min(start + length, stat.st_size)
    while start < end:
        os.posix_fadvise(fd, start, min(step, end - start), os.POSIX_FADV_WILLNEED)
        start += step


@functools.lru_cache(maxsize=64)
def _readahead_cap(device: int) -> int:
    """Bytes one WILLNEED call reads on ``device``: the larger of its read-ahead and its largest
    request (``force_page_cache_ra`` in mm/readahead.c); 128 KB, Linux's default, when unknown."""
    key = f"{os.major(device)}:{os.minor(device)}"
    sizes = []
    for path in (f"/sys/class/bdi/{key}/read_ahead_kb", f"/sys/dev/block/{key}/queue/max_sectors_kb",
                 f"/sys/dev/block/{key}/../queue/max_sectors_kb"):
        try:
            sizes.append(int(Path(path).read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=128) * 1024
