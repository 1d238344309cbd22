"""SharePartition: one share group's view of one topic partition (KIP-932), as Kafka's SharePartition.

The share-partition start offset (SPSO) and end (SPEO) bound the in-flight records: each is Available, Acquired
by one member under an acquisition lock with a deadline, Acknowledged or Archived, and counts its deliveries.
Records past the end have never been delivered. As Kafka's cached state of in-flight batches, the state is kept
in runs of consecutive offsets that share it (a fetched batch is one run until an acknowledgement or a release
splits it), so fetching, acknowledging and writing the state cost per run, not per record. Offsets between
start and end that no run covers do not exist in the log (compacted away). Touched only from the share loop.
"""

from __future__ import annotations

import struct
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from kbroker.protocol.errors import ErrorCode

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
# Acknowledge types of ShareFetch / ShareAcknowledge
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
_BATCH_HEAD = struct.Struct(">qi")
_CONTROL = 0x20
_TRANSACTIONAL = 0x10


@dataclass(slots=True)
class Run:
    """Consecutive in-flight offsets in one state (Kafka's InFlightBatch, split where states differ)."""

    first: int
    last: int
    state: int
    delivery_count: int
    member: str | None = None
    deadline: float = 0.0

    def copy_from(self, first: int, last: int) -> Run:
        return Run(first, last, self.state, self.delivery_count, self.member, self.deadline)


def _first(r: Run) -> int:
    return r.first


# what an acknowledgement turns a record into, per acknowledge type (RELEASE: Available, or Archived once the
# delivery limit is reached; RENEW keeps it Acquired)
_TARGET = {ACCEPT: (ACKNOWLEDGED,), GAP: (ARCHIVED,), REJECT: (ARCHIVED,), RELEASE: (AVAILABLE, ARCHIVED)}


@dataclass(slots=True)
class Undo:
    """How to take back one acknowledgement batch whose state write failed (Kafka's InFlightState rollback
    state): the runs as they were before it, each acquired by the member, and the acknowledge type applied to
    each offset; `resets` is the share-partition's reset count then (a reset since leaves nothing to undo)."""

    resets: int
    runs: list[Run]
    kinds: list[tuple[int, int, int]]  # (first, last, acknowledge type)
    delivery_limit: int  # a record released at it was archived, not made available


def _slice(data: bytes, start: int, end: int) -> bytes:
    return data if start == 0 and end == len(data) else data[start:end]


def in_aborted_txn(data: bytes, pos: int, aborted: list[Any]) -> bool:
    """Whether the batch at pos is a transactional batch of a transaction that aborted (Kafka's SharePartition
    archives these under read_committed rather than deliver them)."""
    if not aborted or not struct.unpack_from(">h", data, pos + 21)[0] & _TRANSACTIONAL:
        return False
    base = _BATCH_HEAD.unpack_from(data, pos)[0]
    producer_id = struct.unpack_from(">q", data, pos + 43)[0]
    return any(a.producer_id == producer_id and a.first_offset <= base <= a.last_offset for a in aborted)


def walk_batches(data: bytes) -> list[tuple[int, int, bool, int, int]]:
    """(base offset, last offset, is control, start, end) of each whole v2 batch in data."""
    out = []
    pos = 0
    while pos + 61 <= len(data):
        base, length = _BATCH_HEAD.unpack_from(data, pos)
        end = pos + 12 + length
        if end > len(data) or data[pos + 16] < 2:
            break
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        last_delta = struct.unpack_from(">i", data, pos + 23)[0]
        out.append((base, base + last_delta, bool(attributes & _CONTROL), pos, end))
        pos = end
    return out


