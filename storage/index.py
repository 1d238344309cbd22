"""Sparse per-segment indexes: OffsetIndex (offset -> file position) and TimeIndex (timestamp -> offset).

On disk the formats are Kafka's (big-endian, relative offsets). Files are append-only and
not preallocated, so the entry count is simply size // entry_size and a clean restart needs
no trimming. Entries are loaded lazily on the first lookup: a broker restart with many
segments only stats the files. Lookups are binary searches over in-memory arrays; appends
are O(1). Readers never lock after the lazy load: appends only grow the arrays (values before
keys, so a reader's len(keys) never exceeds len(values)) and truncation swaps in new arrays.

Appended entries reach the file in batches, as Kafka's memory-mapped index pages do: at the log's flush (before
its fsync), when the segment closes or stops being active, and every PENDING_BYTES. Each append was two small
writes (offset and time index) next to the produced batch's own. A crash loses at most the entries after the
recovery point, whose segments recovery re-indexes anyway; an index missing its last entries is still correct
(it is sparse: a lookup scans a little further).
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
import threading
from array import array
from pathlib import Path

from kbroker.storage.file_handles import LazyFile

_INT32_MAX = 2**31 - 1
PENDING_BYTES = 4096


class IndexCorruptError(Exception):
    pass


class _Index:
    """Keeps entries in the file's own (relative) form; subclasses convert at their API."""

    entry_size: int
    _struct: struct.Struct
    _typecode = "q"

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_size // self.entry_size)
        self._lock = threading.Lock()
        # Appends go through a descriptor opened on first append and closed when idle (storage.file_handles).
        self._writer = LazyFile(path, os.O_WRONLY | os.O_APPEND)
        self._dirty = False
        try:
            file_size = path.stat().st_size
        except FileNotFoundError:
            path.touch()
            file_size = 0
        self._count = file_size // self.entry_size
        if file_size % self.entry_size:
            # A torn final entry (crash mid-write) would misalign every later append.
            file_size = self._count * self.entry_size
            os.truncate(path, file_size)
        self._file_size = file_size  # what the file holds; _count includes the entries still in _pending
        self._pending = bytearray()
        self._entries: tuple[array[int], array[int]] | None = None
        # The last entry, kept so that every append need not read it back from the file; False: unknown.
        self._last: tuple[int, int] | None | bool = False

    # -- loading -------------------------------------------------------------------------------

    def _load(self) -> tuple[array[int], array[int]]:
        entries = self._entries
        if entries is not None:
            return entries
        with self._lock:
            if self._entries is None:
                self._entries = self._parse(self.path.read_bytes()[: self._file_size] + self._pending)
            return self._entries

    def _parse(self, data: bytes) -> tuple[array[int], array[int]]:
        keys: array[int] = array(self._typecode)
        values: array[int] = array(self._typecode)
        for k, v in self._struct.iter_unpack(data):
            keys.append(k)
            values.append(v)
        return keys, values

    def _last_raw(self) -> tuple[int, int] | None:
        """Last entry as (key, value) without loading the whole file."""
        last = self._last
        if last is not False:
            return last  # type: ignore[return-value]
        last = self._read_last()
        self._last = last
        return last

    def _read_last(self) -> tuple[int, int] | None:
        entries = self._entries
        if entries is not None:
            keys, values = entries
            n = len(keys)
            return (keys[n - 1], values[n - 1]) if n else None
        with self._lock:
            if self._count == 0:
                return None
            if self._pending:
                a, b = self._struct.unpack_from(self._pending, len(self._pending) - self.entry_size)
                return a, b
            with open(self.path, "rb") as f:
                f.seek(self._file_size - self.entry_size)
                a, b = self._struct.unpack(f.read(self.entry_size))
            return a, b

    # -- writing -------------------------------------------------------------------------------

    def _append_raw(self, key: int, value: int, packed: bytes) -> None:
        with self._lock:
            pending = self._pending
            pending += packed
            self._dirty = True
            self._last = (key, value)
            self._count += 1
            if self._entries is not None:
                keys, values = self._entries
                values.append(value)
                keys.append(key)
            if len(pending) >= PENDING_BYTES:
                self._write_pending()

    def _write_pending(self) -> None:
        """Append the pending entries to the file (under _lock)."""
        pending = self._pending
        if not pending:
            return
        fd = self._writer.get().fd
        done = os.write(fd, pending)
        while done < len(pending):  # a short write (rare): the rest
            done += os.write(fd, memoryview(pending)[done:])
        self._file_size += len(pending)
        self._pending = bytearray()

    def _truncate_entries(self, n: int) -> None:
        with self._lock:
            if n >= self._count:
                return
            if self._entries is not None:
                keys, values = self._entries
                self._entries = (keys[:n], values[:n])
            self._count = n
            self._last = False
            size = n * self.entry_size
            if size >= self._file_size:
                del self._pending[size - self._file_size :]
            else:
                self._pending = bytearray()
                self._file_size = size
                os.truncate(self.path, size)

    def reset(self) -> None:
        with self._lock:
            self._entries = (array(self._typecode), array(self._typecode))
            self._last = None
            self._count = 0
            self._file_size = 0
            self._pending = bytearray()
            os.truncate(self.path, 0)

    # -- misc ----------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._count

    @property
    def is_full(self) -> bool:
        return self._count >= self.max_entries

    def sanity_check(self) -> None:
        size = self.path.stat().st_size
        if size % self.entry_size:
            raise IndexCorruptError(f"index file {self.path} has size {size}, not a multiple of {self.entry_size}")

    def flush(self) -> None:
        with self._lock:
            if self._dirty:
                self._write_pending()
                # The appends' descriptor may have been closed since: any descriptor flushes the inode.
                writer = self._writer.get()
                os.fsync(writer.fd)
                self._dirty = False

    def close_writer(self) -> None:
        with self._lock:
            self._write_pending()
            self._writer.release()

    def close(self) -> None:
        self.close_writer()

    def rename_to(self, path: Path) -> None:
        with self._lock:
            self._writer.rename(path)
            self.path = path

    def delete_file(self) -> None:
        with self._lock:
            self._pending = bytearray()  # the file goes: nothing to write
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class OffsetIndex(_Index):
    """Entries (relative offset int32, position int32): the last offset of a batch -> that batch's position."""

    entry_size = 8
    _struct = struct.Struct(">ii")
    _typecode = "i"

    def _parse(self, data: bytes) -> tuple[array[int], array[int]]:
        # C-speed load: this runs on the first fetch from a segment after a restart.
        raw: array[int] = array("i")
        raw.frombytes(data)
        if sys.byteorder == "little":
            raw.byteswap()
        return raw[0::2], raw[1::2]

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if not 0 <= rel <= _INT32_MAX:
            raise ValueError(f"offset {offset} is not representable relative to {self.base_offset}")
        last = self._last_raw()
        if last is not None and rel <= last[0]:
            raise ValueError(f"index append of offset {offset} not larger than last entry {last[0] + self.base_offset}")
        self._append_raw(rel, position, self._struct.pack(rel, position))

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry with offset <= target, else (base_offset, 0)."""
        keys, values = self._load()
        n = len(keys)
        rel = max(-1, min(target_offset - self.base_offset, _INT32_MAX))
        i = bisect.bisect_right(keys, rel, 0, n) - 1
        if i < 0:
            return self.base_offset, 0
        return keys[i] + self.base_offset, values[i]

    def lookup_by_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the largest entry with position <= the given one, else (base_offset, 0)."""
        keys, values = self._load()
        n = len(keys)
        i = bisect.bisect_right(values, min(position, _INT32_MAX), 0, n) - 1
        if i < 0:
            return self.base_offset, 0
        return keys[i] + self.base_offset, values[i]

    def last_entry(self) -> tuple[int, int]:
        last = self._last_raw()
        return (last[0] + self.base_offset, last[1]) if last is not None else (self.base_offset, 0)

    def truncate_to(self, offset: int) -> None:
        """Drop entries with offset >= the given one."""
        keys, _ = self._load()
        self._truncate_entries(bisect.bisect_left(keys, offset - self.base_offset))


