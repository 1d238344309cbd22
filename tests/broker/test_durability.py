"""Durability: kill -9 the broker while a producer streams, restart, check every acknowledged message."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.clients import ck_produce_waiting

TOTAL = 200_000
PARTITIONS = 2


def _consume_all(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 60.0) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "durability-check",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 50,
    })
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        n = 0
        deadline = time.monotonic() + timeout
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = c.consume(10000, 0.5)
            if not batch:
                if n >= expect and time.monotonic() - idle_since > 1.0:
                    break
                continue
            idle_since = time.monotonic()
            for m in batch:
                assert m.error() is None, m.error()
                got[m.partition()].append((m.offset(), m.value()))
                n += 1
        return got
    finally:
        c.close()


@pytest.mark.slow
def test_kill_dash_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path, {"log.flush.interval.messages": "1", "log.segment.bytes": str(4 * 1024 * 1024)})
    b.start()
    topic = "durable"
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(10)
        acked: dict[bytes, tuple[int, int]] = {}
        lock = threading.Lock()

        def on_delivery(err: object, msg: object) -> None:
            if err is None:
                with lock:
                    acked[msg.value()] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

        p = Producer({
            "bootstrap.servers": b.bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 5000,
            "retries": 0,
            "enable.idempotence": False,
        })
        killed_at = None
        for i in range(TOTAL):
            value = b"m%07d" % i
            ck_produce_waiting(p, topic, value, key=value[-2:], on_delivery=on_delivery)
            if killed_at is None and len(acked) >= TOTAL // 2:
                b.kill()  # mid-stream: requests are in flight right now
                killed_at = i
                break
        assert killed_at is not None, "producer never reached the kill point"
        p.flush(10)
        del p
        n_acked = len(acked)
        assert n_acked >= TOTAL // 2

        b.start()
        got = _consume_all(b.bootstrap, topic, PARTITIONS, n_acked)
        for part, msgs in got.items():
            offsets = [o for o, _ in msgs]
            assert offsets == list(range(len(offsets))), f"offsets of partition {part} are not contiguous from 0"
        by_value: dict[bytes, tuple[int, int]] = {}
        for part, msgs in got.items():
            for off, val in msgs:
                assert val not in by_value, f"duplicate message {val!r}"
                by_value[val] = (part, off)
        missing = [v for v in acked if v not in by_value]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        moved = [v for v, where in acked.items() if by_value[v] != where]
        assert not moved, f"{len(moved)} acknowledged messages at a different offset, e.g. {moved[:3]}"
        # Per partition, the acknowledged messages keep their produce order.
        for part, msgs in got.items():
            seq = [int(v[1:]) for _, v in msgs]
            assert seq == sorted(seq), f"partition {part} out of order"
        print(f"acknowledged {n_acked} of {killed_at + 1} sent before kill -9; all {n_acked} read back after restart")
    finally:
        b.kill()
