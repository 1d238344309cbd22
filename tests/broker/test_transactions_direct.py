"""Transactional produce on the direct Produce path and the leader's append fast path (and the light marker append),
with real clients, on a broker with the compiled accelerators and on one with KBROKER_PURE_PYTHON=1 (the general
Produce handler, the same log fast paths with their Python checks):

- a batch of a producer's ongoing transaction to a partition never added to it (KIP-890) is refused with Kafka's
  error (INVALID_TXN_STATE, TRANSACTION_ABORTABLE from Produce v11) and opens nothing: the partition's last stable
  offset stays at its high watermark, and the client's own transaction commits as if nothing happened;
- one confluent-kafka transactional producer over 8 partitions of two topics (a Produce request per partition:
  the direct path's single-partition append, each partition's first batch of a transaction verified with the
  coordinator at once), commits and aborts alternating: each open transaction holds every partition's last stable
  offset at its first offset, read_committed consumers of both libraries see exactly the committed records at
  their offsets, and the aborted transactions are in the transaction indexes;
- two transactional producers of two client libraries (confluent-kafka with lz4, kafka-python with gzip) writing
  to the same partitions at once, one committing and one aborting: read_committed consumers of both libraries see
  exactly the committed records, read_uncommitted ones all, and the aborted transaction is in the partition's
  transaction index with Kafka's last stable offset;
- transactions back to back, as a streaming producer runs them (confluent-kafka without a flush between, and
  kafka-python), every fifth aborted: EndTxn is answered once Prepare* is written and the markers follow, so the
  next transaction's AddPartitionsToTxn and Produce requests may arrive before them; every commit and abort
  returns, read_committed and read_uncommitted readers of both libraries see exactly their records at Kafka's
  offsets, and each partition's last stable offset reaches its high watermark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import DescribeTransactionsRequest
from kbroker.protocol.records import build_batch

from tests.broker.test_produce_consume import create_topic
from tests.broker_process import BrokerProcess
from tests.clients import RawClient
from tests.txn_support import (
    TXN_BROKER_OVERRIDES,
    Planned,
    Seen,
    ck_send,
    ck_txn_producer,
    end_offsets,
    expected_reads,
    high_watermark_and_lso,
    plan_transactions,
    produce_request,
    read_ck,
    read_kp,
    read_txn_indexes,
    run_kp,
)

READERS = {"confluent": read_ck, "kafka-python": read_kp}


@pytest.fixture(scope="module", params=["compiled", "pure-python"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    env = {PURE_PYTHON_ENV: "1"} if request.param == "pure-python" else None
    b = BrokerProcess(tmp_path_factory.mktemp(request.param), TXN_BROKER_OVERRIDES, env=env)
    b.start()
    yield b
    b.stop()


def _producer_of(bootstrap: str, transactional_id: str) -> tuple[int, int]:
    """The (producer id, epoch) the coordinator holds for an ongoing transaction (DescribeTransactions)."""
    with RawClient(bootstrap) as raw:
        state = raw.request(65, 0, DescribeTransactionsRequest(transactional_ids=[transactional_id]))
    s = state.transaction_states[0]
    assert s.error_code == 0 and s.transaction_state == "Ongoing", s
    return s.producer_id, s.producer_epoch


def _stray_produce(
    bootstrap: str, transactional_id: str, producer: tuple[int, int], topic: str, partition: int, version: int
) -> int:
    """A transactional batch of the producer to a partition its transaction never added: the error code."""
    batch = build_batch(
        [(None, b"stray", [], int(time.time() * 1000))],
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=0,
        is_transactional=True,
    )
    req = produce_request(transactional_id, topic, [(partition, batch)])
    with RawClient(bootstrap) as raw:
        return int(raw.request(0, version, req).responses[0].partition_responses[0].error_code)


class _KafkaPythonTxn:
    """kafka-python's transactional producer with the calls the tests make of confluent-kafka's."""

    def __init__(self, bootstrap: str, transactional_id: str, **conf: Any) -> None:
        from kafka import KafkaProducer

        self.p = KafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=transactional_id,
            enable_idempotence=True,
            linger_ms=5,
            **conf,
        )
        self.p.init_transactions()

    def begin_transaction(self) -> None:
        self.p.begin_transaction()

    def send(self, topic: str, partition: int, values: list[bytes]) -> None:
        futures = [self.p.send(topic, value=v, partition=partition) for v in values]
        self.p.flush(30)
        for f in futures:
            f.get(30)

    def end(self, commit: bool) -> None:
        if commit:
            self.p.commit_transaction()
        else:
            self.p.abort_transaction()

    def close(self) -> None:
        self.p.close(timeout=10)


class _ConfluentTxn:
    def __init__(self, bootstrap: str, transactional_id: str, **conf: Any) -> None:
        self.p = ck_txn_producer(bootstrap, transactional_id, **conf)

    def begin_transaction(self) -> None:
        self.p.begin_transaction()

    def send(self, topic: str, partition: int, values: list[bytes]) -> None:
        for v in values:
            self.p.produce(topic, value=v, partition=partition)
        assert self.p.flush(30) == 0  # in the log before anything else happens

    def end(self, commit: bool) -> None:
        if commit:
            self.p.commit_transaction(30)
        else:
            self.p.abort_transaction(30)

    def close(self) -> None:
        self.p.flush(10)


CLIENTS = {"confluent": _ConfluentTxn, "kafka-python": _KafkaPythonTxn}


def _read_all(
    bootstrap: str, topic: str, partitions: int, count: int, committed: bool
) -> dict[str, list[bytes]]:
    """What each reader library sees, as values in offset order per partition (their offsets are compared by the
    caller through the partition's end offsets)."""
    tps = [(topic, p) for p in range(partitions)]
    out = {}
    for name, read in READERS.items():
        seen: list[Seen] = read(bootstrap, tps, count, committed, timeout=20)
        out[name] = [s.value for s in seen if s.value is not None]
    return out


@pytest.mark.parametrize("client", list(CLIENTS))
def test_batch_to_a_partition_outside_the_transaction_is_refused(
    broker: BrokerProcess, topic_name: str, client: str
) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=2)
    txn_id = f"{topic_name}-txn"
    p = CLIENTS[client](broker.bootstrap, txn_id)
    try:
        p.begin_transaction()
        p.send(topic_name, 0, [b"first-%d" % i for i in range(5)])
        producer = _producer_of(broker.bootstrap, txn_id)
        # Kafka 3.9's answers to a batch the coordinator does not know of: before and from Produce v11
        assert (
            _stray_produce(broker.bootstrap, txn_id, producer, topic_name, 1, 9)
            == ErrorCode.INVALID_TXN_STATE
        )
        assert (
            _stray_produce(broker.bootstrap, txn_id, producer, topic_name, 1, 11)
            == ErrorCode.TRANSACTION_ABORTABLE
        )
        # nothing opened on partition 1: its LSO is its high watermark; partition 0's transaction holds its own
        assert high_watermark_and_lso(broker.bootstrap, topic_name, [0, 1]) == {0: (5, 0), 1: (0, 0)}
        p.send(topic_name, 0, [b"second-%d" % i for i in range(3)])
        p.end(True)
        p.begin_transaction()
        p.send(topic_name, 0, [b"aborted-%d" % i for i in range(2)])
        p.end(False)
    finally:
        p.close()
    committed = [b"first-%d" % i for i in range(5)] + [b"second-%d" % i for i in range(3)]
    everything = committed + [b"aborted-0", b"aborted-1"]
    # 8 committed records, a COMMIT marker, 2 aborted records, an ABORT marker
    assert high_watermark_and_lso(broker.bootstrap, topic_name, [0, 1]) == {0: (12, 12), 1: (0, 0)}
    assert _read_all(broker.bootstrap, topic_name, 2, len(committed), True) == {
        name: committed for name in READERS
    }
    assert _read_all(broker.bootstrap, topic_name, 2, len(everything), False) == {
        name: everything for name in READERS
    }
    indexed = read_txn_indexes(broker.data_dir / "logs" / f"{topic_name}-0")
    assert [(e.first_offset, e.last_offset, e.last_stable_offset) for e in indexed] == [(9, 11, 12)]
    assert read_txn_indexes(broker.data_dir / "logs" / f"{topic_name}-1") == []


