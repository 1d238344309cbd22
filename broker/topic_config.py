"""Topic-level configs: which keys exist, their broker-level synonyms, validation, effective values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kbroker.broker.config import KafkaConfig, render_value
from kbroker.storage.config import LogConfig

# topic key -> broker key that supplies its default (Kafka's LogConfig synonyms)
TOPIC_TO_BROKER: dict[str, str] = {
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "index.interval.bytes": "log.index.interval.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "cleanup.policy": "log.cleanup.policy",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "min.insync.replicas": "min.insync.replicas",
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "message.downconversion.enable": "log.message.downconversion.enable",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "preallocate": "log.preallocate",
    "local.retention.bytes": "log.local.retention.bytes",
    "local.retention.ms": "log.local.retention.ms",
    "message.format.version": "log.message.format.version",
}

# Topic configs without a broker synonym (Kafka 3.9's LogConfig), with their defaults as described.
TOPIC_ONLY: dict[str, str] = {
    "leader.replication.throttled.replicas": "",
    "follower.replication.throttled.replicas": "",
    "remote.storage.enable": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}

# Kafka's ConfigEntry.ConfigType ids for DescribeConfigs v3+.
CONFIG_TYPES: dict[str, int] = {
    "boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "class": 8, "password": 9,
}
_TOPIC_TYPES = {
    "segment.bytes": "int", "segment.ms": "long", "segment.index.bytes": "int", "index.interval.bytes": "int",
    "retention.ms": "long", "retention.bytes": "long", "cleanup.policy": "list", "max.message.bytes": "int",
    "message.timestamp.type": "string", "flush.messages": "long", "flush.ms": "long",
    "delete.retention.ms": "long", "min.compaction.lag.ms": "long", "min.cleanable.dirty.ratio": "double",
    "file.delete.delay.ms": "long", "min.insync.replicas": "int", "compression.type": "string",
    "unclean.leader.election.enable": "boolean", "compression.gzip.level": "int", "compression.lz4.level": "int",
    "compression.zstd.level": "int", "message.timestamp.difference.max.ms": "long",
    "message.timestamp.before.max.ms": "long", "message.timestamp.after.max.ms": "long",
    "message.downconversion.enable": "boolean", "max.compaction.lag.ms": "long", "segment.jitter.ms": "long",
    "preallocate": "boolean", "local.retention.bytes": "long", "local.retention.ms": "long",
    "message.format.version": "string", "remote.storage.enable": "boolean", "remote.log.copy.disable": "boolean",
    "remote.log.delete.on.disable": "boolean", "leader.replication.throttled.replicas": "list",
    "follower.replication.throttled.replicas": "list",
}


def config_type_of(key: str) -> int:
    return CONFIG_TYPES[_TOPIC_TYPES.get(key, "string")]


class InvalidConfig(ValueError):
    pass


def default_log_config(cfg: KafkaConfig, dynamic: Mapping[str, str] | None = None) -> LogConfig:
    """The LogConfig every topic starts from: broker settings (plus dynamic broker overrides)."""
    topic_view = {t: render_value(_broker_value(cfg, b, dynamic)) for t, b in TOPIC_TO_BROKER.items()}
    return LogConfig.from_topic_configs(LogConfig(), {k: v for k, v in topic_view.items() if v is not None})


def _broker_value(cfg: KafkaConfig, key: str, dynamic: Mapping[str, str] | None) -> Any:
    if dynamic and key in dynamic:
        return dynamic[key]
    return cfg[key]


def validate_topic_configs(configs: Mapping[str, str | None], base: LogConfig) -> LogConfig:
    """Check topic overrides like Kafka's LogConfig.validate; raises InvalidConfig naming the key."""
    for key, value in configs.items():
        if key not in TOPIC_TO_BROKER and key not in TOPIC_ONLY:
            raise InvalidConfig(f"Unknown topic config name: {key}")
        if value is None:
            raise InvalidConfig(f"Null value not supported for topic config {key}")
    if "min.insync.replicas" in configs:
        try:
            if int(str(configs["min.insync.replicas"])) < 1:
                raise ValueError
        except ValueError:
            raise InvalidConfig(
                f"Invalid value {configs['min.insync.replicas']} for configuration min.insync.replicas"
            ) from None
    if "unclean.leader.election.enable" in configs and str(configs["unclean.leader.election.enable"]).lower() not in (
        "true", "false"
    ):
        raise InvalidConfig("Invalid value for configuration unclean.leader.election.enable: expected true or false")
    try:
        config = LogConfig.from_topic_configs(base, {k: str(v) for k, v in configs.items()})
    except ValueError as e:
        raise InvalidConfig(str(e)) from None
    # Kafka's LogConfig.validateValues and validateRemoteStorageOnlyIfSystemEnabled (kbroker has no tiered
    # storage, as a Kafka broker with remote.log.storage.system.enable=false).
    if config.min_compaction_lag_ms > config.max_compaction_lag_ms:
        raise InvalidConfig(f"conflict topic config setting min.compaction.lag.ms ({config.min_compaction_lag_ms}) > "
                            f"max.compaction.lag.ms ({config.max_compaction_lag_ms})")
    if config.remote_storage_enable and str(configs.get("remote.storage.enable", "")).lower() == "true":
        raise InvalidConfig("Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
                            "with remote log storage.")
    return config


