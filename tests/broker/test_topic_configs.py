"""Topic and broker configs as Kafka 3.9 answers them: empty cleanup.policy, compression.type with broker-side
recompression, DescribeConfigs read-only flags, sources and synonyms.

Clients: confluent-kafka's AdminClient, kafka-python's KafkaAdminClient (and its protocol classes), raw frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import AlterConfigOp
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KType

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ck_consume, ck_produce, kcat, kp_consume, kp_produce, wait_until
from tests.conftest import have_kcat

T = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # Fast retention and cleaner schedules, so "nothing was deleted" means something within seconds.
    b = BrokerProcess(Path(tmp_path_factory.mktemp("topic-configs")), {
        "log.retention.check.interval.ms": "100",
        "log.cleaner.backoff.ms": "100",
        "log.segment.delete.delay.ms": "0",
    })
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def ck_admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": False})


@pytest.fixture(scope="module")
def kp_admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    yield a
    a.close()


def ck_describe(admin: AdminClient, rtype: str, name: str) -> dict:
    return next(iter(admin.describe_configs([ConfigResource(rtype, name)]).values())).result(T)


def kp_describe(admin: KafkaAdminClient, rtype: KType, name: str) -> dict:
    out = admin.describe_configs([KConfigResource(rtype, name)], config_filter="all")
    return out["topic" if rtype == KType.TOPIC else "broker"][name]


def ck_incremental(admin: AdminClient, rtype: str, name: str, *entries: ConfigEntry) -> None:
    next(iter(admin.incremental_alter_configs([ConfigResource(rtype, name, incremental_configs=list(entries))])
              .values())).result(T)


# ---------------------------------------------------------------- empty cleanup.policy


def test_empty_cleanup_policy_create_and_describe(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": ""})])[topic_name].result(T)
    entry = ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"]
    assert entry.value == "" and not entry.is_default
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == ""
    other = topic_name + "-kp"
    kp_admin.create_topics({other: {"num_partitions": 1, "replication_factor": 1,
                                    "configs": {"cleanup.policy": ""}}})
    assert ck_describe(ck_admin, "topic", other)["cleanup.policy"].value == ""


def test_subtract_cleanup_policy_to_nothing(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": "compact,delete"})])[topic_name] \
        .result(T)
    ck_incremental(ck_admin, "topic", topic_name,
                   ConfigEntry("cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SUBTRACT))
    assert ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"].value == ""
    # APPEND to the empty list starts from it, not from the broker default.
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
        "cleanup.policy": (AlterConfigOp.APPEND, "compact")})], incremental=True)
    assert r["topic"][topic_name] == "OK"
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == "compact"
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
        "cleanup.policy": (AlterConfigOp.SUBTRACT, "compact")})], incremental=True)
    assert r["topic"][topic_name] == "OK"
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == ""
    # Legacy AlterConfigs with the empty value.
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {"cleanup.policy": "delete"})],
                               incremental=False)
    assert r["topic"][topic_name] == "OK"
    next(iter(ck_admin.alter_configs([ConfigResource("topic", topic_name, set_config={"cleanup.policy": ""})])
              .values())).result(T)
    assert ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"].value == ""
    # Anything but delete/compact is still refused.
    with pytest.raises(KafkaException) as e:
        ck_incremental(ck_admin, "topic", topic_name,
                       ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.APPEND))
    assert e.value.args[0].code() == CKError.INVALID_CONFIG


def test_empty_cleanup_policy_neither_deletes_nor_compacts(broker, ck_admin, topic_name):
    """retention.ms=1 and tiny segments would delete everything under "delete"; duplicate keys would be
    compacted away under "compact". With the empty policy every record stays."""
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={
        "cleanup.policy": "", "retention.ms": "1", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01",
        "segment.ms": "100"})])[topic_name].result(T)
    msgs = [Msg(b"same-key", b"v%03d" % i + b"x" * 200, partition=0)
            for i in range(60)]
    ck_produce(broker.bootstrap, topic_name, msgs, linger_ms=0, batch_num_messages=1)
    # A control topic under "delete" shows the schedule is running: its old segments go within the wait.
    control = topic_name + "-delete"
    ck_admin.create_topics([NewTopic(control, 1, 1, config={"retention.ms": "1", "segment.bytes": "1024"})])[control] \
        .result(T)
    ck_produce(broker.bootstrap, control, msgs, linger_ms=0, batch_num_messages=1)

    def control_start() -> int:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"})
        try:
            return c.get_watermark_offsets(TopicPartition(control, 0), timeout=T)[0]
        finally:
            c.close()

    wait_until(lambda: control_start() > 0, timeout=20, what="retention on the control topic")
    recs = ck_consume(broker.bootstrap, topic_name, [0], 60)
    assert [r.offset for r in recs] == list(range(60))
    assert [r.offset for r in kp_consume(broker.bootstrap, topic_name, [0], 60)] == list(range(60))
    assert "Traceback" not in broker.read_log()


def test_broker_log_cleanup_policy_subtract_to_nothing(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    ck_incremental(ck_admin, "broker", "0",
                   ConfigEntry("log.cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT))
    try:
        assert ck_describe(ck_admin, "broker", "0")["log.cleanup.policy"].value == ""
        # Topics without their own cleanup.policy inherit the empty list.
        assert kp_describe(kp_admin, KType.TOPIC, topic_name)["cleanup.policy"]["value"] == ""
    finally:
        ck_incremental(ck_admin, "broker", "0",
                       ConfigEntry("log.cleanup.policy", None, incremental_operation=AlterConfigOpType.DELETE))
    assert ck_describe(ck_admin, "topic", topic_name)["cleanup.policy"].value == "delete"


# ---------------------------------------------------------------- compression.type


CODEC_IDS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def stored_batches(bootstrap: str, topic: str, partition: int = 0) -> list:
    """The record batch headers as stored, through a raw Fetch v12 from offset 0."""
    from kbroker.protocol.messages import FetchRequest
    from kbroker.protocol.records import iter_batch_headers

    from tests.clients import RawClient

    req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 24, isolation_level=0,
                       topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                           FetchRequest.FetchPartition(partition=partition, fetch_offset=0,
                                                       partition_max_bytes=1 << 24)])])
    with RawClient(bootstrap) as raw:
        resp = raw.request(1, 12, req)
    [pd] = resp.responses[0].partitions
    assert pd.error_code == 0
    return [h for _, h in iter_batch_headers(pd.records or b"")]


def _msgs(tag: str, n: int) -> list[Msg]:
    return [Msg(f"{tag}-{i}".encode(), (f"{tag}-value-{i}-" * (i % 40 + 20)).encode(),
                (("i", str(i).encode()),) if i % 2 else (), 1_700_000_000_000 + i, 0) for i in range(n)]


@pytest.mark.parametrize("target", ["zstd", "gzip", "snappy", "lz4", "uncompressed"])
def test_topic_compression_recompresses(broker, ck_admin, kp_admin, topic_name, target):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"compression.type": target})])[topic_name].result(T)
    assert ck_describe(ck_admin, "topic", topic_name)["compression.type"].value == target
    # librdkafka, idempotent, lz4 (or none when the topic wants lz4); kafka-python gzip (or snappy).
    ck_codec = "none" if target == "lz4" else "lz4"
    kp_codec = "snappy" if target == "gzip" else "gzip"
    sent = _msgs("ck", 500) + _msgs("kp", 300)
    a = ck_produce(broker.bootstrap, topic_name, sent[:500], compression_type=ck_codec, enable_idempotence=True)
    b = kp_produce(broker.bootstrap, topic_name, sent[500:], compression_type=kp_codec)
    assert [r.offset for r in a + b] == list(range(800))
    assert [r.timestamp for r in a + b] == [m.timestamp for m in sent]
    batches = stored_batches(broker.bootstrap, topic_name)
    assert {h.compression for h in batches} == {CODEC_IDS[target]}
    # The idempotent producer's batches keep their producer id, epoch and sequences.
    idem = [h for h in batches if h.producer_id >= 0]
    assert idem and idem[0].base_sequence == 0 and sum(h.records_count for h in idem) == 500
    want = [(m.key, m.value, m.headers, m.timestamp) for m in sent]
    for got in (ck_consume(broker.bootstrap, topic_name, [0], 800), kp_consume(broker.bootstrap, topic_name, [0], 800)):
        assert [r.offset for r in got] == list(range(800))
        assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == want


def test_compression_type_altered_live_and_levels(broker, ck_admin, kp_admin, topic_name):
    kp_admin.create_topics({topic_name: {"num_partitions": 1, "replication_factor": 1}})
    assert kp_describe(kp_admin, KType.TOPIC, topic_name)["compression.type"]["value"] == "producer"
    ck_produce(broker.bootstrap, topic_name, _msgs("a", 50), compression_type="snappy")
    r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
        "compression.type": (AlterConfigOp.SET, "zstd"), "compression.zstd.level": (AlterConfigOp.SET, "10")})],
        incremental=True)
    assert r["topic"][topic_name] == "OK"
    entries = ck_describe(ck_admin, "topic", topic_name)
    assert (entries["compression.type"].value, entries["compression.zstd.level"].value) == ("zstd", "10")
    assert entries["compression.gzip.level"].value == "-1" and entries["compression.lz4.level"].value == "9"
    ck_produce(broker.bootstrap, topic_name, _msgs("b", 50), compression_type="snappy")
    # librdkafka sends a batch uncompressed when compression does not shrink it: look at the sizes too.
    batches = stored_batches(broker.bootstrap, topic_name)
    before = [h for h in batches if h.base_offset < 50]
    after = [h for h in batches if h.base_offset >= 50]
    assert CODEC_IDS["snappy"] in {h.compression for h in before}
    assert {h.compression for h in after} == {CODEC_IDS["zstd"]}
    assert len(kp_consume(broker.bootstrap, topic_name, [0], 100)) == 100
    # Bad values: INVALID_CONFIG naming the key, from both clients.
    for key, bad in [("compression.type", "brotli"), ("compression.gzip.level", "0"),
                     ("compression.lz4.level", "18"), ("compression.zstd.level", "23")]:
        with pytest.raises(KafkaException) as e:
            ck_incremental(ck_admin, "topic", topic_name, ConfigEntry(key, bad, incremental_operation=AlterConfigOpType.SET))
        assert e.value.args[0].code() == CKError.INVALID_CONFIG and key in e.value.args[0].str()
        r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {key: (AlterConfigOp.SET, bad)})],
                                   incremental=True)
        assert "InvalidConfiguration" in r["topic"][topic_name]


def test_broker_compression_type_is_the_topic_default(broker, ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    ck_incremental(ck_admin, "broker", "0",
                   ConfigEntry("compression.type", "gzip", incremental_operation=AlterConfigOpType.SET),
                   ConfigEntry("compression.gzip.level", "9", incremental_operation=AlterConfigOpType.SET))
    try:
        broker_entries = kp_describe(kp_admin, KType.BROKER, "0")
        assert broker_entries["compression.type"]["value"] == "gzip"
        topic_entry = ck_describe(ck_admin, "topic", topic_name)["compression.type"]
        assert topic_entry.value == "gzip" and topic_entry.is_default is False
        ck_produce(broker.bootstrap, topic_name, _msgs("g", 20), compression_type="none")
        assert {h.compression for h in stored_batches(broker.bootstrap, topic_name)} == {CODEC_IDS["gzip"]}
    finally:
        ck_incremental(ck_admin, "broker", "0",
                       ConfigEntry("compression.type", None, incremental_operation=AlterConfigOpType.DELETE),
                       ConfigEntry("compression.gzip.level", None, incremental_operation=AlterConfigOpType.DELETE))
    ck_produce(broker.bootstrap, topic_name, _msgs("n", 20), compression_type="none")
    assert stored_batches(broker.bootstrap, topic_name)[-1].compression == CODEC_IDS["uncompressed"]


@pytest.mark.skipif(not have_kcat(), reason="kcat not installed")
def test_topic_compression_kcat(broker, ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"compression.type": "lz4"})])[topic_name].result(T)
    lines = b"".join(b"k%d:value-%d-%s\n" % (i, i, b"x" * (i % 100)) for i in range(300))
    kcat(broker.bootstrap, "-P", "-t", topic_name, "-K:", "-z", "snappy", "-p", "0", input=lines)
    out = kcat(broker.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-f", "%k:%s\n").stdout
    assert out == lines
    assert {h.compression for h in stored_batches(broker.bootstrap, topic_name)} == {CODEC_IDS["lz4"]}


# ---------------------------------------------------------------- DescribeConfigs as Kafka 3.9 answers


STATIC, DEFAULT, DYNAMIC_DEFAULT, DYNAMIC_BROKER, TOPIC = 4, 5, 3, 2, 1


def kp_synonyms(bootstrap: str, rtype: KType, name: str, keys: list[str]) -> dict[str, tuple]:
    """name -> (value, source, read_only, [(synonym, value, source)...]) through kafka-python's DescribeConfigs v1+."""
    from kafka.protocol.admin.configs import DescribeConfigsRequest

    from tests.clients import KpRaw

    with KpRaw(bootstrap) as raw:
        resp = raw.send(DescribeConfigsRequest(resources=[(rtype, name, keys)], include_synonyms=True))
    [r] = resp.results
    assert r.error_code == 0, r
    return {c.name: (c.value, c.config_source, c.read_only, [(s.name, s.value, s.source) for s in c.synonyms])
            for c in r.configs}


