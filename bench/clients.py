"""Client loops shared by the workloads: produce N messages, consume N messages (three client libraries)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

PRODUCE_BASE = {"acks": "all", "linger.ms": 5, "batch.size": 1 << 20, "log_level": 3}


def partitions_of(topics: list[str], partitions: int = 4) -> list[tuple[str, int]]:
    return [(t, p) for p in range(partitions) for t in topics]


def produce(bootstrap: str, tps: list[tuple[str, int]], n: int, values: list[bytes], conf: dict[str, Any],
            timeout: float) -> tuple[float, int]:
    """Produce n messages round-robin over (topic, partition); returns (seconds until all acked, undelivered)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, **PRODUCE_BASE,
                  "queue.buffering.max.kbytes": 1 << 20, "queue.buffering.max.messages": 2_000_000, **conf})
    # Connect and fetch metadata first, outside the timed region.
    p.list_topics(tps[0][0], timeout=10)
    ntp, nval = len(tps), len(values)
    deadline = time.monotonic() + timeout
    prod = p.produce
    t0 = time.perf_counter()
    i = 0
    try:
        while i < n:
            t, part = tps[i % ntp]
            try:
                prod(t, values[i % nval], partition=part)
                i += 1
            except BufferError:
                p.poll(0.001)
                if time.monotonic() > deadline:
                    break
        left = p.flush(max(0.1, deadline - time.monotonic()))
        return time.perf_counter() - t0, left + (n - i)
    finally:
        p.purge()
        p.flush(0)
        del p


def produce_transactional(bootstrap: str, tps: list[tuple[str, int]], n: int, values: list[bytes],
                          conf: dict[str, Any], timeout: float, commit_every: int) -> tuple[float, int]:
    """Like produce, in transactions of `commit_every` messages (the last one may be shorter), each committed
    (commit_transaction waits for every message of the transaction to be acknowledged)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, **PRODUCE_BASE, "queue.buffering.max.kbytes": 1 << 20,
                  "queue.buffering.max.messages": 2_000_000, "transactional.id": f"bench-{time.monotonic_ns()}",
                  **conf})
    p.list_topics(tps[0][0], timeout=10)
    p.init_transactions(30)  # outside the timed region, like the connection
    ntp, nval = len(tps), len(values)
    deadline = time.monotonic() + timeout
    prod = p.produce
    t0 = time.perf_counter()
    i = 0
    committed = 0
    try:
        while i < n and time.monotonic() < deadline:
            p.begin_transaction()
            end = min(n, i + commit_every)
            while i < end:
                t, part = tps[i % ntp]
                try:
                    prod(t, values[i % nval], partition=part)
                    i += 1
                except BufferError:
                    p.poll(0.001)
                    if time.monotonic() > deadline:
                        break
            p.commit_transaction(max(1.0, deadline - time.monotonic()))
            committed = i
        return time.perf_counter() - t0, n - committed
    finally:
        del p


def consume_confluent(bootstrap: str, tps: list[tuple[str, int]], n: int, timeout: float,
                      offsets: dict[tuple[str, int], int] | None = None,
                      conf: dict[str, Any] | None = None) -> tuple[float, int, int]:
    """Read n messages from offset 0 of the partitions; returns (seconds from assign to the n-th message, messages,
    bytes). The client is connected (metadata fetched) before the clock starts."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 10, "log_level": 3,
                  "enable.partition.eof": False, **(conf or {})})
    try:
        c.list_topics(tps[0][0], timeout=10)  # connected and metadata known before the clock starts
        t0 = time.perf_counter()
        c.assign([TopicPartition(t, p, (offsets or {}).get((t, p), 0)) for t, p in tps])
        got = nbytes = 0
        deadline = time.monotonic() + timeout
        while got < n and time.monotonic() < deadline:
            msgs = c.consume(10000, 0.5)
            for m in msgs:
                if m.error() is None:
                    got += 1
                    nbytes += len(m.value())
        return time.perf_counter() - t0, got, nbytes
    finally:
        c.close()


def consume_aiokafka(bootstrap: str, tps: list[tuple[str, int]], n: int, timeout: float) -> tuple[float, int, int]:
    async def run() -> tuple[float, int, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            t0 = time.perf_counter()
            c.assign([TopicPartition(t, p) for t, p in tps])
            for t, p in tps:
                c.seek(TopicPartition(t, p), 0)
            got = nbytes = 0
            deadline = time.monotonic() + timeout
            while got < n and time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=500, max_records=10000)
                for msgs in batches.values():
                    got += len(msgs)
                    for m in msgs:
                        nbytes += len(m.value)
            return time.perf_counter() - t0, got, nbytes
        finally:
            await c.stop()

    return asyncio.run(run())


def consume_kafka_python(bootstrap: str, tps: list[tuple[str, int]], n: int, timeout: float,
                         api_version: tuple[int, int] = (2, 1)) -> tuple[float, int, int]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                      auto_offset_reset="earliest", api_version=api_version)
    try:
        c.partitions_for_topic(tps[0][0])  # connected and metadata known before the clock starts
        parts = [TopicPartition(t, p) for t, p in tps]
        t0 = time.perf_counter()
        c.assign(parts)
        for tp in parts:
            c.seek(tp, 0)
        got = nbytes = 0
        deadline = time.monotonic() + timeout
        while got < n and time.monotonic() < deadline:
            batches = c.poll(timeout_ms=500, max_records=10000)
            for msgs in batches.values():
                got += len(msgs)
                for m in msgs:
                    nbytes += len(m.value)
        return time.perf_counter() - t0, got, nbytes
    finally:
        c.close()


CONSUMERS = {
    "confluent-kafka": consume_confluent,
    "aiokafka": consume_aiokafka,
    "kafka-python": consume_kafka_python,
}
