"""Fetch answers each partition once and keeps to the client's max_bytes and the 32-bit frame size.

A partition listed thousands of times with max_bytes = 2^31-1 used to build a response past the frame size limit
and drop the connection with a traceback. Raw frames (protocol.codec) and kafka-python's protocol classes.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.messages import FetchRequest
from kbroker.protocol.records import iter_batch_headers

from tests.clients import KpRaw, Msg, RawClient, ck_produce

INT32_MAX = 2**31 - 1
T = 15


@pytest.fixture(scope="module")
def data_topic(broker) -> str:
    """Two partitions of about 300 KB each, in 50 KB batches."""
    name = "fetch-limits"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(T)
    msgs = [Msg(b"k%d" % i, bytes([i % 251]) * 10_000, partition=i % 2) for i in range(60)]
    ck_produce(broker.bootstrap, name, msgs, linger_ms=50, batch_size=50_000)
    return name


def _raw_fetch(version: int, topics: list[tuple[str, list[tuple[int, int]]]], max_bytes: int) -> FetchRequest:
    return FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                        topics=[FetchRequest.FetchTopic(topic=t, partitions=[
                            FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=pmb)
                            for p, pmb in parts]) for t, parts in topics])


@pytest.mark.parametrize("version", [4, 12])
def test_same_partition_many_times_raw(broker, data_topic, version):
    copies = 20_000
    req = _raw_fetch(version, [(data_topic, [(0, 1 << 20)] * copies)], INT32_MAX)
    with RawClient(broker.bootstrap, timeout=30) as raw:
        resp = raw.request(1, version, req)
        [topic] = resp.responses
        [pd] = topic.partitions
        assert pd.error_code == 0 and pd.partition_index == 0
        headers = [h for _, h in iter_batch_headers(pd.records)]
        assert headers and headers[0].base_offset == 0
        assert len(pd.records) <= (1 << 20) + 60_000
        # The connection is still good.
        again = raw.request(1, version, _raw_fetch(version, [(data_topic, [(1, 1000)])], 1000))
        assert again.responses[0].partitions[0].error_code == 0
    assert "Traceback" not in broker.read_log()


def test_duplicates_answered_once_in_first_position_raw(broker, data_topic):
    # The topic is named twice; its partition 1 three times with different limits: Kafka keeps the
    # first position and the last request (LinkedHashMap semantics).
    req = _raw_fetch(12, [(data_topic, [(1, 100), (0, 100)]), (data_topic, [(1, 200_000), (1, 1)])], INT32_MAX)
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(1, 12, req)
    parts = [(t.topic, p.partition_index) for t in resp.responses for p in t.partitions]
    assert parts == [(data_topic, 1), (data_topic, 0)]
    assert len(resp.responses) == 1
    by = {p.partition_index: p for p in resp.responses[0].partitions}
    # partition_max_bytes=1 for partition 1: still the first batch (min one message), nothing more.
    assert len(list(iter_batch_headers(by[1].records))) == 1


def test_max_bytes_respected_kafka_python(broker, data_topic):
    from kafka.protocol.consumer.fetch import FetchRequest as KFetch

    with KpRaw(broker.bootstrap) as raw:
        req = KFetch[4](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=120_000, isolation_level=0,
                        topics=[(data_topic, [(0, 0, 1 << 20), (1, 0, 1 << 20)] * 500)])
        resp = raw.send(req)
    parts = [(t.topic, p.partition_index) for t in resp.responses for p in t.partitions]
    assert parts == [(data_topic, 0), (data_topic, 1)]
    total = sum(len(p.records or b"") for t in resp.responses for p in t.partitions)
    # max_bytes, plus at most the remainder of the batch that crosses it.
    assert 0 < total <= 120_000 + 60_000


@pytest.mark.parametrize("isolation_level, expected", [(0, None), (1, [])])
def test_aborted_transactions_null_unless_read_committed_raw(broker, data_topic, isolation_level, expected):
    # Kafka answers null for read_uncommitted and a list (empty without aborted transactions) for read_committed.
    req = _raw_fetch(12, [(data_topic, [(0, 1000)])], 1000)
    req.isolation_level = isolation_level
    with RawClient(broker.bootstrap) as raw:
        [pd] = raw.request(1, 12, req).responses[0].partitions
    assert pd.error_code == 0 and pd.aborted_transactions == expected
