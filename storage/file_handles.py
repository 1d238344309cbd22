"""Lazily opened segment files with a bound on how many descriptors stay open.

Kafka keeps every segment's files open and asks for an open-files limit in the hundreds of thousands.
Here each file of a segment (.log reader and writer, .index, .timeindex, .txnindex writers) is a
LazyFile: opened on first use, and closed again when it becomes the least recently used past
`FileHandleCache.max_open`, so tens of thousands of partitions that are not being read or written
hold no descriptor at all. A new kind of segment file plugs in by keeping a LazyFile instead of an fd.

The descriptor itself lives in an OpenFile that is closed when the last holder lets go of it
(CPython's reference counting makes that prompt). The cache lets go of it on eviction, but a reader
that took it (a fetch's FileRecordsSlice waiting for sendfile on a network thread) keeps it open until
it is done, so a descriptor is never closed under a reader, nor its number reused while one holds it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from pathlib import Path

# Until the broker sizes it from its open-files limit (LogManager does), a bound that suits tests and tools.
DEFAULT_MAX_OPEN = 4096


class OpenFile:
    """One open descriptor, closed when the last reference to it goes away."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class FileHandleCache:
    """Past max_open, files give up their descriptors, the least recently used first (approximately: CLOCK).

    A file in use only sets its reference bit, without the lock: with tens of partitions written in turn, an exact
    LRU reorder under a lock on every append was a visible share of a Produce's CPU. Opening a file past max_open
    sweeps from the oldest: a file used since the sweep last passed it gets a second chance (its bit cleared, moved
    to the young end), one that was not gives up its descriptor.
    """

    def __init__(self, max_open: int = DEFAULT_MAX_OPEN) -> None:
        self.max_open = max(1, max_open)
        self._open: OrderedDict[LazyFile, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, f: LazyFile) -> None:
        evicted: list[LazyFile] = []
        with self._lock:
            self._open[f] = None
            self._open.move_to_end(f)
            while len(self._open) > self.max_open:
                old = next(iter(self._open))
                if old is f or old.referenced:
                    old.referenced = False
                    self._open.move_to_end(old)
                    continue
                del self._open[old]
                evicted.append(old)
        # Outside the cache lock: dropping the last reference closes the descriptor.
        for old in evicted:
            old.release()

    def forget(self, f: LazyFile) -> None:
        with self._lock:
            self._open.pop(f, None)


SEGMENT_FILES = FileHandleCache()


class LazyFile:
    """A file opened with `flags` on first use and reopened after an eviction; moved with rename()."""

    __slots__ = ("path", "flags", "_handle", "_lock", "_cache", "_closed", "referenced", "__weakref__")

    def __init__(self, path: Path, flags: int, cache: FileHandleCache | None = None) -> None:
        self.path = path
        self.flags = flags
        self._handle: OpenFile | None = None
        self._lock = threading.Lock()
        self._cache = cache if cache is not None else SEGMENT_FILES
        self._closed = False
        self.referenced = False  # used since the cache's sweep last passed this file

    def get(self) -> OpenFile:
        """The open file; hold the returned object (not just its fd) for as long as the fd is used."""
        h = self._handle
        if h is None:
            opened = False
            with self._lock:
                if self._closed:
                    raise OSError(errno.EBADF, f"{self.path} is closed")
                h = self._handle
                if h is None:
                    h = self._handle = OpenFile(os.open(self.path, self.flags, 0o644))
                    opened = True
            if opened:
                self._cache.opened(self)
        self.referenced = True
        return h

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Let go of the descriptor (it closes once current users are done); the next get() reopens."""
        with self._lock:
            self._handle = None
        self._cache.forget(self)

    def rename(self, path: Path, *, missing_ok: bool = False) -> None:
        """Move the file on disk and follow it; under the lock, so no reopen sees neither name."""
        with self._lock:
            try:
                os.replace(self.path, path)
            except FileNotFoundError:
                if not missing_ok:
                    raise
            self.path = path

    def close(self) -> None:
        """Release for good: get() fails from now on."""
        with self._lock:
            self._closed = True
            self._handle = None
        self._cache.forget(self)

    def __repr__(self) -> str:
        return f"LazyFile({self.path}, open={self.is_open})"