def test_two_clients_interleaved_commit_and_abort_compressed(broker: BrokerProcess, topic_name: str) -> None:
    """confluent-kafka (lz4) and kafka-python (gzip) transactions open on the same partitions at once; one aborts
    while the other is still open, then the other commits."""
    create_topic(broker.bootstrap, topic_name, partitions=2)
    ck = _ConfluentTxn(broker.bootstrap, f"{topic_name}-ck", **{"compression.type": "lz4"})
    kp = _KafkaPythonTxn(broker.bootstrap, f"{topic_name}-kp", compression_type="gzip")
    try:
        ck.begin_transaction()
        kp.begin_transaction()
        for round_ in range(3):
            for part in (0, 1):
                ck.send(topic_name, part, [b"ck-%d-%d-%d" % (round_, part, i) for i in range(4)])
                kp.send(topic_name, part, [b"kp-%d-%d-%d" % (round_, part, i) for i in range(3)])
        # both open: the LSO of each partition is the confluent transaction's first offset, 0
        assert {
            p: lso for p, (_, lso) in high_watermark_and_lso(broker.bootstrap, topic_name, [0, 1]).items()
        } == {0: 0, 1: 0}
        ck.end(False)
        kp.end(True)
    finally:
        ck.close()
        kp.close()
    committed = sorted(b"kp-%d-%d-%d" % (r, p, i) for r in range(3) for p in (0, 1) for i in range(3))
    aborted = sorted(b"ck-%d-%d-%d" % (r, p, i) for r in range(3) for p in (0, 1) for i in range(4))
    reads = _read_all(broker.bootstrap, topic_name, 2, len(committed), True)
    assert {name: sorted(values) for name, values in reads.items()} == {name: committed for name in READERS}
    reads = _read_all(broker.bootstrap, topic_name, 2, len(committed) + len(aborted), False)
    assert {name: sorted(values) for name, values in reads.items()} == {
        name: sorted(committed + aborted) for name in READERS
    }
    for part in (0, 1):
        # per partition: 12 confluent and 9 kafka-python records interleaved, the ABORT at 21, the COMMIT at 22
        assert high_watermark_and_lso(broker.bootstrap, topic_name, [part]) == {part: (23, 23)}
        indexed = read_txn_indexes(broker.data_dir / "logs" / f"{topic_name}-{part}")
        # the aborted transaction ran from offset 0 to its marker at 21; the kafka-python one was still open
        # then, from offset 4 (its first batch came after confluent's first four records)
        assert [(e.first_offset, e.last_offset, e.last_stable_offset) for e in indexed] == [(0, 21, 4)]


