"""ListOffsets, OffsetForLeaderEpoch and Fetch long polling, through confluent-kafka, kafka-python and aiokafka."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import kafka.errors as KErr
import pytest
from confluent_kafka import OFFSET_END, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

from tests.clients import KpRaw, Msg, RawClient, ck_consumer, ck_produce, kp_produce

T = 15
TS0 = 1_600_000_000_000
N = 20  # records per partition, timestamps TS0 + 1000*i (partition 0) and TS0 + 1000*i + 500 (partition 1)


@pytest.fixture(scope="module")
def ts_topic(broker) -> str:
    """A 3-partition topic: partitions 0 and 1 with N records at known timestamps, partition 2 empty."""
    name = "offsets-by-time"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(T)
    msgs = [Msg(b"k", f"p0-{i}".encode(), timestamp=TS0 + 1000 * i, partition=0) for i in range(N)]
    msgs += [Msg(b"k", f"p1-{i}".encode(), timestamp=TS0 + 1000 * i + 500, partition=1) for i in range(N)]
    # One record with an out-of-order timestamp: the max timestamp of partition 0 is at offset N.
    msgs.append(Msg(b"k", b"p0-late", timestamp=TS0 + 1000 * N * 10, partition=0))
    msgs.append(Msg(b"k", b"p0-last", timestamp=TS0 + 1000 * N, partition=0))
    ck_produce(broker.bootstrap, name, msgs, **{"linger.ms": 0, "batch.num.messages": 3})
    return name


def test_watermarks_confluent(broker, ts_topic):
    c = ck_consumer(broker.bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition(ts_topic, 0), timeout=T) == (0, N + 2)
        assert c.get_watermark_offsets(TopicPartition(ts_topic, 1), timeout=T) == (0, N)
        assert c.get_watermark_offsets(TopicPartition(ts_topic, 2), timeout=T) == (0, 0)
    finally:
        c.close()


def test_offsets_for_times_confluent(broker, ts_topic):
    c = ck_consumer(broker.bootstrap)
    try:
        query = [
            TopicPartition(ts_topic, 0, TS0 + 1500),  # first record with timestamp >= target: offset 2
            TopicPartition(ts_topic, 1, TS0 + 1500),  # exact match: offset 1
            TopicPartition(ts_topic, 0, TS0 - 1),  # before everything: offset 0
            TopicPartition(ts_topic, 1, TS0 + 10_000_000),  # after everything: end (-1)
            TopicPartition(ts_topic, 2, TS0),  # empty partition
        ]
        got = [c.offsets_for_times([q], timeout=T)[0].offset for q in query]
        assert got == [2, 1, 0, OFFSET_END, OFFSET_END]
        # The out-of-order record: the first record with a timestamp >= TS0 + 1000*N is the late one at offset N.
        assert c.offsets_for_times([TopicPartition(ts_topic, 0, TS0 + 1000 * N)], timeout=T)[0].offset == N
    finally:
        c.close()


def test_list_offsets_admin_confluent(broker, ts_topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    specs = {
        TopicPartition(ts_topic, 0): OffsetSpec.earliest(),
        TopicPartition(ts_topic, 1): OffsetSpec.latest(),
    }
    res = {tp.partition: f.result(T) for tp, f in admin.list_offsets(specs, request_timeout=T).items()}
    assert res[0].offset == 0 and res[1].offset == N
    ts = admin.list_offsets({TopicPartition(ts_topic, 1): OffsetSpec.for_timestamp(TS0 + 3500)})
    only = next(iter(ts.values())).result(T)
    assert only.offset == 3 and only.timestamp == TS0 + 3500
    # ListOffsets v7 (KIP-734): the record with the largest timestamp.
    mx = admin.list_offsets({TopicPartition(ts_topic, 0): OffsetSpec.max_timestamp()})
    only = next(iter(mx.values())).result(T)
    assert (only.offset, only.timestamp) == (N, TS0 + 1000 * N * 10)


def test_list_offsets_kafka_python(broker, ts_topic):
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        tps = [KTP(ts_topic, p) for p in range(3)]
        assert c.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        assert c.end_offsets(tps) == {tps[0]: N + 2, tps[1]: N, tps[2]: 0}
        got = c.offsets_for_times({tps[0]: TS0 + 1500, tps[1]: TS0 + 1500, tps[2]: TS0})
        assert (got[tps[0]].offset, got[tps[0]].timestamp) == (2, TS0 + 2000)
        assert (got[tps[1]].offset, got[tps[1]].timestamp) == (1, TS0 + 1500)
        assert got[tps[2]] is None
        assert c.offsets_for_times({tps[1]: TS0 + 10_000_000})[tps[1]] is None
    finally:
        c.close()


def test_list_offsets_aiokafka(broker, ts_topic):
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
        await c.start()
        try:
            tps = [ATP(ts_topic, 0), ATP(ts_topic, 1)]
            assert await c.beginning_offsets(tps) == dict.fromkeys(tps, 0)
            assert await c.end_offsets(tps) == {tps[0]: N + 2, tps[1]: N}
            got = await c.offsets_for_times({tps[0]: TS0 + 4000})
            assert (got[tps[0]].offset, got[tps[0]].timestamp) == (4, TS0 + 4000)
        finally:
            await c.stop()

    asyncio.run(run())


def test_list_offsets_errors(broker, ts_topic):
    """Unknown topic/partition answers per partition; the connection stays usable (kafka-python protocol)."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest

    with KpRaw(broker.bootstrap) as raw:
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
            (ts_topic, [(0, -1, -2), (9, -1, -2)]),
            ("no-such-topic-for-offsets", [(0, -1, -1)]),
        ])
        resp = raw.send(req)
        by = {(t.name, p.partition_index): p for t in resp.topics for p in t.partitions}
        assert by[(ts_topic, 0)].error_code == 0 and by[(ts_topic, 0)].offset == 0
        assert by[(ts_topic, 9)].error_code == KErr.UnknownTopicOrPartitionError.errno
        assert by[("no-such-topic-for-offsets", 0)].error_code == KErr.UnknownTopicOrPartitionError.errno


