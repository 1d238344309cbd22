"""Transactions across two kbroker processes on one ZooKeeper: the transaction coordinator on broker 1 (the
transactional id is chosen so that its __transaction_state partition is led by broker 1), the data partitions
led by broker 2, so every marker travels from 1 to 2 in a WriteTxnMarkers request.

The tests share one cluster and run in file order: the last one kill -9s both brokers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.protocol.records import iter_batch_headers

from tests.broker_process import BrokerProcess
from tests.clients import wait_until
from tests.coordinator.test_zookeeper import Cluster, broker_ids, wait_for, zk_overrides
from tests.txn_support import (
    TXN_BROKER_OVERRIDES,
    Planned,
    ck_send,
    ck_txn_producer,
    end_offsets,
    expected_reads,
    find_coordinator,
    list_offsets,
    plan_transactions,
    read_ck,
    run_ck,
)
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

TOPIC = "zk-txn-data"
PARTITIONS = 2
TXN_PARTITIONS = int(TXN_BROKER_OVERRIDES["transaction.state.log.num.partitions"])
OUTCOMES = [True, False, True]


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(zookeeper, tmp_path_factory.mktemp("zktxn"))
    for b, broker_id in ((c.b1, 1), (c.b2, 2)):
        b.overrides.update(zk_overrides(zookeeper, broker_id, **TXN_BROKER_OVERRIDES))
    c.b1.start()
    c.b2.start()
    wait_for(lambda: broker_ids(c.b1) == {1, 2} and broker_ids(c.b2) == {1, 2}, "both brokers registered")
    admin = AdminClient({"bootstrap.servers": c.b1.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, replica_assignment=[[2]] * PARTITIONS)])[TOPIC].result(15)
    wait_for(lambda: _leaders(c.b1, TOPIC) == [2] * PARTITIONS == _leaders(c.b2, TOPIC), "data led by broker 2")
    yield c
    c.stop()


def _leaders(b: BrokerProcess, topic: str) -> list[int]:
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(topic=topic, timeout=10)
    t = md.topics[topic]
    assert t.error is None, t.error
    return [t.partitions[p].leader for p in sorted(t.partitions)]


@pytest.fixture(scope="module")
def txn_id(cluster: Cluster) -> str:
    """A transactional id whose coordinator is broker 1."""
    for i in range(200):
        candidate = f"zk-txn-{i}"
        if find_coordinator(cluster.b1.bootstrap, candidate)[0] == 1:
            break
    else:
        raise AssertionError("no transactional id coordinated by broker 1 among 200")
    # Broker 2 answers COORDINATOR_NOT_AVAILABLE (retriable) until broker 1's new topic reaches its metadata.
    wait_for(lambda: find_coordinator(cluster.b2.bootstrap, candidate)[0] == 1, "broker 2 names broker 1")
    leaders = _leaders(cluster.b1, "__transaction_state")
    assert len(leaders) == TXN_PARTITIONS and leaders[partition_for(candidate, TXN_PARTITIONS)] == 1, leaders
    return candidate


def _control_batches(b: BrokerProcess, topic: str, partition: int) -> int:
    return sum(1 for seg in sorted((b.data_dir / "logs" / f"{topic}-{partition}").glob("*.log"))
               for _, h in iter_batch_headers(seg.read_bytes()) if h.is_control)


def test_markers_from_the_coordinator_broker_reach_the_data_broker(cluster: Cluster, txn_id: str) -> None:
    layout = {TOPIC: PARTITIONS}
    txns = plan_transactions("zk", layout, 10, OUTCOMES)
    run_ck(cluster.b1.bootstrap, txn_id, txns, OUTCOMES)

    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    committed = expected_reads(txns, OUTCOMES, committed_only=True)
    everything = expected_reads(txns, OUTCOMES, committed_only=False)
    assert read_ck(cluster.b2.bootstrap, tps, len(committed), True) == committed
    assert read_ck(cluster.b2.bootstrap, tps, len(everything), False) == everything
    ends = end_offsets(txns)
    want = {p: ends[(TOPIC, p)] for p in range(PARTITIONS)}
    wait_until(lambda: _lso(cluster.b2) == want, timeout=15, interval=0.05, what=f"LSO at {want}")
    # The markers are on broker 2's disk; broker 1 (which wrote them, as the coordinator) holds no replica.
    for p in range(PARTITIONS):
        assert _control_batches(cluster.b2, TOPIC, p) == len(OUTCOMES)
        assert not (cluster.b1.data_dir / "logs" / f"{TOPIC}-{p}").exists()


def test_prepared_commit_completes_after_both_brokers_are_killed(cluster: Cluster, txn_id: str) -> None:
    """EndTxn is answered once PrepareCommit is in the transaction log; with the data broker down the markers
    wait; the coordinator is then kill -9'd too, and on restart it finishes the commit from its log."""
    before = list_offsets(cluster.b2.bootstrap, TOPIC, range(PARTITIONS), 0)
    p = ck_txn_producer(cluster.b1.bootstrap, txn_id)
    p.begin_transaction()
    ck_send(p, [Planned(TOPIC, part, f"prepared-{part}-{i}".encode()) for part in range(PARTITIONS)
                for i in range(5)])
    cluster.b2.kill()
    p.commit_transaction(30)
    cluster.b1.kill()
    del p

    cluster.b2.start()
    cluster.b1.start()
    wait_for(lambda: broker_ids(cluster.b1) == {1, 2}, "both brokers registered again", timeout=30)
    want = {part: before[part] + 6 for part in range(PARTITIONS)}
    wait_until(lambda: _lso(cluster.b2) == want, timeout=60, interval=0.3,
               what="the prepared commit's markers written after the restart")
    earlier = len(expected_reads(plan_transactions("zk", {TOPIC: PARTITIONS}, 10, OUTCOMES), OUTCOMES, True))
    tail = read_ck(cluster.b2.bootstrap, [(TOPIC, part) for part in range(PARTITIONS)],
                   earlier + 5 * PARTITIONS, True)
    assert len(tail) == earlier + 5 * PARTITIONS
    assert sorted(s.value for s in tail if s.value is not None and s.value.startswith(b"prepared-")) == \
        sorted(f"prepared-{part}-{i}".encode() for part in range(PARTITIONS) for i in range(5))


def _lso(b: BrokerProcess) -> dict[int, int] | None:
    try:
        return list_offsets(b.bootstrap, TOPIC, range(PARTITIONS), 1)
    except (OSError, AssertionError):
        return None
