"""Kafka's checks of a Produce's record sets (ProduceRequest.validateRecords, UnifiedLog's transaction verification)
over a real socket: each refusal carries Kafka's code, and the log, its high watermark and last stable offset stay
where they were, so read_committed consumers keep reading (issue 39 items 1, 4, 5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol import records as R
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ProduceRequest

from tests.broker_process import BrokerProcess
from tests.clients import Msg, RawClient, ck_produce
from tests.fuzz.seed_corpus import plain_batch, produce_frame, transactional_batch
from tests.txn_support import RawTxnProducer, high_watermark_and_lso, read_ck

T = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    yield b
    b.stop()


def _create(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(T)


def _send(bootstrap: str, version: int, records: bytes | None, topic: str, **kw: object) -> ProduceRequest:
    from kbroker.protocol import codec

    with RawClient(bootstrap) as raw:
        raw.send_bytes(produce_frame(version, records, topic=topic, **kw))  # type: ignore[arg-type]
        _, resp = codec.decode_response(0, version, raw.recv_frame())
    return resp


def _code(resp: ProduceRequest) -> int:
    return resp.responses[0].partition_responses[0].error_code


def _state(broker: BrokerProcess, topic: str) -> tuple[int, int]:
    return high_watermark_and_lso(broker.bootstrap, topic, [0])[0]


@pytest.mark.parametrize("version", [2, 3, 9, 11])
def test_a_transactional_batch_after_a_plain_one_is_refused(
    broker: BrokerProcess, topic_name: str, version: int
) -> None:
    _create(broker.bootstrap, topic_name)
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"before", partition=0)])
    before = _state(broker, topic_name)
    assert before == (1, 1)
    resp = _send(broker.bootstrap, version, plain_batch() + transactional_batch(), topic_name)
    # v3+: one batch per partition; v2 may carry several, and the unverified transactional one fails them all.
    want = ErrorCode.INVALID_RECORD if version >= 3 else ErrorCode.INVALID_TXN_STATE
    assert _code(resp) == want
    assert resp.responses[0].partition_responses[0].base_offset == -1
    assert _state(broker, topic_name) == before
    # The partition stays readable: a read_committed consumer gets what comes next.
    ck_produce(broker.bootstrap, topic_name, [Msg(b"k", b"after", partition=0)])
    assert _state(broker, topic_name) == (2, 2)
    seen = read_ck(broker.bootstrap, [(topic_name, 0)], 2, committed=True)
    assert [s.value for s in seen] == [b"before", b"after"]


def test_transactional_batches_survive_a_restart_of_nothing(broker: BrokerProcess, topic_name: str) -> None:
    """The frozen LSO of the report lasted across restarts; here nothing was written, so nothing comes back."""
    _create(broker.bootstrap, topic_name)
    for v in (2, 9):
        assert _code(_send(broker.bootstrap, v, plain_batch() + transactional_batch(), topic_name)) != 0
    broker.restart()
    assert _state(broker, topic_name) == (0, 0)


def test_transactional_records_without_a_transactional_id_fail_the_request(
    broker: BrokerProcess, topic_name: str
) -> None:
    _create(broker.bootstrap, topic_name, 2)
    P = ProduceRequest
    req = P(
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            P.TopicProduceData(
                name=topic_name,
                partition_data=[
                    P.PartitionProduceData(index=0, records=plain_batch()),
                    P.PartitionProduceData(index=1, records=transactional_batch()),
                ],
            )
        ],
    )
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(0, 9, req)
    # Kafka fails the whole request, the plain partition too.
    assert [p.error_code for p in resp.responses[0].partition_responses] == [
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    ] * 2
    assert high_watermark_and_lso(broker.bootstrap, topic_name, [0, 1]) == {0: (0, 0), 1: (0, 0)}


def test_a_transaction_of_one_producer_may_not_carry_another_producers_batch(
    broker: BrokerProcess, topic_name: str
) -> None:
    _create(broker.bootstrap, topic_name, 2)
    txn = RawTxnProducer(broker.bootstrap, f"{topic_name}-txn")
    try:
        assert txn.add_partitions(topic_name, [0, 1]) == {0: 0, 1: 0}
        P = ProduceRequest
        req = P(
            transactional_id=f"{topic_name}-txn",
            acks=-1,
            timeout_ms=5000,
            topic_data=[
                P.TopicProduceData(
                    name=topic_name,
                    partition_data=[
                        P.PartitionProduceData(
                            index=0, records=transactional_batch(producer_id=txn.producer_id)
                        ),
                        P.PartitionProduceData(
                            index=1, records=transactional_batch(producer_id=txn.producer_id + 1)
                        ),
                    ],
                )
            ],
        )
        resp = txn.raw.request(0, 9, req)
        assert [p.error_code for p in resp.responses[0].partition_responses] == [
            ErrorCode.INVALID_PRODUCER_ID_MAPPING
        ] * 2
        assert high_watermark_and_lso(broker.bootstrap, topic_name, [0, 1]) == {0: (0, 0), 1: (0, 0)}
        # The producer's own transaction goes on.
        assert txn.produce(topic_name, 0, [b"a", b"b"]) == (0, 0)
        assert txn.end(commit=True) == 0
    finally:
        txn.close()
    seen = read_ck(broker.bootstrap, [(topic_name, 0)], 2, committed=True)
    assert [s.value for s in seen] == [b"a", b"b"]


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_zstd_needs_produce_v7(broker: BrokerProcess, topic_name: str, version: int) -> None:
    _create(broker.bootstrap, topic_name)
    batch = plain_batch(compression=R.COMPRESSION_ZSTD)
    assert (
        _code(_send(broker.bootstrap, version, batch, topic_name)) == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    )
    assert _state(broker, topic_name) == (0, 0)
    assert _code(_send(broker.bootstrap, 7, batch, topic_name)) == ErrorCode.NONE
    assert _state(broker, topic_name) == (2, 2)


@pytest.mark.parametrize("version", [3, 9, 11])
@pytest.mark.parametrize("records", [b"", None, b"\x00" * 11], ids=["empty", "null", "11-bytes"])
def test_a_record_set_without_a_batch_is_an_invalid_record(
    broker: BrokerProcess, topic_name: str, version: int, records: bytes | None
) -> None:
    _create(broker.bootstrap, topic_name)
    assert _code(_send(broker.bootstrap, version, records, topic_name)) == ErrorCode.INVALID_RECORD
    assert _state(broker, topic_name) == (0, 0)


def test_checks_come_in_kafkas_order(broker: BrokerProcess, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    # The partition is looked up before its records are.
    resp = _send(broker.bootstrap, 9, b"", topic_name, partition=5)
    assert _code(resp) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # The records before the internal topic.
    assert _code(_send(broker.bootstrap, 9, b"", "__consumer_offsets")) == ErrorCode.INVALID_RECORD
    assert (
        _code(_send(broker.bootstrap, 9, plain_batch(), "__consumer_offsets"))
        == ErrorCode.INVALID_TOPIC_EXCEPTION
    )
    # A size below any entry's is corrupt, as Kafka's batch iterator says.
    tiny = bytearray(plain_batch())
    tiny[8:12] = (13).to_bytes(4, "big")
    assert _code(_send(broker.bootstrap, 9, bytes(tiny), topic_name)) == ErrorCode.CORRUPT_MESSAGE
    assert _state(broker, topic_name) == (0, 0)
