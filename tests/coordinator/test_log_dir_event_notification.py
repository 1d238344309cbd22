"""A failed log dir in a ZooKeeper cluster: the broker notifies the controller (/log_dir_event_notification), which
moves the leadership of the dir's partitions to another ISR member while an idempotent acks=all producer writes;
the failed replica is offline in every broker's Metadata until its broker restarts with a repaired dir."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from kbroker_tools.wire import WireClient
from tests.broker.test_log_dirs import _assert_all_acked_readable, _placement, _Producing
from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import wait_until
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

BROKERS = (1, 2, 3)
DOOMED, HEALTHY = "doomed", "healthy"


@pytest.fixture
def cluster(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[dict[int, BrokerProcess]]:
    out: dict[int, BrokerProcess] = {}
    for b in BROKERS:
        dirs = [tmp_path / f"b{b}" / f"dir{i}" for i in range(2)]
        out[b] = BrokerProcess(
            tmp_path / f"b{b}",
            {
                "zookeeper.connect": zookeeper.connect,
                "broker.id": str(b),
                "log.dirs": ",".join(map(str, dirs)),
                "zookeeper.session.timeout.ms": "3000",
                # The failure shows at the next checkpoint write in the dir.
                "log.flush.offset.checkpoint.interval.ms": "200",
            },
        ).start()
    wait_all_registered(list(out.values()), timeout=15)
    yield out
    for b in out.values():
        b.kill()


def _partition(bootstrap: str, topic: str) -> tuple[int, list[int], list[int]]:
    """(leader, ISR, offline replicas) of partition 0 in the Metadata of one broker."""
    with WireClient(bootstrap) as c:
        p = c.metadata([topic]).topics[0].partitions[0]
    return p.leader_id, sorted(p.isr_nodes), sorted(p.offline_replicas)


def test_failed_leader_dir_moves_leadership_and_returns_after_restart(
    cluster: dict[int, BrokerProcess],
) -> None:
    with WireClient(cluster[1].bootstrap) as c:
        controller = c.metadata([]).controller_id
    # The failing broker is not the controller: its notification reaches another process through ZooKeeper.
    x = max(b for b in BROKERS if b != controller)
    rest = sorted(b for b in BROKERS if b != x)
    broken, observer = cluster[x], cluster[rest[0]]
    admin = KafkaAdminClient(bootstrap_servers=observer.bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(t, num_partitions=-1, replication_factor=-1, replica_assignments={0: [x, *rest]})
                for t in (DOOMED, HEALTHY)
            ]
        )
    finally:
        admin.close()
    for t in (DOOMED, HEALTHY):
        wait_until(
            lambda t=t: _partition(observer.bootstrap, t) == (x, list(BROKERS), []),
            timeout=20,
            what=f"{t} led by broker {x} with the whole ISR",
        )
    # The observer learns the leadership from the controller's UpdateMetadata, which can come before broker x has
    # made the logs its LeaderAndIsr asks for: wait until x describes both.
    def both_described() -> dict[tuple[str, int, bool], tuple[str, int]] | None:
        m = _placement(broken.bootstrap)
        return m if {(DOOMED, 0, False), (HEALTHY, 0, False)} <= m.keys() else None

    placement = wait_until(both_described, timeout=20, what=f"broker {x} has both logs")
    bad, good = Path(placement[(DOOMED, 0, False)][0]), Path(placement[(HEALTHY, 0, False)][0])
    assert bad != good, f"the two topics' logs went to different dirs of broker {x}"

    bootstrap = ",".join(b.bootstrap for b in cluster.values())
    with _Producing(bootstrap, DOOMED) as prod:
        wait_until(lambda: len(prod.acked) > 200, timeout=20, what="records acknowledged before the failure")
        # The dir is replaced by a file: the next checkpoint write in it fails with ENOTDIR.
        bad.rename(bad.with_name("moved-away"))
        bad.write_text("not a directory")
        failed_at = time.monotonic()
        wait_until(
            lambda: _partition(observer.bootstrap, DOOMED) in ((b, rest, [x]) for b in rest),
            timeout=20,
            what=f"another leader, broker {x} offline and out of the ISR",
        )
        moved_after = time.monotonic() - failed_at
        new_leader = _partition(observer.bootstrap, DOOMED)[0]
        # Every broker's Metadata says so, the broken one's too (the controller's UpdateMetadata).
        for b in cluster.values():
            wait_until(
                lambda b=b: _partition(b.bootstrap, DOOMED) == (new_leader, rest, [x]),
                timeout=10,
                what=f"the new leader in the Metadata of {b.bootstrap}",
            )
        acked = len(prod.acked)
        wait_until(lambda: len(prod.acked) > acked + 200, timeout=30, what="produce to the new leader")
    assert moved_after < 10, f"leadership moved {moved_after:.1f} s after the failure"
    assert not prod.errors, prod.errors[:3]
    assert broken.alive()
    # The broken broker still leads the partition in its other dir.
    assert _partition(observer.bootstrap, HEALTHY) == (x, list(BROKERS), [])
    kp = KafkaProducer(bootstrap_servers=broken.bootstrap, acks="all", retries=0)
    try:
        kp.send(HEALTHY, b"still served").get(10)
    finally:
        kp.close()
    # No acknowledged record is lost: all of them are read from the new leader.
    _assert_all_acked_readable(cluster[new_leader].bootstrap, DOOMED, prod.acked)

    # Restarted with the dir still failed, the broker answers the controller's LeaderAndIsr for the replica with
    # KAFKA_STORAGE_ERROR: the replica stays offline (the broker's own Metadata says so, from the controller).
    broken.restart()
    wait_until(
        lambda: _partition(broken.bootstrap, DOOMED) == (new_leader, rest, [x]),
        timeout=15,
        what="the replica offline again after a restart with the failed dir",
    )
    # Repaired and restarted, the broker follows the new leader and rejoins the ISR.
    broken.stop()
    bad.unlink()
    bad.with_name("moved-away").rename(bad)
    broken.start()
    wait_until(
        lambda: _partition(observer.bootstrap, DOOMED) == (new_leader, list(BROKERS), []),
        timeout=30,
        what=f"broker {x} back in the ISR with no offline replica",
    )
