"""Reading a __consumer_offsets partition back at load time (Kafka's GroupMetadataManager.doLoadGroupsAndOffsets).

Runs on an executor thread: it only reads the log and parses records. The coordinator replays the result on
its loop, in log order: transactional offset commits stay pending per producer id until their COMMIT or ABORT
marker. One unreadable record or batch is logged with its offset and skipped, so it never costs the other
groups of the partition their state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kbroker.coordinator import group_records as records
from kbroker.coordinator.consumer_group_records import ConsumerGroupRecord
from kbroker.coordinator.share_group_records import ShareGroupRecord
from kbroker.coordinator.streams_group_records import StreamsGroupRecord
from kbroker.protocol.primitives import I16
from kbroker.protocol.records import NO_PRODUCER_ID, decode_records, iter_batch_headers

log = logging.getLogger("kbroker.group")

READ_BYTES = 4 * 1024 * 1024
# Control record types (Kafka's ControlRecordType): the key is version int16 + type int16.
CONTROL_ABORT, CONTROL_COMMIT = 0, 1


@dataclass
class LoadedRecord:
    offset: int
    record: (records.OffsetRecord | records.GroupRecord | ConsumerGroupRecord | StreamsGroupRecord
             | ShareGroupRecord)
    producer_id: int  # of a transactional batch; NO_PRODUCER_ID outside transactions


@dataclass
class LoadedMarker:
    offset: int
    producer_id: int
    commit: bool


LoadedEntry = LoadedRecord | LoadedMarker


def control_type(key: bytes | None) -> int | None:
    if key is None or len(key) < 4:
        return None
    (version,) = I16.unpack_from(key, 0)
    if version != 0:
        return None
    (kind,) = I16.unpack_from(key, 2)
    return int(kind)


def read_entries(lg: Any, start: int, end: int, name: str) -> list[LoadedEntry]:
    """Every offset/group record and transaction marker in [start, end) of lg, in log order."""
    out: list[LoadedEntry] = []
    offset = max(start, lg.log_start_offset)
    while offset < end:
        info = lg.read(offset, READ_BYTES, max_offset=end)
        if info.records is None or info.records.size == 0:
            break
        data = info.records.read_bytes()
        last = offset
        for pos, header in iter_batch_headers(data):
            last = header.next_offset
            try:
                recs = decode_records(data, pos)
            except Exception as e:  # noqa: BLE001 - a damaged batch costs its own records only
                log.error("Skipping unreadable batch at offsets %d..%d of %s while loading: %s",
                          header.base_offset, header.last_offset, name, e)
                continue
            if header.is_control:
                kind = control_type(recs[0].key) if recs else None
                if kind in (CONTROL_ABORT, CONTROL_COMMIT):
                    out.append(LoadedMarker(header.base_offset, header.producer_id, kind == CONTROL_COMMIT))
                continue
            pid = header.producer_id if header.is_transactional else NO_PRODUCER_ID
            for rec in recs:
                if rec.offset < offset:
                    continue
                parsed = _parse(rec.key, rec.value, rec.offset, name)
                if parsed is not None:
                    out.append(LoadedRecord(rec.offset, parsed, pid))
        if last <= offset:
            break
        offset = last
    return out


def _parse(key: bytes | None, value: bytes | None, offset: int,
           name: str) -> (records.OffsetRecord | records.GroupRecord | ConsumerGroupRecord | StreamsGroupRecord
                          | ShareGroupRecord | None):
    if key is None:
        log.error("Skipping record without a key at offset %d of %s while loading", offset, name)
        return None
    try:
        return records.parse_record(key, value)
    except Exception as e:  # noqa: BLE001 - whatever is wrong with one record, the others still load
        log.error("Skipping unreadable record at offset %d of %s while loading: %s", offset, name, e)
        return None