def test_broker_read_only_sources_and_synonyms(broker, ck_admin):
    port = broker.port
    got = kp_synonyms(broker.bootstrap, KType.BROKER, "0", [
        "advertised.listeners", "listeners", "log.retention.hours", "log.retention.ms", "log.roll.hours",
        "log.segment.bytes", "num.io.threads", "num.partitions", "log.dirs", "max.connections"])
    # Kafka can change listeners, advertised.listeners and thread counts at runtime: not read-only.
    assert got["advertised.listeners"] == (None, DEFAULT, False, [])
    assert got["listeners"] == (f"PLAINTEXT://127.0.0.1:{port}", STATIC, False,
                                [("listeners", f"PLAINTEXT://127.0.0.1:{port}", STATIC),
                                 ("listeners", "PLAINTEXT://:9092", DEFAULT)])
    assert got["num.io.threads"] == ("4", STATIC, False, [("num.io.threads", "4", STATIC),
                                                          ("num.io.threads", "8", DEFAULT)])
    assert got["max.connections"][1:3] == (DEFAULT, False)
    # server.properties sets log.retention.hours: that key is static and read-only; log.retention.ms is unset
    # (null, a default, no synonyms: Kafka drops the synonyms ahead of the key).
    assert got["log.retention.hours"] == ("168", STATIC, True, [("log.retention.hours", "168", STATIC),
                                                               ("log.retention.hours", "168", DEFAULT)])
    assert got["log.retention.ms"] == (None, DEFAULT, False, [])
    assert got["log.roll.hours"] == ("168", DEFAULT, True, [("log.roll.hours", "168", DEFAULT)])
    assert got["log.segment.bytes"][1:] == (STATIC, False, [("log.segment.bytes", "1073741824", STATIC),
                                                            ("log.segment.bytes", "1073741824", DEFAULT)])
    assert got["num.partitions"][1:3] == (STATIC, True)
    assert got["log.dirs"][:3] == (broker.overrides["log.dirs"], STATIC, True)
    # The same through librdkafka.
    entries = ck_describe(ck_admin, "broker", "0")
    assert not entries["advertised.listeners"].is_read_only and entries["advertised.listeners"].value is None
    assert entries["log.retention.hours"].is_read_only and not entries["log.retention.ms"].is_read_only
    assert entries["broker.id"].is_read_only and entries["num.partitions"].is_read_only


