"""Per-partition segmented log storage with Kafka semantics (sync, thread-safe, no asyncio)."""

from storage.config import TOPIC_CONFIG_KEYS, LogConfig
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from storage.log import FetchDataInfo, Log, LogAppendInfo
from storage.manager import LogManager
from storage.segment import FileRecordsSlice, LogSegment
from storage.transaction_index import AbortedTxn

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
