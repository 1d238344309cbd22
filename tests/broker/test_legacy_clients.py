"""Clients of Kafka 0.8-0.10 (message formats v0 and v1, old API versions, no ApiVersions request): librdkafka
with api.version.request=false and broker.version.fallback, kafka-python pinned to an old api_version, kcat, and
raw v0/v1 frames. The log stores record batch v2 only, so produced message sets are converted on append and
fetched ones down-converted; old and new clients read each other's data."""

from __future__ import annotations

import time
import zlib
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.legacy_records import build_message_set, read_message_set
from kbroker.protocol.messages import (
    ApiVersionsRequest,
    FetchRequest,
    ListOffsetsRequest,
    MetadataRequest,
    ProduceRequest,
)
from kbroker.protocol.records import COMPRESSION_GZIP, Record, build_batch

from tests.broker.test_produce_consume import create_topic
from tests.clients import (
    Msg,
    ProduceFailed,
    RawClient,
    ck_conf,
    ck_consume,
    ck_produce,
    kcat,
    kp_consume,
    kp_produce,
)
from tests.conftest import have_kcat

TS0 = 1_700_000_000_000
N = 30


def old_ck(fallback: str) -> dict[str, Any]:
    """librdkafka as a 0.8/0.9 client: no ApiVersions request, protocol versions from the fallback (0.9.0: Metadata
    v0, Produce v1, Fetch v1, ListOffsets v0, magic 0; 0.8.2: Produce v0, Fetch v0). A fallback of 0.10 or later
    makes librdkafka 2.x send ApiVersions anyway, so magic 1 is kafka-python's part here."""
    return {"api.version.request": False, "broker.version.fallback": fallback}


def msgs(tag: str, n: int = N, partition: int = 0) -> list[Msg]:
    return [Msg(f"{tag}-k{i}".encode() if i % 5 else None, f"{tag}-v{i}".encode() + b"x" * (i % 40),
                timestamp=TS0 + i, partition=partition) for i in range(n)]


def values(recs: list[Any]) -> list[bytes | None]:
    return [r.value for r in sorted(recs, key=lambda r: r.offset)]


# ---------------------------------------------------------------- librdkafka without ApiVersions


@pytest.mark.parametrize("fallback", ["0.8.2", "0.9.0"])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_librdkafka_old_producer_and_consumers(broker, topic_name: str, fallback: str, codec: str) -> None:
    """Message sets of magic 0 (lz4 with Kafka's broken magic-0 frame checksum) through Produce v0/v1, read back
    through Fetch v0/v1, and by a current client from the v2 batches they were stored as."""
    create_topic(broker.bootstrap, topic_name, 1)
    sent = msgs(codec)
    delivered = ck_produce(broker.bootstrap, topic_name, sent, **old_ck(fallback), **{"compression.codec": codec})
    assert sorted(r.offset for r in delivered) == list(range(N))
    old = ck_consume(broker.bootstrap, topic_name, [0], N, **old_ck(fallback))
    new = ck_consume(broker.bootstrap, topic_name, [0], N)
    assert values(old) == values(new) == [m.value for m in sent]
    assert [r.key for r in sorted(new, key=lambda r: r.offset)] == [m.key for m in sent]
    # Magic 0 has no timestamps: stored as NO_TIMESTAMP.
    assert {r.timestamp for r in new} == {-1}