def test_dynamic_value_comes_first_then_the_static_synonyms(broker, ck_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={"segment.bytes": "100000"})])[topic_name].result(T)
    topic = kp_synonyms(broker.bootstrap, KType.TOPIC, topic_name, ["retention.ms", "segment.bytes", "segment.ms"])
    # retention.ms's broker synonym chain starts at log.retention.ms, which is unset: a plain default.
    assert topic["retention.ms"] == ("604800000", DEFAULT, False, [])
    assert topic["segment.ms"] == ("604800000", DEFAULT, False, [])
    assert topic["segment.bytes"] == ("100000", TOPIC, False, [("segment.bytes", "100000", TOPIC),
                                                               ("log.segment.bytes", "1073741824", STATIC),
                                                               ("log.segment.bytes", "1073741824", DEFAULT)])
    ck_incremental(ck_admin, "broker", "0",
                   ConfigEntry("log.retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET))
    try:
        # Set on broker 0's own resource: DYNAMIC_BROKER_CONFIG (the empty name would be the cluster default).
        chain = [("log.retention.ms", "7200000", DYNAMIC_BROKER), ("log.retention.hours", "168", STATIC),
                 ("log.retention.hours", "168", DEFAULT)]
        b = kp_synonyms(broker.bootstrap, KType.BROKER, "0", ["log.retention.ms"])
        assert b["log.retention.ms"] == ("7200000", DYNAMIC_BROKER, False, chain)
        topic = kp_synonyms(broker.bootstrap, KType.TOPIC, topic_name, ["retention.ms"])
        assert topic["retention.ms"] == ("7200000", DYNAMIC_BROKER, False, chain)
        entry = ck_describe(ck_admin, "topic", topic_name)["retention.ms"]
        assert (entry.value, entry.source) == ("7200000", DYNAMIC_BROKER)
    finally:
        ck_incremental(ck_admin, "broker", "0",
                       ConfigEntry("log.retention.ms", None, incremental_operation=AlterConfigOpType.DELETE))


def test_broker_config_types_raw(broker):
    from kbroker.protocol.messages import DescribeConfigsRequest

    from tests.clients import RawClient

    req = DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=4, resource_name="0",
        configuration_keys=["num.io.threads", "listeners", "log.retention.bytes", "auto.create.topics.enable",
                            "log.cleaner.min.cleanable.ratio", "compression.type"])],
        include_synonyms=False, include_documentation=False)
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(32, 4, req)
    types = {c.name: c.config_type for c in resp.results[0].configs}
    # Kafka's ConfigType ids: boolean 1, string 2, int 3, long 5, double 6, list 7.
    assert types == {"num.io.threads": 3, "listeners": 7, "log.retention.bytes": 5, "auto.create.topics.enable": 1,
                     "log.cleaner.min.cleanable.ratio": 6, "compression.type": 2}