class TimeIndex(_Index):
    """Entries (timestamp int64, relative offset int32); timestamps strictly increase."""

    entry_size = 12
    _struct = struct.Struct(">qi")

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bool:
        if not skip_full_check and self.is_full:
            raise ValueError(f"time index {self.path} is full")
        rel = offset - self.base_offset
        last = self._last_raw()
        if last is not None and (timestamp <= last[0] or rel < last[1]):
            return False
        if not 0 <= rel <= _INT32_MAX:
            raise ValueError(f"offset {offset} is not representable relative to {self.base_offset}")
        self._append_raw(timestamp, rel, self._struct.pack(timestamp, rel))
        return True

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry with timestamp <= target, else (-1, base_offset)."""
        keys, values = self._load()
        n = len(keys)
        i = bisect.bisect_right(keys, target_timestamp, 0, n) - 1
        if i < 0:
            return -1, self.base_offset
        return keys[i], values[i] + self.base_offset

    def last_entry(self) -> tuple[int, int]:
        last = self._last_raw()
        return (last[0], last[1] + self.base_offset) if last is not None else (-1, self.base_offset)

    def truncate_to(self, offset: int) -> None:
        """Drop entries pointing at offset >= the given one."""
        _, values = self._load()
        self._truncate_entries(bisect.bisect_left(values, offset - self.base_offset))
