"""Idempotent producers through a fault-injecting proxy (tests/chaos_proxy.py): responses dropped after the
broker appended, connections cut before and after a request reached the broker. Every send must be
acknowledged, and reading the topic directly afterwards must show each message exactly once, in per-partition
send order, at contiguous offsets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kbroker.protocol.records import RecordBatchHeader, iter_batch_headers

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess, free_port
from tests.chaos_proxy import ChaosProxy
from tests.clients import Rec, ck_consume, kp_consume

N = 20_000
PARTITIONS = 4
MIN_FAULTS = 20
BUDGET = 12  # per fault kind: at most 36 faults


class ProxiedBroker:
    """A broker advertising a proxy port, so that every client request goes through the proxy."""

    def __init__(self, data_dir: Path) -> None:
        self.proxy_port = free_port()
        self.broker = BrokerProcess(data_dir, {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.proxy_port}"})

    def proxy(self, seed: int) -> ChaosProxy:
        return ChaosProxy(self.broker.port, listen_port=self.proxy_port, seed=seed, probability=0.15,
                          drop_response=BUDGET, cut_before_request=BUDGET, cut_after_request=BUDGET,
                          warmup_requests=3, min_gap=2)

    def advertise_own_port(self) -> None:
        """Restart the broker advertising its own listener: clients then talk to it directly."""
        self.broker.stop()
        self.broker.overrides.pop("advertised.listeners")
        self.broker.start()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedBroker]:
    pb = ProxiedBroker(tmp_path)
    pb.broker.start()
    yield pb
    pb.broker.stop()


def _value(tag: str, i: int) -> bytes:
    return f"{tag}-{i:06d}".encode()


def _produce_confluent(bootstrap: str, topic: str, tag: str, timeout: float) -> int:
    p = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 2,
        "batch.num.messages": 100,  # many small Produce requests, so that faults hit many of them
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 200,
        "retry.backoff.ms": 20,
        "socket.timeout.ms": 10000,
        "log_level": 3,  # the expected disconnects are logged at warning level
        "message.timeout.ms": int(timeout * 1000),
    })
    errors: list[Any] = []
    acked = 0

    def on_delivery(err: Any, _m: Any) -> None:
        nonlocal acked
        if err is not None:
            errors.append(err)
        else:
            acked += 1

    for i in range(N):
        while True:
            try:
                p.produce(topic, key=str(i % 31).encode(), value=_value(tag, i), partition=i % PARTITIONS,
                          on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    left = p.flush(timeout)
    assert not errors, f"{len(errors)} deliveries failed, first: {errors[0]!r}"
    assert left == 0, f"{left} messages unacknowledged after {timeout}s"
    return acked


def _produce_kafka_python(bootstrap: str, topic: str, tag: str, timeout: float) -> int:
    from kafka import KafkaProducer

    p = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        max_in_flight_requests_per_connection=5,
        linger_ms=2,
        batch_size=512,  # ~20 records per batch: many small Produce requests
        reconnect_backoff_ms=20,
        reconnect_backoff_max_ms=200,
        retry_backoff_ms=20,
        request_timeout_ms=10000,
        delivery_timeout_ms=int(timeout * 1000),
    )
    try:
        futures = [p.send(topic, key=str(i % 31).encode(), value=_value(tag, i), partition=i % PARTITIONS)
                   for i in range(N)]
        p.flush(timeout)
        acked = 0
        for f in futures:
            f.get(timeout=1)  # raises the send error, if any
            acked += 1
        return acked
    finally:
        p.close(timeout=5)


def _stored_batches(pb: ProxiedBroker, topic: str) -> list[RecordBatchHeader]:
    return [h for p in range(PARTITIONS)
            for seg in sorted((pb.broker.data_dir / "logs" / f"{topic}-{p}").glob("*.log"))
            for _, h in iter_batch_headers(seg.read_bytes())]


def _read_directly(pb: ProxiedBroker, topic: str, reader: str) -> list[Rec]:
    """Everything in the topic, read with `reader` straight from the broker (no proxy)."""
    stored = sum(h.records_count for h in _stored_batches(pb, topic))
    consume = ck_consume if reader == "confluent" else kp_consume
    recs: list[Rec] = consume(pb.broker.bootstrap, topic, range(PARTITIONS), stored, timeout=30)
    assert len(recs) == stored, f"read {len(recs)} of the {stored} records in the log"
    return recs


def _check_exactly_once(pb: ProxiedBroker, topic: str, tag: str, reader: str) -> dict[str, int]:
    recs = _read_directly(pb, topic, reader)
    values = [r.value for r in recs]
    dupes = len(values) - len(set(values))
    assert dupes == 0, f"{dupes} messages stored more than once"
    assert len(recs) == N, f"read {len(recs)} records, sent {N}"
    for p in range(PARTITIONS):
        got = sorted((r for r in recs if r.partition == p), key=lambda r: r.offset)
        assert [r.offset for r in got] == list(range(len(got))), f"partition {p}: offsets not contiguous"
        assert [r.value for r in got] == [_value(tag, i) for i in range(p, N, PARTITIONS)], \
            f"partition {p}: not in send order"
    headers = _stored_batches(pb, topic)
    assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers), "a batch was written without idempotence"
    return {"batches": len(headers), "producer_ids": len({(h.producer_id, h.producer_epoch) for h in headers})}


@pytest.mark.parametrize("client, reader, seed", [("confluent", "kafka-python", 11),
                                                  ("kafka-python", "confluent", 23)])
def test_idempotent_producer_survives_dropped_responses_and_cut_connections(
        proxied: ProxiedBroker, client: str, reader: str, seed: int) -> None:
    topic = f"chaos-{client}"
    tag = client[:2]
    t0 = time.monotonic()
    with proxied.proxy(seed) as proxy:
        create_topic(proxy.address, topic, partitions=PARTITIONS)
        if client == "confluent":
            acked = _produce_confluent(proxy.address, topic, tag, timeout=60)
        else:
            acked = _produce_kafka_python(proxy.address, topic, tag, timeout=60)
    produce_s = time.monotonic() - t0
    s = proxy.stats
    print(f"\n{client}: {acked} acked in {produce_s:.1f} s; proxy: {s.connections} connections, "
          f"{s.by_api_key.get(0, 0)} produce requests forwarded, faults {s.faults} (dropped responses "
          f"{s.drop_response}, cut before request {s.cut_before_request}, cut after request {s.cut_after_request})")
    assert acked == N
    assert s.faults >= MIN_FAULTS, f"only {s.faults} faults injected: {s}"
    assert s.drop_response and s.cut_before_request and s.cut_after_request, s

    proxied.advertise_own_port()
    info = _check_exactly_once(proxied, topic, tag, reader)
    print(f"{client}: read back with {reader} directly: {N} records exactly once in order; "
          f"{info['batches']} stored batches from {info['producer_ids']} producer id/epoch pair(s)")


def test_without_idempotence_the_same_faults_duplicate_messages(proxied: ProxiedBroker) -> None:
    """Control: the proxy's faults really hit appended batches; a retrying non-idempotent producer duplicates."""
    topic, tag, n = "chaos-control", "ctl", 5000
    with proxied.proxy(5) as proxy:
        create_topic(proxy.address, topic, partitions=PARTITIONS)
        p = Producer({"bootstrap.servers": proxy.address, "enable.idempotence": False, "acks": "all",
                      "max.in.flight.requests.per.connection": 1, "linger.ms": 2, "batch.num.messages": 25,
                      "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200, "retry.backoff.ms": 20,
                      "retries": 1000, "log_level": 3})
        for i in range(n):
            p.produce(topic, value=_value(tag, i), partition=i % PARTITIONS)
            p.poll(0)
        assert p.flush(60) == 0
        del p  # destroyed while the proxy still answers: no reconnect attempts after the restart
    assert proxy.stats.drop_response > 0, proxy.stats
    proxied.advertise_own_port()
    values = [r.value for r in _read_directly(proxied, topic, "confluent")]
    assert set(values) == {_value(tag, i) for i in range(n)}
    print(f"\ncontrol: {proxy.stats.faults} faults ({proxy.stats.drop_response} dropped responses): "
          f"{len(values) - n} duplicates without idempotence")
    assert len(values) > n
