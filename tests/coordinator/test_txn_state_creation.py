"""The first InitProducerIds of a fresh cluster, while `__transaction_state` is being created and its leaders
elected, get retriable coordinator errors (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS)
as Kafka's appendTransactionToLog maps them, never UNKNOWN_SERVER_ERROR (issue 39 item 18). Two brokers and
ZooKeeper, about 10 s."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import InitProducerIdRequest

from tests.broker_process import BrokerProcess
from tests.clients import RawClient
from tests.coordinator.test_zookeeper import broker_ids, wait_for, zk_overrides
from tests.txn_support import TXN_BROKER_OVERRIDES, Planned, ck_send, ck_txn_producer, read_ck
from tests.zookeeper import ZooKeeperServer

RETRIABLE = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.CONCURRENT_TRANSACTIONS,
}


@pytest.fixture
def brokers(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    bs = [
        BrokerProcess(
            tmp_path / f"b{i}",
            zk_overrides(
                zookeeper,
                i,
                **TXN_BROKER_OVERRIDES,
                **{"transaction.state.log.replication.factor": "2", "transaction.state.log.min.isr": "1"},
            ),
        )
        for i in (1, 2)
    ]
    try:
        for b in bs:
            b.start()
        wait_for(lambda: all(broker_ids(b) == {1, 2} for b in bs), "both brokers registered")
        yield bs
    finally:
        for b in bs:
            if b.alive():
                b.stop()


def test_first_init_producer_ids_get_retriable_errors(brokers: list[BrokerProcess]) -> None:
    answers: list[int] = []
    lock = threading.Lock()

    def init(b: BrokerProcess, txn_id: str) -> None:
        with RawClient(b.bootstrap, timeout=30) as raw:
            r = raw.request(
                22,
                4,
                InitProducerIdRequest(
                    transactional_id=txn_id, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1
                ),
            )
        with lock:
            answers.append(int(r.error_code))

    # No FindCoordinator first: the InitProducerIds themselves make a broker create the topic.
    threads = [threading.Thread(target=init, args=(b, f"first-{i}")) for i in range(6) for b in brokers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == len(threads)
    assert set(answers) <= RETRIABLE | {ErrorCode.NONE}, answers
    for b in brokers:
        assert "Traceback" not in b.read_log(), b.read_log()[-3000:]

    # A real client retries them and goes on.
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic("after-creation", 1, 2)])["after-creation"].result(15)
    p = ck_txn_producer(brokers[0].bootstrap, "first-real")
    p.begin_transaction()
    ck_send(p, [Planned("after-creation", 0, b"committed")])
    p.commit_transaction(30)
    assert [s.value for s in read_ck(brokers[1].bootstrap, [("after-creation", 0)], 1, True)] == [
        b"committed"
    ]
