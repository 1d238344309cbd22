"""SharePartition: one share group's view of one topic partition (KIP-932), as Kafka's SharePartition.

The share-partition start offset (SPSO) and end (SPEO) bound the in-flight records: each is Available, Acquired
by one member under an acquisition lock with a deadline, Acknowledged or Archived, and counts its deliveries.
Records past the end have never been delivered. State is per offset; a dict of small objects stays cheap because
`group.share.partition.max.record.locks` caps what is acquired at once. Touched only from the share loop.
"""

from __future__ import annotations

import struct
import time
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
class InFlight:
    state: int
    delivery_count: int
    member: str | None = None
    deadline: float = 0.0


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
        self.records: dict[int, InFlight] = {}
        self.dirty = False  # changed since the last snapshot written to __share_group_state
        self.snapshot_epoch = 0
        # the state epoch read from the share coordinator: a newer one there fences this share-partition
        self.state_epoch = 0
        self.leader_epoch = -1  # of the topic partition when this share-partition was loaded
        self.writing: Any = None  # the task writing the last snapshot to __share_group_state
        # dropped for a leadership change with changes never written: its acknowledgements are not durable
        self.lost = False

    def locks_held(self) -> int:
        return sum(1 for r in self.records.values() if r.state == ACQUIRED)

    def _next_candidate(self, pos: int, limit: int) -> int | None:
        avail = [o for o, r in self.records.items() if r.state == AVAILABLE and o >= pos]
        best = min(avail) if avail else None
        new = max(pos, self.end)
        if new < limit and (best is None or new < best):
            best = new
        return best

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
    ) -> tuple[list[bytes], list[tuple[int, int, int]]]:
        """Acquire up to max_records records for member below limit (the high watermark, or the LSO for
        read_committed, where the records of aborted transactions are archived, never delivered): the whole
        batches holding them and the acquired (first, last, delivery count) ranges."""
        if self.start < lg.log_start_offset:
            self.reset(lg.log_start_offset) if not self.records else self._move_start(lg.log_start_offset)
        budget = min(max_records, max_locks - self.locks_held())
        chunks: list[bytes] = []
        ranges: list[tuple[int, int, int]] = []
        size = 0
        deadline = time.monotonic() + lock_ms / 1000
        pos = self.start
        while budget > 0 and size < max_bytes:
            nxt = self._next_candidate(pos, limit)
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
            for base, last, control, s, e in batches:
                if budget <= 0:
                    break
                control = control or in_aborted_txn(data, s, aborted)
                got: list[tuple[int, int]] = []
                for off in range(max(base, nxt), last + 1):
                    if budget <= 0:
                        break
                    rec = self.records.get(off)
                    if off >= self.end and off < limit:
                        if control:
                            self.records[off] = InFlight(ARCHIVED, 0)
                            self.end = off + 1
                            continue
                        rec = self.records[off] = InFlight(AVAILABLE, 0)
                        self.end = off + 1
                    if rec is None or rec.state != AVAILABLE:
                        continue
                    rec.state, rec.member, rec.deadline = ACQUIRED, member, deadline
                    rec.delivery_count += 1
                    self.dirty = True
                    budget -= 1
                    got.append((off, rec.delivery_count))
                if got:
                    chunks.append(data[s:e])
                    size += e - s
                    first, count = got[0]
                    prev = first
                    for off, c in got[1:]:
                        if off != prev + 1 or c != count:
                            ranges.append((first, prev, count))
                            first, count = off, c
                        prev = off
                    ranges.append((first, prev, count))
                pos = last + 1
            self._advance()
        return chunks, ranges

    def acknowledge(
        self, member: str, first: int, last: int, types: list[int], delivery_limit: int, lock_ms: int
    ) -> int:
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            return ErrorCode.INVALID_REQUEST
        if any(t not in (GAP, ACCEPT, RELEASE, REJECT, RENEW) for t in types):
            return ErrorCode.INVALID_REQUEST
        for off in range(first, last + 1):
            rec = self.records.get(off)
            if rec is None or rec.state != ACQUIRED or rec.member != member:
                return ErrorCode.INVALID_RECORD_STATE
        for i, off in enumerate(range(first, last + 1)):
            rec = self.records[off]
            t = types[0] if len(types) == 1 else types[i]
            if t == ACCEPT:
                rec.state, rec.member = ACKNOWLEDGED, None
            elif t in (GAP, REJECT):
                rec.state, rec.member = ARCHIVED, None
            elif t == RELEASE:
                self._release(rec, delivery_limit)
            else:
                rec.deadline = time.monotonic() + lock_ms / 1000
        self.dirty = True
        self._advance()
        return ErrorCode.NONE

    def _release(self, rec: InFlight, delivery_limit: int) -> None:
        self.dirty = True
        rec.state = ARCHIVED if rec.delivery_count >= delivery_limit else AVAILABLE
        rec.member = None

    def release_member(self, member: str, delivery_limit: int) -> bool:
        """A member left or its session closed: what it holds is available again."""
        changed = False
        for rec in self.records.values():
            if rec.state == ACQUIRED and rec.member == member:
                self._release(rec, delivery_limit)
                changed = True
        self._advance()
        return changed

    def expire_locks(self, now: float, delivery_limit: int) -> bool:
        changed = False
        for rec in self.records.values():
            if rec.state == ACQUIRED and rec.deadline <= now:
                self._release(rec, delivery_limit)
                changed = True
        if changed:
            self._advance()
        return changed

    def _advance(self) -> None:
        records = self.records
        while self.start < self.end:
            rec = records.get(self.start)
            if rec is not None and rec.state not in (ACKNOWLEDGED, ARCHIVED):
                break
            records.pop(self.start, None)
            self.start += 1

    def _move_start(self, offset: int) -> None:
        for off in [o for o in self.records if o < offset]:
            del self.records[off]
        self.start = offset
        self.end = max(self.end, offset)

    def reset(self, offset: int) -> None:
        """AlterShareGroupOffsets, or records deleted under an idle share-partition: start over at offset."""
        self.dirty = True
        self.records.clear()
        self.start = self.end = offset

    def state_batches(self) -> list[tuple[int, int, int, int]]:
        """(first, last, state, delivery count) runs of the in-flight records that are not plainly new; an
        acquired record is Available to whoever reads the state back (its lock does not survive a restart)."""
        out: list[tuple[int, int, int, int]] = []
        for off in sorted(self.records):
            rec = self.records[off]
            state = AVAILABLE if rec.state == ACQUIRED else rec.state
            if out and out[-1][1] == off - 1 and out[-1][2] == state and out[-1][3] == rec.delivery_count:
                out[-1] = (out[-1][0], off, state, rec.delivery_count)
            else:
                out.append((off, off, state, rec.delivery_count))
        return out

    def load(self, start: int, batches: list[tuple[int, int, int, int]]) -> None:
        self.records.clear()
        self.start = self.end = start
        for first, last, state, count in batches:
            for off in range(max(first, start), last + 1):
                self.records[off] = InFlight(state, count)
            self.end = max(self.end, last + 1)
        self._advance()