def test_transactions_over_many_partitions_commit_and_abort(broker: BrokerProcess, topic_name: str) -> None:
    """Six transactions of 5 records per partition over 2 topics x 4 partitions, commits and aborts alternating:
    transaction n takes offsets 6n..6n+4 of every partition and its marker 6n+5."""
    layout = {f"{topic_name}-a": 4, f"{topic_name}-b": 4}
    for t, n in layout.items():
        create_topic(broker.bootstrap, t, partitions=n)
    outcomes = [True, False, True, True, False, True]
    txns = plan_transactions(topic_name, layout, 5, outcomes)
    p = ck_txn_producer(broker.bootstrap, f"{topic_name}-txn")
    for n, (recs, commit) in enumerate(zip(txns, outcomes, strict=True)):
        p.begin_transaction()
        ck_send(p, recs)
        for t in layout:
            # open: the last stable offset is the transaction's first offset, the records are behind it
            assert high_watermark_and_lso(broker.bootstrap, t, range(4)) == dict.fromkeys(
                range(4), (6 * n + 5, 6 * n)
            )
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    del p
    tps = _check_reads(broker, layout, txns, outcomes)
    deadline = time.monotonic() + 10
    while True:  # the last commit's markers are written after the client's EndTxn answer
        ends = {t: high_watermark_and_lso(broker.bootstrap, t, range(4)) for t in layout}
        if (
            all(v == (36, 36) for parts in ends.values() for v in parts.values())
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.05)
    assert ends == {t: dict.fromkeys(range(4), (36, 36)) for t in layout}
    for t, part in tps:
        indexed = read_txn_indexes(broker.data_dir / "logs" / f"{t}-{part}")
        assert [(e.first_offset, e.last_offset, e.last_stable_offset) for e in indexed] == [
            (6, 11, 12),
            (24, 29, 30),
        ]


def _check_reads(
    broker: BrokerProcess, layout: dict[str, int], txns: list[list[Planned]], outcomes: list[bool]
) -> list[tuple[str, int]]:
    """Readers of both libraries see exactly the committed records (read_committed) and all of them
    (read_uncommitted) at their offsets; returns the partitions read."""
    tps = [(t, part) for t, parts in layout.items() for part in range(parts)]
    for committed in (True, False):
        expected = expected_reads(txns, outcomes, committed)
        for name, read in READERS.items():
            assert read(broker.bootstrap, tps, len(expected), committed, timeout=30) == expected, (
                name,
                committed,
            )
    return tps


def _run_ck_streaming(
    bootstrap: str, transactional_id: str, txns: list[list[Planned]], outcomes: list[bool]
) -> None:
    """The bench's loop: begin, produce, commit (which flushes), at once again; an abort flushes first so that
    it has records to abort."""
    p = ck_txn_producer(bootstrap, transactional_id)
    for recs, commit in zip(txns, outcomes, strict=True):
        p.begin_transaction()
        for r in recs:
            p.produce(r.topic, value=r.value, partition=r.partition)
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0
            p.abort_transaction(30)


def _check(
    broker: BrokerProcess, layout: dict[str, int], txns: list[list[Planned]], outcomes: list[bool]
) -> None:
    _check_reads(broker, layout, txns, outcomes)
    ends = end_offsets(txns)
    want = {t: {p: (ends[(t, p)], ends[(t, p)]) for p in range(parts)} for t, parts in layout.items()}
    deadline = time.monotonic() + 10
    while True:  # the last transaction's markers follow its EndTxn answer
        got = {t: high_watermark_and_lso(broker.bootstrap, t, range(parts)) for t, parts in layout.items()}
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == want


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_back_to_back_transactions(broker: BrokerProcess, topic_name: str, client: str) -> None:
    """40 transactions (confluent-kafka; 15 with kafka-python) of 3 records per partition over 2 topics x 4
    partitions, every fifth one aborted."""
    layout = {f"{topic_name}-a": 4, f"{topic_name}-b": 4}
    for t, n in layout.items():
        create_topic(broker.bootstrap, t, partitions=n)
    count = 40 if client == "confluent" else 15
    outcomes = [n % 5 != 4 for n in range(count)]
    txns = plan_transactions(topic_name, layout, 3, outcomes)
    run = _run_ck_streaming if client == "confluent" else run_kp
    run(broker.bootstrap, f"{topic_name}-txn", txns, outcomes)
    _check(broker, layout, txns, outcomes)
