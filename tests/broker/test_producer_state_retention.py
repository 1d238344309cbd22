"""After DeleteRecords moves the log start past all of a producer's data, Kafka 3.x keeps the producer's state (it
expires only after producer.id.expiration.ms), so idempotent and transactional producers carry on, across a restart
too (issue 39 item 16). Before, the next produce got UNKNOWN_PRODUCER_ID."""

from __future__ import annotations

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol import records as R
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import InitProducerIdRequest, ProduceRequest

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, ck_conf
from tests.txn_support import list_offsets, read_ck

T = 15


def _delete_all(admin: AdminClient, topic: str) -> int:
    """DeleteRecords up to the high watermark (-1): the new log start offset."""
    result = admin.delete_records([TopicPartition(topic, 0, -1)])
    return result[TopicPartition(topic, 0, -1)].result(T).low_watermark


def _sent(p: Producer, topic: str, values: list[bytes]) -> list[int]:
    offsets: list[int] = []
    errors: list[object] = []
    for v in values:
        p.produce(
            topic,
            v,
            partition=0,
            on_delivery=lambda err, m: errors.append(err) if err else offsets.append(m.offset()),
        )
    assert p.flush(T) == 0
    assert not errors, errors
    return offsets


def test_raw_idempotent_sequence_continues_after_delete_records(
    broker: BrokerProcess, topic_name: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    P = ProduceRequest
    with RawClient(broker.bootstrap) as raw:
        init = raw.request(
            22,
            4,
            InitProducerIdRequest(
                transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1
            ),
        )
    assert init.error_code == 0

    def produce(seq: int) -> P:
        batch = R.build_batch(
            [(b"k", b"v%d" % seq, (), 1_700_000_000_000)],
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            base_sequence=seq,
        )
        with RawClient(broker.bootstrap) as raw:
            return (
                raw.request(
                    0,
                    9,
                    P(
                        acks=-1,
                        timeout_ms=5000,
                        topic_data=[
                            P.TopicProduceData(
                                name=topic_name,
                                partition_data=[P.PartitionProduceData(index=0, records=batch)],
                            )
                        ],
                    ),
                )
                .responses[0]
                .partition_responses[0]
            )

    assert produce(0).base_offset == 0
    assert produce(1).base_offset == 1
    assert _delete_all(admin, topic_name) == 2
    nxt = produce(2)
    assert (nxt.error_code, nxt.base_offset, nxt.log_start_offset) == (ErrorCode.NONE, 2, 2)
    # The state still tells a retry from a gap.
    assert produce(2).base_offset == 2
    assert produce(5).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _delete_all(admin, topic_name) == 3
    broker.restart()
    assert produce(3).base_offset == 3
    assert [list_offsets(broker.bootstrap, topic_name, [0], i) for i in (0, 1)] == [{0: 4}, {0: 4}]


def test_idempotent_and_transactional_clients_carry_on(broker: BrokerProcess, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(T)
    idem = Producer(ck_conf(broker.bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    txn = Producer(ck_conf(broker.bootstrap, **{"transactional.id": f"{topic_name}-txn", "linger.ms": 5}))
    txn.init_transactions(T)
    assert _sent(idem, topic_name, [b"a", b"b"]) == [0, 1]
    txn.begin_transaction()
    assert _sent(txn, topic_name, [b"t1"]) == [2]
    txn.commit_transaction(T)  # its marker at 3
    assert _delete_all(admin, topic_name) == 4

    assert _sent(idem, topic_name, [b"c"]) == [4]
    txn.begin_transaction()
    assert _sent(txn, topic_name, [b"t2"]) == [5]
    txn.commit_transaction(T)
    broker.restart()
    # librdkafka reconnects; the broker's state came back from its snapshot.
    assert _sent(idem, topic_name, [b"d"]) == [7]
    txn.begin_transaction()
    assert _sent(txn, topic_name, [b"t3"]) == [8]
    txn.commit_transaction(T)
    seen = read_ck(broker.bootstrap, [(topic_name, 0)], 4, committed=True)
    assert [s.value for s in seen] == [b"c", b"t2", b"d", b"t3"]
