"""JBOD in a ZooKeeper cluster: the leader's and a follower's log of a replicated partition move to another log dir
while an idempotent acks=all producer writes; the ISR stays whole and every acknowledged record is readable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import TopicPartitionReplica
from kafka.admin import KafkaAdminClient
from kafka.errors import NoError

from kbroker_tools.wire import WireClient
from tests.broker.test_log_dirs import _assert_all_acked_readable, _placement, _Producing
from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import wait_until
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

BROKERS = (1, 2)


@pytest.fixture
def cluster(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> Iterator[dict[int, tuple[BrokerProcess, list[Path]]]]:
    out: dict[int, tuple[BrokerProcess, list[Path]]] = {}
    for b in BROKERS:
        dirs = [tmp_path / f"b{b}" / f"dir{i}" for i in range(2)]
        out[b] = (
            BrokerProcess(
                tmp_path / f"b{b}",
                {
                    "zookeeper.connect": zookeeper.connect,
                    "broker.id": str(b),
                    "num.partitions": "1",
                    "log.dirs": ",".join(map(str, dirs)),
                    "zookeeper.session.timeout.ms": "3000",
                    "replica.alter.log.dirs.io.max.bytes.per.second": "300000",
                },
            ).start(),
            [d.resolve() for d in dirs],
        )
    wait_all_registered([b for b, _ in out.values()], timeout=15)
    yield out
    for b, _ in out.values():
        b.kill()


def test_leader_and_follower_logs_move_under_produce(
    cluster: dict[int, tuple[BrokerProcess, list[Path]]],
) -> None:
    first = cluster[1][0]
    topic = "replicated-moving"
    with WireClient(first.bootstrap) as c:
        c.create_topic(topic, 1, replication_factor=2)

    def isr() -> list[int]:
        with WireClient(first.bootstrap) as c:
            return sorted(c.metadata([topic]).topics[0].partitions[0].isr_nodes)

    wait_until(lambda: isr() == [1, 2], timeout=20, what="the ISR of both brokers")
    admin = KafkaAdminClient(bootstrap_servers=first.bootstrap)
    try:
        with _Producing(first.bootstrap, topic) as prod:
            prod.send(600)
            prod.p.flush(30)
            moves = {}
            for b, (proc, dirs) in cluster.items():
                src = Path(_placement(proc.bootstrap)[(topic, 0, False)][0])
                moves[b] = next(d for d in dirs if d != src)
            result = admin.alter_replica_log_dirs(
                {TopicPartitionReplica(topic, 0, b): str(dest) for b, dest in moves.items()}
            )
            assert set(result.values()) == {NoError}
            for b, dest in moves.items():
                wait_until(
                    lambda b=b, dest=dest: (
                        _placement(cluster[b][0].bootstrap).get((topic, 0, False), ("",))[0] == str(dest)
                        and (topic, 0, True) not in _placement(cluster[b][0].bootstrap)
                    ),
                    timeout=60,
                    what=f"the move on broker {b}",
                )
            acked = len(prod.acked)
            wait_until(lambda: len(prod.acked) > acked + 100, timeout=20, what="produce after the moves")
        assert not prod.errors, prod.errors[:3]
        assert isr() == [1, 2]
        _assert_all_acked_readable(first.bootstrap, topic, prod.acked)
    finally:
        admin.close()