@dataclass
class DescribedConfig:
    name: str
    value: str | None
    source: int  # Kafka ConfigSource: 1 topic, 2 dynamic broker, 4 static broker, 5 default
    read_only: bool = False
    sensitive: bool = False
    synonyms: list[tuple[str, str | None, int]] | None = None


SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


def broker_synonyms(name: str) -> list[str]:
    """Kafka's DynamicBrokerConfig.brokerConfigSynonyms: the broker keys that set the same value, by priority."""
    for group in _SYNONYM_GROUPS:
        if name in group:
            return list(group)
    if name == "log.flush.interval.ms":
        return ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"]
    return [name]


_SYNONYM_GROUPS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)


def broker_config_synonyms(cfg: KafkaConfig, dynamic: Mapping[str, str], name: str,
                           own: Mapping[str, str] | None = None) -> list[tuple[str, str | None, int]]:
    """Kafka's ConfigHelper.configSynonyms: by source first (dynamic, static, default), then by synonym priority;
    `dynamic` holds the cluster-wide defaults, `own` this broker's dynamic configs; the synonyms ahead of `name`
    itself are dropped (so log.retention.ms set only through log.retention.hours
    has none, and describes as a default)."""
    from kbroker.broker.config import KEYS

    names = broker_synonyms(name)
    out: list[tuple[str, str | None, int]] = []
    for n in names:
        if own and n in own:
            out.append((n, own[n], SOURCE_DYNAMIC_BROKER))
    for n in names:
        if n in dynamic:
            out.append((n, dynamic[n], SOURCE_DYNAMIC_DEFAULT_BROKER))
    for n in names:
        if n in cfg.originals:
            out.append((n, cfg.originals[n], SOURCE_STATIC_BROKER))
    for n in names:
        spec = KEYS.get(n)
        if spec is not None and spec.default is not None:
            out.append((n, render_value(spec.default), SOURCE_DEFAULT))
    while out and out[0][0] != name:
        out.pop(0)
    return out


def describe_topic(cfg: KafkaConfig, overrides: Mapping[str, str], dynamic: Mapping[str, str],
                   own: Mapping[str, str] | None = None) -> list[DescribedConfig]:
    """Kafka's createTopicConfigEntry: the topic's own value first, then its broker synonym's chain (`dynamic`: the
    cluster-wide dynamic defaults, `own`: this broker's dynamic configs)."""
    out = []
    effective = {**dynamic, **(own or {})}
    for key, bkey in sorted(TOPIC_TO_BROKER.items()):
        synonyms = broker_config_synonyms(cfg, dynamic, bkey, own)
        if key in overrides:
            synonyms.insert(0, (key, overrides[key], SOURCE_TOPIC))
        value = overrides[key] if key in overrides else render_value(_broker_value(cfg, bkey, effective))
        source = synonyms[0][2] if synonyms else SOURCE_DEFAULT
        out.append(DescribedConfig(key, value, source, synonyms=synonyms))
    for key, default in TOPIC_ONLY.items():
        if key in overrides:
            out.append(DescribedConfig(key, overrides[key], SOURCE_TOPIC, synonyms=[(key, overrides[key], SOURCE_TOPIC)]))
        else:
            out.append(DescribedConfig(key, default, SOURCE_DEFAULT, synonyms=[]))
    out.sort(key=lambda c: c.name)
    return out
