"""Record formats of __transaction_state (Kafka's TransactionLogKey / TransactionLogValue).

Kafka 3.9 writes key version 0 and, while transaction.version is 0 (its default), value version 0: the
non-flexible encoding. Version 1 (flexible, tagged fields) is read but never written. A tombstone (value None)
removes an expired transactional id.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kbroker.coordinator.transaction_metadata import TransactionMetadata, TransactionState, TxnTransitMetadata
from kbroker.protocol import codec
from kbroker.protocol.messages import TransactionLogKey, TransactionLogValue
from kbroker.protocol.primitives import I16

KEY_VERSION = 0
VALUE_VERSION = 0


class UnknownTxnRecordVersion(ValueError):
    pass


def _versioned(version: int, obj: object) -> bytes:
    out = bytearray(I16.pack(version))
    codec.encode(obj, version, out)
    return bytes(out)


def key_bytes(transactional_id: str) -> bytes:
    return _versioned(KEY_VERSION, TransactionLogKey(transactional_id=transactional_id))


@functools.lru_cache(maxsize=256)
def _partitions_schema(tps: frozenset[tuple[str, int]]) -> list[TransactionLogValue.PartitionsSchema]:
    """The value's partition list, by topic in sorted order. Cached: a transaction writes the same set in its
    Ongoing and Prepare* records, and a producer's transactions usually span the same partitions; the list is only
    encoded, never changed."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(tps):
        by_topic.setdefault(topic, []).append(partition)
    return [TransactionLogValue.PartitionsSchema(topic=topic, partition_ids=ids) for topic, ids in by_topic.items()]


def value_bytes(t: TxnTransitMetadata) -> bytes:
    """Kafka's TransactionLog.valueToBytes: Empty carries a null partition list, other states group by topic."""
    if t.txn_state is TransactionState.EMPTY and t.topic_partitions:
        raise ValueError(f"an Empty transaction carries no partitions: {t}")
    partitions: list[TransactionLogValue.PartitionsSchema] | None = None
    if t.txn_state is not TransactionState.EMPTY:
        partitions = _partitions_schema(frozenset(t.topic_partitions))
    return _versioned(VALUE_VERSION, TransactionLogValue(
        producer_id=t.producer_id,
        producer_epoch=t.producer_epoch,
        transaction_timeout_ms=t.txn_timeout_ms,
        transaction_status=int(t.txn_state),
        transaction_partitions=partitions,
        transaction_last_update_timestamp_ms=t.txn_last_update_timestamp,
        transaction_start_timestamp_ms=t.txn_start_timestamp,
    ))


def parse_key(key: bytes) -> str:
    version = I16.unpack_from(key, 0)[0]
    if version != KEY_VERSION:
        raise UnknownTxnRecordVersion(f"unknown transaction log key version {version}")
    k, _ = codec.decode(TransactionLogKey, version, key, 2)
    return str(k.transactional_id)


def parse_value(transactional_id: str, value: bytes) -> TransactionMetadata:
    """Kafka's TransactionLog.readTxnRecordValue. The v0 value has no previous producer id or epoch, so they load
    as -1: a KIP-360 retry that spans a coordinator reload is fenced, as in Kafka."""
    version = I16.unpack_from(value, 0)[0]
    lo, hi = TransactionLogValue.VALID_VERSIONS or (0, 0)
    if not lo <= version <= hi:
        raise UnknownTxnRecordVersion(f"unknown transaction log value version {version}")
    v, _ = codec.decode(TransactionLogValue, version, value, 2)
    state = TransactionState(v.transaction_status)
    meta = TransactionMetadata(
        transactional_id, v.producer_id, v.producer_epoch, v.transaction_timeout_ms, state,
        txn_last_update_timestamp=v.transaction_last_update_timestamp_ms,
        txn_start_timestamp=v.transaction_start_timestamp_ms,
    )
    if state is not TransactionState.EMPTY:
        for p in v.transaction_partitions or []:
            meta.topic_partitions.update((p.topic, pid) for pid in p.partition_ids)
    return meta


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """One record of __transaction_state: metadata None is a tombstone."""

    transactional_id: str
    metadata: TransactionMetadata | None


def parse_record(key: bytes, value: bytes | None) -> TxnRecord:
    tid = parse_key(key)
    return TxnRecord(tid, None if value is None else parse_value(tid, value))