def test_alter_read_only_and_runtime_fixed_keys(broker, ck_admin, kp_admin):
    for key, value, text in [("num.partitions", "3", "Cannot update these configs dynamically"),
                             ("advertised.listeners", "PLAINTEXT://127.0.0.1:1", "at runtime")]:
        with pytest.raises(KafkaException) as e:
            ck_incremental(ck_admin, "broker", "0",
                           ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET))
        assert e.value.args[0].code() == CKError.INVALID_CONFIG and text in e.value.args[0].str()
        r = kp_admin.alter_configs([KConfigResource(KType.BROKER, "0", {key: (AlterConfigOp.SET, value)})],
                                   incremental=True, raise_on_unknown=False)
        assert "InvalidConfiguration" in r["broker"]["0"]


# Kafka 3.9's LogConfig.configNames() and a valid value of each (not its default where that would prove nothing).
KAFKA_39_TOPIC_CONFIGS = {
    "cleanup.policy": "compact", "compression.gzip.level": "5", "compression.lz4.level": "10",
    "compression.type": "lz4", "compression.zstd.level": "7", "delete.retention.ms": "1000",
    "file.delete.delay.ms": "1000", "flush.messages": "1000", "flush.ms": "1000",
    "follower.replication.throttled.replicas": "0:0,1:0", "index.interval.bytes": "1000",
    "leader.replication.throttled.replicas": "*", "local.retention.bytes": "-2", "local.retention.ms": "5000",
    "max.compaction.lag.ms": "3600000", "max.message.bytes": "100000", "message.downconversion.enable": "false",
    "message.format.version": "2.8", "message.timestamp.after.max.ms": "1000",
    "message.timestamp.before.max.ms": "1000", "message.timestamp.difference.max.ms": "1000",
    "message.timestamp.type": "LogAppendTime", "min.cleanable.dirty.ratio": "0.3", "min.compaction.lag.ms": "10",
    "min.insync.replicas": "1", "preallocate": "true", "remote.log.copy.disable": "true",
    "remote.log.delete.on.disable": "true", "remote.storage.enable": "false", "retention.bytes": "100000",
    "retention.ms": "100000", "segment.bytes": "100000", "segment.index.bytes": "100000",
    "segment.jitter.ms": "100", "segment.ms": "100000", "unclean.leader.election.enable": "true",
}