def test_librdkafka_old_consumer_group_commits(broker, topic_name: str) -> None:
    """A balanced consumer of 0.9 (FindCoordinator v0, JoinGroup v0, SyncGroup v0, Heartbeat v0, OffsetCommit v2,
    OffsetFetch v1) commits, and a second one in the group resumes from the commit."""
    from confluent_kafka import Consumer

    create_topic(broker.bootstrap, topic_name, 1)
    ck_produce(broker.bootstrap, topic_name, msgs("g", 20))
    group = f"g-{topic_name}"

    def consume_some(limit: int) -> list[Any]:
        c = Consumer(ck_conf(broker.bootstrap, **old_ck("0.9.0"), **{
            "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "fetch.wait.max.ms": 100}))
        try:
            c.subscribe([topic_name])
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < limit and time.monotonic() < deadline:
                for m in c.consume(limit - len(got), 0.5):
                    assert not m.error(), m.error()
                    got.append(m)
            if got:
                c.commit(message=got[-1], asynchronous=False)
            return got
        finally:
            c.close()

    first = consume_some(12)
    assert [m.offset() for m in first] == list(range(12))
    second = consume_some(8)
    assert [m.offset() for m in second] == list(range(12, 20))


# ---------------------------------------------------------------- kafka-python pinned to old versions


@pytest.mark.parametrize("api_version", [(0, 10, 0), (0, 9)])
def test_kafka_python_old_api_version(broker, topic_name: str, api_version: tuple[int, ...]) -> None:
    """kafka-python 3 with api_version=(0, 10, 0) speaks Produce v2 / Fetch v2 with magic 1, ListOffsets v0,
    Metadata v1, JoinGroup v0, OffsetCommit v2, OffsetFetch v1; with (0, 9) Produce v1 / Fetch v1 with magic 0."""
    from kafka import KafkaConsumer, TopicPartition

    create_topic(broker.bootstrap, topic_name, 1)
    sent = msgs("kp")
    delivered = kp_produce(broker.bootstrap, topic_name, sent, api_version=api_version, compression_type="gzip")
    assert [r.offset for r in delivered] == list(range(N))
    old = kp_consume(broker.bootstrap, topic_name, [0], N, api_version=api_version)
    assert values(old) == [m.value for m in sent]
    new = ck_consume(broker.bootstrap, topic_name, [0], N)
    assert values(new) == [m.value for m in sent]
    if api_version >= (0, 10):
        assert [r.timestamp for r in sorted(old, key=lambda r: r.offset)] == [m.timestamp for m in sent]
    group = f"kp-{topic_name}"
    tp = TopicPartition(topic_name, 0)
    c = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group, api_version=api_version,
                      enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500, max_records=10 - len(got)).values():
                got.extend(recs)
        assert [r.offset for r in got] == list(range(10))
        c.commit()
        assert c.committed(tp) == 10
        assert c.end_offsets([tp]) == {tp: N}  # ListOffsets v0
    finally:
        c.close()
    c = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group, api_version=api_version,
                      enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    try:
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                got.extend(recs)
        assert got and got[0].offset == 10
    finally:
        c.close()
    # A current client joining the same group (JoinGroup v9 etc.) goes on from the old client's commit.
    from confluent_kafka import Consumer

    ck = Consumer(ck_conf(broker.bootstrap, **{"group.id": group, "enable.auto.commit": False,
                                               "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
    try:
        ck.subscribe([topic_name])
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            m = ck.poll(0.5)
            if m is not None and not m.error():
                first = m
        assert first is not None and first.offset() == 10 and first.value() == sent[10].value
    finally:
        ck.close()


# ---------------------------------------------------------------- kcat


@pytest.mark.skipif(not have_kcat(), reason="kcat not installed")
@pytest.mark.parametrize("fallback", ["0.8.2", "0.9.0"])
def test_kcat_old_fallback(broker, topic_name: str, fallback: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    x = ["-X", "api.version.request=false", "-X", f"broker.version.fallback={fallback}"]
    lines = [f"kcat-{i}" for i in range(20)]
    kcat(broker.bootstrap, "-P", "-t", topic_name, "-p", "0", "-z", "snappy", *x, input="\n".join(lines).encode())
    out = kcat(broker.bootstrap, "-C", "-t", topic_name, "-p", "0", "-o", "beginning", "-e", "-f", "%o:%s\n", *x)
    assert out.stdout.decode().split() == [f"{i}:{line}" for i, line in enumerate(lines)]
    assert values(ck_consume(broker.bootstrap, topic_name, [0], 20)) == [line.encode() for line in lines]


# ---------------------------------------------------------------- old and new clients on one topic


def test_old_consumers_read_new_producers_data(broker, topic_name: str) -> None:
    """Compressed v2 batches with headers, down-converted: magic 1 keeps timestamps, headers are dropped."""
    create_topic(broker.bootstrap, topic_name, 1)
    sent = [m._replace(headers=(("h", b"1"),)) for m in msgs("new")]
    ck_produce(broker.bootstrap, topic_name, sent, **{"compression.codec": "lz4", "linger.ms": 50})
    kp_produce(broker.bootstrap, topic_name, msgs("new2"), compression_type="gzip")
    want = [m.value for m in sent] + [m.value for m in msgs("new2")]
    for fallback in ("0.8.2", "0.9.0"):
        assert values(ck_consume(broker.bootstrap, topic_name, [0], 2 * N, **old_ck(fallback))) == want
    v1 = kp_consume(broker.bootstrap, topic_name, [0], 2 * N, api_version=(0, 10, 0))
    assert values(v1) == want
    assert all(r.headers == () for r in v1)
    ordered = sorted(v1, key=lambda r: r.offset)
    assert [r.offset for r in ordered] == list(range(2 * N))
    assert [r.timestamp for r in ordered] == [m.timestamp for m in sent] + [m.timestamp for m in msgs("new2")]


def test_new_consumers_read_old_producers_data(broker, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    ck_produce(broker.bootstrap, topic_name, msgs("a"), **old_ck("0.9.0"), **{"compression.codec": "gzip"})
    kp_produce(broker.bootstrap, topic_name, msgs("b"), api_version=(0, 10, 0), compression_type="snappy")
    sent = msgs("a") + msgs("b")
    for recs in (ck_consume(broker.bootstrap, topic_name, [0], 2 * N),
                 kp_consume(broker.bootstrap, topic_name, [0], 2 * N)):
        ordered = sorted(recs, key=lambda r: r.offset)
        assert [r.value for r in ordered] == [m.value for m in sent]
        # Magic 0 (librdkafka 0.9) has no timestamps, magic 1 (kafka-python 0.10) keeps the producer's.
        assert [r.timestamp for r in ordered] == [-1] * N + [m.timestamp for m in msgs("b")]


def test_log_append_time_topic(broker, topic_name: str) -> None:
    """message.timestamp.type=LogAppendTime: old producers' messages get the broker's time, and old v1 consumers
    see it as LogAppendTime."""
    create_topic(broker.bootstrap, topic_name, 1, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    kp_produce(broker.bootstrap, topic_name, msgs("lat", 5), api_version=(0, 10, 0))
    ck_produce(broker.bootstrap, topic_name, msgs("lat0", 5), **old_ck("0.9.0"))
    after = int(time.time() * 1000)
    for recs in (ck_consume(broker.bootstrap, topic_name, [0], 10),
                 kp_consume(broker.bootstrap, topic_name, [0], 10)):
        assert len(recs) == 10 and all(before <= r.timestamp <= after for r in recs), recs
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, api_version=(0, 10, 0), auto_offset_reset="earliest")
    try:
        c.assign([TopicPartition(topic_name, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                got.extend(recs)
        assert len(got) == 10 and {r.timestamp_type for r in got} == {1}
        assert all(before <= r.timestamp <= after for r in got)
    finally:
        c.close()


def test_old_consumers_skip_transaction_markers(broker, topic_name: str) -> None:
    """A committed transaction's records reach 0.9/0.10 consumers; its COMMIT marker (a control batch) does not,
    and the offsets go on past it."""
    create_topic(broker.bootstrap, topic_name, 1)
    p = Producer(ck_conf(broker.bootstrap, **{"transactional.id": f"tx-{topic_name}", "linger.ms": 5}))
    p.init_transactions(15)
    p.begin_transaction()
    for m in msgs("txn", 10):
        p.produce(topic_name, key=m.key, value=m.value, partition=0, timestamp=m.timestamp)
    p.commit_transaction(15)
    ck_produce(broker.bootstrap, topic_name, msgs("after", 5))
    want = [m.value for m in msgs("txn", 10)] + [m.value for m in msgs("after", 5)]
    for recs in (ck_consume(broker.bootstrap, topic_name, [0], 15, **old_ck("0.8.2")),
                 ck_consume(broker.bootstrap, topic_name, [0], 15, **old_ck("0.9.0")),
                 kp_consume(broker.bootstrap, topic_name, [0], 15, api_version=(0, 10, 0))):
        ordered = sorted(recs, key=lambda r: r.offset)
        assert [r.value for r in ordered] == want
        assert [r.offset for r in ordered] == list(range(10)) + list(range(11, 16))  # 10 is the marker


# ---------------------------------------------------------------- raw v0/v1 frames and refusals


def _produce(bootstrap: str, topic: str, records: bytes, version: int) -> Any:
    P = ProduceRequest
    req = P(acks=1, timeout_ms=10000, topic_data=[P.TopicProduceData(
        name=topic, partition_data=[P.PartitionProduceData(index=0, records=records)])])
    with RawClient(bootstrap) as raw:
        return raw.request(0, version, req).responses[0].partition_responses[0]


def _fetch(bootstrap: str, topic: str, version: int, offset: int = 0, max_bytes: int = 1 << 20) -> Any:
    F = FetchRequest
    req = F(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, topics=[F.FetchTopic(
        topic=topic, partitions=[F.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)])])
    with RawClient(bootstrap) as raw:
        return raw.request(1, version, req).responses[0].partitions[0]


def test_raw_v0_v1_frames_round_trip(broker, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    v0 = build_message_set([Record(i, -1, None, b"zero-%d" % i) for i in range(3)], magic=0)
    v1 = build_message_set([Record(i, TS0 + i, b"k", b"one-%d" % i) for i in range(3)], magic=1,
                           compression=COMPRESSION_GZIP)
    assert _produce(broker.bootstrap, topic_name, v0, 0).base_offset == 0
    assert _produce(broker.bootstrap, topic_name, v1, 2).base_offset == 3
    for version, magic in ((0, 0), (1, 0), (2, 1), (3, 1)):
        part = _fetch(broker.bootstrap, topic_name, version)
        assert part.error_code == 0 and part.high_watermark == 6
        got = read_message_set(part.records)
        assert {m.magic for m in got} == {magic}
        assert [(m.offset, m.value) for m in got] == [(i, b"zero-%d" % i) for i in range(3)] + [
            (3 + i, b"one-%d" % i) for i in range(3)]
        if magic:
            assert [m.timestamp for m in got[3:]] == [TS0, TS0 + 1, TS0 + 2]
    # Produce v0-v2 take record batches v2 too (Kafka checks the magic from v3 only).
    v2 = build_batch([(b"k", b"two", (), TS0)])
    assert _produce(broker.bootstrap, topic_name, v2, 1).base_offset == 6
    assert read_message_set(_fetch(broker.bootstrap, topic_name, 1, offset=6).records)[0].value == b"two"
    # Fetch v0-v2 bound a partition by its max bytes, cutting the last message; the client reads whole ones.
    part = _fetch(broker.bootstrap, topic_name, 2, offset=0, max_bytes=60)
    assert len(part.records) == 60 and [m.offset for m in read_message_set(part.records)] == [0]


def test_raw_refusals(broker, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    good = build_message_set([Record(0, TS0, b"k", b"v")], magic=1)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    assert _produce(broker.bootstrap, topic_name, bytes(bad_crc), 2).error_code == ErrorCode.CORRUPT_MESSAGE
    # zstd below magic 2: Kafka's legacy record iterator refuses it (InvalidRecordException).
    zstd_wrapper = bytearray(build_message_set([Record(0, TS0, b"k", b"v")], magic=1, compression=COMPRESSION_GZIP))
    zstd_wrapper[17] = (zstd_wrapper[17] & ~0x07) | 4
    zstd_wrapper[12:16] = zlib.crc32(bytes(zstd_wrapper[16:])).to_bytes(4, "big")
    assert _produce(broker.bootstrap, topic_name, bytes(zstd_wrapper), 2).error_code == ErrorCode.INVALID_RECORD
    # From Produce v3 only record batches v2 (ProduceRequest.validateRecords).
    assert _produce(broker.bootstrap, topic_name, good, 3).error_code == ErrorCode.INVALID_RECORD
    resp = _produce(broker.bootstrap, topic_name, good, 8)
    assert resp.error_code == ErrorCode.INVALID_RECORD and "magic version 2" in resp.error_message
    assert _fetch(broker.bootstrap, topic_name, 3).high_watermark == 0


def test_max_message_bytes_applies_to_each_message(broker, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1, **{"max.message.bytes": "2000"})
    big = build_message_set([Record(0, TS0, b"k", b"x" * 3000)], magic=1)
    assert _produce(broker.bootstrap, topic_name, big, 2).error_code == ErrorCode.MESSAGE_TOO_LARGE
    with pytest.raises(ProduceFailed) as e:
        ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"x" * 3000, partition=0)], **old_ck("0.9.0"))
    assert e.value.errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    ok = build_message_set([Record(i, TS0, b"k", b"x" * 500) for i in range(3)], magic=1)
    assert _produce(broker.bootstrap, topic_name, ok, 2).error_code == 0


def test_down_conversion_disabled(broker, topic_name: str) -> None:
    """message.downconversion.enable=false: Fetch v0-v3 get UNSUPPORTED_VERSION for the partition, newer fetches
    read on."""
    create_topic(broker.bootstrap, topic_name, 1, **{"message.downconversion.enable": "false"})
    ck_produce(broker.bootstrap, topic_name, msgs("dc", 5))
    for version in (0, 1, 2, 3):
        assert _fetch(broker.bootstrap, topic_name, version).error_code == ErrorCode.UNSUPPORTED_VERSION
    assert _fetch(broker.bootstrap, topic_name, 4).error_code == 0
    assert len(ck_consume(broker.bootstrap, topic_name, [0], 5)) == 5
    # librdkafka as a 0.9 client surfaces the partition error.
    with pytest.raises(KafkaException) as e:
        ck_consume(broker.bootstrap, topic_name, [0], 5, timeout=10, **old_ck("0.9.0"))
    assert e.value.args[0].code() == KafkaError.UNSUPPORTED_VERSION


def test_zstd_topic_refused_to_fetches_before_v10(broker, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1, **{"compression.type": "zstd"})
    ck_produce(broker.bootstrap, topic_name, msgs("z", 3))
    for version in (2, 9):
        assert _fetch(broker.bootstrap, topic_name, version).error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert _fetch(broker.bootstrap, topic_name, 10).error_code == 0


def test_old_metadata_list_offsets_and_api_versions(broker, topic_name: str) -> None:
    from kafka.protocol.metadata.api_versions import ApiVersionsRequest as KpApiVersions

    from tests.clients import KpRaw

    create_topic(broker.bootstrap, topic_name, 2)
    ck_produce(broker.bootstrap, topic_name, msgs("lo", 4))
    with RawClient(broker.bootstrap) as raw:
        md = raw.request(3, 0, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)]))
        assert md.topics[0].error_code == 0 and len(md.topics[0].partitions) == 2
        L = ListOffsetsRequest
        lo = raw.request(2, 0, L(replica_id=-1, topics=[L.ListOffsetsTopic(name=topic_name, partitions=[
            L.ListOffsetsPartition(partition_index=0, timestamp=-1, max_num_offsets=1)])]))
        assert lo.topics[0].partitions[0].old_style_offsets == [4]
        av = raw.request(18, 0, ApiVersionsRequest())
        ranges = {a.api_key: (a.min_version, a.max_version) for a in av.api_keys}
        assert ranges[0] == (0, 11) and ranges[1] == (0, 17)
    with KpRaw(broker.bootstrap) as kp:
        ranges = {k.api_key: (k.min_version, k.max_version) for k in kp.send(KpApiVersions[0]()).api_keys}
        assert ranges[0] == (0, 11) and ranges[1] == (0, 17)


def test_down_conversion_config_described_and_altered(broker, topic_name: str) -> None:
    """message.downconversion.enable is a topic config (default true, broker synonym
    log.message.downconversion.enable) that DescribeConfigs lists and AlterConfigs changes live."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    from kafka import KafkaAdminClient
    from kafka.admin import AlterConfigOp
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType as KType

    create_topic(broker.bootstrap, topic_name, 1)
    ck_produce(broker.bootstrap, topic_name, msgs("cfg", 3))
    ck_admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)

    def ck_entry(rtype: str, name: str, key: str) -> Any:
        return next(iter(ck_admin.describe_configs([ConfigResource(rtype, name)]).values())).result(15)[key]

    def ck_set(rtype: str, name: str, key: str, value: str | None) -> None:
        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        res = ConfigResource(rtype, name, incremental_configs=[ConfigEntry(key, value, incremental_operation=op)])
        next(iter(ck_admin.incremental_alter_configs([res]).values())).result(15)

    try:
        entry = ck_entry("topic", topic_name, "message.downconversion.enable")
        assert (entry.value, entry.is_default) == ("true", True)
        described = kp_admin.describe_configs([KConfigResource(KType.TOPIC, topic_name)], config_filter="all")
        assert described["topic"][topic_name]["message.downconversion.enable"]["value"] == "true"
        assert ck_entry("broker", "0", "log.message.downconversion.enable").value == "true"

        ck_set("topic", topic_name, "message.downconversion.enable", "false")
        assert ck_entry("topic", topic_name, "message.downconversion.enable").value == "false"
        assert _fetch(broker.bootstrap, topic_name, 1).error_code == ErrorCode.UNSUPPORTED_VERSION
        r = kp_admin.alter_configs([KConfigResource(KType.TOPIC, topic_name, {
            "message.downconversion.enable": (AlterConfigOp.SET, "TRUE")})], incremental=True)
        assert r["topic"][topic_name] == "OK"
        assert len(read_message_set(_fetch(broker.bootstrap, topic_name, 1).records)) == 3
        with pytest.raises(KafkaException) as e:
            ck_set("topic", topic_name, "message.downconversion.enable", "maybe")
        assert e.value.args[0].code() == KafkaError.INVALID_CONFIG

        # The broker-wide default applies to topics without their own value.
        ck_set("topic", topic_name, "message.downconversion.enable", None)
        ck_set("broker", "0", "log.message.downconversion.enable", "false")
        assert ck_entry("topic", topic_name, "message.downconversion.enable").value == "false"
        assert _fetch(broker.bootstrap, topic_name, 3).error_code == ErrorCode.UNSUPPORTED_VERSION
    finally:
        ck_set("broker", "0", "log.message.downconversion.enable", None)
        kp_admin.close()
    assert _fetch(broker.bootstrap, topic_name, 3).error_code == 0


def test_kafka_python_0_8_2_assign_and_commit(broker, topic_name: str) -> None:
    """kafka-python at (0, 8, 2): Produce v0 / Fetch v0 with magic 0, offsets through OffsetCommit v1 and
    OffsetFetch v1 (no group membership before 0.9)."""
    from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

    create_topic(broker.bootstrap, topic_name, 1)
    sent = msgs("082", 10)
    assert [r.offset for r in kp_produce(broker.bootstrap, topic_name, sent, api_version=(0, 8, 2))] == list(
        range(10))
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=f"g-{topic_name}", api_version=(0, 8, 2),
                      enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    tp = TopicPartition(topic_name, 0)
    try:
        c.assign([tp])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                got.extend(recs)
        assert [r.value for r in got] == [m.value for m in sent]
        c.commit({tp: OffsetAndMetadata(7, "seven", -1)})
        assert c.committed(tp) == 7
    finally:
        c.close()


def test_offset_commit_and_fetch_v0(broker, topic_name: str) -> None:
    """OffsetCommit v0 / OffsetFetch v0. Kafka keeps v0 offsets in ZooKeeper, apart from the v1+ ones; kbroker keeps
    them with the group coordinator like every other commit (docs/apis.md: Old clients)."""
    from kafka.protocol.consumer.group import OffsetCommitRequest as KpCommit
    from kafka.protocol.consumer.group import OffsetFetchRequest as KpFetch
    from kbroker.protocol.messages import OffsetCommitRequest, OffsetFetchRequest

    from tests.clients import KpRaw

    create_topic(broker.bootstrap, topic_name, 1)
    group = f"g0-{topic_name}"
    C = KpCommit[0]
    with KpRaw(broker.bootstrap) as kp:
        resp = kp.send(C(group_id=group, topics=[C.OffsetCommitRequestTopic(name=topic_name, partitions=[
            C.OffsetCommitRequestTopic.OffsetCommitRequestPartition(partition_index=0, committed_offset=5,
                                                                    committed_metadata="m")])]))
        assert resp.topics[0].partitions[0].error_code == 0
        F = KpFetch[0]
        got = kp.send(F(group_id=group, topics=[F.OffsetFetchRequestTopic(name=topic_name, partition_indexes=[0])]))
        p = got.topics[0].partitions[0]
        assert (p.error_code, p.committed_offset, p.metadata) == (0, 5, "m")
    OC, OF = OffsetCommitRequest, OffsetFetchRequest
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(8, 0, OC(group_id=group, topics=[OC.OffsetCommitRequestTopic(name=topic_name, partitions=[
            OC.OffsetCommitRequestPartition(partition_index=0, committed_offset=9, committed_metadata="")])]))
        assert resp.topics[0].partitions[0].error_code == 0
        resp = raw.request(9, 0, OF(group_id=group, topics=[OF.OffsetFetchRequestTopic(name=topic_name,
                                                                                       partition_indexes=[0])]))
        assert resp.topics[0].partitions[0].committed_offset == 9
        # A partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION, as Kafka's metadata check.
        resp = raw.request(8, 0, OC(group_id=group, topics=[OC.OffsetCommitRequestTopic(name=topic_name, partitions=[
            OC.OffsetCommitRequestPartition(partition_index=3, committed_offset=1, committed_metadata="")])]))
        assert resp.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_long_poll_wakes_old_fetches(broker, topic_name: str) -> None:
    """Fetch v2 with max_wait_ms/min_bytes waits for data like newer versions, and answers as soon as a produce
    arrives (raw frames, then kafka-python at (0, 10, 0) with a 10 s fetch wait)."""
    import threading

    create_topic(broker.bootstrap, topic_name, 1)
    F = FetchRequest
    req = F(replica_id=-1, max_wait_ms=10000, min_bytes=1, topics=[F.FetchTopic(topic=topic_name, partitions=[
        F.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
    later = threading.Timer(0.5, lambda: kp_produce(broker.bootstrap, topic_name, msgs("lp", 3),
                                                    api_version=(0, 10, 0)))
    with RawClient(broker.bootstrap, timeout=15) as raw:
        start = time.monotonic()
        later.start()
        part = raw.request(1, 2, req).responses[0].partitions[0]
        waited = time.monotonic() - start
    later.join()
    assert 0.4 < waited < 8, waited
    assert [m.value for m in read_message_set(part.records)] == [m.value for m in msgs("lp", 3)]
    later = threading.Timer(0.5, lambda: ck_produce(broker.bootstrap, topic_name, msgs("lp2", 2)))
    later.start()
    start = time.monotonic()
    got = kp_consume(broker.bootstrap, topic_name, [0], 5, api_version=(0, 10, 0), fetch_max_wait_ms=10000)
    later.join()
    assert values(got) == [m.value for m in msgs("lp", 3) + msgs("lp2", 2)]
    assert time.monotonic() - start < 8


def test_old_group_admin_apis(broker, topic_name: str) -> None:
    """ListGroups v0 and DescribeGroups v0 (kafka-python's admin at (0, 10, 0), and raw frames) see a group of an
    old consumer (JoinGroup v0); its LeaveGroup v0 on close empties the group."""
    from kafka import KafkaAdminClient, KafkaConsumer
    from kbroker.protocol.messages import DescribeGroupsRequest, ListGroupsRequest

    create_topic(broker.bootstrap, topic_name, 1)
    group = f"adm-{topic_name}"
    c = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group, api_version=(0, 10, 0))
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, api_version=(0, 10, 0))
    try:
        deadline = time.monotonic() + 20
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(200)
        assert c.assignment()
        assert {"group_id": group, "protocol_type": "consumer"} in admin.list_groups()
        desc = admin.describe_groups([group])[group]
        assert desc["group_state"] == "Stable" and len(desc["members"]) == 1
        assert desc["members"][0]["member_assignment"]["assigned_partitions"] == [
            {"topic": topic_name, "partitions": [0]}]
        with RawClient(broker.bootstrap) as raw:
            listed = raw.request(16, 0, ListGroupsRequest())
            assert group in {g.group_id for g in listed.groups}
            raw_desc = raw.request(15, 0, DescribeGroupsRequest(groups=[group])).groups[0]
            assert (raw_desc.error_code, raw_desc.group_state, len(raw_desc.members)) == (0, "Stable", 1)
        c.close()
        with RawClient(broker.bootstrap) as raw:
            assert raw.request(15, 0, DescribeGroupsRequest(groups=[group])).groups[0].group_state == "Empty"
    finally:
        c.close()
        admin.close()


def test_record_level_refusals_of_old_messages(broker, topic_name: str) -> None:
    """Kafka's per-record checks apply to converted messages: no key on a compacted topic (INVALID_RECORD), a
    CreateTime outside message.timestamp.*.max.ms (INVALID_TIMESTAMP; magic 0 messages have none to check), and a
    producer claiming LogAppendTime (INVALID_TIMESTAMP). librdkafka as a 0.9 client gets the same answers."""
    compacted, bounded = f"{topic_name}-c", f"{topic_name}-b"
    create_topic(broker.bootstrap, compacted, 1, **{"cleanup.policy": "compact"})
    create_topic(broker.bootstrap, bounded, 1, **{"message.timestamp.difference.max.ms": "3600000"})
    keyless = build_message_set([Record(0, TS0, b"k", b"v"), Record(1, TS0, None, b"v")], magic=1)
    resp = _produce(broker.bootstrap, compacted, keyless, 2)
    assert resp.error_code == ErrorCode.INVALID_RECORD
    assert _produce(broker.bootstrap, compacted, build_message_set([Record(0, -1, b"k", b"v")], magic=0),
                    1).error_code == 0
    with pytest.raises(ProduceFailed) as e:
        ck_produce(broker.bootstrap, compacted, [Msg(None, b"no key", partition=0)], **old_ck("0.9.0"))
    assert e.value.errors[0].code() == KafkaError.INVALID_RECORD

    old = build_message_set([Record(0, TS0, b"k", b"v")], magic=1)  # 2023: far outside one hour
    assert _produce(broker.bootstrap, bounded, old, 2).error_code == ErrorCode.INVALID_TIMESTAMP
    now = int(time.time() * 1000)
    assert _produce(broker.bootstrap, bounded, build_message_set([Record(0, now, b"k", b"v")], magic=1),
                    2).error_code == 0
    assert _produce(broker.bootstrap, bounded, build_message_set([Record(0, -1, b"k", b"v")], magic=0),
                    0).error_code == 0
    claimed = build_message_set([Record(0, now, b"k", b"v")], magic=1, log_append_time=now)
    assert _produce(broker.bootstrap, bounded, claimed, 2).error_code == ErrorCode.INVALID_TIMESTAMP
    assert _fetch(broker.bootstrap, bounded, 3).high_watermark == 2


@pytest.mark.parametrize("acks", [0, -1])
def test_acks_with_old_producers(broker, topic_name: str, acks: int) -> None:
    """acks=0 gets no answer and acks=all waits for the ISR, as with newer Produce versions (kafka-python at
    (0, 10, 0), then librdkafka as a 0.9 client)."""
    create_topic(broker.bootstrap, topic_name, 1)
    kp_produce(broker.bootstrap, topic_name, msgs("a", 5), api_version=(0, 10, 0), acks=acks if acks else 0)
    ck_produce(broker.bootstrap, topic_name, msgs("b", 5), **old_ck("0.9.0"), **{"acks": acks})
    got = ck_consume(broker.bootstrap, topic_name, [0], 10)
    assert values(got) == [m.value for m in msgs("a", 5) + msgs("b", 5)]
    if acks == 0:
        # No answer on the wire: the next frame is the answer to the request after it.
        from kbroker.protocol import codec

        P = ProduceRequest
        req = P(acks=0, timeout_ms=10000, topic_data=[P.TopicProduceData(name=topic_name, partition_data=[
            P.PartitionProduceData(index=0, records=build_message_set([Record(0, -1, b"k", b"v")], magic=0))])])
        with RawClient(broker.bootstrap) as raw:
            raw.send_bytes(raw.frame(0, 0, req))
            raw.send_bytes(raw.frame(3, 0, MetadataRequest(topics=[])))
            cid, _ = codec.decode_response(3, 0, raw.recv_frame())
            assert cid == raw.correlation_id
        assert _fetch(broker.bootstrap, topic_name, 0).high_watermark == 11


def test_list_offsets_v0_answers_segment_offsets(broker, topic_name: str) -> None:
    """ListOffsets v0 (Kafka's legacyFetchOffsetsBefore): latest is the log end offset followed by the segment
    starts, a timestamp the starts of the segments last modified before it, newest first, at most max_num_offsets
    (raw frames, and kafka-python's protocol classes)."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest as KpListOffsets

    from tests.clients import KpRaw

    create_topic(broker.bootstrap, topic_name, 1, **{"segment.bytes": "100"})
    for i in range(3):  # each produce rolls a new segment (one batch fills 100 bytes)
        kp_produce(broker.bootstrap, topic_name, msgs(f"s{i}", 2), api_version=(0, 10, 0))
    L = ListOffsetsRequest

    def raw_v0(timestamp: int, max_num: int) -> list[int]:
        with RawClient(broker.bootstrap) as raw:
            resp = raw.request(2, 0, L(replica_id=-1, topics=[L.ListOffsetsTopic(name=topic_name, partitions=[
                L.ListOffsetsPartition(partition_index=0, timestamp=timestamp, max_num_offsets=max_num)])]))
        part = resp.topics[0].partitions[0]
        assert part.error_code == 0
        return list(part.old_style_offsets)

    assert raw_v0(-1, 1) == [6]
    assert raw_v0(-1, 10) == [6, 4, 2, 0]
    assert raw_v0(-2, 10) == [0]
    assert raw_v0(int(time.time() * 1000) + 3_600_000, 2) == [6, 4]
    assert raw_v0(1, 10) == []  # every segment was written after 1970
    K = KpListOffsets[0]
    with KpRaw(broker.bootstrap) as kp:
        resp = kp.send(K(replica_id=-1, topics=[K.ListOffsetsTopic(name=topic_name, partitions=[
            K.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1, max_num_offsets=3)])]))
    assert list(resp.topics[0].partitions[0].old_style_offsets) == [6, 4, 2]
