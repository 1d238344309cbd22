"""LeaderEpochFileCache: which leader epoch wrote which offsets of a partition (Kafka's KIP-101 cache).

Each entry is (epoch, start offset): the first offset the leader of that epoch wrote. Entries are strictly
increasing in both. The cache is persisted in the partition directory as `leader-epoch-checkpoint`, Kafka's
text format: a version line "0", a count line, then one "epoch start_offset" line per entry.

Concurrency: every mutation happens under the owning Log's lock; readers (OffsetForLeaderEpoch, the fetch
path) read `_entries`, a list replaced copy-on-write, so they need no lock.
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path
from typing import NamedTuple

from kbroker.storage.atomic_file import write_atomically

logger = logging.getLogger("kbroker.storage")

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_VERSION = 0


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def read_checkpoint(path: Path) -> list[EpochEntry]:
    """Entries of a leader-epoch-checkpoint file; a missing file is empty, a malformed one is an error."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.splitlines()
    if len(lines) < 2 or int(lines[0]) != _VERSION:
        raise ValueError(f"malformed leader epoch checkpoint {path}: bad header")
    count = int(lines[1])
    entries = []
    for line in lines[2 : 2 + count]:
        epoch, offset = line.split()
        entries.append(EpochEntry(int(epoch), int(offset)))
    if len(entries) != count:
        raise ValueError(f"malformed leader epoch checkpoint {path}: expected {count} entries, found {len(entries)}")
    return entries


def write_checkpoint(path: Path, entries: list[EpochEntry], *, sync: bool = True) -> None:
    lines = [str(_VERSION), str(len(entries)), *(f"{e.epoch} {e.start_offset}" for e in entries)]
    write_atomically(path, ("\n".join(lines) + "\n").encode(), sync=sync)


class LeaderEpochFileCache:
    def __init__(self, dir: Path, name: str) -> None:
        self.dir = dir
        self.name = name
        try:
            entries = read_checkpoint(dir / LEADER_EPOCH_CHECKPOINT)
        except (ValueError, OSError) as e:
            # The log holds every batch's epoch: recovery or the next leader rebuilds what matters.
            logger.error("Ignoring leader epoch checkpoint of %s: %s", name, e)
            entries = []
        self._entries: list[EpochEntry] = entries
        self._unsynced = False

    # -- reads ---------------------------------------------------------------------------------

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        entries = self._entries
        return entries[-1].epoch if entries else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[0] if entries else None

    def previous_epoch(self) -> int:
        entries = self._entries
        return entries[-2].epoch if len(entries) >= 2 else UNDEFINED_EPOCH

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote offset (the last entry starting at or below it), or UNDEFINED_EPOCH."""
        entries = self._entries
        i = bisect.bisect_right(entries, offset, key=lambda e: e.start_offset) - 1
        return entries[i].epoch if i >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch, by Kafka's rules: the largest epoch at or below the
        requested one and the start offset of the first epoch after it (the log end for the latest epoch)."""
        entries = self._entries
        if requested_epoch == UNDEFINED_EPOCH or not entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if entries[-1].epoch == requested_epoch:
            return requested_epoch, log_end_offset
        hi = bisect.bisect_right(entries, requested_epoch, key=lambda e: e.epoch)
        if hi == len(entries):
            # Larger than every known epoch: the latest cached epoch is always the largest, so never on a leader.
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if hi == 0:
            # Older than anything left (the log start moved past it): the follower restarts at the first one.
            return requested_epoch, entries[0].start_offset
        return entries[hi - 1].epoch, entries[hi].start_offset

    # -- writes (under the Log's lock) ---------------------------------------------------------

    def holds(self, epoch: int, start_offset: int) -> bool:
        """assign(epoch, start_offset) would change nothing (the leader's common append: its epoch is the latest)."""
        entries = self._entries
        if entries:
            last = entries[-1]
            if last.epoch == epoch and start_offset >= last.start_offset:
                return True
        return epoch < 0 or start_offset < 0

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that epoch starts at start_offset; cheap when the epoch is already the latest."""
        entries = self._entries
        if entries:
            last = entries[-1]
            if last.epoch == epoch and start_offset >= last.start_offset:
                return
        if epoch < 0 or start_offset < 0:
            return  # batches of old message formats carry no epoch
        # Entries that would break monotonicity go first (Kafka's maybeTruncateNonMonotonicEntries).
        kept = [e for e in entries if e.epoch < epoch and e.start_offset < start_offset]
        removed = entries[len(kept):]
        # A lone entry at the same start offset is an epoch that wrote nothing: expected, not worth a warning.
        if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
            logger.warning("Leader epoch entry (%d, %d) of %s removes %s", epoch, start_offset, self.name,
                           [tuple(e) for e in removed])
        self._entries = [*kept, EpochEntry(epoch, start_offset)]
        self.flush()

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries starting at or after end_offset (the log was truncated there)."""
        entries = self._entries
        if end_offset < 0 or not entries or entries[-1].start_offset < end_offset:
            return
        self._entries = [e for e in entries if e.start_offset < end_offset]
        logger.info("Truncated leader epoch cache of %s from end offset %d: latest epoch now %d", self.name,
                    end_offset, self.latest_epoch)
        self.flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved to start_offset: entries wholly below it go, the one holding it starts there."""
        entries = self._entries
        if start_offset < 0 or not entries or entries[0].start_offset >= start_offset:
            return
        i = bisect.bisect_right(entries, start_offset, key=lambda e: e.start_offset) - 1
        self._entries = [EpochEntry(entries[i].epoch, start_offset), *entries[i + 1:]]
        self.flush()

    def clear(self) -> None:
        if self._entries:
            self._entries = []
            self.flush()

    def flush(self) -> None:
        """Write the file, without fsync (Kafka 3.7's KAFKA-15046): a leadership change writes one per partition,
        and two fsyncs each held LeaderAndIsr up to a second on a busy disk. What a crash may lose is rebuilt by
        recovery from the batches past the recovery point, and the log syncs the file before moving that point
        (sync)."""
        write_checkpoint(self.dir / LEADER_EPOCH_CHECKPOINT, self._entries, sync=False)
        self._unsynced = True

    def sync(self) -> None:
        """Make the file durable if it changed since the last sync (under the owning log's lock, as mutations)."""
        if self._unsynced:
            write_checkpoint(self.dir / LEADER_EPOCH_CHECKPOINT, self._entries)
            self._unsynced = False
