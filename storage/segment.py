"""LogSegment: one .log file of whole batches plus its offset, time and transaction indexes."""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

from kbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    BATCH_OVERHEAD,
    DEFAULT_MAX_DECOMPRESSED,
    LOG_OVERHEAD,
    RecordBatchHeader,
    decode_records,
    parse_batch_header,
)
from kbroker.storage.file_handles import LazyFile, OpenFile
from kbroker.storage.index import OffsetIndex, TimeIndex
from kbroker.storage.leader_append import APPEND_WALK, PlainWritten, append_plain, write_plain
from kbroker.storage.producer_state import ProducerStateEntry
from kbroker.storage.transaction_index import TXN_INDEX_SUFFIX, TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"

# Header scans read this much at a time: many small batches per syscall, little waste on big ones.
_SCAN_CHUNK = 16 * 1024
_PAGE = 4096
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


def _scan_chunk(position: int, sequential: bool) -> int:
    """How much a header scan reads at position: a whole chunk when it runs on past its last read (small batches
    one after another); else, at its start (most often an index entry a few headers before the one wanted) or
    after a jump over a large batch, only to the end of the page. Copying 16 KB out of the page cache for one
    61-byte header was a fifth of a read from an older offset (1,000 partitions, in-process)."""
    if sequential:
        return _SCAN_CHUNK
    n = _PAGE - position % _PAGE
    return n if n >= BATCH_HEADER_SIZE else n + _PAGE


def _recent_end(recent: list[tuple[int, int]], n: int, limit: int, size: int, after: int) -> tuple[int, int] | None:
    """Where a read of whole batches up to position limit ends, from the first n recent batches (those whole within
    size, the last ending at size): (end position, next offset), or None when they hold no batch that starts at or
    after `after` (the read's first batch) and ends by limit."""
    k = bisect.bisect_right(recent, limit, 0, n, key=_POSITION)
    end = n if k == n and size <= limit else k - 1  # batches before recent[end] fit, each ending where the next starts
    if end < 1 or recent[end - 1][1] < after:
        return None
    return (recent[end][1] if end < n else size), recent[end - 1][0] + 1


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


