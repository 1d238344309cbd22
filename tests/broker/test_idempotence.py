"""Idempotent producers against the real broker: InitProducerId, exactly-once appends, duplicate and
sequence errors over the wire, kill -9 mid-stream with retries."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import InitProducerIdRequest, ProduceRequest
from kbroker.protocol.records import RecordBatchHeader, build_batch, decode_records, iter_batch_headers

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess
from tests.clients import (
    Msg,
    RawClient,
    aio_produce,
    ck_consume,
    ck_consumer,
    ck_produce,
    ck_produce_waiting,
    kp_produce,
)

N = 12_000
PARTITIONS = 3


def _messages(n: int, tag: str) -> list[Msg]:
    return [Msg(key=f"{tag}-{i % 31}".encode(), value=f"{tag}-{i:06d}".encode(), partition=i % PARTITIONS)
            for i in range(n)]


def _stored_batches(broker: BrokerProcess, topic: str, partition: int) -> list[RecordBatchHeader]:
    return [h for seg in sorted((broker.data_dir / "logs" / f"{topic}-{partition}").glob("*.log"))
            for _, h in iter_batch_headers(seg.read_bytes())]


def _check_exactly_once_in_order(broker: BrokerProcess, topic: str, msgs: list[Msg]) -> None:
    consumed = ck_consume(broker.bootstrap, topic, range(PARTITIONS), len(msgs), timeout=30)
    assert len(consumed) == len(msgs), f"consumed {len(consumed)} records of {len(msgs)} sent"
    for p in range(PARTITIONS):
        sent = [m.value for m in msgs if m.partition == p]
        recs = sorted((r for r in consumed if r.partition == p), key=lambda r: r.offset)
        assert [r.offset for r in recs] == list(range(len(recs)))
        assert [r.value for r in recs] == sent
        # nothing beyond them in the log either, and the client really produced idempotently:
        # every stored batch carries the producer id and a sequence
        headers = _stored_batches(broker, topic, p)
        assert sum(h.records_count for h in headers) == len(sent)
        assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers)
        assert len({h.producer_id for h in headers}) == 1


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_idempotent_clients_write_each_message_once(broker: BrokerProcess, topic_name: str, client: str) -> None:
    create_topic(broker.bootstrap, topic_name)
    msgs = _messages(N, client)
    if client == "confluent":
        delivered = ck_produce(broker.bootstrap, topic_name, msgs, **{"enable.idempotence": True, "acks": "all"})
    elif client == "kafka-python":
        delivered = kp_produce(broker.bootstrap, topic_name, msgs, enable_idempotence=True, acks="all")
    else:
        delivered = aio_produce(broker.bootstrap, topic_name, msgs, enable_idempotence=True, acks="all")
    assert len(delivered) == N
    _check_exactly_once_in_order(broker, topic_name, msgs)


# -- raw protocol ---------------------------------------------------------------------------------


def _init_producer_id(c: RawClient) -> tuple[int, int]:
    resp = c.request(22, 4, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                                  producer_id=-1, producer_epoch=-1))
    assert resp.error_code == 0
    return resp.producer_id, resp.producer_epoch


def _produce(c: RawClient, topic: str, records: bytes, partition: int = 0) -> Any:
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.PartitionProduceData(index=partition, records=records)])])
    resp = c.request(0, 9, req)
    return resp.responses[0].partition_responses[0]


def _batch(pid: int, epoch: int, seq: int, n: int, tag: str) -> bytes:
    now = int(time.time() * 1000)
    return build_batch([(None, f"{tag}-{i}".encode(), [], now) for i in range(n)], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)


def test_init_producer_id_gives_fresh_ids(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        a, b = _init_producer_id(c), _init_producer_id(c)
    assert a[1] == b[1] == 0 and a[0] >= 0 and b[0] > a[0]


def test_raw_duplicate_returns_original_offset(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    with RawClient(broker.bootstrap) as c:
        pid, epoch = _init_producer_id(c)
        first = _produce(c, topic_name, _batch(pid, epoch, 0, 3, "a"))
        second = _produce(c, topic_name, _batch(pid, epoch, 3, 2, "b"))
        assert (first.error_code, first.base_offset, second.error_code, second.base_offset) == (0, 0, 0, 3)
        # resend both: answered with the original offsets, nothing appended
        again = _produce(c, topic_name, _batch(pid, epoch, 0, 3, "a"))
        again2 = _produce(c, topic_name, _batch(pid, epoch, 3, 2, "b"))
        assert (again.error_code, again.base_offset, again2.error_code, again2.base_offset) == (0, 0, 0, 3)
        nxt = _produce(c, topic_name, _batch(pid, epoch, 5, 1, "c"))
        assert (nxt.error_code, nxt.base_offset) == (0, 5)
    values = [r.value for r in ck_consume(broker.bootstrap, topic_name, [0], 100, timeout=3)]
    assert values == [b"a-0", b"a-1", b"a-2", b"b-0", b"b-1", b"c-0"]


def test_raw_sequence_errors(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    with RawClient(broker.bootstrap) as c:
        pid, epoch = _init_producer_id(c)
        assert _produce(c, topic_name, _batch(pid, epoch, 0, 2, "a")).error_code == 0
        gap = _produce(c, topic_name, _batch(pid, epoch, 5, 1, "gap"))
        assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER == 45
        new_pid, _ = _init_producer_id(c)
        unknown = _produce(c, topic_name, _batch(new_pid, 0, 7, 1, "unknown"))
        assert unknown.error_code == ErrorCode.UNKNOWN_PRODUCER_ID == 59
        assert _produce(c, topic_name, _batch(pid, epoch + 1, 0, 1, "bump")).error_code == 0
        fenced = _produce(c, topic_name, _batch(pid, epoch, 2, 1, "old"))
        assert fenced.error_code == ErrorCode.INVALID_PRODUCER_EPOCH == 47
    values = [r.value for r in ck_consume(broker.bootstrap, topic_name, [0], 100, timeout=3)]
    assert values == [b"a-0", b"a-1", b"bump-0"]


def test_producer_state_survives_clean_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path)
    b.start()
    try:
        create_topic(b.bootstrap, "restart", partitions=1)
        with RawClient(b.bootstrap) as c:
            pid, epoch = _init_producer_id(c)
            assert _produce(c, "restart", _batch(pid, epoch, 0, 4, "a")).base_offset == 0
        b.restart()
        with RawClient(b.bootstrap) as c:
            dup = _produce(c, "restart", _batch(pid, epoch, 0, 4, "a"))
            assert (dup.error_code, dup.base_offset) == (0, 0)
            assert _produce(c, "restart", _batch(pid, epoch, 9, 1, "gap")).error_code == 45
            assert _produce(c, "restart", _batch(pid, epoch, 4, 1, "b")).base_offset == 4
            # a new producer id after the restart: the id block is not reused
            assert _init_producer_id(c)[0] > pid
    finally:
        b.kill()


# -- kill -9 mid-stream ---------------------------------------------------------------------------

KILL_TOTAL = 60_000


@pytest.mark.slow
def test_kill_dash_9_idempotent_producer_no_duplicates(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path, {"log.flush.interval.messages": "1", "log.segment.bytes": str(1024 * 1024)})
    b.start()
    topic = "idem-durable"
    try:
        create_topic(b.bootstrap, topic, partitions=2)
        acked: dict[bytes, tuple[int, int]] = {}
        failed: list[Any] = []
        lock = threading.Lock()

        def on_delivery(err: Any, msg: Any) -> None:
            with lock:
                if err is None:
                    acked[msg.value()] = (msg.partition(), msg.offset())
                else:
                    failed.append(err)

        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "message.timeout.ms": 60000, "retry.backoff.ms": 100,
                      "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 500})
        restarted = False
        for i in range(KILL_TOTAL):
            value = b"m%07d" % i
            ck_produce_waiting(p, topic, value, key=value[-2:], on_delivery=on_delivery)
            while not restarted and i - len(acked) > 5000:
                p.poll(0.01)  # keep a bounded number in flight until the kill
            if not restarted and len(acked) >= KILL_TOTAL // 3:
                b.kill()  # requests in flight; the producer keeps retrying them
                time.sleep(0.5)
                b.start()
                restarted = True
        assert restarted, "producer never reached the kill point"
        assert p.flush(60) == 0
        assert not failed, f"{len(failed)} deliveries failed, first {failed[0]!r}"
        assert len(acked) == KILL_TOTAL

        got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        # Read exactly what the log holds (the end offsets), so duplicates show up without waiting for a timeout.
        c = ck_consumer(b.bootstrap)
        try:
            total = sum(c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)[1] for part in (0, 1))
        finally:
            c.close()
        for r in ck_consume(b.bootstrap, topic, [0, 1], total, timeout=30):
            assert r.value is not None
            got[r.partition].append((r.offset, r.value))
        seen: dict[bytes, tuple[int, int]] = {}
        for part, recs in got.items():
            recs.sort()
            assert [o for o, _ in recs] == list(range(len(recs))), f"partition {part}: offsets not contiguous"
            for off, val in recs:
                assert val not in seen, f"duplicate {val!r} at {part}/{off} and {seen[val]}"
                seen[val] = (part, off)
            # per key order is produce order (keys map to partitions; one producer, in order per partition)
            nums = [int(v[1:]) for _, v in recs]
            assert nums == sorted(nums), f"partition {part} out of order"
        assert set(seen) == set(acked), "acknowledged messages missing or unacknowledged ones present"
        moved = [v for v, where in acked.items() if seen[v] != where]
        assert not moved, f"{len(moved)} messages acknowledged at a different offset, e.g. {moved[:3]}"
    finally:
        b.kill()


def test_records_helper_sanity() -> None:
    # the raw batches used above carry what the broker validates
    data = _batch(5, 1, 7, 3, "x")
    (_, h), = list(iter_batch_headers(data))
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (5, 1, 7, 9)
    assert [r.value for r in decode_records(data)] == [b"x-0", b"x-1", b"x-2"]
