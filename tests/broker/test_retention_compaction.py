"""Retention and compaction on the real broker, observed by real clients."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

from tests.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def fast_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        Path(tmp_path_factory.mktemp("retention")),
        {
            "log.retention.check.interval.ms": "200",
            "log.cleaner.backoff.ms": "200",
            "log.segment.delete.delay.ms": "100",
        },
    )
    b.start()
    yield b
    b.stop()


def _create(bootstrap: str, name: str, configs: dict[str, str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(10)


def _earliest(bootstrap: str, topic: str) -> int:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        tp = KTP(topic, 0)
        return int(c.beginning_offsets([tp])[tp])
    finally:
        c.close()


def test_size_retention_deletes_old_segments_while_a_consumer_reads(fast_broker: BrokerProcess) -> None:
    topic = "retained-by-size"
    _create(fast_broker.bootstrap, topic, {"segment.bytes": "20000", "retention.bytes": "60000"})
    p = Producer({"bootstrap.servers": fast_broker.bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    value = b"v" * 500
    for i in range(2000):
        p.produce(topic, key=str(i).encode(), value=value)
        if i % 100 == 0:
            p.poll(0)
    assert p.flush(10) == 0

    # A slow consumer starting at the beginning races the retention thread.
    c = Consumer({
        "bootstrap.servers": fast_broker.bootstrap, "group.id": "retention-reader", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "fetch.max.bytes": 4096, "max.partition.fetch.bytes": 4096,
        "message.max.bytes": 4096,
    })
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen: list[int] = []
    errors: list[KafkaError] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None:
            if m.error():
                errors.append(m.error())
            else:
                seen.append(m.offset())
                if m.offset() == 1999:
                    break
    c.close()
    start = _earliest(fast_broker.bootstrap, topic)
    assert start > 0, "size retention deleted nothing"
    # 60000 bytes retained at least (whole segments only, never the active one).
    assert 2000 - start >= 60000 // 600
    assert seen and seen[-1] == 1999
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert all(e.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._PARTITION_EOF) for e in errors), errors


def test_time_retention_keeps_the_active_segment(fast_broker: BrokerProcess) -> None:
    topic = "retained-by-time"
    _create(fast_broker.bootstrap, topic, {"segment.bytes": "10000", "retention.ms": "1000"})
    p = Producer({"bootstrap.servers": fast_broker.bootstrap, "batch.num.messages": 5})
    now_ms = int(time.time() * 1000)
    for _ in range(300):
        p.produce(topic, value=b"x" * 200, timestamp=now_ms)
    assert p.flush(10) == 0
    deadline = time.monotonic() + 15
    start = 0
    while time.monotonic() < deadline:
        start = _earliest(fast_broker.bootstrap, topic)
        if start > 0:
            break
        time.sleep(0.2)
    assert start > 0, "time retention deleted nothing"
    time.sleep(1.5)
    start = _earliest(fast_broker.bootstrap, topic)
    # Everything is older than retention.ms, but the active segment stays, with the newest records.
    assert 0 < start < 300
    c = KafkaConsumer(bootstrap_servers=fast_broker.bootstrap, group_id=None, auto_offset_reset="earliest",
                      consumer_timeout_ms=2000)
    c.assign([KTP(topic, 0)])
    offsets = [m.offset for m in c]
    c.close()
    assert offsets == list(range(start, 300))


def test_compaction_keeps_the_last_value_per_key_and_drops_tombstones(fast_broker: BrokerProcess) -> None:
    topic = "compacted"
    _create(fast_broker.bootstrap, topic, {
        "cleanup.policy": "compact", "segment.bytes": "4000", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100",
    })
    p = Producer({"bootstrap.servers": fast_broker.bootstrap, "batch.num.messages": 20})
    expected: dict[bytes, bytes | None] = {}
    for rnd in range(20):
        for k in range(20):
            key = b"k%02d" % k
            value = None if (k % 5 == 0 and rnd == 19) else b"r%02d-%s" % (rnd, key)
            p.produce(topic, key=key, value=value)
            expected[key] = value
    assert p.flush(10) == 0
    # Roll the last segment by writing filler keys, so the final round becomes cleanable.
    for i in range(60):
        p.produce(topic, key=b"filler%02d" % (i % 3), value=b"f" * 100)
        expected[b"filler%02d" % (i % 3)] = b"f" * 100
    assert p.flush(10) == 0
    total = 20 * 20 + 60

    def read_all() -> list[tuple[int, bytes, bytes | None]]:
        c = KafkaConsumer(bootstrap_servers=fast_broker.bootstrap, group_id=None, auto_offset_reset="earliest",
                          consumer_timeout_ms=1500)
        c.assign([KTP(topic, 0)])
        out = [(m.offset, m.key, m.value) for m in c]
        c.close()
        return out

    deadline = time.monotonic() + 30
    records = read_all()
    while time.monotonic() < deadline and len(records) > 60:
        time.sleep(0.5)
        records = read_all()
    assert len(records) < total, "nothing was compacted"
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for off, key, value in records:
        latest[key] = (off, value)
    # The last value of every key survives, the offsets keep their order, nothing was invented.
    for key, value in expected.items():
        if value is None:
            assert key not in latest or latest[key][1] is None
        else:
            assert latest[key][1] == value, key
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert offsets[-1] == total - 1
