"""Broker configuration: Kafka's server.properties keys, types, defaults and validation."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A bad config value: the message names the key."""


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s not in ("true", "false"):
        raise ValueError("expected true or false")
    return s == "true"


def _int(v: str) -> int:
    n = int(v.strip())
    if not -(2**31) <= n <= INT_MAX:
        raise ValueError("out of int32 range")
    return n


def _long(v: str) -> int:
    n = int(v.strip())
    if not -(2**63) <= n <= LONG_MAX:
        raise ValueError("out of int64 range")
    return n


def _double(v: str) -> float:
    return float(v.strip())


def _lower(v: str) -> str:
    """Kafka's case-insensitive enum keys (ConfigDef.CaseInsensitiveValidString)."""
    return v.strip().lower()


def _str(v: str) -> str:
    return v.strip()


def _list(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def _short(v: str) -> int:
    n = int(v.strip())
    if not -(2**15) <= n <= 2**15 - 1:
        raise ValueError("out of int16 range")
    return n


def _class(v: str) -> str:
    """Kafka's Type.CLASS: a class name (kbroker loads none; kept as written)."""
    return v.strip()


def _password(v: str) -> str:
    """Kafka's Type.PASSWORD: a string never shown by DescribeConfigs."""
    return v


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class ConfigKey:
    name: str
    parse: Callable[[str], Any]
    default: Any
    check: Callable[[Any], str | None] | None = None  # returns an error text, or None when valid
    dynamic: bool = False  # may be changed with AlterConfigs at runtime
    # kbroker takes no behaviour from it (Kerberos, tiered storage, JVM plumbing, thread counts of an asyncio
    # broker): accepted, validated, stored and described as Kafka does, dynamically too where Kafka allows that.
    inert: bool = False

    @property
    def sensitive(self) -> bool:
        return self.parse is _password


def at_least(n: float) -> Callable[[Any], str | None]:
    return lambda v: None if v is None or v >= n else f"must be at least {n}"


def between(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if v is None or lo <= v <= hi else f"must be in [{lo}, {hi}]"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        values = v if isinstance(v, list) else [v]
        bad = [x for x in values if x not in choices]
        return f"must be one of {', '.join(choices)}" if bad else None

    return check


def _listeners_check(v: Any) -> str | None:
    for entry in v or []:
        try:
            parse_listener(entry)
        except ValueError as e:
            return str(e)
    return None


# The web console's address (kbroker's own key): one http://HOST:PORT, or empty for no console.
CONSOLE_LISTENER = re.compile(r"http://(\[[^\]]*\]|[^:/\s]*):(\d+)")


def _console_listener_check(v: str) -> str | None:
    if not v:
        return None
    m = CONSOLE_LISTENER.fullmatch(v)
    if m is None or not 0 <= int(m.group(2)) <= 65535:
        return "must be http://HOST:PORT (one listener; https is not served), or empty for no console"
    return None


def _schema_registry_listener_check(v: str) -> str | None:
    if not v:
        return None
    m = re.fullmatch(r"https?://(\[[^\]]*\]|[^:/\s]*):(\d+)", v)
    if m is None or not 0 <= int(m.group(2)) <= 65535:
        return "must be http://HOST:PORT or https://HOST:PORT (one listener), or empty for no schema registry"
    if importlib.util.find_spec("avro") is None:
        return "needs the avro and jsonschema packages: pip install 'kbroker[registry]'"
    return None


def _protocol_map(v: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in v.split(","):
        if not item.strip():
            continue
        name, sep, proto = item.partition(":")
        if not sep or not name.strip() or not proto.strip():
            raise ValueError(f"{item!r} is not NAME:PROTOCOL")
        out[name.strip().upper()] = proto.strip().upper()
    return out


AUTHORIZER_CLASS_NAMES = (
    "kafka.security.authorizer.AclAuthorizer",
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
)


def _super_users(v: str) -> frozenset[str]:
    """super.users: principals separated by semicolons (User:alice;User:bob)."""
    out = set()
    for item in (x.strip() for x in v.split(";")):
        if not item:
            continue
        ptype, sep, name = item.partition(":")
        if not sep or not ptype or not name:
            raise ValueError(f"expected principalType:principalName but got {item!r}")
        out.add(item)
    return frozenset(out)


KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in [
        ConfigKey("broker.id", _int, 0, at_least(0)),
        ConfigKey("listeners", _list, ["PLAINTEXT://:9092"], _listeners_check),
        ConfigKey("advertised.listeners", _list, None, _listeners_check),
        ConfigKey("listener.security.protocol.map", _protocol_map,
                  {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT", "SASL_SSL": "SASL_SSL"}),
        ConfigKey("inter.broker.listener.name", _str, None),
        ConfigKey("security.inter.broker.protocol", _str, "PLAINTEXT", one_of(*SECURITY_PROTOCOLS)),
        ConfigKey("sasl.enabled.mechanisms", _list, ["GSSAPI"]),
        ConfigKey("sasl.mechanism.inter.broker.protocol", _str, "GSSAPI"),
        ConfigKey("sasl.jaas.config", _password, None),
        ConfigKey("sasl.server.max.receive.size", _int, 524288, at_least(1)),
        ConfigKey("connections.max.reauth.ms", _long, 0, at_least(0)),
        ConfigKey("connection.failed.authentication.delay.ms", _int, 100, at_least(0)),
        # OAUTHBEARER (broker/security/oauthbearer.py): which validator, and the signed-JWT validator's settings.
        ConfigKey("sasl.server.callback.handler.class", _str, None),
        ConfigKey("sasl.oauthbearer.jwks.endpoint.url", _str, None),
        ConfigKey("sasl.oauthbearer.jwks.endpoint.refresh.ms", _long, 3600000, at_least(1)),
        ConfigKey("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", _long, 100, at_least(0)),
        ConfigKey("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", _long, 10000, at_least(0)),
        ConfigKey("sasl.oauthbearer.clock.skew.seconds", _int, 30, at_least(0)),
        ConfigKey("sasl.oauthbearer.expected.audience", _list, []),
        ConfigKey("sasl.oauthbearer.expected.issuer", _str, None),
        ConfigKey("sasl.oauthbearer.scope.claim.name", _str, "scope"),
        ConfigKey("sasl.oauthbearer.sub.claim.name", _str, "sub"),
        # Accepted as Kafka does; they configure a client's token retrieval, which the broker does not do here.
        ConfigKey("sasl.oauthbearer.token.endpoint.url", _str, None),
        ConfigKey("sasl.login.callback.handler.class", _str, None),
        ConfigKey("sasl.login.class", _str, None),
        ConfigKey("ssl.protocol", _str, "TLSv1.3"),
        ConfigKey("ssl.enabled.protocols", _list, ["TLSv1.2", "TLSv1.3"], one_of("TLSv1.2", "TLSv1.3")),
        ConfigKey("ssl.cipher.suites", _list, []),
        ConfigKey("ssl.client.auth", _str, "none", one_of("none", "requested", "required")),
        ConfigKey("ssl.principal.mapping.rules", _str, "DEFAULT"),
        ConfigKey("ssl.endpoint.identification.algorithm", _str, "https"),
        ConfigKey("ssl.keystore.type", _str, "JKS"),
        ConfigKey("ssl.keystore.location", _str, None),
        ConfigKey("ssl.keystore.password", _password, None),
        ConfigKey("ssl.key.password", _password, None),
        ConfigKey("ssl.keystore.certificate.chain", _password, None),
        ConfigKey("ssl.keystore.key", _password, None),
        ConfigKey("ssl.truststore.type", _str, "JKS"),
        ConfigKey("ssl.truststore.location", _str, None),
        ConfigKey("ssl.truststore.password", _password, None),
        ConfigKey("ssl.truststore.certificates", _password, None),
        ConfigKey("log.dirs", _list, None),
        ConfigKey("log.dir", _str, "/tmp/kafka-logs"),
        ConfigKey("num.network.threads", _int, 3, at_least(1)),
        ConfigKey("num.io.threads", _int, 8, at_least(1)),
        ConfigKey("num.recovery.threads.per.data.dir", _int, 1, at_least(1), dynamic=True, inert=True),
        ConfigKey("background.threads", _int, 10, at_least(1), dynamic=True, inert=True),
        ConfigKey("queued.max.requests", _int, 500, at_least(1)),
        ConfigKey("queued.max.request.bytes", _long, -1),
        ConfigKey("socket.send.buffer.bytes", _int, 102400),
        ConfigKey("socket.receive.buffer.bytes", _int, 102400),
        ConfigKey("socket.request.max.bytes", _int, 104857600, at_least(1)),
        ConfigKey("socket.listen.backlog.size", _int, 50, at_least(1)),
        ConfigKey("connections.max.idle.ms", _long, 600000),
        ConfigKey("max.connections", _int, INT_MAX, at_least(0), dynamic=True),
        ConfigKey("max.connections.per.ip", _int, INT_MAX, at_least(0), dynamic=True),
        ConfigKey("num.partitions", _int, 1, at_least(1)),
        ConfigKey("default.replication.factor", _int, 1, at_least(1)),
        ConfigKey("min.insync.replicas", _int, 1, at_least(1), dynamic=True),
        ConfigKey("auto.create.topics.enable", _bool, True),
        ConfigKey("delete.topic.enable", _bool, True),
        ConfigKey("message.max.bytes", _int, 1048588, at_least(0), dynamic=True),
        ConfigKey("log.segment.bytes", _int, 1073741824, at_least(14), dynamic=True),
        ConfigKey("log.roll.ms", _long, None, at_least(1), dynamic=True),
        ConfigKey("log.roll.hours", _int, 168, at_least(1)),
        ConfigKey("log.index.size.max.bytes", _int, 10485760, at_least(4), dynamic=True),
        ConfigKey("log.index.interval.bytes", _int, 4096, at_least(0), dynamic=True),
        ConfigKey("log.retention.ms", _long, None, dynamic=True),
        ConfigKey("log.retention.minutes", _int, None),
        ConfigKey("log.retention.hours", _int, 168),
        ConfigKey("log.retention.bytes", _long, -1, dynamic=True),
        ConfigKey("log.retention.check.interval.ms", _long, 300000, at_least(1)),
        ConfigKey("log.cleanup.policy", _list, ["delete"], one_of("delete", "compact"), dynamic=True),
        ConfigKey("log.cleaner.enable", _bool, True),
        ConfigKey("log.cleaner.threads", _int, 1, at_least(0), dynamic=True, inert=True),
        ConfigKey("log.cleaner.backoff.ms", _long, 15000, at_least(0), dynamic=True),
        ConfigKey("log.cleaner.delete.retention.ms", _long, 86400000, at_least(0), dynamic=True),
        ConfigKey("log.cleaner.min.compaction.lag.ms", _long, 0, at_least(0), dynamic=True),
        ConfigKey("log.cleaner.min.cleanable.ratio", _double, 0.5, dynamic=True),
        ConfigKey("log.flush.interval.messages", _long, LONG_MAX, at_least(1), dynamic=True),
        ConfigKey("log.flush.interval.ms", _long, None, at_least(0), dynamic=True),
        ConfigKey("log.flush.scheduler.interval.ms", _long, LONG_MAX, at_least(0)),
        ConfigKey("log.flush.offset.checkpoint.interval.ms", _int, 60000, at_least(0)),
        ConfigKey("log.flush.start.offset.checkpoint.interval.ms", _int, 60000, at_least(0)),
        ConfigKey("log.segment.delete.delay.ms", _long, 60000, at_least(0), dynamic=True),
        ConfigKey(
            "log.message.timestamp.type", _str, "CreateTime", one_of("CreateTime", "LogAppendTime"), dynamic=True
        ),
        ConfigKey("log.message.timestamp.difference.max.ms", _long, LONG_MAX, at_least(0), dynamic=True),
        ConfigKey("log.message.timestamp.before.max.ms", _long, LONG_MAX, at_least(0), dynamic=True),
        ConfigKey("log.message.timestamp.after.max.ms", _long, LONG_MAX, at_least(0), dynamic=True),
        ConfigKey("log.message.format.version", _str, "3.0-IV1", inert=True),
        ConfigKey("log.cleaner.max.compaction.lag.ms", _long, LONG_MAX, at_least(1), dynamic=True),
        ConfigKey("log.roll.jitter.ms", _long, None, at_least(0), dynamic=True, inert=True),
        ConfigKey("log.roll.jitter.hours", _int, 0, at_least(0), inert=True),
        ConfigKey("log.preallocate", _bool, False, dynamic=True, inert=True),
        ConfigKey("log.local.retention.bytes", _long, -2, at_least(-2), dynamic=True, inert=True),
        ConfigKey("log.local.retention.ms", _long, -2, at_least(-2), dynamic=True, inert=True),
        ConfigKey("log.cleaner.dedupe.buffer.size", _long, 134217728, dynamic=True, inert=True),
        ConfigKey("log.cleaner.io.buffer.load.factor", _double, 0.9, dynamic=True, inert=True),
        ConfigKey("log.cleaner.io.buffer.size", _int, 524288, at_least(0), dynamic=True, inert=True),
        ConfigKey("log.cleaner.io.max.bytes.per.second", _double, 1.7976931348623157e308, dynamic=True,
                  inert=True),
        ConfigKey("max.connection.creation.rate", _int, INT_MAX, at_least(0), dynamic=True, inert=True),
        ConfigKey("max.connections.per.ip.overrides", _str, "", dynamic=True, inert=True),
        ConfigKey("metric.reporters", _list, [], dynamic=True, inert=True),
        ConfigKey("principal.builder.class", _class,
                  "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder", inert=True),
        ConfigKey("remote.fetch.max.wait.ms", _int, 500, at_least(1), dynamic=True, inert=True),
        ConfigKey("remote.log.index.file.cache.total.size.bytes", _long, 1073741824, at_least(1), dynamic=True,
                  inert=True),
        ConfigKey("remote.log.manager.copy.max.bytes.per.second", _long, LONG_MAX, at_least(1), dynamic=True,
                  inert=True),
        ConfigKey("remote.log.manager.fetch.max.bytes.per.second", _long, LONG_MAX, at_least(1), dynamic=True,
                  inert=True),
        ConfigKey("sasl.kerberos.kinit.cmd", _str, "/usr/bin/kinit", dynamic=True, inert=True),
        ConfigKey("sasl.kerberos.min.time.before.relogin", _long, 60000, dynamic=True, inert=True),
        ConfigKey("sasl.kerberos.principal.to.local.rules", _list, ["DEFAULT"], dynamic=True, inert=True),
        ConfigKey("sasl.kerberos.service.name", _str, None, dynamic=True, inert=True),
        ConfigKey("sasl.kerberos.ticket.renew.jitter", _double, 0.05, dynamic=True, inert=True),
        ConfigKey("sasl.kerberos.ticket.renew.window.factor", _double, 0.8, dynamic=True, inert=True),
        ConfigKey("sasl.login.refresh.buffer.seconds", _short, 300, dynamic=True, inert=True),
        ConfigKey("sasl.login.refresh.min.period.seconds", _short, 60, dynamic=True, inert=True),
        ConfigKey("sasl.login.refresh.window.factor", _double, 0.8, dynamic=True, inert=True),
        ConfigKey("sasl.login.refresh.window.jitter", _double, 0.05, dynamic=True, inert=True),
        ConfigKey("ssl.engine.factory.class", _class, None, dynamic=True, inert=True),
        ConfigKey("ssl.keymanager.algorithm", _str, "SunX509", dynamic=True, inert=True),
        ConfigKey("ssl.provider", _str, None, dynamic=True, inert=True),
        ConfigKey("ssl.secure.random.implementation", _str, None, dynamic=True, inert=True),
        ConfigKey("ssl.trustmanager.algorithm", _str, "PKIX", dynamic=True, inert=True),
        ConfigKey("log.message.downconversion.enable", _bool, True, dynamic=True),
        ConfigKey("compression.type", _str, "producer",
                  one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"), dynamic=True),
        ConfigKey("compression.gzip.level", _int, -1,
                  lambda v: None if v == -1 or 1 <= v <= 9 else "must be -1 or in [1, 9]", dynamic=True),
        ConfigKey("compression.lz4.level", _int, 9, between(1, 17), dynamic=True),
        ConfigKey("compression.zstd.level", _int, 3, between(-131072, 22), dynamic=True),
        ConfigKey("zookeeper.connect", _str, None),
        ConfigKey("zookeeper.session.timeout.ms", _int, 18000, at_least(1)),
        ConfigKey("zookeeper.connection.timeout.ms", _int, None, at_least(1)),
        ConfigKey("zookeeper.max.in.flight.requests", _int, 10, at_least(1)),
        ConfigKey("offsets.topic.num.partitions", _int, 50, at_least(1)),
        ConfigKey("offsets.topic.replication.factor", _int, 3, at_least(1)),
        ConfigKey("offsets.topic.segment.bytes", _int, 104857600, at_least(1)),
        ConfigKey("offsets.retention.minutes", _int, 10080, at_least(1)),
        ConfigKey("offsets.retention.check.interval.ms", _long, 600000, at_least(1)),
        ConfigKey("offsets.load.buffer.size", _int, 5242880, at_least(1)),
        ConfigKey("offsets.commit.timeout.ms", _int, 5000, at_least(1)),
        ConfigKey("offset.metadata.max.bytes", _int, 4096, at_least(0)),
        ConfigKey("group.initial.rebalance.delay.ms", _int, 3000, at_least(0)),
        ConfigKey("group.min.session.timeout.ms", _int, 6000, at_least(0)),
        ConfigKey("group.max.session.timeout.ms", _int, 1800000, at_least(0)),
        ConfigKey("group.max.size", _int, INT_MAX, at_least(1)),
        # KIP-848 consumer groups (group.protocol=consumer)
        ConfigKey("group.consumer.session.timeout.ms", _int, 45000, at_least(1)),
        ConfigKey("group.consumer.min.session.timeout.ms", _int, 45000, at_least(1)),
        ConfigKey("group.consumer.max.session.timeout.ms", _int, 60000, at_least(1)),
        ConfigKey("group.consumer.heartbeat.interval.ms", _int, 5000, at_least(1)),
        ConfigKey("group.consumer.min.heartbeat.interval.ms", _int, 5000, at_least(1)),
        ConfigKey("group.consumer.max.heartbeat.interval.ms", _int, 15000, at_least(1)),
        ConfigKey("group.consumer.max.size", _int, INT_MAX, at_least(1)),
        ConfigKey("group.consumer.assignors", _list, ["uniform", "range"],
                  one_of("uniform", "range", "org.apache.kafka.coordinator.group.assignor.UniformAssignor",
                         "org.apache.kafka.coordinator.group.assignor.RangeAssignor")),
        # Online migration between classic and consumer groups; Kafka 4.0's default (3.9's was `disabled`).
        ConfigKey("group.consumer.migration.policy", _lower, "bidirectional",
                  one_of("disabled", "upgrade", "downgrade", "bidirectional")),
        # KIP-1071 streams groups (group.protocol=streams; Kafka 4.2's GroupCoordinatorConfig)
        ConfigKey("group.streams.session.timeout.ms", _int, 45000, at_least(1)),
        ConfigKey("group.streams.heartbeat.interval.ms", _int, 5000, at_least(1)),
        ConfigKey("group.streams.max.size", _int, INT_MAX, at_least(1)),
        ConfigKey("group.streams.num.standby.replicas", _int, 0, at_least(0)),
        ConfigKey("group.streams.initial.rebalance.delay.ms", _int, 3000, at_least(0)),
        # KIP-932 share groups (Kafka 4.2's GroupCoordinatorConfig / ShareGroupConfig)
        ConfigKey("group.share.session.timeout.ms", _int, 45000, at_least(1)),
        ConfigKey("group.share.min.session.timeout.ms", _int, 45000, at_least(1)),
        ConfigKey("group.share.max.session.timeout.ms", _int, 60000, at_least(1)),
        ConfigKey("group.share.heartbeat.interval.ms", _int, 5000, at_least(1)),
        ConfigKey("group.share.min.heartbeat.interval.ms", _int, 5000, at_least(1)),
        ConfigKey("group.share.max.heartbeat.interval.ms", _int, 15000, at_least(1)),
        ConfigKey("group.share.record.lock.duration.ms", _int, 30000, at_least(1000)),
        ConfigKey("group.share.min.record.lock.duration.ms", _int, 15000, at_least(1000)),
        ConfigKey("group.share.max.record.lock.duration.ms", _int, 60000, at_least(1000)),
        ConfigKey("group.share.delivery.count.limit", _int, 5, at_least(2)),
        ConfigKey("group.share.partition.max.record.locks", _int, 2000, at_least(100)),
        ConfigKey("group.share.max.size", _int, 200, at_least(1)),
        ConfigKey("share.coordinator.state.topic.num.partitions", _int, 50, at_least(1)),
        ConfigKey("share.coordinator.state.topic.replication.factor", _int, 3, at_least(1)),
        ConfigKey("transaction.state.log.num.partitions", _int, 50, at_least(1)),
        ConfigKey("transaction.state.log.replication.factor", _int, 3, at_least(1)),
        ConfigKey("transaction.state.log.min.isr", _int, 2, at_least(1)),
        ConfigKey("transaction.state.log.segment.bytes", _int, 104857600, at_least(1)),
        ConfigKey("transaction.state.log.load.buffer.size", _int, 5242880, at_least(1)),
        ConfigKey("transaction.max.timeout.ms", _int, 900000, at_least(1)),
        ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", _int, 10000, at_least(1)),
        ConfigKey("transaction.remove.expired.transaction.cleanup.interval.ms", _int, 3600000, at_least(1)),
        ConfigKey("transaction.partition.verification.enable", _bool, True, dynamic=True),
        ConfigKey("transactional.id.expiration.ms", _int, 604800000, at_least(1)),
        ConfigKey("producer.id.expiration.ms", _int, 86400000, at_least(1), dynamic=True),
        ConfigKey("unclean.leader.election.enable", _bool, False, dynamic=True),
        ConfigKey("controlled.shutdown.enable", _bool, True),
        ConfigKey("controlled.shutdown.max.retries", _int, 3, at_least(0)),
        ConfigKey("controlled.shutdown.retry.backoff.ms", _long, 5000, at_least(0)),
        ConfigKey("auto.leader.rebalance.enable", _bool, True),
        ConfigKey("leader.imbalance.check.interval.seconds", _long, 300, at_least(1)),
        ConfigKey("leader.imbalance.per.broker.percentage", _int, 10, at_least(0)),
        ConfigKey("request.timeout.ms", _int, 30000, at_least(0)),
        ConfigKey("replica.lag.time.max.ms", _long, 30000, at_least(0)),
        ConfigKey("num.replica.fetchers", _int, 1, at_least(1)),
        ConfigKey("replica.fetch.max.bytes", _int, 1048576, at_least(0)),
        # Kafka's quota on moving replicas between log dirs (AlterReplicaLogDirs), a dynamic broker config there.
        ConfigKey("replica.alter.log.dirs.io.max.bytes.per.second", _long, 2**63 - 1, at_least(1)),
        ConfigKey("replica.fetch.response.max.bytes", _int, 10485760, at_least(0)),
        ConfigKey("replica.fetch.wait.max.ms", _int, 500, at_least(0)),
        ConfigKey("replica.fetch.min.bytes", _int, 1, at_least(1)),
        ConfigKey("replica.fetch.backoff.ms", _int, 1000, at_least(0)),
        ConfigKey("replica.high.watermark.checkpoint.interval.ms", _long, 5000, at_least(1)),
        ConfigKey("max.incremental.fetch.session.cache.slots", _int, 1000, at_least(0)),
        ConfigKey("quota.window.num", _int, 11, at_least(1)),
        ConfigKey("quota.window.size.seconds", _int, 1, at_least(1)),
        # Kafka 4.2+: the streams rebalance protocol (KIP-1071) is on by default.
        ConfigKey("group.coordinator.rebalance.protocols", _list, ["classic", "consumer", "streams"],
                  one_of("classic", "consumer", "streams")),
        # kbroker's own: Prometheus metrics over HTTP (unset = off), where Kafka would run the JMX exporter agent.
        ConfigKey("metrics.port", _int, None, between(0, 65535)),
        # Unset: the host of the first listener (a broker on loopback keeps its metrics there too).
        ConfigKey("metrics.host", _str, None),
        # kbroker's own: the web console over HTTP (console/; empty = off).
        ConfigKey("console.listeners", _str, "", _console_listener_check),
        # kbroker's own: the Confluent-compatible schema registry over HTTP (schema_registry/; empty = off).
        ConfigKey("schema.registry.listeners", _str, "", _schema_registry_listener_check),
        # Authorization (broker.security.authorizer): Kafka's ACL authorizer class names turn it on.
        ConfigKey("authorizer.class.name", _str, "", one_of("", *AUTHORIZER_CLASS_NAMES)),
        ConfigKey("super.users", _super_users, frozenset()),
        ConfigKey("allow.everyone.if.no.acl.found", _bool, False),
    ]
}


# Kafka 3.9's DynamicBrokerConfig.AllDynamicConfigs among the keys above: DescribeConfigs says read_only=False
# for exactly these, whether or not kbroker can change them at runtime (ConfigKey.dynamic says that).
KAFKA_DYNAMIC_CONFIGS: frozenset[str] = frozenset({
    # LogCleaner.ReconfigurableConfigs
    "log.cleaner.threads", "log.cleaner.backoff.ms", "message.max.bytes",
    # DynamicLogConfig.ReconfigurableConfigs: the first broker synonym of each topic config
    "log.segment.bytes", "log.roll.ms", "log.index.size.max.bytes", "log.flush.interval.messages",
    "log.flush.interval.ms", "log.retention.bytes", "log.retention.ms", "log.index.interval.bytes",
    "log.cleaner.delete.retention.ms", "log.cleaner.min.compaction.lag.ms", "log.segment.delete.delay.ms",
    "log.cleaner.min.cleanable.ratio", "log.cleanup.policy", "unclean.leader.election.enable", "min.insync.replicas",
    "compression.type", "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "log.message.timestamp.type", "log.message.timestamp.difference.max.ms", "log.message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms", "log.message.downconversion.enable",
    # DynamicThreadPool.ReconfigurableConfigs
    "num.io.threads", "num.network.threads", "num.recovery.threads.per.data.dir", "background.threads",
    "num.replica.fetchers",
    # DynamicListenerConfig.ReconfigurableConfigs
    "listeners", "advertised.listeners", "listener.security.protocol.map",
    # SocketServer.ReconfigurableConfigs
    "max.connections", "max.connections.per.ip",
    # DynamicProducerStateManagerConfig
    "producer.id.expiration.ms",
    # DynamicSecurityConfigs (SSL and SASL)
    "sasl.enabled.mechanisms", "sasl.jaas.config", "sasl.mechanism.inter.broker.protocol", "ssl.cipher.suites",
    "ssl.client.auth", "ssl.enabled.protocols", "ssl.endpoint.identification.algorithm", "ssl.key.password",
    "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.keystore.location", "ssl.keystore.password",
    "ssl.keystore.type", "ssl.protocol", "ssl.truststore.certificates", "ssl.truststore.location",
    "ssl.truststore.password", "ssl.truststore.type", "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.min.time.before.relogin", "sasl.kerberos.principal.to.local.rules", "sasl.kerberos.service.name",
    "sasl.kerberos.ticket.renew.jitter", "sasl.kerberos.ticket.renew.window.factor",
    "sasl.login.refresh.buffer.seconds", "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter", "ssl.engine.factory.class", "ssl.keymanager.algorithm", "ssl.provider",
    "ssl.secure.random.implementation", "ssl.trustmanager.algorithm",
    # the rest of LogCleaner.ReconfigurableConfigs and DynamicLogConfig (tiered storage and preallocation too)
    "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor", "log.cleaner.io.buffer.size",
    "log.cleaner.io.max.bytes.per.second", "log.cleaner.max.compaction.lag.ms", "log.local.retention.bytes",
    "log.local.retention.ms", "log.preallocate", "log.roll.jitter.ms",
    # SocketServer, metrics reporters, RemoteLogManager, the transaction verification switch
    "max.connection.creation.rate", "max.connections.per.ip.overrides", "metric.reporters", "principal.builder.class",
    "remote.fetch.max.wait.ms", "remote.log.index.file.cache.total.size.bytes",
    "remote.log.manager.copy.max.bytes.per.second", "remote.log.manager.fetch.max.bytes.per.second",
    "transaction.partition.verification.enable",
})

# DescribeConfigs v3+ config types (Kafka's ConfigDef.Type) by parser.
CONFIG_TYPE_NAMES: dict[Callable[[str], Any], str] = {
    _bool: "boolean", _int: "int", _long: "long", _double: "double", _str: "string", _list: "list",
    _protocol_map: "string", _password: "password", _super_users: "string", _short: "short", _class: "class",
}

# Keys a listener may override as listener.name.<listener>.<key> (Kafka's ListenerName.configPrefix), and the
# ones that also take a mechanism: listener.name.<listener>.<mechanism>.<key>.
LISTENER_KEYS: frozenset[str] = frozenset(
    {k for k in KEYS if k.startswith(("ssl.", "sasl.")) and k != "sasl.mechanism.inter.broker.protocol"}
    | {"connections.max.reauth.ms"}
)
MECHANISM_KEYS: frozenset[str] = frozenset(
    {"sasl.jaas.config", "connections.max.reauth.ms", "sasl.server.callback.handler.class"})


@dataclass(frozen=True)
class Listener:
    name: str
    security_protocol: str
    host: str
    port: int


def parse_listener(entry: str) -> Listener:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)://(\[[^\]]*\]|[^:/]*):(\d+)", entry.strip())
    if not m:
        raise ValueError(f"listener {entry!r} is not of the form NAME://host:port")
    name, host, port = m.group(1), m.group(2).strip("[]"), int(m.group(3))
    if not 0 <= port <= 65535:
        raise ValueError(f"listener {entry!r}: port out of range")
    urlsplit(f"x://{m.group(2)}:{port}")  # rejects malformed IPv6 literals
    return Listener(name.upper(), "", host, port)


def read_properties(text: str) -> dict[str, str]:
    """Java .properties: `key=value` or `key: value`, # and ! comments, backslash line continuation."""
    props: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        m = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", logical)
        if m:
            props[m.group(1)] = m.group(2)
        elif logical:
            props[logical] = ""
        logical = ""
    return props


class KafkaConfig:
    """Typed broker config. Unknown keys and invalid values raise ConfigError naming the key."""

    def __init__(self, props: dict[str, str]) -> None:
        self.originals = dict(props)
        self._values: dict[str, Any] = {}
        # listener name (upper case) -> key (with its mechanism prefix, lower case) -> parsed value
        self._listener_values: dict[str, dict[str, Any]] = {}
        self._advertised: tuple[object, object, list[Listener]] | None = None
        for name, key in KEYS.items():
            self._values[name] = key.default
        for name, raw in props.items():
            self.set(name, raw)
        self._derive()

    def set(self, name: str, raw: str) -> None:
        if name.startswith("listener.name."):
            self._set_listener_key(name, raw)
            return
        key = KEYS.get(name)
        if key is None:
            raise ConfigError(f"{name}: unknown config key")
        try:
            value = key.parse(raw)
        except ValueError as e:
            raise ConfigError(f"{name}: invalid value {raw!r} ({e})") from None
        problem = key.check(value) if key.check else None
        if problem:
            raise ConfigError(f"{name}: invalid value {raw!r} ({problem})")
        self._values[name] = value

    def _set_listener_key(self, name: str, raw: str) -> None:
        listener, _, rest = name.removeprefix("listener.name.").partition(".")
        base = rest
        mechanism, _, tail = rest.partition(".")
        if rest not in LISTENER_KEYS and mechanism.upper() in (*SASL_MECHANISMS, "GSSAPI", "OAUTHBEARER") \
                and tail in MECHANISM_KEYS:
            base = tail
            rest = f"{mechanism.lower()}.{tail}"
        key = KEYS.get(base)
        if not listener or key is None or base not in LISTENER_KEYS:
            raise ConfigError(f"{name}: unknown config key")
        try:
            value = key.parse(raw)
        except ValueError as e:
            raise ConfigError(f"{name}: invalid value ({e})") from None
        problem = key.check(value) if key.check else None
        if problem:
            raise ConfigError(f"{name}: invalid value ({problem})")
        self._listener_values.setdefault(listener.upper(), {})[rest] = value

    def for_listener(self, listener: str, name: str, mechanism: str | None = None) -> Any:
        """A key as Kafka resolves it for one listener: listener.name.<l>.<mechanism>.<key>, then
        listener.name.<l>.<key>, then the plain key."""
        own = self._listener_values.get(listener.upper(), {})
        if mechanism is not None and f"{mechanism.lower()}.{name}" in own:
            return own[f"{mechanism.lower()}.{name}"]
        if name in own:
            return own[name]
        return self._values[name]

    def security_protocol(self, listener: str) -> str:
        return str(self._values["listener.security.protocol.map"][listener.upper()])

    def _derive(self) -> None:
        v = self._values
        if not v["log.dirs"]:
            v["log.dirs"] = [v["log.dir"]]
        if v["log.retention.ms"] is None:
            if v["log.retention.minutes"] is not None:
                v["log.retention.ms"] = v["log.retention.minutes"] * 60000
            else:
                v["log.retention.ms"] = v["log.retention.hours"] * 3600000
        if v["log.roll.ms"] is None:
            v["log.roll.ms"] = v["log.roll.hours"] * 3600000
        if v["log.roll.jitter.ms"] is None:
            v["log.roll.jitter.ms"] = v["log.roll.jitter.hours"] * 3600000
        if v["log.flush.interval.ms"] is None:
            v["log.flush.interval.ms"] = v["log.flush.scheduler.interval.ms"]
        listeners = [parse_listener(x) for x in v["listeners"]]
        if not listeners:
            raise ConfigError("listeners: at least one listener is required")
        names = [x.name for x in listeners]
        if len(set(names)) != len(names):
            raise ConfigError("listeners: each listener needs a distinct name")
        protocols = v["listener.security.protocol.map"]
        for listener in listeners:
            proto = protocols.get(listener.name)
            if proto is None:
                raise ConfigError(
                    f"listener.security.protocol.map: no security protocol for listener {listener.name}"
                )
            if proto not in SECURITY_PROTOCOLS:
                raise ConfigError(f"listener.security.protocol.map: {listener.name} maps to unknown protocol {proto}")
            if proto.startswith("SASL_"):
                mechanisms = self.for_listener(listener.name, "sasl.enabled.mechanisms")
                unsupported = [m for m in mechanisms if m not in SASL_MECHANISMS]
                if unsupported or not mechanisms:
                    raise ConfigError(
                        f"sasl.enabled.mechanisms: listener {listener.name} enables {', '.join(mechanisms) or 'none'};"
                        f" kbroker supports {', '.join(SASL_MECHANISMS)}")
        ibl = v["inter.broker.listener.name"]
        if ibl is not None:
            v["inter.broker.listener.name"] = ibl = ibl.upper()
            if ibl not in names:
                raise ConfigError(f"inter.broker.listener.name: {ibl} is not a configured listener")
        if v["advertised.listeners"] is None:
            v["advertised.listeners"] = v["listeners"]
        for adv in v["advertised.listeners"]:
            if parse_listener(adv).name not in names:
                raise ConfigError(f"advertised.listeners: {adv!r} names no configured listener")
        if v["group.min.session.timeout.ms"] > v["group.max.session.timeout.ms"]:
            raise ConfigError("group.min.session.timeout.ms: must not exceed group.max.session.timeout.ms")
        for problem in consumer_group_bound_problems(v):
            raise ConfigError(problem)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def effective(self, name: str, dynamic: Mapping[str, str]) -> Any:
        """The value in force: a dynamic broker config (AlterConfigs on the BROKER resource) over this file's."""
        raw = dynamic.get(name)
        return self._values[name] if raw is None else KEYS[name].parse(raw)

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._values.items()

    @property
    def broker_id(self) -> int:
        return int(self._values["broker.id"])

    def _with_protocol(self, listener: Listener) -> Listener:
        proto = self._values["listener.security.protocol.map"].get(listener.name, "PLAINTEXT")
        return Listener(listener.name, proto, listener.host, listener.port)

    @property
    def listeners(self) -> list[Listener]:
        return [self._with_protocol(parse_listener(x)) for x in self._values["listeners"]]

    @property
    def advertised_listeners(self) -> list[Listener]:
        # Parsed once per value (a regex and a URL check per listener): every uncached Metadata and DescribeCluster
        # reads them. Keyed by the values' identity, as set() replaces a value, never changes it in place.
        raw, protocols = self._values["advertised.listeners"], self._values["listener.security.protocol.map"]
        memo = self._advertised
        if memo is None or memo[0] is not raw or memo[1] is not protocols:
            memo = self._advertised = (raw, protocols, [self._with_protocol(parse_listener(x)) for x in raw])
        return list(memo[2])

    @property
    def log_dirs(self) -> list[str]:
        return list(self._values["log.dirs"])

    @classmethod
    def from_file(cls, path: str | Path, overrides: Iterable[str] = ()) -> KafkaConfig:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        props = read_properties(text)
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"--override {item!r}: expected key=value")
            k, _, val = item.partition("=")
            props[k.strip()] = val
        return cls(props)


def consumer_group_bound_problems(v: Mapping[str, Any]) -> list[str]:
    """Kafka's GroupCoordinatorConfig checks of the group.consumer.* timeouts, each naming the key at fault."""
    out = []
    for kind in ("heartbeat.interval", "session.timeout"):
        key, low, high = (f"group.consumer.{kind}.ms", f"group.consumer.min.{kind}.ms", f"group.consumer.max.{kind}.ms")
        if v[high] < v[low]:
            out.append(f"{high}: must be greater than or equal to {low}")
        if v[key] < v[low]:
            out.append(f"{key}: must be greater than or equal to {low}")
        if v[key] > v[high]:
            out.append(f"{key}: must be less than or equal to {high}")
    if v["group.consumer.heartbeat.interval.ms"] >= v["group.consumer.session.timeout.ms"]:
        out.append("group.consumer.heartbeat.interval.ms: must be less than group.consumer.session.timeout.ms")
    return out


def render_value(value: Any) -> str | None:
    """A config value as Kafka shows it in DescribeConfigs."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(x) for x in value)
    if isinstance(value, frozenset):
        return ";".join(sorted(str(x) for x in value))
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value)
