"""Kafka 4.2's KafkaShareConsumer on three kbroker brokers (ZooKeeper, replication factor 3): the leader of a
partition is killed with kill -9 mid-run. No record is lost, no record whose acceptance the broker confirmed is
delivered again, and a record whose acknowledgement was lost in the failover comes back with a higher delivery
count (the share-partition state moved to the new leader through __share_group_state)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess, wait_all_registered
from tests.java import test_java_share_consumer as single
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

N = 600
T = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, BrokerProcess]]:
    reason = zookeeper_missing()
    if reason is not None:
        pytest.skip(reason)
    base: Path = tmp_path_factory.mktemp("share-cluster")
    zk = ZooKeeperServer(base / "zk").start()
    common = {
        "zookeeper.connect": zk.connect,
        "offsets.topic.num.partitions": "1",
        "offsets.topic.replication.factor": "3",
        "share.coordinator.state.topic.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "3",
        "group.share.heartbeat.interval.ms": "500",
        "group.share.min.heartbeat.interval.ms": "100",
        "group.share.session.timeout.ms": "6000",
        "group.share.min.session.timeout.ms": "6000",
        "controlled.shutdown.retry.backoff.ms": "200",
    }
    bs = {b: BrokerProcess(base / f"b{b}", {**common, "broker.id": str(b)}) for b in (1, 2, 3)}
    try:
        for b in (3, 2, 1):  # broker 3 is the controller: broker 1, killed, is not
            bs[b].start()
        wait_all_registered(list(bs.values()), timeout=T)
        yield bs
    finally:
        for b in bs.values():
            b.stop()
        zk.stop()


class Consumer:
    """One ShareConsumerCompat process whose lines are read as they come."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[list[str]] = []
        self.err = ""
        self._out = threading.Thread(target=self._read, daemon=True)
        self._out.start()
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._err.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.split())

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err = self.proc.stderr.read()

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._out.join(10)
        self._err.join(10)
        return rc


share_classpath = single.share_classpath  # the fixture: kafka-clients 4.2 and ShareConsumerCompat compiled
set_group_config = single.set_group_config


def test_a_leader_killed_mid_run(
    share_classpath: str, cluster: dict[int, BrokerProcess], topic_name: str
) -> None:
    bootstrap = ",".join(b.bootstrap for b in cluster.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [
            NewTopic(
                topic_name,
                num_partitions=2,
                replica_assignment=[[1, 2, 3], [2, 3, 1]],
                config={"min.insync.replicas": "2"},
            )
        ]
    )[topic_name].result(T)
    group = "share-" + topic_name
    set_group_config(bootstrap, group, "share.auto.offset.reset", "earliest")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    values = [f"v{i}" + ("-release" if i % 10 == 3 else "") for i in range(N)]
    for i, v in enumerate(values):
        p.produce(topic_name, v.encode(), partition=i % 2)
    assert p.flush(T) == 0
    # count N: a consumer stops when it has been idle 15 s, after the failover
    cmd = [
        "java",
        "-cp",
        share_classpath,
        "ShareConsumerCompat",
        bootstrap,
        topic_name,
        group,
        str(N),
        "15000",
    ]
    consumers = [Consumer([*cmd, "20", "30"]) for _ in range(2)]
    deadline = time.monotonic() + 90
    while (
        time.monotonic() < deadline
        and sum(1 for c in consumers for w in c.lines if w and w[0] == "ACCEPT" and w[1] == "0") < N // 8
    ):
        time.sleep(0.05)
    before = sum(1 for c in consumers for w in c.lines if w and w[0] == "ACCEPT" and w[1] == "0")
    cluster[1].kill()
    rcs = [c.wait(180) for c in consumers]
    lines = [w for c in consumers for w in c.lines]
    detail = [c.err[-3000:] for c in consumers] + [b.read_log()[-3000:] for b in (cluster[2], cluster[3])]
    assert rcs == [0, 0] and all(any(w and w[0] == "DONE" for w in c.lines) for c in consumers), detail
    accepted = [w for w in lines if w[0] == "ACCEPT"]
    print(
        f"partition 0: {before} of {N // 2} accepted before the kill;",
        f"{sum(1 for w in lines if w[0] == 'ACKFAIL')} acknowledgements refused in the failover",
    )
    # every record, each accepted (and confirmed) exactly once: none lost, none delivered again once accepted
    assert sorted(w[3] for w in accepted) == sorted(values), (len(accepted), detail)
    killed_partition = [w for w in accepted if w[1] == "0"]
    assert len(killed_partition) == N // 2
    # an acknowledgement lost with the leader: the record came back counting that delivery
    final = {w[3]: int(w[4]) for w in accepted}
    for w in lines:
        if w[0] == "ACKFAIL":
            assert final[w[3]] > int(w[4]), (w, final[w[3]])
    assert all(final[v] >= 2 for v in values if v.endswith("-release"))
