"""Control records of record batch v2: transaction markers (Kafka's ControlRecordType, EndTransactionMarker).

A control batch (attributes transactional|control) holds one record:
    key:   version int16 (0) | type int16 (0 ABORT, 1 COMMIT, others: not a transaction marker)
    value: version int16 (0) | coordinator epoch int32
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from kbroker.protocol.records import (
    DEFAULT_MAX_DECOMPRESSED,
    NO_SEQUENCE,
    Buffer,
    CorruptRecordError,
    build_batch,
    decode_records,
)

CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_CURRENT_VERSION = 0


@dataclass(slots=True, frozen=True)
class EndTxnMarker:
    commit: bool
    coordinator_epoch: int

    @property
    def control_type(self) -> int:
        return CONTROL_TYPE_COMMIT if self.commit else CONTROL_TYPE_ABORT


def encode_end_txn_marker(commit: bool, coordinator_epoch: int) -> tuple[bytes, bytes]:
    """(key, value) of the control record."""
    return (_KEY.pack(_CURRENT_VERSION, CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT),
            _VALUE.pack(_CURRENT_VERSION, coordinator_epoch))


@functools.lru_cache(maxsize=16)  # a transaction's markers are one batch, written to each of its partitions
def build_end_txn_marker_batch(producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                               timestamp: int, *, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytes:
    """One control batch holding the marker, as Kafka's MemoryRecords.withEndTransactionMarker writes it."""
    key, value = encode_end_txn_marker(commit, coordinator_epoch)
    return build_batch([(key, value, [], timestamp)], base_offset=base_offset, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE, is_transactional=True,
                       is_control=True, partition_leader_epoch=partition_leader_epoch)


def control_record_type(key: bytes | None) -> int | None:
    """The type in a control record key; None when the key is too short to hold one."""
    if key is None or len(key) < _KEY.size:
        return None
    return int(_KEY.unpack_from(key)[1])


def parse_end_txn_marker(batch: Buffer, pos: int = 0, *,
                         max_size: int = DEFAULT_MAX_DECOMPRESSED) -> EndTxnMarker | None:
    """The transaction marker in the control batch at pos; None for an empty (cleaned) batch or another type.

    Raises CorruptRecordError when a marker's value is malformed.
    """
    records = decode_records(batch, pos, max_size=max_size)
    if not records:
        return None
    rec = records[0]
    ctype = control_record_type(rec.key)
    if ctype not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
        return None
    if rec.value is None or len(rec.value) < _VALUE.size:
        raise CorruptRecordError(f"transaction marker at offset {rec.offset} has a malformed value")
    _, coordinator_epoch = _VALUE.unpack_from(rec.value)
    return EndTxnMarker(ctype == CONTROL_TYPE_COMMIT, coordinator_epoch)
