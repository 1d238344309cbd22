"""Produce and Fetch end to end: every codec, every producer client, read back by a different client."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka.admin import AdminClient, NewTopic

from tests.clients import (
    Msg,
    ProduceFailed,
    Rec,
    aio_consume,
    aio_produce,
    by_partition,
    ck_consume,
    ck_produce,
    kcat,
    kp_consume,
    kp_produce,
)
from tests.conftest import have_kcat

N = 10_000
PARTITIONS = 3
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TS0 = 1_700_000_000_000


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS, **config: str) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(name, partitions, 1, config=config)], operation_timeout=10)[name].result(15)


def messages(n: int, tag: str) -> list[Msg]:
    return [
        Msg(
            key=f"{tag}-key-{i % 97}".encode(),
            value=(f"{tag}-value-{i}-" + "x" * (i % 50)).encode(),
            headers=(("seq", str(i).encode()), ("tag", tag.encode()), ("empty", b"")) if i % 3 else (),
            timestamp=TS0 + i,
            partition=i % PARTITIONS,
        )
        for i in range(n)
    ]


def produce(client: str, bootstrap: str, topic: str, msgs: list[Msg], codec: str, **kw: object) -> list[Rec]:
    if client == "confluent":
        return ck_produce(bootstrap, topic, msgs, **{"compression.type": codec, **kw})
    if client == "kafka-python":
        return kp_produce(bootstrap, topic, msgs, compression_type=None if codec == "none" else codec, **kw)
    return aio_produce(bootstrap, topic, msgs, compression_type=None if codec == "none" else codec, **kw)


def consume(client: str, bootstrap: str, topic: str, count: int, partitions: int = PARTITIONS) -> list[Rec]:
    fn = {"confluent": ck_consume, "kafka-python": kp_consume, "aiokafka": aio_consume}[client]
    return fn(bootstrap, topic, range(partitions), count)


def check_round_trip(msgs: list[Msg], delivered: list[Rec], consumed: list[Rec]) -> None:
    assert len(consumed) == len(msgs), f"consumed {len(consumed)} of {len(msgs)}"
    # The consumer sees exactly what the producer was told was written, at the same offsets.
    assert sorted(consumed) == sorted(delivered)
    got = by_partition(consumed)
    for p in range(PARTITIONS):
        sent = [m for m in msgs if m.partition == p]
        recs = got.get(p, [])
        assert [r.offset for r in recs] == list(range(len(sent))), f"partition {p}: offsets not dense from 0"
        assert [(r.key, r.value, r.headers, r.timestamp) for r in recs] == [
            (m.key, m.value, m.headers, m.timestamp) for m in sent
        ], f"partition {p}: records differ or are out of order"


READER = {"confluent": "kafka-python", "kafka-python": "aiokafka", "aiokafka": "confluent"}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer", ["confluent", "kafka-python", "aiokafka"])
def test_round_trip_per_codec(broker, topic_name, producer, codec):
    create_topic(broker.bootstrap, topic_name)
    msgs = messages(N, f"{producer}-{codec}")
    delivered = produce(producer, broker.bootstrap, topic_name, msgs, codec)
    consumed = consume(READER[producer], broker.bootstrap, topic_name, N)
    check_round_trip(msgs, delivered, consumed)


@pytest.mark.parametrize("acks", [0, 1, -1])
@pytest.mark.parametrize("producer", ["confluent", "kafka-python", "aiokafka"])
def test_acks(broker, topic_name, producer, acks):
    create_topic(broker.bootstrap, topic_name)
    msgs = messages(300, f"acks{acks}")
    if producer == "confluent":
        delivered = ck_produce(broker.bootstrap, topic_name, msgs, acks=acks)
    elif producer == "kafka-python":
        delivered = kp_produce(broker.bootstrap, topic_name, msgs, acks="all" if acks == -1 else acks)
    else:
        delivered = aio_produce(broker.bootstrap, topic_name, msgs, acks="all" if acks == -1 else acks)
    consumed = consume(READER[producer], broker.bootstrap, topic_name, len(msgs))
    if acks == 0:
        # No response means no offsets in the delivery reports; the data must still all be there, in order.
        assert len(consumed) == len(msgs)
        got = by_partition(consumed)
        for p in range(PARTITIONS):
            assert [(r.key, r.value) for r in got[p]] == [(m.key, m.value) for m in msgs if m.partition == p]
    else:
        check_round_trip(msgs, delivered, consumed)


def test_message_too_large_confluent(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1, **{"max.message.bytes": "10000"})
    big = Msg(b"k", b"v" * 20_000, partition=0)
    with pytest.raises(ProduceFailed) as e:
        ck_produce(broker.bootstrap, topic_name, [big], timeout=15, **{"message.max.bytes": 1_000_000})
    assert e.value.errors[0].code() == CKError.MSG_SIZE_TOO_LARGE, e.value.errors
    # The topic still takes records that fit.
    ok = ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"small", partition=0)])
    assert ok[0].offset == 0


def test_message_too_large_kafka_python(broker, topic_name):
    from kafka.errors import MessageSizeTooLargeError

    create_topic(broker.bootstrap, topic_name, 1, **{"max.message.bytes": "10000"})
    with pytest.raises(MessageSizeTooLargeError):
        kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v" * 20_000, partition=0)], retries=0)


def test_message_too_large_aiokafka(broker, topic_name):
    from aiokafka.errors import MessageSizeTooLargeError

    create_topic(broker.bootstrap, topic_name, 1, **{"max.message.bytes": "10000"})
    with pytest.raises(MessageSizeTooLargeError):
        aio_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v" * 20_000, partition=0)], timeout=15)


def test_message_too_large_broker_limit(broker, topic_name):
    """message.max.bytes (broker, default 1048588) applies to topics without max.message.bytes."""
    create_topic(broker.bootstrap, topic_name, 1)
    with pytest.raises(ProduceFailed) as e:
        ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v" * 1_100_000, partition=0)], timeout=15,
                   **{"message.max.bytes": 2_000_000, "compression.type": "none"})
    assert e.value.errors[0].code() == CKError.MSG_SIZE_TOO_LARGE


def test_large_fetch_across_clients(broker, topic_name):
    """Big records (sendfile path on the broker) come back intact in every client."""
    create_topic(broker.bootstrap, topic_name, 1)
    msgs = [Msg(f"k{i}".encode(), bytes([i]) * 500_000, partition=0) for i in range(8)]
    delivered = ck_produce(broker.bootstrap, topic_name, msgs, **{"compression.type": "none"})
    for reader in (ck_consume, kp_consume, aio_consume):
        got = reader(broker.bootstrap, topic_name, [0], len(msgs))
        assert sorted(got) == sorted(delivered), reader.__name__


@pytest.mark.skipif(not have_kcat(), reason="kcat not installed")
def test_kcat_round_trip(broker, topic_name):
    lines = [f"key{i}:value {i}" for i in range(200)]
    kcat(broker.bootstrap, "-P", "-t", topic_name, "-K:", input=("\n".join(lines) + "\n").encode())
    out = kcat(broker.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-f", "%k:%s\n")
    assert out.stdout.decode().splitlines() == lines
    # Another client sees the same records (topic auto-created with num.partitions=1).
    got = ck_consume(broker.bootstrap, topic_name, [0], len(lines))
    assert [(r.key, r.value) for r in got] == [(ln.split(":")[0].encode(), ln.split(":", 1)[1].encode()) for ln in lines]


@pytest.mark.skipif(not have_kcat(), reason="kcat not installed")
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kcat_reads_compressed_from_kafka_python(broker, topic_name, codec):
    create_topic(broker.bootstrap, topic_name, 1)
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), (("h", b"1"),), TS0 + i, 0) for i in range(500)]
    kp_produce(broker.bootstrap, topic_name, msgs, compression_type=codec)
    out = kcat(broker.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-f", "%k=%s@%T|%h\n")
    assert out.stdout.decode().splitlines() == [f"k{i}=v{i}@{TS0 + i}|h=1" for i in range(500)]


def test_produce_to_unknown_partition(broker, topic_name):
    """A partition that does not exist is an error for the client, not a broker crash."""
    create_topic(broker.bootstrap, topic_name, 1)
    start = time.monotonic()
    with pytest.raises(ProduceFailed) as e:
        ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"v", partition=5)], timeout=10,
                   **{"message.timeout.ms": 3000})
    assert e.value.errors[0].code() in (CKError._UNKNOWN_PARTITION, CKError._MSG_TIMED_OUT)
    assert time.monotonic() - start < 10
    assert broker.alive()


def test_log_append_time(broker, topic_name):
    """message.timestamp.type=LogAppendTime: the broker stamps records; producers and consumers see its time."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    create_topic(broker.bootstrap, topic_name, 1, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), timestamp=TS0 + i, partition=0) for i in range(50)]
    delivered = kp_produce(broker.bootstrap, topic_name, msgs, compression_type="gzip")
    after = int(time.time() * 1000)
    assert all(before - 5 <= r.timestamp <= after + 5 for r in delivered), "ProduceResponse log_append_time_ms"
    got = ck_consume(broker.bootstrap, topic_name, [0], 50)
    assert [r.value for r in got] == [m.value for m in msgs]
    assert all(before - 5 <= r.timestamp <= after + 5 for r in got)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, auto_offset_reset="earliest")
    try:
        tp = KTP(topic_name, 0)
        c.assign([tp])
        recs: list = []
        deadline = time.monotonic() + 15
        while len(recs) < 50 and time.monotonic() < deadline:
            recs += c.poll(timeout_ms=300).get(tp, [])
        assert len(recs) == 50
        assert {r.timestamp_type for r in recs} == {1}  # LogAppendTime
        assert [r.timestamp for r in recs] == [r.timestamp for r in got]
    finally:
        c.close()