@dataclass(slots=True)
class FileRecordsSlice:
    """A byte range of a segment file; the broker sendfile()s it straight to the socket.

    The slice holds the open file itself, so its fd stays open while the slice lives even when the
    segment's handle is evicted or the segment closed and deleted meanwhile.
    """

    file: OpenFile
    position: int
    size: int

    @property
    def fd(self) -> int:
        return self.file.fd

    def read_bytes(self) -> bytes:
        chunks = []
        pos, remaining = self.position, self.size
        while remaining > 0:
            chunk = os.pread(self.file.fd, remaining, pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


@dataclass(slots=True)
class BatchLocation:
    position: int
    header: RecordBatchHeader

    @property
    def size(self) -> int:
        return self.header.batch_length + LOG_OVERHEAD


@dataclass(slots=True)
class SegmentReadResult:
    records: FileRecordsSlice | None
    first_entry_incomplete: bool = False
    # The offset after the last batch returned (the upper bound for aborted transactions of a fetch).
    next_offset: int = -1


# LogSegment._read_recent's answer when the recent batches do not cover the read (never returned by read()).
_NOT_RECENT = SegmentReadResult(None)
_RECENT_BATCHES = 64
_LAST_OFFSET = itemgetter(0)
_POSITION = itemgetter(1)


class LogSegment:
    """Mutated only under the owning Log's lock; reads are lock-free snapshots of `size`."""

    def __init__(self, dir: Path, base_offset: int, *, index_interval_bytes: int, max_index_size: int,
                 suffix: str = "", create: bool = False) -> None:
        self.dir = dir
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix
        self.log_path = dir / (segment_file_name(base_offset, LOG_SUFFIX) + suffix)
        if create:
            os.close(os.open(self.log_path, os.O_WRONLY | os.O_CREAT, 0o644))
        self._size = os.stat(self.log_path).st_size  # FileNotFoundError for a missing segment, as before
        # (last offset, position) of the batches appended last, the segment's tail: the reads of a replicated
        # partition stop at the high watermark just behind the log end, and finding it from the offset index meant
        # parsing every batch header of up to index.interval.bytes, twice per read (Kafka keeps the high
        # watermark's position with it; this is the same shortcut for any offset near the end). Replaced, never
        # changed in place but for appends, so lock-free readers see a consistent list.
        self._recent: list[tuple[int, int]] = []
        # One descriptor for reads (pread, sendfile) and writes (pwrite): opened on first use, closed again
        # when idle (storage.file_handles).
        self._file = LazyFile(self.log_path, os.O_RDWR)
        self.index = OffsetIndex(dir / (segment_file_name(base_offset, INDEX_SUFFIX) + suffix), base_offset,
                                 max_index_size)
        self.time_index = TimeIndex(dir / (segment_file_name(base_offset, TIME_INDEX_SUFFIX) + suffix),
                                    base_offset, max_index_size)
        self.txn_index = TransactionIndex(dir / (segment_file_name(base_offset, TXN_INDEX_SUFFIX) + suffix),
                                          base_offset)
        self._bytes_since_last_index_entry = 0
        # Loaded lazily from the time index (a clean restart must not scan data).
        self._max_ts: tuple[int, int] | None = None
        # Wall-clock of the first append since open; for loaded segments the first batch's
        # timestamp is used instead (Kafka's rollingBasedTimestamp).
        self._rolling_base_ms: int | None = None
        self._closed = False
        self._close_lock = threading.Lock()

    # -- properties ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    def reader(self) -> OpenFile:
        """The .log file open for reading; keep the returned object while its fd is in use."""
        return self._file.get()

    @property
    def max_timestamp_and_offset(self) -> tuple[int, int]:
        """(largest batch maxTimestamp, last offset of that batch); (-1, base) when empty."""
        if self._max_ts is None:
            ts, off = self.time_index.last_entry()
            if ts < 0 and self._size > 0:
                # Only an index-less segment (e.g. a small active one) lands here.
                for loc in self.iter_batches():
                    if loc.header.max_timestamp > ts:
                        ts, off = loc.header.max_timestamp, loc.header.last_offset
            self._max_ts = (ts, off)
        return self._max_ts

    @property
    def max_timestamp(self) -> int:
        return self.max_timestamp_and_offset[0]

    def largest_timestamp(self) -> int:
        """For time retention: max record timestamp, or the file's mtime when there is none."""
        ts = self.max_timestamp
        if ts >= 0:
            return ts
        return int(os.stat(self.log_path).st_mtime * 1000)

    def rolling_base_ms(self) -> int | None:
        if self._rolling_base_ms is None and self._size > 0:
            first = next(self.iter_batches(), None)
            if first is not None:
                self._rolling_base_ms = first.header.max_timestamp
        return self._rolling_base_ms

    def time_waited_for_roll(self, now_ms: int) -> int:
        base = self.rolling_base_ms()
        return 0 if base is None else now_ms - base

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    # -- writes --------------------------------------------------------------------------------

    def _writer(self) -> OpenFile:
        return self._file.get()

    def append(self, data: bytes | bytearray | memoryview, batches: list[tuple[int, RecordBatchHeader]],
               now_ms: int | None = None) -> None:
        """Write whole batches at the end; batches are (position within data, header with final offsets).

        On OSError the file is cut back and `size` unchanged, so readers never see a partial write.
        """
        start = self._size
        view = memoryview(data)
        writer = self._writer()
        fd = writer.fd
        try:
            written = os.pwrite(fd, view, start)
            while written < len(view):  # a short write (rare): the rest
                written += os.pwrite(fd, view[written:], start + written)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # the next append overwrites the tail at `start` anyway
            raise
        if self._rolling_base_ms is None:
            self._rolling_base_ms = now_ms if now_ms is not None else (batches[0][1].max_timestamp if batches else None)
        recent = self._recent
        self._index_batches(start, batches, recent)
        self._bound_recent(recent)
        self._size = start + len(view)

    def append_plain(self, buf: bytearray | memoryview, base_offset: int, leader_epoch: int | None,
                     now_ms: int) -> None:
        """append() for the leader's fast path (Log._append_plain): buf is one whole batch, its base offset (and
        leader epoch) assigned here; the write and the index bookkeeping are one call (storage/leader_append.py)."""
        start = self._size
        max_ts = self._max_ts if self._max_ts is not None else self.max_timestamp_and_offset
        writer = self._file.get()  # held while the call writes to its descriptor (_writer, without the call)
        last, since, indexed, ts, ts_offset = write_plain(
            buf, writer.fd, start, base_offset, leader_epoch, self._bytes_since_last_index_entry,
            self.index_interval_bytes, max_ts[0], max_ts[1])
        if ts != max_ts[0]:  # the batch holds a larger timestamp than the segment had
            self._max_ts = (ts, ts_offset)
        if self._rolling_base_ms is None:
            self._rolling_base_ms = now_ms
        if indexed:
            self.index.append(last, start)
            self.time_index.maybe_append(ts, ts_offset, skip_full_check=True)
        self._bytes_since_last_index_entry = since
        recent = self._recent
        recent.append((last, start))
        if len(recent) > _RECENT_BATCHES:  # _bound_recent's test, without its call on every append
            self._bound_recent(recent)
        self._size = start + len(buf)

    def append_plain_one(self, buf: bytearray | memoryview, compacted: bool, timestamp_bounds: tuple[int, int] | None,
                         producers: dict[int, ProducerStateEntry], base_offset: int, leader_epoch: int | None, now_ms: int,
                         segment_bytes: int, max_segment_ms: int) -> PlainWritten | None:
        """Log._append_plain's one call (storage/leader_append.py's append_plain) with this segment's part of it:
        None, with nothing changed, when the call declines or the segment is due a roll (Log._maybe_roll's tests:
        its age and full indexes here, its size and relative offsets in the call); else append_plain's result,
        the batch written at the end and indexed as append_plain() does; an OSError as append_plain()'s."""
        start = self._size
        if start == 0:
            room = max_delta = _INT64_MAX
        else:
            base = self._rolling_base_ms
            if base is None:
                base = self.rolling_base_ms()
            if ((base is not None and now_ms - base > max_segment_ms) or self.index._count >= self.index.max_entries
                    or self.time_index._count >= self.time_index.max_entries):
                return None
            room = segment_bytes - start
            max_delta = _INT32_MAX - (base_offset - self.base_offset)
        max_ts = self._max_ts if self._max_ts is not None else self.max_timestamp_and_offset
        low, high = timestamp_bounds if timestamp_bounds is not None else (0, 0)
        writer = self._file.get()  # held while the call writes to its descriptor
        written = append_plain(buf, APPEND_WALK, compacted, timestamp_bounds is not None, low, high, producers,  # type: ignore[misc]
                               writer.fd, start, base_offset, leader_epoch, self._bytes_since_last_index_entry,
                               self.index_interval_bytes, max_ts[0], max_ts[1], room, max_delta)
        if written is None:
            return None
        last, since, _, ts, ts_offset = written[:5]
        if ts != max_ts[0]:
            self._max_ts = (ts, ts_offset)
        if self._rolling_base_ms is None:
            self._rolling_base_ms = now_ms
        if written[2]:
            self.index.append(last, start)
            self.time_index.maybe_append(ts, ts_offset, skip_full_check=True)
        self._bytes_since_last_index_entry = since
        recent = self._recent
        recent.append((last, start))
        if len(recent) > _RECENT_BATCHES:
            self._bound_recent(recent)
        self._size = start + len(buf)
        return written

    def _bound_recent(self, recent: list[tuple[int, int]]) -> None:
        """The recent batches' list kept bounded however many batches one append brings (a follower's catch-up)."""
        if len(recent) > _RECENT_BATCHES:
            self._recent = recent[-(_RECENT_BATCHES // 2):]

    def _index_batch(self, position: int, header: RecordBatchHeader) -> None:
        self._index_batches(position, ((0, header),))

    def _index_batches(self, start: int, batches: Iterable[tuple[int, RecordBatchHeader]],
                       recent: list[tuple[int, int]] | None = None) -> None:
        """Index the batches at start + their positions: an offset and a time index entry every
        index.interval.bytes, the largest timestamp, and (last offset, position) into recent when given."""
        max_ts = self.max_timestamp_and_offset
        since = self._bytes_since_last_index_entry
        interval = self.index_interval_bytes
        for pos, header in batches:
            position = start + pos
            last = header.base_offset + header.last_offset_delta
            if header.max_timestamp > max_ts[0]:
                max_ts = self._max_ts = (header.max_timestamp, last)
            if since > interval:
                self.index.append(last, position)
                self.time_index.maybe_append(max_ts[0], max_ts[1], skip_full_check=True)
                since = 0
            since += header.batch_length + LOG_OVERHEAD
            self._bytes_since_last_index_entry = since
            if recent is not None:
                recent.append((last, position))

    def reset_indexes(self) -> None:
        """Empty all indexes, the transaction index included (recovery rebuilds it from producer state)."""
        self.index.reset()
        self.time_index.reset()
        self.txn_index.reset()
        self._bytes_since_last_index_entry = 0
        self._max_ts = (-1, self.base_offset)

    def truncate_to_position(self, position: int) -> int:
        """Cut the file at position (a batch boundary); returns bytes removed. Indexes must be fixed by the caller."""
        removed = self._size - position
        self._recent = []
        if removed > 0:
            os.ftruncate(self._writer().fd, position)
            self._size = position
        return max(0, removed)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset >= offset (whole batches); returns bytes removed."""
        loc = self.translate_offset(offset)
        if loc is None:
            return 0
        removed = self.truncate_to_position(loc.position)
        self.index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        self._max_ts = None
        self._bytes_since_last_index_entry = 0
        if self._size == 0:
            self._rolling_base_ms = None
        return removed

    def on_become_inactive(self) -> None:
        """Record the final max timestamp in the time index so retention needs no scan later; reads near the log
        end are no longer this segment's, so its recent batch positions go."""
        self._recent = []
        ts, off = self.max_timestamp_and_offset
        if ts >= 0:
            self.time_index.maybe_append(ts, off, skip_full_check=True)

    def flush(self) -> None:
        reader = self._file.get()
        os.fsync(reader.fd)  # any fd of the file (a read-only one too) flushes the inode on Linux
        self.index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    # -- reads ---------------------------------------------------------------------------------

    def iter_batches(self, start_position: int = 0, end_position: int | None = None) -> Iterator[BatchLocation]:
        """Headers of whole batches in [start, end); stops at a torn or invalid header."""
        end = self._size if end_position is None else end_position
        if end - start_position < BATCH_HEADER_SIZE:
            return  # nothing to read: an empty segment need not be opened
        reader = self._file.get()  # held while the generator runs
        fd = reader.fd
        pos = start_position
        buf = b""
        buf_start = pos
        while end - pos >= BATCH_HEADER_SIZE:
            off = pos - buf_start
            if off + BATCH_HEADER_SIZE > len(buf):
                buf = os.pread(fd, min(_scan_chunk(pos, bool(buf) and off <= len(buf)), end - pos), pos)
                buf_start, off = pos, 0
                if len(buf) < BATCH_HEADER_SIZE:
                    return
            header = parse_batch_header(buf, off)
            if header.batch_length < BATCH_OVERHEAD:
                return
            size = header.batch_length + LOG_OVERHEAD
            if pos + size > end:
                return
            yield BatchLocation(pos, header)
            pos += size

    def translate_offset(self, offset: int, starting_position: int = 0) -> BatchLocation | None:
        """The first batch whose last offset >= offset (the one containing it, or the next after a gap)."""
        position = self._recent_position_of(offset)
        if position is None:
            _, position = self.index.lookup(offset)
        for loc in self.iter_batches(max(position, starting_position)):
            if loc.header.last_offset >= offset:
                return loc
        return None

    def _recent_position_of(self, offset: int, size: int | None = None) -> int | None:
        """Position of the first batch with last offset >= offset, when the recent batches know it (the one
        before it is among them too); size (the segment's end) when offset is past them all."""
        size = self._size if size is None else size
        found = self._recent_index(offset, size)
        if found is None:
            return None
        recent, n, i = found
        return recent[i][1] if i < n else size

    def _recent_start_below(self, position: int) -> int:
        """The start of the last recent batch starting before position (a batch boundary to scan from), or 0."""
        recent = self._recent
        i = bisect.bisect_left(recent, position, key=_POSITION)
        return recent[i - 1][1] if i > 0 else 0

    def _recent_whole(self, size: int) -> tuple[list[tuple[int, int]], int]:
        """(recent batches, how many lie whole within size). An append racing a reader on another thread lists its
        batches before it moves the size; the first of those starts at the old size."""
        recent = self._recent
        return recent, bisect.bisect_left(recent, size, key=_POSITION)

    def _recent_index(self, offset: int, size: int) -> tuple[list[tuple[int, int]], int, int] | None:
        """(recent batches, how many lie whole within size, index of the first with last offset >= offset) when
        they know it, else None."""
        recent, n = self._recent_whole(size)
        if not n or offset <= recent[0][0]:
            return None
        return recent, n, bisect.bisect_left(recent, offset, 0, n, key=_LAST_OFFSET)

    def position_of(self, offset: int) -> int | None:
        """translate_offset(offset).position, without reading the file when the recent batches know it."""
        size = self._size
        position = self._recent_position_of(offset, size)
        if position is not None:
            return position if position < size else None
        loc = self.translate_offset(offset)
        return loc.position if loc is not None else None

    def _read_recent(self, start_offset: int, max_size: int, size: int, limit_pos: int,
                     min_one_message: bool) -> SegmentReadResult | None:
        """read() from the recent batches' positions alone, without a header read: what a follower or a consumer
        at the log end asks for. _NOT_RECENT when they do not cover start_offset."""
        found = self._recent_index(start_offset, size)
        if found is None:
            return _NOT_RECENT
        recent, n, i = found
        if i == n:
            return None
        start_pos = recent[i][1]
        if start_pos >= limit_pos:
            return None
        first_size = (recent[i + 1][1] if i + 1 < n else size) - start_pos
        budget = max(max_size, first_size) if min_one_message else max_size
        if first_size > budget:
            return SegmentReadResult(None, first_entry_incomplete=True)
        found_end = _recent_end(recent, n, min(limit_pos, start_pos + budget), size, start_pos)
        if found_end is None:
            return _NOT_RECENT
        end_pos, next_offset = found_end
        return SegmentReadResult(FileRecordsSlice(self._file.get(), start_pos, end_pos - start_pos),
                                 next_offset=next_offset)

    def read(self, start_offset: int, max_size: int, max_position: int | None = None,
             min_one_message: bool = True) -> SegmentReadResult | None:
        """Whole batches from the one containing start_offset, up to max_size bytes (KIP-74:
        at least the first batch when min_one_message). None when no batch has offset >= start."""
        size = self._size
        limit_pos = size if max_position is None else min(max_position, size)
        fast = self._read_recent(start_offset, max_size, size, limit_pos, min_one_message)
        if fast is not _NOT_RECENT:
            return fast
        start = self.translate_offset(start_offset)
        if start is None or start.position >= limit_pos:
            return None
        first_size = start.size
        budget = max(max_size, first_size) if min_one_message else max_size
        if first_size > budget:
            return SegmentReadResult(None, first_entry_incomplete=True)
        limit = min(limit_pos, start.position + budget)
        # The read began before the recent batches, but they may know where it ends (at the segment's end, most
        # often): no header read for the end then.
        found_end = _recent_end(*self._recent_whole(size), limit, size, start.position)
        if found_end is not None:
            end_pos, next_offset = found_end
            return SegmentReadResult(FileRecordsSlice(self._file.get(), start.position, end_pos - start.position),
                                     next_offset=next_offset)
        # Jump close to the limit via the index (positions there are batch starts), then scan.
        _, scan_from = self.index.lookup_by_position(limit)
        scan_from = max(scan_from, start.position, self._recent_start_below(limit))
        end = scan_from
        last: RecordBatchHeader | None = None
        for loc in self.iter_batches(scan_from, limit):
            end = loc.position + loc.size
            last = loc.header
        if last is not None:
            next_offset = last.next_offset
        else:
            # Nothing fitted after the index entry: the batch starting there is the first one left out.
            after = next(self.iter_batches(end), None)
            next_offset = after.header.base_offset if after is not None else self.read_next_offset()
        return SegmentReadResult(FileRecordsSlice(self._file.get(), start.position, end - start.position),
                                 next_offset=next_offset)

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int,
                                 max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= target and offset >= starting_offset."""
        _, ts_offset = self.time_index.lookup(timestamp)
        _, position = self.index.lookup(max(ts_offset, starting_offset))
        for loc in self.iter_batches(position):
            h = loc.header
            if h.max_timestamp >= timestamp and h.last_offset >= starting_offset:
                found = self._first_record_at_or_after(loc, timestamp, starting_offset, max_decompressed)
                if found is not None:
                    return found
        return None

    def read_batch_bytes(self, loc: BatchLocation) -> bytes:
        return FileRecordsSlice(self._file.get(), loc.position, loc.size).read_bytes()

    def _first_record_at_or_after(self, loc: BatchLocation, timestamp: int, starting_offset: int,
                                  max_decompressed: int) -> tuple[int, int] | None:
        for rec in decode_records(self.read_batch_bytes(loc), max_size=max_decompressed):
            if rec.timestamp >= timestamp and rec.offset >= starting_offset:
                return rec.offset, rec.timestamp
        return None

    def read_next_offset(self) -> int:
        """Offset after the last batch; from the last index entry plus a short scan."""
        _, position = self.index.last_entry()
        next_offset = self.base_offset
        for loc in self.iter_batches(position):
            next_offset = loc.header.next_offset
        return next_offset

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._file.close()
            self.index.close()
            self.time_index.close()
            self.txn_index.close()

    def close_writers(self) -> None:
        """The segment became inactive: give its descriptors back now rather than when they are evicted."""
        self._file.release()
        self.index.close_writer()
        self.time_index.close_writer()
        self.txn_index.close_writer()

    def change_file_suffix(self, new_suffix: str) -> None:
        """Rename the segment's files (open fds stay valid); e.g. '' -> '.deleted' or '.swap' -> ''."""
        new_log = self.dir / (segment_file_name(self.base_offset, LOG_SUFFIX) + new_suffix)
        self._file.rename(new_log)
        self.log_path = new_log
        self.index.rename_to(self.dir / (segment_file_name(self.base_offset, INDEX_SUFFIX) + new_suffix))
        self.time_index.rename_to(self.dir / (segment_file_name(self.base_offset, TIME_INDEX_SUFFIX) + new_suffix))
        self.txn_index.rename_to(self.dir / (segment_file_name(self.base_offset, TXN_INDEX_SUFFIX) + new_suffix))
        self.suffix = new_suffix

    def delete_files(self) -> None:
        self.close()
        for p in (self.log_path, self.index.path, self.time_index.path, self.txn_index.path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self._size}, path={self.log_path})"
