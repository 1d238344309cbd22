"""Per-partition segmented log storage with Kafka semantics (sync, thread-safe, no asyncio)."""

from kbroker.storage.config import TOPIC_CONFIG_KEYS, LogConfig
from kbroker.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from kbroker.storage.log import FetchDataInfo, Log, LogAppendInfo
from kbroker.storage.manager import LogManager
from kbroker.storage.segment import FileRecordsSlice, LogSegment
from kbroker.storage.transaction_index import AbortedTxn

__all__ = [
    "TOPIC_CONFIG_KEYS",
    "AbortedTxn",
    "CorruptRecordError",
    "FetchDataInfo",
    "FileRecordsSlice",
    "InvalidRecordError",
    "KafkaStorageError",
    "Log",
    "LogAppendInfo",
    "LogConfig",
    "LogManager",
    "LogSegment",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "StorageError",
]
