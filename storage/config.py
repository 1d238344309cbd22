"""LogConfig: topic-level log settings with Kafka's names, defaults and validation."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

_LONG_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    flush_messages: int = _LONG_MAX
    flush_ms: int = _LONG_MAX
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    file_delete_delay_ms: int = 60000
    # "producer" keeps each batch's codec (the fast path); a codec name recompresses batches on append.
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    message_timestamp_difference_max_ms: int = _LONG_MAX
    message_timestamp_before_max_ms: int = _LONG_MAX
    message_timestamp_after_max_ms: int = _LONG_MAX
    # Fetch v0-v3 consumers get the log's v2 batches converted to their message format only when this is true.
    message_downconversion_enable: bool = True
    # KIP-354: a dirty record is compacted at the latest this long after it was written (Long.MAX: no bound).
    max_compaction_lag_ms: int = _LONG_MAX
    # Kept, validated and described as Kafka does; kbroker has no use for them (no preallocation, no tiered
    # storage, no replication throttles, one message format; segment rolls take no random jitter).
    segment_jitter_ms: int = 0
    preallocate: bool = False
    local_retention_bytes: int = -2
    local_retention_ms: int = -2
    message_format_version: str = "3.0-IV1"
    remote_storage_enable: bool = False
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""

    # Filled in below the class: the topic config keys this class understands.
    TOPIC_CONFIG_KEYS: ClassVar[frozenset[str]]

    # cleanup_policy only ever holds the tokens "compact" and "delete" (validated), so a substring
    # test is exact, and cheap enough for the append path. An empty policy is neither.
    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def policies(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.cleanup_policy.split(",") if p.strip())

    @property
    def max_segment_ms(self) -> int:
        """Kafka's LogConfig.maxSegmentMs: a compacted topic rolls its active segment by max.compaction.lag.ms
        at the latest, so the cleaner can reach its records in time."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @property
    def target_codec(self) -> int | None:
        """The codec id batches are stored with, or None to keep the producer's."""
        return COMPRESSION_CODECS.get(self.compression_type)

    @property
    def compression_level(self) -> int | None:
        return {"gzip": self.compression_gzip_level, "lz4": self.compression_lz4_level,
                "zstd": self.compression_zstd_level}.get(self.compression_type)

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    def timestamp_bounds(self, now_ms: int) -> tuple[int, int] | None:
        """The CreateTime range a produced record must fall in, None when unbounded (the default).

        Kafka 3.6+: message.timestamp.before/after.max.ms, each falling back to the deprecated
        message.timestamp.difference.max.ms while left at its default.
        """
        before = self.message_timestamp_before_max_ms
        if before == _LONG_MAX:
            before = self.message_timestamp_difference_max_ms
        after = self.message_timestamp_after_max_ms
        if after == _LONG_MAX:
            after = self.message_timestamp_difference_max_ms
        if before == _LONG_MAX and after == _LONG_MAX:
            return None
        return (now_ms - before if before != _LONG_MAX else -(2**63),
                now_ms + after if after != _LONG_MAX else _LONG_MAX)

    def replace(self, **changes: Any) -> LogConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_topic_configs(cls, base: LogConfig, overrides: Mapping[str, str]) -> LogConfig:
        """Apply Kafka topic config overrides (string values) on top of base; unknown keys are
        ignored here because the broker owns the full topic-config namespace."""
        changes: dict[str, Any] = {}
        for key, raw in overrides.items():
            spec = _SPECS.get(key)
            if spec is None:
                continue
            attr, parse = spec
            try:
                changes[attr] = parse(raw.strip() if isinstance(raw, str) else raw)
            except (ValueError, TypeError) as e:
                raise ValueError(f"Invalid value {raw!r} for configuration {key}: {e}") from None
        return dataclasses.replace(base, **changes)

    def to_topic_configs(self) -> dict[str, str]:
        out = {}
        for key, (attr, _) in _SPECS.items():
            value = getattr(self, attr)
            out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return out


def _int(lo: int, hi: int = _LONG_MAX) -> Callable[[str], int]:
    def parse(s: str) -> int:
        v = int(s)
        if not lo <= v <= hi:
            raise ValueError(f"must be in [{lo}, {hi}]")
        return v

    return parse


def _ratio(s: str) -> float:
    v = float(s)
    if not 0.0 <= v <= 1.0:
        raise ValueError("must be in [0, 1]")
    return v


def _policy(s: str) -> str:
    # An empty list is legal (Kafka's ValidList): neither retention deletion nor compaction.
    parts = [p.strip() for p in s.split(",") if p.strip()]
    if any(p not in ("delete", "compact") for p in parts):
        raise ValueError("must be a list of 'delete' and/or 'compact'")
    return ",".join(sorted(set(parts), key=parts.index))


# Kafka's BrokerCompressionType names -> record batch codec ids ("producer" is absent: keep the batch's).
COMPRESSION_CODECS: dict[str, int] = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _compression_type(s: str) -> str:
    if s not in COMPRESSION_CODECS and s != "producer":
        raise ValueError("must be one of uncompressed, zstd, lz4, snappy, gzip, producer")
    return s


def _gzip_level(s: str) -> int:
    v = int(s)
    if v != -1 and not 1 <= v <= 9:
        raise ValueError("must be -1 or in [1, 9]")
    return v


def _bool(s: str) -> bool:
    # Kafka's ConfigDef BOOLEAN: true or false, any case.
    if s.lower() not in ("true", "false"):
        raise ValueError("Expected value to be either true or false")
    return s.lower() == "true"