# ---------------------------------------------------------------- OffsetForLeaderEpoch


def test_offset_for_leader_epoch_confluent(broker, ts_topic):
    """librdkafka validates a position that carries a leader epoch with OffsetForLeaderEpoch (KIP-320)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("kbroker-tests-rdkafka")
    logger.addHandler(Collect())
    logger.setLevel(logging.DEBUG)
    c = ck_consumer(broker.bootstrap, debug="protocol", logger=logger)
    try:
        c.assign([TopicPartition(ts_topic, 1, 5, leader_epoch=0)])
        deadline = time.monotonic() + T
        m = None
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error():
                pytest.fail(str(m.error()))
        assert m is not None and (m.offset(), m.value(), m.leader_epoch()) == (5, b"p1-5", 0)
    finally:
        c.close()
    assert any("Received OffsetForLeaderEpochResponse" in ln for ln in lines), "no epoch validation happened"


def test_offset_for_leader_epoch_kafka_python(broker, ts_topic):
    from kafka.consumer.fetcher import _OffsetForLeaderPartition as P
    from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest

    with KpRaw(broker.bootstrap) as raw:
        resp = raw.send(OffsetForLeaderEpochRequest(replica_id=-1, topics=[(ts_topic, [
            P(partition=0, current_leader_epoch=0, leader_epoch=0),
            P(partition=1, current_leader_epoch=-1, leader_epoch=0),
            P(partition=2, current_leader_epoch=0, leader_epoch=0),
            P(partition=7, current_leader_epoch=0, leader_epoch=0),
        ])]))
        got = {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for t in resp.topics for p in t.partitions}
        assert got[0] == (0, 0, N + 2)
        assert got[1] == (0, 0, N)
        assert got[2] == (0, 0, 0)
        assert got[7][0] == KErr.UnknownTopicOrPartitionError.errno
        # A newer epoch than the leader's is UNKNOWN_LEADER_EPOCH; this broker's epoch is 0.
        resp = raw.send(OffsetForLeaderEpochRequest(replica_id=-1, topics=[(ts_topic, [
            P(partition=0, current_leader_epoch=3, leader_epoch=0)])]))
        assert resp.topics[0].partitions[0].error_code == KErr.UnknownLeaderEpochError.errno


def test_offset_for_leader_epoch_codec(broker, ts_topic):
    """The same through protocol.codec, at the oldest and newest supported versions."""
    from kbroker.protocol.messages import OffsetForLeaderEpochRequest as Req

    topic = Req.OffsetForLeaderTopic(topic=ts_topic, partitions=[
        Req.OffsetForLeaderPartition(partition=1, current_leader_epoch=-1, leader_epoch=0)])
    with RawClient(broker.bootstrap) as raw:
        for version in (0, 4):
            body = Req(replica_id=-1, topics=[topic]) if version >= 3 else Req(topics=[topic])
            resp = raw.request(23, version, body)
            p = resp.topics[0].partitions[0]
            assert (p.error_code, p.end_offset) == (0, N)


# ---------------------------------------------------------------- Fetch long poll


def _produce_later(bootstrap: str, topic: str, delay: float, stamp: list[float]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        stamp.append(time.monotonic())
        kp_produce(bootstrap, topic, [Msg(b"k", b"late", partition=0)], linger_ms=0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_long_poll_wakes_confluent(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    c = ck_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 5000})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        assert c.poll(0.3) is None  # the first fetch is now parked in the broker
        stamp: list[float] = []
        t = _produce_later(broker.bootstrap, topic_name, 0.5, stamp)
        m = None
        deadline = time.monotonic() + 10
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.05)
        arrived = time.monotonic()
        t.join()
        assert m is not None and m.value() == b"late"
        assert arrived - stamp[0] < 1.0, f"message took {arrived - stamp[0]:.2f}s to arrive"
    finally:
        c.close()


def test_long_poll_wakes_kafka_python(broker, topic_name):
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"first", partition=0)])  # auto-creates
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, fetch_max_wait_ms=5000,
                      auto_offset_reset="earliest")
    try:
        tp = KTP(topic_name, 0)
        c.assign([tp])
        c.seek(tp, 1)
        assert c.poll(timeout_ms=300) == {}
        stamp: list[float] = []
        t = _produce_later(broker.bootstrap, topic_name, 0.5, stamp)
        got: list = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = c.poll(timeout_ms=50).get(tp, [])
        arrived = time.monotonic()
        t.join()
        assert [r.value for r in got] == [b"late"]
        assert arrived - stamp[0] < 1.0, f"message took {arrived - stamp[0]:.2f}s to arrive"
    finally:
        c.close()


def _raw_fetch(raw: RawClient, topic: str, offset: int, max_wait_ms: int, min_bytes: int = 1):  # type: ignore[no-untyped-def]
    from kbroker.protocol.messages import FetchRequest as F

    req = F(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20, isolation_level=0,
            session_id=0, session_epoch=-1,
            topics=[F.FetchTopic(topic=topic, partitions=[F.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                partition_max_bytes=1 << 20)])],
            forgotten_topics_data=[], rack_id="")
    t0 = time.monotonic()
    resp = raw.request(1, 12, req)
    return resp, time.monotonic() - t0


def test_long_poll_waits_when_no_data(broker, topic_name):
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"only", partition=0)])
    with RawClient(broker.bootstrap) as raw:
        resp, took = _raw_fetch(raw, topic_name, 1, max_wait_ms=1000)
        p = resp.responses[0].partitions[0]
        assert p.error_code == 0 and p.high_watermark == 1
        assert not p.records
        assert 0.9 <= took < 3.0, f"empty fetch with max_wait_ms=1000 returned after {took:.2f}s"
        # Data already there: no waiting at all.
        resp, took = _raw_fetch(raw, topic_name, 0, max_wait_ms=5000)
        assert resp.responses[0].partitions[0].records and took < 1.0
        # min_bytes larger than what is there: waits the full max_wait_ms, then returns what it has.
        resp, took = _raw_fetch(raw, topic_name, 0, max_wait_ms=600, min_bytes=1 << 20)
        assert resp.responses[0].partitions[0].records and 0.5 <= took < 3.0


def test_long_poll_does_not_block_other_requests(broker, topic_name):
    """A parked fetch on one connection must not delay requests on another."""
    kp_produce(broker.bootstrap, topic_name, [Msg(b"k", b"x", partition=0)])
    with RawClient(broker.bootstrap) as parked, RawClient(broker.bootstrap) as other:
        from kbroker.protocol.messages import ApiVersionsRequest

        result: list = []
        t = threading.Thread(target=lambda: result.append(_raw_fetch(parked, topic_name, 1, max_wait_ms=2000)))
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        resp = other.request(18, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert resp.error_code == 0 and time.monotonic() - t0 < 0.5
        t.join()
        assert result[0][1] >= 1.5
