"""The aborted-transaction index of a segment, `<base offset>.txnindex` (Kafka's TransactionIndex).

One entry per aborted transaction whose ABORT marker lies in the segment, in marker order, in Kafka's
format (big endian, 34 bytes): version int16 (0) | producer id int64 | first offset int64 |
last offset int64 (the marker) | last stable offset int64 (the LSO right after the marker).

Like Kafka the file exists only once a transaction was aborted in the segment. Entries are few:
they are kept in memory after the first use. Readers (fetches) take no lock: appends only extend
the list, truncation swaps in a new one.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kbroker.storage.file_handles import LazyFile

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
_VERSION = 0


class CorruptTransactionIndexError(Exception):
    pass


@dataclass(slots=True, frozen=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(_VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


@dataclass(slots=True, frozen=True)
class CompletedTxn:
    """A transaction ended by a marker (Kafka's CompletedTxn); last_offset is the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


def decode_entries(data: bytes) -> list[AbortedTxn]:
    out = []
    for version, pid, first, last, lso in _ENTRY.iter_unpack(data):
        if version != _VERSION:
            raise CorruptTransactionIndexError(f"unknown aborted transaction entry version {version}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


class TransactionIndex:
    """Mutated only under the owning Log's lock."""

    def __init__(self, path: Path, start_offset: int) -> None:
        self.path = path
        self.start_offset = start_offset
        self._entries: list[AbortedTxn] | None = None
        # Opened on the first abort in the segment (creating the file) and closed when idle (storage.file_handles).
        self._writer = LazyFile(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._dirty = False
        self._load_lock = threading.Lock()

    # -- reads ---------------------------------------------------------------------------------

    def _load(self) -> list[AbortedTxn]:
        entries = self._entries
        if entries is not None:
            return entries
        with self._load_lock:
            if self._entries is None:
                try:
                    data = self.path.read_bytes()
                except FileNotFoundError:
                    data = b""
                # A torn last entry (crash mid-write) is dropped; recovery rebuilds the index of an unflushed segment.
                self._entries = decode_entries(data[: len(data) - len(data) % ENTRY_SIZE])
            return self._entries

    def all_entries(self) -> list[AbortedTxn]:
        return list(self._load())

    @property
    def last_offset(self) -> int | None:
        entries = self._load()
        return entries[-1].last_offset if entries else None

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """Entries overlapping [fetch_offset, upper_bound_offset); True when no later segment can hold more."""
        entries = self._load()
        out = []
        for i in range(len(entries)):
            txn = entries[i]
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                out.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return out, True
        return out, False

    def sanity_check(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size % ENTRY_SIZE:
            raise CorruptTransactionIndexError(f"{self.path} has size {size}, not a multiple of {ENTRY_SIZE}")
        decode_entries(self.path.read_bytes())

    # -- writes --------------------------------------------------------------------------------

    def append(self, txn: AbortedTxn) -> None:
        entries = self._load()
        if entries and entries[-1].last_offset >= txn.last_offset:
            raise ValueError(f"aborted transaction ending at {txn.last_offset} does not follow the last one in "
                             f"{self.path} (ending at {entries[-1].last_offset})")
        data = txn.encode()
        writer = self._writer.get()
        written = 0
        while written < len(data):
            written += os.write(writer.fd, data[written:])
        self._dirty = True
        entries.append(txn)


    def truncate_to(self, offset: int) -> None:
        """Drop the entries of transactions aborted at or after offset."""
        entries = self._load()
        keep = [t for t in entries if t.last_offset < offset]
        if len(keep) == len(entries):
            return
        self._rewrite(keep)

    def reset(self) -> None:
        self._rewrite([])

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        if self.path.exists():
            os.truncate(self.path, len(entries) * ENTRY_SIZE)
        self._entries = entries

    def flush(self) -> None:
        if self._dirty:
            writer = self._writer.get()  # any descriptor of the file flushes the inode
            os.fsync(writer.fd)
            self._dirty = False

    def close_writer(self) -> None:
        self._writer.release()

    def close(self) -> None:
        self.close_writer()

    def rename_to(self, path: Path) -> None:
        self._writer.rename(path, missing_ok=True)
        self.path = path

    def delete_file(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def collect_aborted_txns(indexes: Iterable[TransactionIndex], fetch_offset: int,
                         upper_bound_offset: int) -> list[AbortedTxn]:
    """Kafka's collectAbortedTransactions over the indexes of consecutive segments, starting with the one
    holding fetch_offset: each entry's last stable offset tells whether a later segment can still hold a
    transaction that started below the upper bound."""
    out: list[AbortedTxn] = []
    for index in indexes:
        found, complete = index.collect_aborted_txns(fetch_offset, upper_bound_offset)
        out.extend(found)
        if complete:
            break
    return out
