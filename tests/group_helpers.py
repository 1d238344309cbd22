"""Helpers shared by the consumer group tests (classic, KIP-848, migration, kill -9 of members)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kbroker.coordinator.group_records import parse_record
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ConsumerGroupDescribeRequest

from tests.clients import RawClient, wait_until


def kip848_broker(session_ms: int = 6000, **more: str) -> dict[str, str]:
    """Broker overrides for consumer-group tests: short KIP-848 heartbeats and sessions (below Kafka's default
    bounds, so the bounds are lowered too) and few __consumer_offsets partitions."""
    return {
        "group.consumer.heartbeat.interval.ms": "300",
        "group.consumer.min.heartbeat.interval.ms": "100",
        "group.consumer.session.timeout.ms": str(session_ms),
        "group.consumer.min.session.timeout.ms": "1000",
        "offsets.topic.num.partitions": "4",
        **more,
    }


def produce_steadily(bootstrap: str, topic: str, count: int, per_second: int, partitions: int) -> threading.Thread:
    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(count):
            p.produce(topic, str(i).encode(), partition=i % partitions)
            if i % 20 == 19:
                p.poll(0)
                time.sleep(20 / per_second)
        p.flush(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-" + uuid.uuid4().hex})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def once_loaded(answer: Callable[[], Any]) -> Any:
    """`answer()` again while it says COORDINATOR_LOAD_IN_PROGRESS, as clients retry it: a restarted broker listens
    before its __consumer_offsets partitions are loaded."""
    return wait_until(lambda: (lambda a: a if a.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else None)(
        answer()), timeout=15, what="the group coordinator to load")


def describe(bootstrap: str, group: str) -> Any:
    def answer() -> Any:
        with RawClient(bootstrap) as raw:
            [g] = raw.request(69, 0, ConsumerGroupDescribeRequest(group_ids=[group])).groups
        return g

    return once_loaded(answer)


def group_epoch_records(bootstrap: str, group: str, partition: int = 0, timeout: float = 30) -> list[tuple[int, int]]:
    """(epoch, metadata hash) of the group's ConsumerGroupMetadata, ShareGroupMetadata or StreamsGroupMetadata
    records in __consumer_offsets-partition, in log order (tombstones left out), read as any consumer reads them."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-" + uuid.uuid4().hex})
    try:
        tp = TopicPartition("__consumer_offsets", partition, 0)
        _, high = c.get_watermark_offsets(tp, timeout=timeout)
        c.assign([tp])
        out: list[tuple[int, int]] = []
        seen = -1
        deadline = time.monotonic() + timeout
        while seen < high - 1 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            seen = m.offset()
            r = parse_record(m.key(), m.value())
            rtype = getattr(r, "type", None)
            if rtype is not None and rtype.name == "METADATA" and getattr(r, "group_id", None) == group:
                if r.value is not None:  # type: ignore[union-attr]
                    out.append((r.value.epoch, r.value.metadata_hash))  # type: ignore[union-attr]
        assert seen >= high - 1, f"read __consumer_offsets-{partition} to {seen}, not {high - 1}"
        return out
    finally:
        c.close()


def share_group_offsets(bootstrap: str, group: str, topic: str, partitions: list[int]) -> list[tuple[int, int, int]]:
    """DescribeShareGroupOffsets v1 of the group's partitions of topic: (error, start offset, lag) each."""
    from kbroker.protocol.messages import DescribeShareGroupOffsetsRequest as D

    from kbroker_tools.wire import WireClient

    with WireClient(bootstrap) as w:
        r = w.request(90, 1, D(groups=[D.DescribeShareGroupOffsetsRequestGroup(
            group_id=group, topics=[D.DescribeShareGroupOffsetsRequestTopic(topic_name=topic, partitions=partitions)],
        )]))
    return [(p.error_code, p.start_offset, p.lag) for p in r.groups[0].topics[0].partitions]