class SharePartition:
    def __init__(self, group_id: str, topic: str, partition: int, start_offset: int) -> None:
        self.group_id = group_id
        self.topic = topic
        self.partition = partition
        self.start = start_offset
        self.end = start_offset
        self.runs: list[Run] = []  # sorted, disjoint, within [start, end)
        # changed since the last snapshot written to __share_group_state by what Kafka writes (acknowledgements,
        # releases, expired locks, resets); an acquisition alone is not written, as in Kafka's SharePartition
        self.dirty = False
        self.snapshot_epoch = 0
        # the state epoch read from the share coordinator: a newer one there fences this share-partition
        self.state_epoch = 0
        self.leader_epoch = -1  # of the topic partition when this share-partition was loaded
        self.writing: Any = None  # the task writing the last snapshot to __share_group_state
        # dropped for a leadership change with changes never written: its acknowledgements are not durable
        self.lost = False
        self.resets = 0  # moves whenever the start offset jumps (reset, records deleted): see Undo

    # ------------------------------------------------------------ runs

    def _split(self, off: int) -> int:
        """Make offset off start a run if a run holds it; the index of the first run at or after off."""
        runs = self.runs
        i = bisect_right(runs, off, key=_first) - 1
        if i < 0:
            return 0
        r = runs[i]
        if r.first == off:
            return i
        if off <= r.last:
            runs.insert(i + 1, r.copy_from(off, r.last))
            r.last = off - 1
        return i + 1

    def _span(self, first: int, last: int) -> tuple[int, int]:
        """Runs [i, j) covering exactly first..last (split at both ends)."""
        i = self._split(first)
        j = self._split(last + 1)
        return i, j

    def in_flight(self) -> int:
        """Kafka's count against group.share.partition.max.record.locks: the whole window from the start offset
        to the end, whatever the state of the records in it."""
        return self.end - self.start if self.runs else 0

    def locks_held(self) -> int:
        """Records acquired by a consumer now."""
        return sum(r.last - r.first + 1 for r in self.runs if r.state == ACQUIRED)

    def delivery_complete(self) -> int:
        """Records past the start offset already acknowledged or archived."""
        return sum(r.last - r.first + 1 for r in self.runs if r.state in (ACKNOWLEDGED, ARCHIVED))

    def _next_available(self, pos: int) -> int | None:
        for r in self.runs:
            if r.last >= pos and r.state == AVAILABLE:
                return max(r.first, pos)
        return None

    # ------------------------------------------------------------ acquisition

    def acquire(
        self,
        lg: Any,
        member: str,
        max_records: int,
        max_bytes: int,
        lock_ms: int,
        max_locks: int,
        limit: int,
        read_committed: bool = False,
        record_limit: bool = False,
        batch_size: int = 0,
    ) -> tuple[list[bytes], list[tuple[int, int, int]]]:
        """Acquire records for member below limit (the high watermark, or the LSO for read_committed, where the
        records of aborted transactions are archived, never delivered): the whole batches holding them and the
        acquired (first, last, delivery count) ranges. As Kafka's share.acquire.mode: batch_optimized (the
        default) acquires whole batches until max_records is reached, so the last one may pass it; record_limit
        stops at max_records exactly, leaving the rest of a new batch Available. New records are acquired only
        while the window from the start offset stays within max_locks (Kafka's max in-flight records);
        released ones are delivered again whatever the window. A ShareFetch's BatchSize cuts the acquired ranges
        as Kafka's createBatches does: a range ends before the first log batch whose base offset is BatchSize
        records or more past the range's first offset."""
        if self.start < lg.log_start_offset:
            self.reset(lg.log_start_offset) if not self.runs else self._move_start(lg.log_start_offset)
        new_budget = min(max_records, max_locks - self.in_flight())
        chunks: list[bytes] = []
        ranges: list[tuple[int, int, int]] = []
        acquired = 0
        size = 0
        deadline = time.monotonic() + lock_ms / 1000
        pos = self.start
        while acquired < max_records and size < max_bytes:
            nxt = self._next_available(pos)
            new = max(pos, self.end)
            if new < limit and new_budget > 0 and (nxt is None or new < nxt):
                nxt = new
            if nxt is None:
                break
            info = lg.read(
                nxt,
                max(max_bytes - size, 1),
                max_offset=limit,
                min_one_message=True,
                isolation_committed=read_committed,
            )
            data = info.records.read_bytes() if info.records is not None and info.records.size else b""
            batches = walk_batches(data)
            if not batches:
                break
            aborted = list(info.aborted_transactions or []) if read_committed else []
            # the batches answered from this read, as one slice while they are consecutive (most often all of
            # them: the read's own bytes, not a copy)
            span = [0, 0]
            for base, last, control, s, e in batches:
                if acquired >= max_records:
                    break
                lo = max(base, nxt)
                got: list[tuple[int, int, int]] = []
                if lo < self.end:
                    acquired += self._acquire_existing(
                        lo,
                        min(last, self.end - 1),
                        member,
                        deadline,
                        max_records - acquired,
                        record_limit,
                        got,
                    )
                hi = min(last, limit - 1)
                lo = max(lo, self.end)
                if lo <= hi and new_budget > 0 and acquired < max_records:
                    if control or in_aborted_txn(data, s, aborted):
                        self.runs.append(Run(lo, hi, ARCHIVED, 0))
                    else:
                        take = hi - lo + 1
                        if record_limit:
                            take = min(take, max_records - acquired, new_budget)
                        self.runs.append(Run(lo, lo + take - 1, ACQUIRED, 1, member, deadline))
                        if lo + take <= hi:  # record_limit: the rest of the batch is in flight, not acquired
                            self.runs.append(Run(lo + take, hi, AVAILABLE, 0))
                        got.append((lo, lo + take - 1, 1))
                        acquired += take
                        new_budget -= take
                    self.end = hi + 1
                if got:
                    if s != span[1]:
                        if span[1] > span[0]:
                            chunks.append(_slice(data, span[0], span[1]))
                        span[0] = s
                    span[1] = e
                    size += e - s
                    for first, la, count in got:
                        if (
                            ranges
                            and ranges[-1][1] == first - 1
                            and ranges[-1][2] == count
                            and (batch_size <= 0 or first - ranges[-1][0] < batch_size)
                        ):
                            ranges[-1] = (ranges[-1][0], la, count)
                        else:
                            ranges.append((first, la, count))
                pos = last + 1
            if span[1] > span[0]:
                chunks.append(_slice(data, span[0], span[1]))
            self._advance()
        return chunks, ranges

    def _acquire_existing(
        self,
        lo: int,
        hi: int,
        member: str,
        deadline: float,
        room: int,
        record_limit: bool,
        got: list[tuple[int, int, int]],
    ) -> int:
        """Acquire the Available runs within lo..hi (records released or whose locks expired, delivered again)."""
        taken = 0
        i = self._split(lo)
        while i < len(self.runs) and self.runs[i].first <= hi:
            r = self.runs[i]
            if r.state == AVAILABLE:
                if record_limit and taken >= room:
                    break
                last = min(r.last, hi)
                if record_limit:
                    last = min(last, r.first + room - taken - 1)
                if last < r.last:
                    self.runs.insert(i + 1, r.copy_from(last + 1, r.last))
                    r.last = last
                r.state, r.member, r.deadline = ACQUIRED, member, deadline
                r.delivery_count += 1
                taken += r.last - r.first + 1
                got.append((r.first, r.last, r.delivery_count))
            i += 1
        return taken

    # ------------------------------------------------------------ acknowledgement

    def acknowledge(
        self,
        member: str,
        first: int,
        last: int,
        types: list[int],
        delivery_limit: int,
        lock_ms: int,
        undo: list[Undo] | None = None,
    ) -> int:
        """Apply one acknowledgement batch; with `undo`, what `rollback` needs to take it back is appended."""
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            return ErrorCode.INVALID_REQUEST
        if any(t not in (GAP, ACCEPT, RELEASE, REJECT, RENEW) for t in types):
            return ErrorCode.INVALID_REQUEST
        # every offset acquired by this member (runs cover first..last without a hole)
        runs = self.runs
        i = max(bisect_right(runs, first, key=_first) - 1, 0)
        expect = first
        while i < len(runs) and expect <= last:
            r = runs[i]
            if r.last < expect:
                i += 1
                continue
            if r.first > expect or r.state != ACQUIRED or r.member != member:
                return ErrorCode.INVALID_RECORD_STATE
            expect = r.last + 1
            i += 1
        if expect <= last:
            return ErrorCode.INVALID_RECORD_STATE
        kinds: list[tuple[int, int, int]] = []
        if len(types) == 1:
            kinds.append((first, last, types[0]))
        else:
            seg = first
            for k in range(1, len(types) + 1):
                if k == len(types) or types[k] != types[k - 1]:
                    kinds.append((seg, first + k - 1, types[k - 1]))
                    seg = first + k
        if undo is not None:
            i, j = self._span(first, last)
            saved = [r.copy_from(r.first, r.last) for r in self.runs[i:j]]
            undo.append(Undo(self.resets, saved, kinds, delivery_limit))
        for seg_first, seg_last, kind in kinds:
            self._apply(seg_first, seg_last, kind, delivery_limit, lock_ms)
        self.dirty = True
        self._advance()
        return ErrorCode.NONE

    def _apply(self, first: int, last: int, kind: int, delivery_limit: int, lock_ms: int) -> None:
        i, j = self._span(first, last)
        for r in self.runs[i:j]:
            if kind == ACCEPT:
                r.state, r.member = ACKNOWLEDGED, None
            elif kind in (GAP, REJECT):
                r.state, r.member = ARCHIVED, None
            elif kind == RELEASE:
                self._release(r, delivery_limit)
            else:
                r.deadline = time.monotonic() + lock_ms / 1000

    def rollback(self, undo: Undo) -> bool:
        """Take back an acknowledgement whose state write failed, as Kafka's SharePartition rolls back its state
        transitions (completeStateTransition(false)): its records are Acquired by the member again, under their
        lock as it was (they come back to the group when it expires). A record changed since by something else
        (released and acquired again, its lock expired, the share-partition reset) is left as it is now. Returns
        whether anything was taken back."""
        if undo.resets != self.resets:
            return False
        pieces: list[tuple[Run, int]] = []
        for first, last, kind in undo.kinds:
            for saved in undo.runs:
                lo, hi = max(first, saved.first), min(last, saved.last)
                if lo <= hi:
                    pieces.append((saved.copy_from(lo, hi), kind))
        pieces.sort(key=lambda x: x[0].first)
        restored = self._restore_head(pieces, undo.delivery_limit)
        for saved, kind in pieces:
            if saved.last < self.start or saved.first >= self.end:
                continue
            targets = (ACQUIRED,) if kind == RENEW else _TARGET.get(kind, ())
            i, j = self._span(max(saved.first, self.start), min(saved.last, self.end - 1))
            for r in self.runs[i:j]:
                if r.state not in targets or (kind == RENEW and r.member != saved.member):
                    continue
                if r.state == AVAILABLE and r.delivery_count != saved.delivery_count:
                    continue  # acquired and released again since
                r.state, r.member, r.deadline = saved.state, saved.member, saved.deadline
                r.delivery_count = saved.delivery_count
                restored = True
        if restored:
            self.dirty = True
            self._advance()
        return restored

    def _restore_head(self, pieces: list[tuple[Run, int]], delivery_limit: int) -> bool:
        """The acknowledged records the start offset moved past come back before it: those this acknowledgement
        finished (accepted, rejected, or released at the delivery limit: archived) as they were before it; any
        other offset in between stays done (Acknowledged: a record released by it and finished by another member
        since, or another member's acknowledgement)."""
        head: list[Run] = []
        for saved, kind in pieces:
            if saved.first >= self.start:
                break
            if kind not in (ACCEPT, GAP, REJECT) and not (
                kind == RELEASE and saved.delivery_count >= delivery_limit
            ):
                continue
            part = saved.copy_from(saved.first, min(saved.last, self.start - 1))
            if head and head[-1].last + 1 < part.first:
                head.append(Run(head[-1].last + 1, part.first - 1, ACKNOWLEDGED, 1))
            head.append(part)
        if not head:
            return False
        if head[-1].last + 1 < self.start:
            head.append(Run(head[-1].last + 1, self.start - 1, ACKNOWLEDGED, 1))
        if not self.runs:
            self.end = max(self.end, self.start)
        self.runs[:0] = head
        self.start = head[0].first
        return True

    def _release(self, r: Run, delivery_limit: int) -> None:
        self.dirty = True
        r.state = ARCHIVED if r.delivery_count >= delivery_limit else AVAILABLE
        r.member = None

    def release_member(self, member: str, delivery_limit: int) -> bool:
        """A member left or its session closed: what it holds is available again."""
        changed = False
        for r in self.runs:
            if r.state == ACQUIRED and r.member == member:
                self._release(r, delivery_limit)
                changed = True
        self._advance()
        return changed

    def expire_locks(self, now: float, delivery_limit: int) -> bool:
        changed = False
        for r in self.runs:
            if r.state == ACQUIRED and r.deadline <= now:
                self._release(r, delivery_limit)
                changed = True
        if changed:
            self._advance()
        return changed

    def _advance(self) -> None:
        """Move the start offset past the acknowledged and archived runs at the head; merge neighbours in the
        same state so the list stays as short as the state is varied."""
        runs = self.runs
        k = 0
        while k < len(runs) and runs[k].state in (ACKNOWLEDGED, ARCHIVED):
            k += 1
        if k:
            del runs[:k]
        self.start = runs[0].first if runs else max(self.start, self.end)
        if len(runs) > 1:
            out = [runs[0]]
            for r in runs[1:]:
                p = out[-1]
                if (
                    p.last + 1 == r.first
                    and p.state == r.state
                    and p.delivery_count == r.delivery_count
                    and p.member == r.member
                    and p.deadline == r.deadline
                ):
                    p.last = r.last
                else:
                    out.append(r)
            if len(out) != len(runs):
                self.runs = out

    def _move_start(self, offset: int) -> None:
        self.resets += 1
        i = self._split(offset)
        del self.runs[:i]
        self.start = offset
        self.end = max(self.end, offset)

    def reset(self, offset: int) -> None:
        """AlterShareGroupOffsets, or records deleted under an idle share-partition: start over at offset."""
        self.dirty = True
        self.resets += 1
        self.runs.clear()
        self.start = self.end = offset

    def state_batches(self) -> list[tuple[int, int, int, int]]:
        """(first, last, state, delivery count) runs of the in-flight records that are not plainly new; an
        acquired record is Available to whoever reads the state back (its lock does not survive a restart)."""
        out: list[tuple[int, int, int, int]] = []
        for r in self.runs:
            state = AVAILABLE if r.state == ACQUIRED else r.state
            if out and out[-1][1] == r.first - 1 and out[-1][2] == state and out[-1][3] == r.delivery_count:
                out[-1] = (out[-1][0], r.last, state, r.delivery_count)
            else:
                out.append((r.first, r.last, state, r.delivery_count))
        return out

    def load(self, start: int, batches: list[tuple[int, int, int, int]]) -> None:
        self.runs = []
        self.start = self.end = start
        for first, last, state, count in sorted(batches):
            first = max(first, start, self.end)
            if first > last:
                continue
            self.runs.append(Run(first, last, state, count))
            self.end = last + 1
        self._advance()
