"""The direct Produce path (broker/produce_codec.py, protocol/_produce.c) answers byte for byte as the general one:
the same Produce frames, sent in the same order to a broker that has it and to one on the Python references
(KBROKER_PURE_PYTHON=1: handle_produce and the generated codec for every request), get identical response frames,
for the common requests the direct path takes and for the ones it hands back (~5 s: two brokers)."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kbroker.broker import produce_codec
from kbroker.protocol import codec
from kbroker.protocol import records as R
from kbroker.protocol.accelerators import PURE_PYTHON_ENV
from kbroker.protocol.messages import (
    AddPartitionsToTxnRequest,
    CreateTopicsRequest,
    DescribeTransactionsRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    RequestHeader,
)

from tests.broker_process import BrokerProcess
from tests.clients import RawClient

P = ProduceRequest
C = CreateTopicsRequest
NOW = 1_700_000_000_000


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    if not produce_codec.COMPILED:
        pytest.skip(
            f"protocol/_produce.c not built (python setup.py build_ext --inplace), or {PURE_PYTHON_ENV} is set"
        )
    direct = BrokerProcess(tmp_path_factory.mktemp("direct")).start()
    general = BrokerProcess(tmp_path_factory.mktemp("general"), env={PURE_PYTHON_ENV: "1"}).start()
    try:
        yield direct, general
    finally:
        direct.stop()
        general.stop()


def _frame(api_key: int, version: int, correlation_id: int, body: object) -> bytes:
    header = RequestHeader(
        request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id="t"
    )
    return bytes(codec.encode_request(header, body))


def _produce(version: int, acks: int, *topics: tuple[str, list[tuple[int, bytes | None]]]) -> P:
    return P(
        transactional_id=None,
        acks=acks,
        timeout_ms=5000,
        topic_data=[
            P.TopicProduceData(
                name=n, partition_data=[P.PartitionProduceData(index=i, records=r) for i, r in parts]
            )
            for n, parts in topics
        ],
    )


def _batch(n: int = 3, key: bytes | None = b"k", **producer: int) -> bytes:
    return R.build_batch([(key, b"v%d" % i, (), NOW + i) for i in range(n)], **producer)


def _idempotent(seq: int, n: int = 2) -> bytes:
    return _batch(n, producer_id=4242, producer_epoch=0, base_sequence=seq)


def _requests() -> list[tuple[int, P]]:
    """(version, request): the common case at every version, then what the direct path answers with errors, then
    what it hands to handle_produce."""
    plain = [(v, _produce(v, 1, ("t", [(0, _batch())]))) for v in range(3, 12)]
    return plain + [
        (9, _produce(9, -1, ("t", [(1, _batch()), (0, _batch(1))]), ("t", [(2, _batch())]))),
        (9, _produce(9, 0, ("t", [(0, _batch())]))),  # acks=0: no answer; the next one shows it was appended
        (7, _produce(7, 1, ("t", [(0, _batch())]), ("empty", []))),
        (9, _produce(9, 2, ("t", [(0, _batch())]))),  # INVALID_REQUIRED_ACKS
        (9, _produce(9, 1, ("nope", [(0, _batch())]), ("t", [(99, _batch())]))),  # unknown topic, partition
        (9, _produce(9, 1, ("__consumer_offsets", [(0, _batch())]))),  # an internal topic
        (
            11,
            _produce(11, 1, ("c", [(0, _batch(3, None))])),
        ),  # keyless records in a compacted topic: record errors
        (5, _produce(5, 1, ("c", [(0, _batch(2, None))]))),
        (9, _produce(9, 1, ("t", [(0, _idempotent(0))]))),
        (9, _produce(9, 1, ("t", [(0, _idempotent(2))]))),
        (9, _produce(9, 1, ("t", [(0, _idempotent(0))]))),  # a retry: the first offsets again
        (9, _produce(9, 1, ("t", [(0, _idempotent(9))]))),  # OUT_OF_ORDER_SEQUENCE_NUMBER
        # The general path's cases: two batches, a transactional batch without a transactional id, null and
        # empty records, zstd before v7.
        (9, _produce(9, 1, ("t", [(0, _batch() + _batch())]))),
        (
            9,
            _produce(
                9,
                1,
                (
                    "t",
                    [(0, _batch(producer_id=77, producer_epoch=0, base_sequence=0, is_transactional=True))],
                ),
            ),
        ),
        (9, _produce(9, 1, ("t", [(0, None), (1, b"")]))),
        (3, _produce(3, 1, ("t", [(0, _batch(compression=R.COMPRESSION_ZSTD))]))),
        (11, _produce(11, 1, ("t", [(0, _batch())]))),
        # One partition, the direct path's plain append (_append_plain_one) and what it leaves to _answer: acks=0
        # and acks=all, fsync per message (flush.messages=1), a compressed batch refused record by record.
        (9, _produce(9, 0, ("t", [(1, _batch())]))),
        (9, _produce(9, -1, ("t", [(1, _batch())]))),
        (9, _produce(9, 1, ("f", [(0, _batch())]))),
        (9, _produce(9, -1, ("f", [(0, _batch())]))),
        (11, _produce(11, 1, ("c", [(0, _batch(3, None, compression=R.COMPRESSION_ZSTD))]))),
        (9, _produce(9, 1, ("t", [(1, _idempotent(0))]))),
        (9, _produce(9, -1, ("t", [(1, _idempotent(2, 3))]))),
        (9, _produce(9, 1, ("t", [(1, _idempotent(5, 1))]))),
    ]


def test_direct_and_general_paths_answer_the_same_bytes(brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    conns = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    create = C(
        topics=[
            C.CreatableTopic(name="t", num_partitions=3, replication_factor=1),
            C.CreatableTopic(
                name="c",
                num_partitions=1,
                replication_factor=1,
                configs=[C.CreatableTopicConfig(name="cleanup.policy", value="compact")],
            ),
            C.CreatableTopic(
                name="f",
                num_partitions=1,
                replication_factor=1,
                configs=[C.CreatableTopicConfig(name="flush.messages", value="1")],
            ),
        ],
        timeout_ms=15000,
    )
    for conn in conns:
        conn.send_bytes(_frame(19, 7, 1, create))
        assert all(t.error_code == 0 for t in codec.decode_response(19, 7, conn.recv_frame())[1].topics)
    answered = 0
    for correlation_id, (version, req) in enumerate(_requests(), start=2):
        frame = _frame(0, version, correlation_id, req)
        for conn in conns:
            conn.send_bytes(frame)
        if req.acks == 0:
            continue
        direct, general = (conn.recv_frame() for conn in conns)
        assert direct == general, (version, req.acks, codec.decode_response(0, version, general)[1])
        assert struct.unpack_from(">i", direct)[0] == correlation_id
        answered += 1
    assert answered == len([r for _, r in _requests() if r.acks != 0])
    assert "produce path compiled" in brokers[0].read_log()
    assert "produce path pure Python" in brokers[1].read_log()


def _txn_produce(version: int, txn_id: str | None, *topics: tuple[str, list[tuple[int, bytes | None]]]) -> P:
    req = _produce(version, -1, *topics)
    req.transactional_id = txn_id
    return req


def test_transactional_produce_answers_the_same_bytes(brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    """A transactional producer's Produce requests, now on the direct path when the coordinator can confirm the
    partitions at once (KIP-890): the same answers as handle_produce for batches in the transaction, for partitions
    never added (INVALID_TXN_STATE, TRANSACTION_ABORTABLE from v11), before AddPartitionsToTxn and after EndTxn, a
    retry, a plain batch inside the transaction, two producers, no transactional id, a fenced epoch."""
    conns = [RawClient(b.bootstrap, timeout=15) for b in brokers]
    create = C(topics=[C.CreatableTopic(name="x", num_partitions=3, replication_factor=1)], timeout_ms=15000)
    for conn in conns:
        assert conn.request(19, 7, create).topics[0].error_code == 0
    ids = set()
    for conn in conns:
        resp = conn.request(
            22,
            4,
            InitProducerIdRequest(
                transactional_id="tx", transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1
            ),
        )
        assert resp.error_code == 0
        ids.add((resp.producer_id, resp.producer_epoch))
    assert len(ids) == 1  # two fresh brokers hand out the same id: the same batches go to both
    ((pid, epoch),) = ids

    def txn(seq: int, n: int = 2, **other: int) -> bytes:
        fields = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq, **other}
        return _batch(n, is_transactional=True, **fields)

    def add(*partitions: int) -> tuple[str, Any]:
        return (
            "add",
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id="tx",
                v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[
                    AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="x", partitions=list(partitions))
                ],
            ),
        )

    def end(commit: bool) -> tuple[str, Any]:
        return (
            "end",
            EndTxnRequest(transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=commit),
        )

    steps: list[tuple[Any, ...]] = [
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(0))]))),  # before AddPartitionsToTxn
        add(0, 1),
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(0))]))),
        (
            "produce",
            11,
            _txn_produce(11, "tx", ("x", [(0, txn(2)), (2, txn(0))])),
        ),  # x-2 not in the transaction
        ("produce", 9, _txn_produce(9, "tx", ("x", [(2, txn(0))]))),
        ("produce", 9, _txn_produce(9, "tx", ("x", [(1, txn(0, 3)), (0, txn(4, 1))]))),
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(4, 1))]))),  # a retry: its first offsets again
        ("produce", 9, _txn_produce(9, None, ("x", [(0, txn(5))]))),  # no transactional id
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(5)), (1, txn(0, producer_id=pid + 1))]))),
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(5, producer_epoch=epoch + 1))]))),
        (
            "produce",
            9,
            _txn_produce(
                9, "tx", ("x", [(0, _batch(1, producer_id=pid, producer_epoch=epoch, base_sequence=5))])
            ),
        ),  # plain, in a transaction
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(5, 2, compression=R.COMPRESSION_GZIP))]))),
        end(True),
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(7))]))),  # after EndTxn: not in a transaction
        add(0),
        ("produce", 9, _txn_produce(9, "tx", ("x", [(0, txn(7))]))),
        end(False),
    ]
    correlation_id = 100
    for step in steps:
        correlation_id += 1
        if step[0] == "produce":
            frame = _frame(0, step[1], correlation_id, step[2])
            for conn in conns:
                conn.send_bytes(frame)
            direct, general = (conn.recv_frame() for conn in conns)
            assert direct == general, (step, codec.decode_response(0, step[1], general)[1])
            continue
        for conn in conns:
            if step[0] == "add":
                codes = [
                    r.partition_error_code
                    for t in conn.request(24, 3, step[1]).results_by_topic_v3_and_below
                    for r in t.results_by_partition
                ]
                assert codes == [0] * len(codes)
            else:
                assert conn.request(26, 3, step[1]).error_code == 0
                # EndTxn answers once Prepare* is written; the markers follow. Until they are, the partitions still
                # hold the open transaction that a batch would join (as in Kafka): wait for Complete*.
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    state = conn.request(65, 0, DescribeTransactionsRequest(transactional_ids=["tx"]))
                    if state.transaction_states[0].transaction_state.startswith("Complete"):
                        break
                    time.sleep(0.02)
                else:
                    raise AssertionError(f"the transaction did not complete: {state}")
    for conn in conns:
        conn.close()
