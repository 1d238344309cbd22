"""Group-level configs (config resource type GROUP, 32): Kafka 3.9's GroupConfig for KIP-848 consumer groups.

A group's `consumer.session.timeout.ms` / `consumer.heartbeat.interval.ms` override the broker's
`group.consumer.session.timeout.ms` / `group.consumer.heartbeat.interval.ms` for that group only, within the
broker's `group.consumer.min/max.*` bounds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kbroker.broker.config import KafkaConfig
from kbroker.broker.topic_config import CONFIG_TYPES, DescribedConfig, broker_config_synonyms

CONSUMER_SESSION_TIMEOUT_MS = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS = "consumer.heartbeat.interval.ms"
# group key -> the broker key that supplies its default (Kafka: GroupCoordinatorConfig.GROUP_PREFIX + name)
GROUP_TO_BROKER: dict[str, str] = {
    CONSUMER_HEARTBEAT_INTERVAL_MS: "group.consumer.heartbeat.interval.ms",
    CONSUMER_SESSION_TIMEOUT_MS: "group.consumer.session.timeout.ms",
}
DOCUMENTATION: dict[str, str] = {
    CONSUMER_SESSION_TIMEOUT_MS: "The timeout to detect client failures when using the consumer group protocol.",
    CONSUMER_HEARTBEAT_INTERVAL_MS: "The heartbeat interval given to the members of a consumer group.",
}
# Kafka's DescribeConfigsResponse.ConfigSource.GROUP_CONFIG (the admin client's DYNAMIC_GROUP_CONFIG).
SOURCE_GROUP = 8
INT_TYPE = CONFIG_TYPES["int"]
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
        if name not in GROUP_TO_BROKER:
            raise InvalidGroupConfig(f"Unknown group config name: {name}")
    nulls = [n for n, v in configs.items() if v is None]
    if nulls:
        raise InvalidGroupConfig(f"Null value not supported for group configs: {','.join(nulls)}")
    values = {name: cfg[bkey] for name, bkey in GROUP_TO_BROKER.items()}
    for name, value in configs.items():
        values[name] = _parse_int(name, str(value))
    for name, bounded in ((CONSUMER_HEARTBEAT_INTERVAL_MS, "heartbeat.interval"),
                          (CONSUMER_SESSION_TIMEOUT_MS, "session.timeout")):
        low, high = f"group.consumer.min.{bounded}.ms", f"group.consumer.max.{bounded}.ms"
        if values[name] < cfg[low]:
            raise InvalidGroupConfig(f"{name} must be greater than or equal to {low}")
        if values[name] > cfg[high]:
            raise InvalidGroupConfig(f"{name} must be less than or equal to {high}")
    if values[CONSUMER_SESSION_TIMEOUT_MS] <= values[CONSUMER_HEARTBEAT_INTERVAL_MS]:
        raise InvalidGroupConfig(f"{CONSUMER_SESSION_TIMEOUT_MS} must be greater than {CONSUMER_HEARTBEAT_INTERVAL_MS}")
    return values


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
    return out