# Kafka 3.9's MetadataVersion strings that message.format.version (deprecated, ignored since 3.0) accepts.
MESSAGE_FORMAT_VERSIONS = (
    "0.8.0", "0.8.1", "0.8.2", "0.9.0", "0.10.0-IV0", "0.10.0-IV1", "0.10.1-IV0", "0.10.1-IV1", "0.10.1-IV2",
    "0.10.2-IV0", "0.11.0-IV0", "0.11.0-IV1", "0.11.0-IV2", "1.0-IV0", "1.1-IV0", "2.0-IV0", "2.0-IV1", "2.1-IV0",
    "2.1-IV1", "2.1-IV2", "2.2-IV0", "2.2-IV1", "2.3-IV0", "2.3-IV1", "2.4-IV0", "2.4-IV1", "2.5-IV0", "2.6-IV0",
    "2.7-IV0", "2.7-IV1", "2.7-IV2", "2.8-IV0", "2.8-IV1", "3.0-IV0", "3.0-IV1", "3.1-IV0", "3.2-IV0", "3.3-IV0",
    "3.3-IV1", "3.3-IV2", "3.3-IV3", "3.4-IV0", "3.5-IV0", "3.5-IV1", "3.5-IV2", "3.6-IV0", "3.6-IV1", "3.6-IV2",
    "3.7-IV0", "3.7-IV1", "3.7-IV2", "3.7-IV3", "3.7-IV4", "3.8-IV0", "3.9-IV0", "4.0-IV0", "4.0-IV1",
)


def _message_format_version(s: str) -> str:
    # MetadataVersion.fromVersionString: a full name, or a release ("2.8", "0.10.0", "0.10.0.1") for its last IV.
    release = ".".join(s.split(".")[:3] if s.startswith("0.") else s.split(".")[:2])
    if s in MESSAGE_FORMAT_VERSIONS or any(v.split("-")[0] == release for v in MESSAGE_FORMAT_VERSIONS):
        return s
    raise ValueError(f"Version {s} is not a valid version. Should be one of {', '.join(MESSAGE_FORMAT_VERSIONS)}")


_THROTTLED = re.compile(r"\s*\d+\s*:\s*\d+\s*")


def _throttled_replicas(s: str) -> str:
    # Kafka's ThrottledReplicaListValidator: empty, the wildcard, or partitionId:brokerId pairs.
    parts = [p for p in s.split(",")] if s.strip() else []
    if s.strip() == "*" or all(_THROTTLED.fullmatch(p) for p in parts):
        return s.strip()
    raise ValueError("must be the literal '*' or a list of replicas in the following format: "
                     "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


def _ts_type(s: str) -> str:
    if s not in ("CreateTime", "LogAppendTime"):
        raise ValueError("must be CreateTime or LogAppendTime")
    return s


# Kafka's lower bounds (TopicConfig/LogConfig validators).
_SPECS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "segment.bytes": ("segment_bytes", _int(14, _INT_MAX)),
    "segment.ms": ("segment_ms", _int(1)),
    "segment.index.bytes": ("segment_index_bytes", _int(4, _INT_MAX)),
    "index.interval.bytes": ("index_interval_bytes", _int(0, _INT_MAX)),
    "retention.ms": ("retention_ms", _int(-1)),
    "retention.bytes": ("retention_bytes", _int(-(2**63))),
    "cleanup.policy": ("cleanup_policy", _policy),
    "max.message.bytes": ("max_message_bytes", _int(0, _INT_MAX)),
    "message.timestamp.type": ("message_timestamp_type", _ts_type),
    "flush.messages": ("flush_messages", _int(1)),
    "flush.ms": ("flush_ms", _int(0)),
    "delete.retention.ms": ("delete_retention_ms", _int(0)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", _int(0)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _ratio),
    "file.delete.delay.ms": ("file_delete_delay_ms", _int(0)),
    "compression.type": ("compression_type", _compression_type),
    # KIP-390 (Kafka 3.8) levels and ranges.
    "compression.gzip.level": ("compression_gzip_level", _gzip_level),
    "compression.lz4.level": ("compression_lz4_level", _int(1, 17)),
    "compression.zstd.level": ("compression_zstd_level", _int(-131072, 22)),
    "message.timestamp.difference.max.ms": ("message_timestamp_difference_max_ms", _int(0)),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", _int(0)),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", _int(0)),
    "message.downconversion.enable": ("message_downconversion_enable", _bool),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", _int(1)),
    "segment.jitter.ms": ("segment_jitter_ms", _int(0)),
    "preallocate": ("preallocate", _bool),
    "local.retention.bytes": ("local_retention_bytes", _int(-2)),
    "local.retention.ms": ("local_retention_ms", _int(-2)),
    "message.format.version": ("message_format_version", _message_format_version),
    "remote.storage.enable": ("remote_storage_enable", _bool),
    "remote.log.copy.disable": ("remote_log_copy_disable", _bool),
    "remote.log.delete.on.disable": ("remote_log_delete_on_disable", _bool),
    "leader.replication.throttled.replicas": ("leader_replication_throttled_replicas", _throttled_replicas),
    "follower.replication.throttled.replicas": ("follower_replication_throttled_replicas", _throttled_replicas),
}

TOPIC_CONFIG_KEYS: frozenset[str] = frozenset(_SPECS)
LogConfig.TOPIC_CONFIG_KEYS = TOPIC_CONFIG_KEYS