def test_every_kafka_39_topic_config_is_accepted_and_described(ck_admin, kp_admin, topic_name):
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config=KAFKA_39_TOPIC_CONFIGS)])[topic_name].result(T)
    described = ck_describe(ck_admin, "topic", topic_name)
    assert {k: described[k].value for k in KAFKA_39_TOPIC_CONFIGS} == KAFKA_39_TOPIC_CONFIGS
    assert set(described) == set(KAFKA_39_TOPIC_CONFIGS)
    kp = kp_describe(kp_admin, KType.TOPIC, topic_name)
    assert kp["max.compaction.lag.ms"]["value"] == "3600000" and kp["message.format.version"]["value"] == "2.8"
    # a fresh topic describes Kafka's defaults, topic-only keys as DEFAULT_CONFIG without synonyms
    other = topic_name + "-defaults"
    ck_admin.create_topics([NewTopic(other, 1, 1)])[other].result(T)
    d = ck_describe(ck_admin, "topic", other)
    assert (d["max.compaction.lag.ms"].value, d["message.format.version"].value, d["segment.jitter.ms"].value,
            d["local.retention.ms"].value, d["preallocate"].value, d["remote.storage.enable"].value,
            d["leader.replication.throttled.replicas"].value) == (
        "9223372036854775807", "3.0-IV1", "0", "-2", "false", "false", "")
    assert d["remote.storage.enable"].source == 5 and d["max.compaction.lag.ms"].source == 5


