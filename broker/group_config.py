"""Group-level configs (config resource type GROUP, 32): Kafka 3.9's GroupConfig for KIP-848 consumer groups.

A group's `consumer.session.timeout.ms` / `consumer.heartbeat.interval.ms` override the broker's
`group.consumer.session.timeout.ms` / `group.consumer.heartbeat.interval.ms` for that group only, within the
broker's `group.consumer.min/max.*` bounds. Kafka 4.2's share-group keys (KIP-932) do the same for share groups
within `group.share.min/max.*`, and add `share.auto.offset.reset` and `share.isolation.level`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kbroker.broker.config import KafkaConfig
from kbroker.broker.topic_config import CONFIG_TYPES, SOURCE_DEFAULT, DescribedConfig, broker_config_synonyms

CONSUMER_SESSION_TIMEOUT_MS = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS = "consumer.heartbeat.interval.ms"
SHARE_SESSION_TIMEOUT_MS = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL_MS = "share.heartbeat.interval.ms"
SHARE_RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"
# group key -> the broker key that supplies its default (Kafka: GroupCoordinatorConfig.GROUP_PREFIX + name)
GROUP_TO_BROKER: dict[str, str] = {
    CONSUMER_HEARTBEAT_INTERVAL_MS: "group.consumer.heartbeat.interval.ms",
    CONSUMER_SESSION_TIMEOUT_MS: "group.consumer.session.timeout.ms",
    SHARE_HEARTBEAT_INTERVAL_MS: "group.share.heartbeat.interval.ms",
    SHARE_SESSION_TIMEOUT_MS: "group.share.session.timeout.ms",
    SHARE_RECORD_LOCK_DURATION_MS: "group.share.record.lock.duration.ms",
}
# Group keys without a broker synonym: their defaults (Kafka's ShareGroupConfig).
STRING_DEFAULTS: dict[str, str] = {SHARE_AUTO_OFFSET_RESET: "latest", SHARE_ISOLATION_LEVEL: "read_uncommitted"}
DOCUMENTATION: dict[str, str] = {
    CONSUMER_SESSION_TIMEOUT_MS: "The timeout to detect client failures when using the consumer group protocol.",
    CONSUMER_HEARTBEAT_INTERVAL_MS: "The heartbeat interval given to the members of a consumer group.",
    SHARE_SESSION_TIMEOUT_MS: "The timeout to detect client failures when using the share group protocol.",
    SHARE_HEARTBEAT_INTERVAL_MS: "The heartbeat interval given to the members of a share group.",
    SHARE_RECORD_LOCK_DURATION_MS: "The record acquisition lock duration in milliseconds for share groups.",
    SHARE_AUTO_OFFSET_RESET: "The strategy to initialize the share-partition start offset.",
    SHARE_ISOLATION_LEVEL: "Controls how to read records written transactionally.",
}
_BY_DURATION = re.compile(r"by_duration:P(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?", re.IGNORECASE)
# Kafka's DescribeConfigsResponse.ConfigSource.GROUP_CONFIG (the admin client's DYNAMIC_GROUP_CONFIG).
SOURCE_GROUP = 8
INT_TYPE = CONFIG_TYPES["int"]
STRING_TYPE = CONFIG_TYPES["string"]
_INT32_MAX = 2**31 - 1
_JAVA_INT = re.compile(r"[+-]?[0-9]+")


class InvalidGroupConfig(ValueError):
    """Kafka's InvalidConfigurationException / ConfigException for a group config (INVALID_CONFIG)."""


def _parse_int(name: str, value: str) -> int:
    # Java's ConfigDef: Integer.parseInt of the trimmed string, then the atLeast(1) validator.
    text = value.strip()
    n = int(text) if _JAVA_INT.fullmatch(text) else None
    if n is None or not -_INT32_MAX - 1 <= n <= _INT32_MAX:
        raise InvalidGroupConfig(f"Invalid value {value} for configuration {name}: Not a number of type INT")
    if n < 1:
        raise InvalidGroupConfig(f"Invalid value {value} for configuration {name}: Value must be at least 1")
    return n


def validate_group_configs(configs: Mapping[str, str | None], cfg: KafkaConfig) -> dict[str, int]:
    """Kafka's GroupConfig.validate: known names, ints, within the broker's bounds; the group's effective
    values (overrides over broker defaults)."""
    for name in configs:
        if name not in GROUP_TO_BROKER and name not in STRING_DEFAULTS:
            raise InvalidGroupConfig(f"Unknown group config name: {name}")
    nulls = [n for n, v in configs.items() if v is None]
    if nulls:
        raise InvalidGroupConfig(f"Null value not supported for group configs: {','.join(nulls)}")
    values = {name: cfg[bkey] for name, bkey in GROUP_TO_BROKER.items()}
    for name, value in configs.items():
        if name in STRING_DEFAULTS:
            _check_string(name, str(value))
        else:
            values[name] = _parse_int(name, str(value))
    for prefix in ("consumer", "share"):
        for bounded in ("heartbeat.interval", "session.timeout", "record.lock.duration"):
            name = f"{prefix}.{bounded}.ms"
            if name not in GROUP_TO_BROKER:
                continue
            low, high = f"group.{prefix}.min.{bounded}.ms", f"group.{prefix}.max.{bounded}.ms"
            if values[name] < cfg[low]:
                raise InvalidGroupConfig(f"{name} must be greater than or equal to {low}")
            if values[name] > cfg[high]:
                raise InvalidGroupConfig(f"{name} must be less than or equal to {high}")
        session, heartbeat = f"{prefix}.session.timeout.ms", f"{prefix}.heartbeat.interval.ms"
        if values[session] <= values[heartbeat]:
            raise InvalidGroupConfig(f"{session} must be greater than {heartbeat}")
    return values


def _check_string(name: str, value: str) -> None:
    if name == SHARE_AUTO_OFFSET_RESET:
        v = value.strip().lower()
        if v not in ("earliest", "latest") and not _BY_DURATION.fullmatch(v):
            raise InvalidGroupConfig(
                f"Invalid value {value} for configuration {name}: the value must be either 'earliest', 'latest' "
                "or of the format 'by_duration:<PnDTnHnMn.nS.>'.")
    elif value not in ("read_committed", "read_uncommitted"):
        raise InvalidGroupConfig(
            f"Invalid value {value} for configuration {name}: String must be one of: read_committed, read_uncommitted")


def config_type(name: str) -> int:
    """The DescribeConfigs type of a group key."""
    return STRING_TYPE if name in STRING_DEFAULTS else INT_TYPE


def describe_group(cfg: KafkaConfig, overrides: Mapping[str, str]) -> list[DescribedConfig]:
    """Kafka's ConfigHelper.createGroupConfigEntry: the group's own value first, then its broker synonym's chain
    (a static broker setting, or the default)."""
    out = []
    for name, bkey in sorted(GROUP_TO_BROKER.items()):
        synonyms = broker_config_synonyms(cfg, {}, bkey)
        if name in overrides:
            synonyms.insert(0, (name, overrides[name], SOURCE_GROUP))
        value = overrides[name] if name in overrides else str(cfg[bkey])
        out.append(DescribedConfig(name, value, synonyms[0][2], read_only=False, synonyms=synonyms))
    for name, default in STRING_DEFAULTS.items():
        value = overrides.get(name, default)
        source = SOURCE_GROUP if name in overrides else SOURCE_DEFAULT
        synonyms = [(name, value, SOURCE_GROUP)] if name in overrides else []
        out.append(DescribedConfig(name, value, source, read_only=False, synonyms=synonyms))
    return sorted(out, key=lambda d: d.name)
