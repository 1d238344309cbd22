"""Storage-layer exceptions, each carrying the Kafka error code the broker should return."""

from __future__ import annotations

from kbroker.protocol.records import CorruptRecordError, InvalidRecordError

__all__ = [
    "CorruptRecordError",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTxnStateError",
    "KafkaStorageError",
    "LogDirNotFoundError",
    "LogReplacedError",
    "NotLeaderOrFollowerError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "RecordTooLargeError",
    "StorageError",
    "TransactionCoordinatorFencedError",
    "UnknownProducerIdError",
]


class StorageError(Exception):
    error_code = -1


class RecordTooLargeError(StorageError):
    error_code = 10  # MESSAGE_TOO_LARGE


class OffsetOutOfRangeError(StorageError):
    error_code = 1  # OFFSET_OUT_OF_RANGE


class KafkaStorageError(StorageError):
    error_code = 56  # KAFKA_STORAGE_ERROR


class LogReplacedError(KafkaStorageError):
    """The log was swapped for its copy in another log dir (AlterReplicaLogDirs): look the partition up again."""


class LogDirNotFoundError(StorageError):
    error_code = 57  # LOG_DIR_NOT_FOUND


class NotLeaderOrFollowerError(StorageError):
    error_code = 6  # NOT_LEADER_OR_FOLLOWER


class OutOfOrderSequenceError(StorageError):
    error_code = 45  # OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(StorageError):
    error_code = 47  # INVALID_PRODUCER_EPOCH


class UnknownProducerIdError(StorageError):
    error_code = 59  # UNKNOWN_PRODUCER_ID


class InvalidTxnStateError(StorageError):
    error_code = 48  # INVALID_TXN_STATE


class TransactionCoordinatorFencedError(StorageError):
    error_code = 52  # TRANSACTION_COORDINATOR_FENCED
