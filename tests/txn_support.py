"""Helpers for the transaction tests: transactional producers and isolation-aware readers of four client
libraries (confluent-kafka, kafka-python, aiokafka, kcat), raw-frame transaction calls, and `.txnindex` parsing.

Readers return `Seen(topic, partition, offset, value)` tuples so that a test can compare what each client saw
with one expectation, whoever produced.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from tests.broker_process import ROOT
from tests.clients import RawClient, ck_conf

ISOLATION = {False: "read_uncommitted", True: "read_committed"}
TXN_BROKER_OVERRIDES = {
    "transaction.state.log.num.partitions": "5",
    "transaction.max.timeout.ms": "60000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300",
}


class Seen(NamedTuple):
    topic: str
    partition: int
    offset: int
    value: bytes | None


class Planned(NamedTuple):
    """One record a transactional producer sends: to topic-partition, with value."""

    topic: str
    partition: int
    value: bytes


def plan_transactions(tag: str, layout: dict[str, int], per_partition: int,
                      outcomes: Sequence[bool]) -> list[list[Planned]]:
    """One list of records per transaction (outcome True = commit); every transaction writes `per_partition`
    records to every partition of every topic of `layout` (topic -> partitions)."""
    return [[Planned(t, p, f"{tag}-x{n}-{'c' if commit else 'a'}-{t}-{p}-{i}".encode())
             for t, parts in layout.items() for p in range(parts) for i in range(per_partition)]
            for n, commit in enumerate(outcomes)]


def expected_reads(txns: list[list[Planned]], outcomes: Sequence[bool], committed_only: bool) -> list[Seen]:
    """The records a reader must see, at the offsets they must have: each transaction's records of a partition
    follow one another, and each transaction ends with one control record (a marker) that no reader sees."""
    next_offset: dict[tuple[str, int], int] = {}
    out: list[Seen] = []
    for recs, commit in zip(txns, outcomes, strict=True):
        touched: list[tuple[str, int]] = []
        for r in recs:
            tp = (r.topic, r.partition)
            if tp not in touched:
                touched.append(tp)
            off = next_offset.get(tp, 0)
            next_offset[tp] = off + 1
            if commit or not committed_only:
                out.append(Seen(r.topic, r.partition, off, r.value))
        for tp in touched:
            next_offset[tp] += 1  # the marker
    return sorted(out)


def end_offsets(txns: list[list[Planned]]) -> dict[tuple[str, int], int]:
    ends: dict[tuple[str, int], int] = {}
    for recs in txns:
        for tp in {(r.topic, r.partition) for r in recs}:
            ends[tp] = ends.get(tp, 0) + sum(1 for r in recs if (r.topic, r.partition) == tp) + 1
    return ends


# ---------------------------------------------------------------- transactional producers


def ck_txn_producer(bootstrap: str, transactional_id: str, **conf: Any) -> Producer:
    p = Producer(ck_conf(bootstrap, **{"transactional.id": transactional_id, "linger.ms": 5, **conf}))
    p.init_transactions(30)
    return p


def ck_send(p: Producer, recs: Sequence[Planned]) -> None:
    for r in recs:
        while True:
            try:
                p.produce(r.topic, value=r.value, partition=r.partition)
                break
            except BufferError:
                p.poll(0.05)
    # The records reach the log before the transaction ends, so that an abort has something to abort.
    assert p.flush(30) == 0


def run_ck(bootstrap: str, transactional_id: str, txns: list[list[Planned]], outcomes: Sequence[bool]) -> None:
    p = ck_txn_producer(bootstrap, transactional_id)
    for recs, commit in zip(txns, outcomes, strict=True):
        p.begin_transaction()
        ck_send(p, recs)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


def run_kp(bootstrap: str, transactional_id: str, txns: list[list[Planned]], outcomes: Sequence[bool]) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, enable_idempotence=True,
                      linger_ms=5)
    try:
        p.init_transactions()
        for recs, commit in zip(txns, outcomes, strict=True):
            p.begin_transaction()
            futures = [p.send(r.topic, value=r.value, partition=r.partition) for r in recs]
            p.flush(30)
            for f in futures:
                f.get(30)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
    finally:
        p.close(timeout=10)


def run_aio(bootstrap: str, transactional_id: str, txns: list[list[Planned]], outcomes: Sequence[bool]) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                             enable_idempotence=True, linger_ms=5)
        await p.start()
        try:
            for recs, commit in zip(txns, outcomes, strict=True):
                await p.begin_transaction()
                futures = [await p.send(r.topic, value=r.value, partition=r.partition) for r in recs]
                await asyncio.wait_for(asyncio.gather(*futures), 30)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())


PRODUCERS = {"confluent": run_ck, "kafka-python": run_kp, "aiokafka": run_aio}


# ---------------------------------------------------------------- readers


def read_ck(bootstrap: str, tps: Sequence[tuple[str, int]], count: int, committed: bool,
            timeout: float = 30.0) -> list[Seen]:
    c = Consumer(ck_conf(bootstrap, **{"group.id": "txn-tests-nocommit", "enable.auto.commit": False,
                                       "isolation.level": ISOLATION[committed], "fetch.wait.max.ms": 100}))
    try:
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in tps])
        out: list[Seen] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(1000, 0.3):
                if m.error():
                    raise KafkaException(m.error())
                out.append(Seen(m.topic(), m.partition(), m.offset(), m.value()))
        return sorted(out)
    finally:
        c.close()


def read_kp(bootstrap: str, tps: Sequence[tuple[str, int]], count: int, committed: bool,
            timeout: float = 30.0) -> list[Seen]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100, isolation_level=ISOLATION[committed])
    try:
        parts = [KTP(t, p) for t, p in tps]
        c.assign(parts)
        c.seek_to_beginning(*parts)
        out: list[Seen] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=300, max_records=1000).values():
                out.extend(Seen(r.topic, r.partition, r.offset, r.value) for r in recs)
        return sorted(out)
    finally:
        c.close()


def read_aio(bootstrap: str, tps: Sequence[tuple[str, int]], count: int, committed: bool,
             timeout: float = 30.0) -> list[Seen]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> list[Seen]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100,
                             isolation_level=ISOLATION[committed])
        await c.start()
        try:
            parts = [ATP(t, p) for t, p in tps]
            c.assign(parts)
            await c.seek_to_beginning(*parts)
            out: list[Seen] = []
            deadline = time.monotonic() + timeout
            while len(out) < count and time.monotonic() < deadline:
                for recs in (await c.getmany(timeout_ms=300, max_records=1000)).values():
                    out.extend(Seen(r.topic, r.partition, r.offset, r.value) for r in recs)
            return sorted(out)
        finally:
            await c.stop()

    return asyncio.run(run())


def read_kcat(bootstrap: str, tps: Sequence[tuple[str, int]], count: int, committed: bool,
              timeout: float = 30.0) -> list[Seen]:
    """kcat -C ... -e: reads each partition to its end (the LSO for read_committed) and exits."""
    out: list[Seen] = []
    for topic, partition in tps:
        r = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", "beginning",
                            "-e", "-q", "-X", f"isolation.level={ISOLATION[committed]}",
                            "-f", "%t %p %o %s\\n"], capture_output=True, timeout=timeout)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        for line in r.stdout.decode().splitlines():
            t, p, o, v = line.split(" ", 3)
            out.append(Seen(t, int(p), int(o), v.encode()))
    return sorted(out)


READERS = {"confluent": read_ck, "kafka-python": read_kp, "aiokafka": read_aio, "kcat": read_kcat}


# ---------------------------------------------------------------- raw frames


def find_coordinator(bootstrap: str, key: str, key_type: int = 1, timeout: float = 30.0) -> tuple[int, str, int]:
    """FindCoordinator v3 until the coordinator is available: (node id, host, port)."""
    from kbroker.protocol.messages import FindCoordinatorRequest

    deadline = time.monotonic() + timeout
    with RawClient(bootstrap) as raw:
        while True:
            resp = raw.request(10, 3, FindCoordinatorRequest(key=key, key_type=key_type))
            if resp.error_code == 0:
                return resp.node_id, resp.host, resp.port
            assert resp.error_code in (14, 15), resp  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE
            if time.monotonic() > deadline:
                raise AssertionError(f"no coordinator for {key!r}: {resp}")
            time.sleep(0.1)


def list_offsets(bootstrap: str, topic: str, partitions: Sequence[int], isolation_level: int,
                 timestamp: int = -1) -> dict[int, int]:
    """A raw ListOffsets v4 (-1: latest): with isolation level 1 the answer is the last stable offset."""
    from kbroker.protocol.messages import ListOffsetsRequest

    req = ListOffsetsRequest(replica_id=-1, isolation_level=isolation_level, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=timestamp) for p in partitions])])
    with RawClient(bootstrap) as raw:
        resp = raw.request(2, 4, req)
    out = {}
    for pr in resp.topics[0].partitions:
        assert pr.error_code == 0, pr
        out[pr.partition_index] = pr.offset
    return out


def high_watermark_and_lso(bootstrap: str, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
    """partition -> (high watermark, last stable offset), both from one raw Fetch v4 answer, so from one instant
    (two ListOffsets, read_uncommitted then read_committed, miss a transaction that opens and commits between
    them)."""
    from kbroker.protocol.messages import FetchRequest

    req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1, isolation_level=0, topics=[
        FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1) for p in partitions])])
    with RawClient(bootstrap) as raw:
        resp = raw.request(1, 4, req)
    out = {}
    for pd in resp.responses[0].partitions:
        assert pd.error_code == 0, pd
        out[pd.partition_index] = (pd.high_watermark, pd.last_stable_offset)
    return out


def txn_app(*args: str) -> subprocess.Popen[str]:
    """python -m tests.txn_apps ... in its own process (stdout piped, line-buffered text)."""
    return subprocess.Popen([sys.executable, "-m", "tests.txn_apps", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)


# ---------------------------------------------------------------- .txnindex (Kafka's TransactionIndex format)

TXN_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset: 34 bytes


class TxnIndexEntry(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def read_txn_indexes(partition_dir: Path) -> list[TxnIndexEntry]:
    """Every entry of every `<base>.txnindex` of a partition directory, in segment order."""
    out = []
    for f in sorted(partition_dir.glob("*.txnindex")):
        data = f.read_bytes()
        assert len(data) % TXN_ENTRY.size == 0, f"{f}: {len(data)} bytes is not a whole number of 34-byte entries"
        for pos in range(0, len(data), TXN_ENTRY.size):
            version, *rest = TXN_ENTRY.unpack_from(data, pos)
            assert version == 0, f"{f}@{pos}: version {version}"
            out.append(TxnIndexEntry(*rest))
    return out


def produce_request(transactional_id: str | None, topic: str, partitions: Sequence[tuple[int, bytes | None]],
                    acks: int = -1, timeout_ms: int = 10000) -> Any:
    """A ProduceRequest of one topic: (partition, records) each."""
    from kbroker.protocol.messages import ProduceRequest

    return ProduceRequest(transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.PartitionProduceData(index=i, records=r) for i, r in partitions])])


class RawTxnProducer:
    """A transactional producer spoken in raw frames (InitProducerId v4, AddPartitionsToTxn v3, Produce v9,
    EndTxn v3), for the steps a client library will not take on request (an EndTxn and nothing after)."""

    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int = 60000) -> None:
        from kbroker.protocol.messages import InitProducerIdRequest

        self.raw = RawClient(bootstrap)
        self.transactional_id = transactional_id
        self.sequences: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + 30
        while True:
            resp = self.raw.request(22, 4, InitProducerIdRequest(transactional_id=transactional_id,
                                                                 transaction_timeout_ms=timeout_ms,
                                                                 producer_id=-1, producer_epoch=-1))
            # CONCURRENT_TRANSACTIONS while an earlier epoch's transaction is being aborted; load in progress
            if resp.error_code in (51, 14, 15) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            break
        assert resp.error_code == 0, resp
        self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch

    def add_partitions(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        from kbroker.protocol.messages import AddPartitionsToTxnRequest

        req = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.producer_epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic,
                                                                                   partitions=list(partitions))])
        resp = self.raw.request(24, 3, req)
        return {r.partition_index: r.partition_error_code
                for t in resp.results_by_topic_v3_and_below for r in t.results_by_partition}

    def produce(self, topic: str, partition: int, values: Sequence[bytes], version: int = 9) -> tuple[int, int]:
        """(error code, base offset) of one transactional batch."""
        from kbroker.protocol.records import build_batch

        seq = self.sequences.get((topic, partition), 0)
        now = int(time.time() * 1000)
        batch = build_batch([(None, v, [], now) for v in values], producer_id=self.producer_id,
                            producer_epoch=self.producer_epoch, base_sequence=seq, is_transactional=True)
        req = produce_request(self.transactional_id, topic, [(partition, batch)])
        pr = self.raw.request(0, version, req).responses[0].partition_responses[0]
        if pr.error_code == 0:
            self.sequences[(topic, partition)] = seq + len(values)
        return pr.error_code, pr.base_offset

    def end(self, commit: bool, version: int = 3, epoch: int | None = None) -> int:
        from kbroker.protocol.messages import EndTxnRequest

        resp = self.raw.request(26, version, EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch if epoch is None else epoch, committed=commit))
        return int(resp.error_code)

    def close(self) -> None:
        self.raw.close()