@pytest.mark.parametrize(("configs", "message"), [
    ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
    ({"min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "4000"},
     "conflict topic config setting min.compaction.lag.ms (5000) > max.compaction.lag.ms (4000)"),
    ({"remote.storage.enable": "true"},
     "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage."),
    ({"message.format.version": "banana"}, "message.format.version"),
    ({"leader.replication.throttled.replicas": "0-0"}, "[partitionId]:[brokerId]"),
    ({"local.retention.ms": "-3"}, "local.retention.ms"),
    ({"preallocate": "maybe"}, "preallocate"),
])
def test_invalid_new_topic_configs_are_refused_and_create_nothing(broker, ck_admin, topic_name, configs, message):
    with pytest.raises(KafkaException) as e:
        ck_admin.create_topics([NewTopic(topic_name, 1, 1, config=configs)])[topic_name].result(T)
    assert e.value.args[0].code() == CKError.INVALID_CONFIG and message in e.value.args[0].str(), e.value
    assert topic_name not in ck_admin.list_topics(timeout=T).topics
    # and on an existing topic, nothing changes
    ck_admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    with pytest.raises(KafkaException) as e:
        ck_incremental(ck_admin, "topic", topic_name,
                       *[ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    assert e.value.args[0].code() == CKError.INVALID_CONFIG
    d = ck_describe(ck_admin, "topic", topic_name)
    assert all(d[k].source == 5 for k in configs), {k: d[k].source for k in configs}


def test_max_compaction_lag_compacts_below_the_dirty_ratio(broker, ck_admin, topic_name):
    # min.cleanable.dirty.ratio 1.0 is never exceeded: only max.compaction.lag.ms (KIP-354) gets the log
    # compacted, and the active segment rolls by it (Kafka's maxSegmentMs) so the last records are reached too.
    ck_admin.create_topics([NewTopic(topic_name, 1, 1, config={
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "1.0", "max.compaction.lag.ms": "1500",
        "segment.bytes": "2000"})])[topic_name].result(T)
    msgs = [Msg(b"k%d" % (i % 3), b"v%d" % i, partition=0) for i in range(60)]
    ck_produce(broker.bootstrap, topic_name, msgs, timeout=T)
    import time

    time.sleep(1.6)
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k0", b"last", partition=0)], timeout=T)  # rolls the segment

    def compacted() -> bool:
        return len(stored_batches(broker.bootstrap, topic_name)) < 20

    wait_until(compacted, timeout=T)
    got = ck_consume(broker.bootstrap, topic_name, [0], 3, timeout=T)
    latest = {r.key: r.value for r in got}
    assert latest[b"k1"] == b"v58" and latest[b"k2"] == b"v59"


def test_every_kafka_39_dynamic_broker_config_is_accepted_and_described(broker, ck_admin):
    # Keys kbroker takes no behaviour from (Kerberos, tiered storage, cleaner I/O buffers...) are stored and
    # described as Kafka does; a bad value is refused as Kafka's ConfigDef would.
    changes = {"sasl.kerberos.min.time.before.relogin": "120000", "log.cleaner.io.buffer.size": "1048576",
               "remote.fetch.max.wait.ms": "700", "log.cleaner.max.compaction.lag.ms": "86400000",
               "metric.reporters": "", "sasl.login.refresh.buffer.seconds": "200"}
    ck_incremental(ck_admin, "broker", "0",
                   *[ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in changes.items()])
    d = ck_describe(ck_admin, "broker", "0")
    for k, v in changes.items():
        assert (d[k].value or "", d[k].is_read_only) == (v, False), (k, d[k])
        assert d[k].source == DYNAMIC_BROKER, (k, d[k].source)
    with pytest.raises(KafkaException) as e:
        ck_incremental(ck_admin, "broker", "0", ConfigEntry("sasl.kerberos.min.time.before.relogin", "soon",
                                                           incremental_operation=AlterConfigOpType.SET))
    assert e.value.args[0].code() == CKError.INVALID_CONFIG
    assert ck_describe(ck_admin, "broker", "0")["sasl.kerberos.min.time.before.relogin"].value == "120000"
    ck_incremental(ck_admin, "broker", "0", *[ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
                                              for k in changes])
