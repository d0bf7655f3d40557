"""Where recorded arrays are held while a check runs: in memory, then in a temporary file.

A check holds what both models computed, every activation and gradient, until it has
compared them, so its peak memory grows with the model. Once a :class:`Spool` holds
``above`` bytes in memory, each further array is written once to an unlinked temporary
file (``pwrite``: no page of the process is touched) and handed back as a read-only view
of the file's map. Reading a view pulls its pages in; :meth:`Spool.read` counts what was
read and hands the pages back to the operating system once more than ``budget`` bytes
are held, so a check keeps at most about that much of the spooled recording in memory.
The data stays in the file (the page cache, written back to disk under pressure): a view
read again is read again from it, and stays valid for as long as it lives.

Arrays under a KiB (a loss, a scalar) stay in memory: a view of the map costs more than they
do. A small layer's activations do not: a long watch of many small layers piled them up.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile

import numpy as np

__all__ = ["Spool", "MEMORY_MIB", "SMALL_BYTES", "spoolable", "give_back_heap", "in_file"]

MEMORY_MIB = 256.0
"""Default: a check holds this many MiB of its recording in memory, the rest in a file. The
benchmark transformer (215 MiB) stays in memory; spooling costs it about 5% more time."""

SMALL_BYTES = 1 << 10
"""Arrays below this many bytes are copied in memory, never spooled."""
_ALIGN = 64  # each array starts on a cache line, so every dtype is aligned in the map


def spoolable(a: np.ndarray) -> bool:
    """Whether ``a`` goes to the file once spooling: numbers, and not small."""
    return a.nbytes >= SMALL_BYTES and a.dtype.kind in "biufc"


class Spool:
    """Copies of recorded arrays: the first ``above`` bytes in memory, the rest in one file.

    ``above=None`` keeps everything in memory (no file is ever made). ``chunk`` is how much
    file one map covers (a larger array gets a map of its own); ``budget`` is how many bytes
    of read pages may stay in the process between trims.
    """

    def __init__(
        self, above: int | None, folder: str | None = None, *, chunk: int = 64 << 20, budget: int = 8 << 20
    ) -> None:
        self.above = above
        self.folder = folder
        self._chunk = chunk
        self._budget = budget
        self._fd = -1
        self._maps: list[mmap.mmap] = []
        self._start = 0  # file offset of the last map
        self._used = 0  # bytes of the last map already written
        self._end = 0  # file size
        self._unread = 0  # bytes read since the last trim
        self.held = 0
        """Bytes copied into memory so far."""
        self.written = 0
        """Bytes written to the file so far."""
        self.failure: str | None = None
        """Why spooling stopped (the file could not be written): later arrays stay in memory."""

    @property
    def spooling(self) -> bool:
        """Whether arrays go to the file now."""
        return self.above is not None and self.held >= self.above and self.failure is None

    def keep(self, a: np.ndarray) -> np.ndarray:
        """A copy of ``a`` that no later write to ``a`` changes (read-only when in the file)."""
        return self._hold(a, copy=True)

    def adopt(self, a: np.ndarray) -> np.ndarray:
        """``a`` itself, an array only the caller holds (a sum just made), or its spooled copy."""
        return self._hold(a, copy=False)

    def _hold(self, a: np.ndarray, copy: bool) -> np.ndarray:
        if self.spooling and spoolable(a):
            view = self._write(np.ascontiguousarray(a))
            if view is not None:
                return view
        self.held += a.nbytes
        return np.array(a, copy=True) if copy else a

    def read(self, *arrays: np.ndarray | None) -> None:
        """Count ``arrays`` as read: past the budget, every page read so far is handed back."""
        if self._maps:
            self._unread += sum(a.nbytes for a in arrays if a is not None)
            if self._unread > self._budget:
                self.trim()

    def trim(self) -> None:
        """Hand every page of the maps back to the operating system; the views stay valid."""
        self._unread = 0
        for m in self._maps:
            m.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Stop writing (later arrays are kept in memory); the views stay valid, each map holds the file."""
        self.trim()
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self.above = -1, None

    def _write(self, src: np.ndarray) -> np.ndarray | None:
        n = src.nbytes
        try:
            if self._fd < 0:
                fd, path = tempfile.mkstemp(prefix="nbdiff-spool-", dir=self.folder)
                os.unlink(path)  # the maps keep the data; nothing is left behind however the process ends
                self._fd = fd
            if not self._maps or self._used + n > len(self._maps[-1]):
                self._new_map(n)
            pwrite_all(self._fd, memoryview(src.reshape(-1)).cast("B"), self._start + self._used)
        except OSError as exc:
            self.failure = f"writing recorded tensors to {self.folder or tempfile.gettempdir()} failed ({exc})"
            return None
        view = np.frombuffer(self._maps[-1], dtype=src.dtype, count=src.size, offset=self._used)
        self._used = -(-(self._used + n) // _ALIGN) * _ALIGN
        self.written += n
        return view.reshape(src.shape)

    def _new_map(self, n: int) -> None:
        page = mmap.ALLOCATIONGRANULARITY
        start = -(-self._end // page) * page
        size = max(self._chunk, -(-n // page) * page)
        if hasattr(os, "posix_fallocate"):
            # Blocks allocated up front: writes into them then cost a copy, not a block allocation
            # per page (200 MiB: 50 ms instead of 70-360 ms, and less than copies into new memory).
            os.posix_fallocate(self._fd, start, size)
        else:
            os.ftruncate(self._fd, start + size)
        self._maps.append(mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ, offset=start))
        self._start, self._end, self._used = start, start + size, 0


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def give_back_heap() -> None:
    """Return the C heap's free pages to the operating system (glibc only; elsewhere nothing).

    A framework's freed activations stay in glibc's heap: after one model's step they add to
    the peak of the next, which allocates from a different pool (paddle's, torch's).
    """
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, where it is the C library
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim: ctypes._CFuncPtr | bool | None = None


def in_file(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a file map (a spooled array, or a ``numpy.memmap``)."""
    while isinstance(a, np.ndarray):
        if isinstance(a, np.memmap):
            return True
        a = a.base
    return isinstance(a.obj if isinstance(a, memoryview) else a, mmap.mmap)
