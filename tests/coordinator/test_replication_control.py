"""The replication control plane on three real brokers sharing a real ZooKeeper, driven by real clients:
replica assignment, the controller's partition states in ZooKeeper, Metadata with replicas / ISR /
offline replicas / leader epochs, controller failover after kill -9, LEADER_NOT_AVAILABLE without a live
ISR member, controlled shutdown, reassignments, ElectLeaders and DescribeLogDirs.

The tests share one ZooKeeper and one cluster and run in file order (later ones kill and stop brokers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import KafkaError as CKError
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartition
from kazoo.client import KazooClient
from kbroker.coordinator import zk_paths as zp

from tests.broker_process import BrokerProcess, free_port, wait_all_registered
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

SESSION_MS = 3000
BROKERS = (1, 2, 3)


def overrides(zk: ZooKeeperServer, broker_id: int) -> dict[str, str]:
    # Broker 1, the first controller, leaves preferred leaders to the ElectLeaders test; brokers 2 and 3
    # (controllers after broker 1 is killed) rebalance every second.
    rebalance = "false" if broker_id == 1 else "true"
    return {
        "zookeeper.connect": zk.connect,
        "broker.id": str(broker_id),
        "zookeeper.session.timeout.ms": str(SESSION_MS),
        "zookeeper.connection.timeout.ms": "5000",
        "num.partitions": "1",
        "controlled.shutdown.retry.backoff.ms": "200",
        "auto.leader.rebalance.enable": rebalance,
        "leader.imbalance.check.interval.seconds": "1",
        "leader.imbalance.per.broker.percentage": "0",
    }


class Cluster:
    def __init__(self, zk: ZooKeeperServer, base: Path) -> None:
        self.metrics_ports = {b: free_port() for b in BROKERS}
        self.brokers = {b: BrokerProcess(base / f"b{b}", {**overrides(zk, b), "metrics.host": "127.0.0.1",
                                                          "metrics.port": str(self.metrics_ports[b])})
                        for b in BROKERS}

    def __getitem__(self, broker_id: int) -> BrokerProcess:
        return self.brokers[broker_id]

    def alive(self) -> list[BrokerProcess]:
        return [b for b in self.brokers.values() if b.alive()]

    def stop(self) -> None:
        for b in self.brokers.values():
            try:
                b.stop()
            except RuntimeError:
                b.kill()


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(zookeeper, tmp_path_factory.mktemp("replcluster"))
    for b in BROKERS:
        c[b].start()  # broker 1 first: the controller
    wait_all_registered([c[b] for b in BROKERS], timeout=15)
    _ALIVE[:] = c.brokers.values()
    yield c
    c.stop()


def _log_lines(b: BrokerProcess, needle: str, last: int = 8) -> list[str]:
    """A broker's log lines about one thing, for a failure message."""
    return [line for line in b.read_log().splitlines() if needle in line][-last:]


def wait_for(cond: Any, what: str, timeout: float = 15.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if cond():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001  (a broker still starting or already gone: ask again)
            pass
        time.sleep(0.1)
    try:
        last = cond()
    except Exception as e:  # noqa: BLE001
        last = e
    raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last: {last!r})")


def ck_admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def ck_metadata(b: BrokerProcess, topic: str = "__probe_absent") -> Any:
    return ck_admin(b).list_topics(topic=topic, timeout=10)


def kp_admin(b: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=10000)


def kp_partitions(b: BrokerProcess, topic: str) -> dict[int, dict[str, Any]]:
    admin = kp_admin(b)
    try:
        (t,) = admin.describe_topics([topic])
    finally:
        admin.close()
    return {p["partition_index"]: p for p in t["partitions"]}


def controller_gauges(cluster: Cluster, b: int) -> tuple[float, float]:
    """(ActiveControllerCount, OfflinePartitionsCount) from a broker's Prometheus endpoint."""
    import re  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    url = f"http://127.0.0.1:{cluster.metrics_ports[b]}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()

    def gauge(name: str) -> float:
        return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]

    return (gauge("kafka_controller_kafkacontroller_activecontrollercount"),
            gauge("kafka_controller_kafkacontroller_offlinepartitionscount"))


def isr_changes(cluster: Cluster, b: int) -> tuple[float, float]:
    """(IsrShrinks, IsrExpands) counted by a broker, from its Prometheus endpoint."""
    import re  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_ports[b]}/metrics", timeout=10).read().decode()
    return tuple(float(re.search(rf"^kafka_server_replicamanager_isr{kind}_total (\S+)$", text,  # type: ignore[union-attr]
                                 re.M).group(1)) for kind in ("shrinks", "expands"))  # type: ignore[return-value]


def zk_state(zk: KazooClient, topic: str, p: int) -> dict[str, Any]:
    return zp.loads(zk.get(zp.partition_state_path(topic, p))[0])


def controller_of(zk: KazooClient) -> int:
    return int(zp.loads(zk.get(zp.CONTROLLER)[0])["brokerid"])


def create(b: BrokerProcess, topic: str, partitions: int = 3, rf: int = 3,
           assignment: dict[int, list[int]] | None = None) -> None:
    new = (NewTopic(topic, len(assignment), replica_assignment=[assignment[p] for p in sorted(assignment)]) if assignment
           else NewTopic(topic, partitions, rf))
    admin = ck_admin(b)  # kept referenced: the handle must outlive the future
    admin.create_topics([new], operation_timeout=10)[topic].result(15)
    n = len(assignment) if assignment else partitions
    # CreateTopics answers once the receiving broker knows the leaders; the others hear it a moment later.
    wait_for(lambda: all(_has_leaders(cluster_b, topic, n) for cluster_b in _ALIVE if cluster_b.alive()), f"{topic} leaders everywhere")


_ALIVE: list[BrokerProcess] = []


def raw_metadata(b: BrokerProcess, topic: str | None = None) -> Any:
    """Metadata asked of broker b itself (librdkafka and kafka-python ask whichever broker they like)."""
    from kbroker.protocol.messages import MetadataRequest  # noqa: PLC0415

    from tests.clients import RawClient  # noqa: PLC0415

    topics = None if topic is None else [MetadataRequest.MetadataRequestTopic(name=topic)]
    with RawClient(b.bootstrap) as raw:
        return raw.request(3, 12, MetadataRequest(topics=topics, allow_auto_topic_creation=False))


def _has_leaders(b: BrokerProcess, topic: str, n: int) -> bool:
    (t,) = raw_metadata(b, topic).topics
    return len(t.partitions) == n and all(p.leader_id >= 0 and p.error_code == 0 for p in t.partitions)


# ---------------------------------------------------------------- creation and metadata


def test_rf3_topic_has_replicas_isr_and_leaders_in_metadata_and_zookeeper(cluster: Cluster, zk_client: KazooClient) -> None:
    topic = "rf3"
    create(cluster[2], topic, partitions=6, rf=3)

    assignment = zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0])
    assert len(assignment.replicas) == 6
    assert all(sorted(r) == [1, 2, 3] for r in assignment.replicas)
    # Kafka's round-robin: the first replicas (preferred leaders) spread over all three brokers
    assert {r[0] for r in assignment.replicas} == {1, 2, 3}
    epoch = int(zk_client.get(zp.CONTROLLER_EPOCH)[0])
    for p, replicas in enumerate(assignment.replicas):
        state = zk_state(zk_client, topic, p)
        assert state["leader"] == replicas[0]
        assert sorted(state["isr"]) == [1, 2, 3]
        assert state["leader_epoch"] == 0 and state["controller_epoch"] == epoch

    # librdkafka through every broker (CreateTopics answered once leaders were known: no waiting here)
    for b in BROKERS:
        t = ck_metadata(cluster[b], topic).topics[topic]
        assert t.error is None
        for p, replicas in enumerate(assignment.replicas):
            pm = t.partitions[p]
            assert pm.error is None
            assert (pm.leader, pm.replicas, sorted(pm.isrs)) == (replicas[0], replicas, [1, 2, 3])

    # kafka-python's describe_topics: leader epochs and no offline replicas
    for p, info in kp_partitions(cluster[3], topic).items():
        assert info["error_code"] == 0
        assert info["leader_id"] == assignment.replicas[p][0]
        assert info["replica_nodes"] == assignment.replicas[p]
        assert sorted(info["isr_nodes"]) == [1, 2, 3]
        assert info["leader_epoch"] == 0
        assert info["offline_replicas"] == []


def test_java_admin_sees_replicas_isr_log_dirs_and_elects_preferred_leaders(
        cluster: Cluster, zk_client: KazooClient, tmp_path: Path) -> None:
    """The official Java admin client (kafka-clients 3.9): describeTopics, describeCluster, describeLogDirs and
    electLeaders on the RF=3 topic."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    from tests.java.test_java_client import JARS, find_jar_dir  # noqa: PLC0415

    jars = find_jar_dir()
    if jars is None or shutil.which("javac") is None:
        pytest.skip("the Java Kafka client or a JDK is not installed")
    cp = ":".join(str(jars / f"{j}.jar") for j in JARS)
    src = Path(__file__).resolve().parent.parent / "java" / "ReplicationAdmin.java"
    subprocess.run(["javac", "-cp", cp, "-d", str(tmp_path), str(src)], check=True, timeout=120)
    out = subprocess.run(
        ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{tmp_path}:{cp}", "ReplicationAdmin",
         cluster[3].bootstrap, "rf3"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    assignment = zp.parse_topic_assignment(zk_client.get(zp.topic_path("rf3"))[0]).replicas
    parts = {int(p): (int(leader), replicas, isr) for kind, p, leader, replicas, isr in
             (x for x in lines if x[0] == "P")}
    assert parts == {p: (r[0], ",".join(map(str, r)), parts[p][2]) for p, r in enumerate(assignment)}
    assert all(sorted(isr.split(",")) == ["1", "2", "3"] for _, _, isr in parts.values())
    assert [x for x in lines if x[0] == "C"] == [["C", str(controller_of(zk_client))]]
    assert sorted(x for x in lines if x[0] == "D") == [["D", str(b), "6"] for b in BROKERS]
    # every partition is led by its preferred replica already
    assert sorted(x for x in lines if x[0] == "E") == [["E", str(p), "ElectionNotNeededException"] for p in range(6)]


def test_describe_topic_partitions_pages_with_a_cursor(cluster: Cluster, zk_client: KazooClient) -> None:
    assignment = zp.parse_topic_assignment(zk_client.get(zp.topic_path("rf3"))[0]).replicas
    admin = kp_admin(cluster[2])
    try:
        first = admin.describe_topic_partitions(["rf3", "absent-topic"], response_partition_limit=4)
        assert first["next_cursor"] == {"topic_name": "rf3", "partition_index": 4}
        absent, rf3 = first["topics"]  # sorted by name
        assert absent["name"] == "absent-topic" and absent["error_code"] == 3
        assert [p["partition_index"] for p in rf3["partitions"]] == [0, 1, 2, 3]
        rest = admin.describe_topic_partitions(["rf3"], cursor=first["next_cursor"])
        assert rest["next_cursor"] is None
        parts = rf3["partitions"] + rest["topics"][0]["partitions"]
    finally:
        admin.close()
    assert [p["partition_index"] for p in parts] == list(range(6))
    for p in parts:
        i = p["partition_index"]
        assert (p["error_code"], p["leader_id"], p["leader_epoch"]) == (0, assignment[i][0], 0)
        assert p["replica_nodes"] == assignment[i] and sorted(p["isr_nodes"]) == [1, 2, 3]
        assert p["offline_replicas"] == []


def test_replication_factor_above_live_brokers_is_refused(cluster: Cluster) -> None:
    admin = ck_admin(cluster[1])
    fut = admin.create_topics([NewTopic("rf4", 1, 4)], operation_timeout=10)["rf4"]
    with pytest.raises(Exception) as e:
        fut.result(15)
    assert e.value.args[0].code() == CKError.INVALID_REPLICATION_FACTOR
    assert "larger than available brokers: 3" in e.value.args[0].str()


def test_explicit_assignment_and_create_partitions(cluster: Cluster, zk_client: KazooClient) -> None:
    topic = "explicit"
    create(cluster[1], topic, assignment={0: [3, 1], 1: [2, 3]})
    t = ck_metadata(cluster[2], topic).topics[topic]
    assert [(t.partitions[p].leader, t.partitions[p].replicas) for p in (0, 1)] == [(3, [3, 1]), (2, [2, 3])]

    from confluent_kafka.admin import NewPartitions  # noqa: PLC0415

    admin = ck_admin(cluster[1])
    admin.create_partitions([NewPartitions(topic, 4)], operation_timeout=10)[topic].result(15)
    assignment = zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0])
    assert len(assignment.replicas) == 4 and all(len(r) == 2 for r in assignment.replicas)
    wait_for(lambda: all(_has_leaders(cluster[b], topic, 4) for b in BROKERS), "new partitions everywhere")
    for b in BROKERS:
        parts = ck_metadata(cluster[b], topic).topics[topic].partitions
        assert len(parts) == 4 and all(parts[p].leader == assignment.replicas[p][0] for p in range(4))

    bad = admin.create_topics(
        [NewTopic("dup-replicas", 1, replica_assignment=[[1, 1]])], operation_timeout=10)["dup-replicas"]
    with pytest.raises(Exception) as e:
        bad.result(15)
    assert e.value.args[0].code() == CKError.INVALID_REPLICA_ASSIGNMENT


# ---------------------------------------------------------------- DescribeLogDirs


def test_describe_log_dirs_through_two_clients(cluster: Cluster) -> None:
    admin = kp_admin(cluster[1])
    try:
        result = admin.describe_log_dirs(topic_partitions={"rf3": list(range(6))})
    finally:
        admin.close()
    by_broker = {r["broker"]: r["log_dirs"] for r in result}
    assert set(by_broker) == set(BROKERS)
    for b, dirs in by_broker.items():
        (d,) = dirs
        assert d["error_code"] == 0 and d["log_dir"] == str((cluster[b].data_dir / "logs").resolve())
        assert {(t["name"], p["partition_index"]) for t in d["topics"] for p in t["partitions"]} == {
            ("rf3", p) for p in range(6)}

    from kbroker.protocol.messages import DescribeLogDirsRequest  # noqa: PLC0415

    from tests.clients import RawClient  # noqa: PLC0415

    for b in BROKERS:
        with RawClient(cluster[b].bootstrap) as raw:
            resp = raw.request(35, 4, DescribeLogDirsRequest(topics=None))
        assert resp.error_code == 0
        (d,) = resp.results
        assert d.error_code == 0 and d.log_dir == str((cluster[b].data_dir / "logs").resolve())
        assert d.total_bytes > 0 and 0 <= d.usable_bytes <= d.total_bytes
        parts = {(t.name, p.partition_index) for t in d.topics for p in t.partitions}
        # every broker holds a replica of each rf3 partition (created when LeaderAndIsr named it)
        assert {("rf3", p) for p in range(6)} <= parts


# ---------------------------------------------------------------- reassignment and preferred leaders


def test_reassignment_reorders_and_elect_leaders_restores_preferred(cluster: Cluster, zk_client: KazooClient) -> None:
    topic = "rf3"
    current = zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0]).replicas[0]
    leader = current[0]
    reordered = current[1:] + current[:1]  # same replicas, another preferred leader
    admin = kp_admin(cluster[2])
    try:
        admin.alter_partition_reassignments({TopicPartition(topic, 0): reordered})
        # every target replica is in the ISR already: the reassignment completes at once
        wait_for(lambda: zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0]).replicas[0] == reordered,
                 "assignment reordered")
        assert admin.list_partition_reassignments() == {}
        # the leader did not move (it is still a replica), so it is not the preferred one now
        assert zk_state(zk_client, topic, 0)["leader"] == leader
    finally:
        admin.close()

    epoch = zk_state(zk_client, topic, 0)["leader_epoch"]
    ck = ck_admin(cluster[3])
    result = ck.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(topic, 0),
                                                                        CKTopicPartition(topic, 1)])
    errors = result.result(15)
    assert errors[CKTopicPartition(topic, 0)] is None
    assert errors[CKTopicPartition(topic, 1)].code() == CKError.ELECTION_NOT_NEEDED
    state = zk_state(zk_client, topic, 0)
    assert state["leader"] == reordered[0] and state["leader_epoch"] == epoch + 1
    wait_for(lambda: all(ck_metadata(cluster[b], topic).topics[topic].partitions[0].leader == reordered[0]
                         for b in BROKERS), "new preferred leader in every broker's metadata")


def test_reassignment_removes_a_replica_and_its_log(cluster: Cluster, zk_client: KazooClient) -> None:
    topic = "shrink"
    create(cluster[1], topic, assignment={0: [1, 2, 3]})
    wait_for(lambda: (cluster[3].data_dir / "logs" / f"{topic}-0").is_dir(), "broker 3 holds a replica")
    admin = kp_admin(cluster[1])
    try:
        admin.alter_partition_reassignments({TopicPartition(topic, 0): [1, 2]})
        wait_for(lambda: zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0]).replicas == [[1, 2]],
                 "assignment without broker 3")
        assert sorted(zk_state(zk_client, topic, 0)["isr"]) == [1, 2]
        # StopReplica(delete) reached broker 3: its log is gone
        wait_for(lambda: not (cluster[3].data_dir / "logs" / f"{topic}-0").exists(), "broker 3's replica deleted")
        def shrunk(b: int) -> bool:
            pm = ck_metadata(cluster[b], topic).topics[topic].partitions[0]
            return bool(pm.replicas == [1, 2] and sorted(pm.isrs) == [1, 2])

        wait_for(lambda: all(shrunk(b) for b in BROKERS), "every broker's metadata without broker 3")

        # Adding broker 3 back: its new replica copies the log and joins the ISR, then the reassignment completes
        produce_acks_all(cluster[1], topic, 0, 500)
        result = admin.alter_partition_reassignments({TopicPartition(topic, 0): [1, 2, 3]})
        assert result == {TopicPartition(topic, 0): None}

        def completed() -> bool:
            doc = zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0])
            return (doc.replicas == [[1, 2, 3]] and not doc.adding and not admin.list_partition_reassignments()
                    and sorted(zk_state(zk_client, topic, 0)["isr"]) == [1, 2, 3])

        wait_for(completed, "broker 3 caught up and the reassignment completed", timeout=30)
        sizes = {r["broker"]: {(t["name"], p["partition_index"]): p["partition_size"] for d in r["log_dirs"]
                               for t in d["topics"] for p in t["partitions"]}
                 for r in admin.describe_log_dirs(topic_partitions={topic: [0]})}
        assert sizes[3][(topic, 0)] == sizes[1][(topic, 0)] > 0, sizes

        # Nothing to cancel any more
        cancel = admin.alter_partition_reassignments({TopicPartition(topic, 0): None})
        assert cancel[TopicPartition(topic, 0)].errno == 85  # NO_REASSIGNMENT_IN_PROGRESS
    finally:
        admin.close()
    assert consume_values(cluster[3], topic, 0, 500) == [f"{topic}-{i}".encode() for i in range(500)]


def produce_acks_all(b: BrokerProcess, topic: str, partition: int, n: int) -> None:
    from confluent_kafka import Producer  # noqa: PLC0415

    errors: list[Any] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, f"{topic}-{i}".encode(), partition=partition,
                  on_delivery=lambda err, _msg: errors.append(err) if err else None)
    assert p.flush(30) == 0 and not errors, errors


def consume_values(b: BrokerProcess, topic: str, partition: int, n: int, timeout: float = 20) -> list[bytes]:
    from kafka import KafkaConsumer  # noqa: PLC0415

    consumer = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, partition)])
        consumer.seek_to_beginning()
        out: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=500).values():
                out += [m.value for m in msgs]
        return out
    finally:
        consumer.close()


def test_reassignment_written_to_admin_reassign_partitions(cluster: Cluster, zk_client: KazooClient) -> None:
    """The ZooKeeper-era way (kafka-reassign-partitions --zookeeper): the controller executes the znode and
    deletes it once every partition in it has moved."""
    topic = "zk-reassign"
    create(cluster[1], topic, assignment={0: [1, 2], 1: [2, 3]})
    produce_acks_all(cluster[1], topic, 0, 100)
    zk_client.create(zp.REASSIGN_PARTITIONS, zp.reassign_partitions_doc({(topic, 0): [3, 2], (topic, 1): [2, 3],
                                                                         ("no-such-topic", 0): [1]}))
    wait_for(lambda: not zk_client.exists(zp.REASSIGN_PARTITIONS), "the znode executed and deleted", timeout=30)
    assert zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0]).replicas == [[3, 2], [2, 3]]
    state = zk_state(zk_client, topic, 0)
    # broker 1 left, so the first target replica in the ISR leads (Kafka's reassignment election)
    assert state["leader"] == 3 and sorted(state["isr"]) == [2, 3]
    assert consume_values(cluster[3], topic, 0, 100) == [f"{topic}-{i}".encode() for i in range(100)]


# ---------------------------------------------------------------- requests from brokers to the controller


def test_alter_partition_and_controlled_shutdown_requests_are_checked_by_the_controller(
        cluster: Cluster, zk_client: KazooClient) -> None:
    """What a leader's ISR change (AlterPartition v2) and a stopping broker's ControlledShutdown get answered,
    sent as a broker sends them."""
    from kbroker.protocol.messages import (  # noqa: PLC0415
        AlterPartitionRequest,
        ControlledShutdownRequest,
    )

    from tests.clients import RawClient  # noqa: PLC0415

    topic = "isr-change"
    create(cluster[1], topic, assignment={0: [2, 3, 1]})
    controller = controller_of(zk_client)
    other = next(b for b in BROKERS if b != controller)
    epoch_of = {b: zk_client.exists(zp.broker_path(b)).czxid for b in BROKERS}
    data, stat = zk_client.get(zp.partition_state_path(topic, 0))
    state = zp.loads(data)
    topic_id = zp.parse_topic_assignment(zk_client.get(zp.topic_path(topic))[0]).topic_id

    def alter(broker_epoch: int, leader_epoch: int, isr: list[int], partition_epoch: int, to: int) -> Any:
        req = AlterPartitionRequest(broker_id=2, broker_epoch=broker_epoch, topics=[AlterPartitionRequest.TopicData(
            topic_id=topic_id, partitions=[AlterPartitionRequest.PartitionData(
                partition_index=0, leader_epoch=leader_epoch, new_isr=isr, partition_epoch=partition_epoch)])])
        with RawClient(cluster[to].bootstrap) as raw:
            return raw.request(56, 2, req)

    assert alter(epoch_of[2], state["leader_epoch"], [2, 3], stat.version, other).error_code == 41  # NOT_CONTROLLER
    assert alter(epoch_of[2] - 1, state["leader_epoch"], [2, 3], stat.version, controller).error_code == 77
    fenced = alter(epoch_of[2], state["leader_epoch"] + 1, [2, 3], stat.version, controller)
    assert fenced.topics[0].partitions[0].error_code == 74  # FENCED_LEADER_EPOCH
    ok = alter(epoch_of[2], state["leader_epoch"], [2, 3], stat.version, controller)
    (res,) = ok.topics[0].partitions
    assert ok.error_code == 0 and res.error_code == 0
    assert (res.leader_id, res.leader_epoch, res.isr, res.partition_epoch) == (2, state["leader_epoch"], [2, 3],
                                                                               stat.version + 1)
    new, new_stat = zk_client.get(zp.partition_state_path(topic, 0))
    assert zp.loads(new)["isr"] == [2, 3] and new_stat.version == stat.version + 1
    stale = alter(epoch_of[2], state["leader_epoch"], [2], stat.version - 1, controller)
    assert stale.topics[0].partitions[0].error_code == 95  # INVALID_UPDATE_VERSION
    wait_for(lambda: sorted(ck_metadata(cluster[1], topic).topics[topic].partitions[0].isrs) == [2, 3],
             "the smaller ISR in every broker's metadata (UpdateMetadata)")

    with RawClient(cluster[other].bootstrap) as raw:
        assert raw.request(7, 3, ControlledShutdownRequest(broker_id=3, broker_epoch=epoch_of[3])).error_code == 41
    with RawClient(cluster[controller].bootstrap) as raw:
        resp = raw.request(7, 3, ControlledShutdownRequest(broker_id=3, broker_epoch=epoch_of[3] - 1))
    assert resp.error_code == 77  # STALE_BROKER_EPOCH: an older registration of broker 3


# ---------------------------------------------------------------- failures


def test_killed_controller_fails_over_and_its_partitions_get_new_leaders(cluster: Cluster,
                                                                          zk_client: KazooClient) -> None:
    single = "single-on-1"
    create(cluster[1], single, assignment={0: [1]})
    assert controller_of(zk_client) == 1
    # The standard alert sum(ActiveControllerCount) != 1: exactly one broker of the cluster counts itself.
    wait_for(lambda: [controller_gauges(cluster, b)[0] for b in BROKERS] == [1, 0, 0], "one active controller")
    before = {p: zk_state(zk_client, "rf3", p) for p in range(6)}
    led_by_1 = [p for p, s in before.items() if s["leader"] == 1]
    assert led_by_1

    for p in range(6):
        produce_acks_all(cluster[2], "rf3", p, 200)  # acknowledged by every in-sync replica before the kill
    t0 = time.monotonic()
    cluster[1].kill()

    def failed_over() -> bool:
        if controller_of(zk_client) == 1:
            return False
        t = ck_metadata(cluster[2], "rf3").topics["rf3"]
        return all(t.partitions[p].leader in (2, 3) for p in range(6))

    wait_for(failed_over, "a new controller and new leaders", timeout=SESSION_MS / 1000 + 10)
    elapsed = time.monotonic() - t0
    print(f"leader failover after kill -9 of the controller: {elapsed:.2f} s (session timeout {SESSION_MS} ms)")
    assert elapsed < SESSION_MS / 1000 + 4
    assert controller_of(zk_client) in (2, 3)
    for p in range(6):
        state = zk_state(zk_client, "rf3", p)
        assert 1 not in state["isr"] and state["leader"] in (2, 3)
        if p in led_by_1:
            assert state["leader_epoch"] == before[p]["leader_epoch"] + 1
    # Not one acknowledged record lost, read from the new leaders
    for p in range(6):
        assert consume_values(cluster[2], "rf3", p, 200) == [f"rf3-{i}".encode() for i in range(200)]
    # kafka-python sees broker 1's replicas offline (once broker 3 has the controller's UpdateMetadata)
    wait_for(lambda: all(info["offline_replicas"] == [1] and 1 not in info["isr_nodes"]
                         for info in kp_partitions(cluster[3], "rf3").values()), "broker 1 offline in metadata")

    # No live ISR member: LEADER_NOT_AVAILABLE with leader -1 (the dead broker stays the last ISR member)
    pm = ck_metadata(cluster[2], single).topics[single].partitions[0]
    assert pm.error is not None and pm.error.code() == CKError.LEADER_NOT_AVAILABLE
    assert pm.leader == -1
    wait_for(lambda: kp_partitions(cluster[3], single)[0]["leader_epoch"] == 1, "broker 3 has the new state")
    info = kp_partitions(cluster[3], single)[0]
    assert info["error_code"] == 5 and info["leader_id"] == -1 and info["offline_replicas"] == [1]
    state = zk_state(zk_client, single, 0)
    assert state["leader"] == -1 and state["isr"] == [1]
    # The new controller counts it offline (Kafka's OfflinePartitionsCount); the other broker is not active.
    new_controller = controller_of(zk_client)

    def gauges_match() -> bool:
        offline = sum(1 for t in raw_metadata(cluster[new_controller]).topics for pm in t.partitions if pm.leader_id < 0)
        return offline >= 1 and controller_gauges(cluster, new_controller) == (1, offline)

    wait_for(gauges_match, "the controller's gauges: active, and the partitions without a leader")
    assert controller_gauges(cluster, 5 - new_controller) == (0, 0)


def test_returning_broker_leads_its_single_replica_partition_again(cluster: Cluster, zk_client: KazooClient) -> None:
    single = "single-on-1"
    expands_before = sum(isr_changes(cluster, b)[1] for b in (2, 3))
    cluster[1].start(timeout=SESSION_MS / 1000 + 20)
    # The leaders of rf3 take broker 1 back into their ISR once it caught up (ReplicaManager IsrExpandsPerSec)
    wait_for(lambda: sum(isr_changes(cluster, b)[1] for b in (2, 3)) > expands_before, "ISR expansions counted",
             timeout=SESSION_MS / 1000 + 15)
    wait_for(lambda: ck_metadata(cluster[2], single).topics[single].partitions[0].leader == 1,
             "broker 1 leads its partition again", timeout=SESSION_MS / 1000 + 10)
    assert zk_state(zk_client, single, 0)["isr"] == [1]
    # the controller stayed where it moved
    assert controller_of(zk_client) in (2, 3)


def test_controlled_shutdown_moves_leaderships_first(cluster: Cluster, zk_client: KazooClient) -> None:
    import re  # noqa: PLC0415

    controller = controller_of(zk_client)
    # The other of brokers 2 and 3, so the controller (and its auto rebalance, for the next test) stays put.
    leader = next(b for b in (2, 3) if b != controller)
    led = [p for p in range(6) if zk_state(zk_client, "rf3", p)["leader"] == leader]
    assert led
    # An idempotent acks=all producer writes to one of its partitions throughout: its longest wait for an
    # acknowledgement is the produce pause of the controlled shutdown.
    import threading  # noqa: PLC0415

    from confluent_kafka import Producer  # noqa: PLC0415

    acked: list[float] = []
    errors: list[Any] = []
    done = threading.Event()

    def produce() -> None:
        prod = Producer({"bootstrap.servers": cluster[controller].bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0})
        i = 0
        while not done.is_set():
            prod.produce("rf3", f"cs-{i}".encode(), partition=led[0],
                         on_delivery=lambda err, _m: errors.append(err) if err else acked.append(time.monotonic()))
            prod.poll(0.01)
            i += 1
        assert prod.flush(30) == 0

    producer = threading.Thread(target=produce)
    producer.start()
    wait_for(lambda: len(acked) > 20, "the producer running")
    t0 = time.monotonic()
    cluster[leader].stop()
    try:
        stopped = time.monotonic() - t0
        time.sleep(1.5)
        done.set()
        producer.join(40)
        assert not errors, errors
        window = [t for t in acked if t >= t0 - 0.5]
        pause = max(b - a for a, b in zip(window, window[1:], strict=False))
        print(f"controlled shutdown: longest wait between acknowledgements {pause * 1000:.0f} ms")
        # Issue 13: well under a second. Measured by hand in 26 repetitions (a script doing what this test does):
        # 85-170 ms in 24, 390 ms in 2 (librdkafka's own leader re-query after it forgets the stopped broker).
        # Before 2026-11-26 it was 0.1-1.4 s, once 5.1 s in CI: parked long polls held the stopping broker's
        # connections open, its metadata still named it leader, and the followers' parked fetches could not
        # carry the partitions they had just been given.
        assert pause < 1.0, (pause, _log_lines(cluster[leader], "ontrolled shutdown"),
                             _log_lines(cluster[controller], "ontrolled shutdown"))
        # The controller moved the leaderships while the broker was still registered and serving.
        moves = re.findall(rf"Controlled shutdown of broker {leader}: (\d+) leaderships moved", cluster[controller].read_log())
        assert moves and int(moves[0]) >= len(led), moves
        log = cluster[leader].read_log()
        shutting = log.index(f"Shutting down broker {leader}")
        assert "Controlled shutdown" in log[shutting:] and log.index("Closed the ZooKeeper session") > shutting
        for p in led:
            state = zk_state(zk_client, "rf3", p)
            assert state["leader"] not in (leader, -1) and leader not in state["isr"]
        print(f"controlled shutdown of broker {leader} took {stopped:.2f} s; {len(led)} rf3 leaderships moved")
        others = [b for b in BROKERS if b != leader]
        wait_for(lambda: all(ck_metadata(cluster[others[0]], "rf3").topics["rf3"].partitions[p].leader in others
                             for p in led), "new leaders in metadata")
    finally:
        # Back for the module's next tests whatever failed above.
        done.set()
        if not cluster[leader].alive():
            cluster[leader].start()
    wait_for(lambda: all(set(ck_metadata(cluster[b]).brokers) == set(BROKERS) for b in BROKERS),
             "broker back in every broker's metadata")


def test_auto_leader_rebalance_moves_leaders_to_preferred_replicas(cluster: Cluster, zk_client: KazooClient) -> None:
    assert controller_of(zk_client) in (2, 3)  # auto.leader.rebalance.enable=true, checked every second
    topic, p = "rebalance", 0
    create(cluster[2], topic, assignment={0: [1, 2, 3]})
    assert zk_state(zk_client, topic, p)["leader"] == 1
    preferred = 2
    target = [2, 3, 1]  # the same replicas, broker 2 preferred: broker 1 stays leader until the rebalance
    admin = kp_admin(cluster[2])
    try:
        admin.alter_partition_reassignments({TopicPartition(topic, p): target})
    finally:
        admin.close()
    elapsed = wait_for(lambda: zk_state(zk_client, topic, p)["leader"] == preferred,
                       "the controller's rebalance to the preferred replica", timeout=10)
    assert elapsed < 5
    wait_for(lambda: ck_metadata(cluster[preferred], topic).topics[topic].partitions[p].leader == preferred,
             "the preferred leader in metadata")


def test_unclean_leader_election_by_topic_config_and_by_elect_leaders(cluster: Cluster,
                                                                      zk_client: KazooClient) -> None:
    controller = controller_of(zk_client)
    x = next(b for b in (2, 3) if b != controller)
    auto, manual = "unclean-auto", "unclean-manual"
    admin = ck_admin(cluster[controller])
    futures = admin.create_topics([
        NewTopic(auto, 1, replica_assignment=[[1, x]], config={"unclean.leader.election.enable": "true"}),
        NewTopic(manual, 1, replica_assignment=[[1, x]]),
    ], operation_timeout=10)
    for f in futures.values():
        f.result(15)
    wait_for(lambda: all(zk_state(zk_client, t, 0)["leader"] == 1 for t in (auto, manual)), "broker 1 leads both")

    cluster[x].kill()  # the follower goes first: the ISR is [1] alone
    wait_for(lambda: all(zk_state(zk_client, t, 0)["isr"] == [1] for t in (auto, manual)),
             f"broker {x} out of the ISRs", timeout=SESSION_MS / 1000 + 10)
    cluster[1].kill()  # then the last ISR member: no leader, and no clean candidate
    wait_for(lambda: all(zk_state(zk_client, t, 0)["leader"] == -1 for t in (auto, manual)),
             "both without a leader", timeout=SESSION_MS / 1000 + 10)

    cluster[x].start(timeout=SESSION_MS / 1000 + 20)
    # unclean.leader.election.enable=true on the topic: the returning out-of-sync replica may lead
    wait_for(lambda: zk_state(zk_client, auto, 0)["leader"] == x, f"broker {x} leads {auto}",
             timeout=SESSION_MS / 1000 + 10)
    assert zk_state(zk_client, auto, 0)["isr"] == [x]
    # without it the partition stays offline
    pm = ck_metadata(cluster[controller], manual).topics[manual].partitions[0]
    assert pm.leader == -1 and pm.error is not None and pm.error.code() == CKError.LEADER_NOT_AVAILABLE
    assert zk_state(zk_client, manual, 0) == {**zk_state(zk_client, manual, 0), "leader": -1, "isr": [1]}

    # until an operator asks for an unclean election
    kp = kp_admin(cluster[controller])
    try:
        kp.elect_leaders(1, {manual: [0]})
    finally:
        kp.close()
    state = zk_state(zk_client, manual, 0)
    assert state["leader"] == x and state["isr"] == [x]
    wait_for(lambda: ck_metadata(cluster[controller], manual).topics[manual].partitions[0].leader == x,
             "the unclean leader in metadata")
    cluster[1].start(timeout=SESSION_MS / 1000 + 20)


def test_frozen_controller_is_replaced_and_steps_down_when_it_thaws(cluster: Cluster, zk_client: KazooClient) -> None:
    """SIGSTOP the controller past its session timeout: another broker takes over with a higher controller
    epoch; thawed, the old controller finds its seat gone, steps down and changes nothing."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    wait_for(lambda: all(set(ck_metadata(cluster[b]).brokers) == set(BROKERS) for b in BROKERS), "three brokers")
    old = controller_of(zk_client)
    old_epoch = int(zk_client.get(zp.CONTROLLER_EPOCH)[0])
    proc = cluster[old].proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: controller_of(zk_client) != old, "a new controller", timeout=SESSION_MS / 1000 + 10)
        new = controller_of(zk_client)
        new_epoch = int(zk_client.get(zp.CONTROLLER_EPOCH)[0])
        assert new_epoch == old_epoch + 1
        # the frozen broker's leaderships moved as for a dead broker
        wait_for(lambda: all(zk_state(zk_client, "rf3", p)["leader"] != old for p in range(6)), "leaders moved")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    wait_for(lambda: set(ck_metadata(cluster[new]).brokers) == set(BROKERS), "the thawed broker registered again",
             timeout=SESSION_MS / 1000 + 10)
    wait_for(lambda: "is no longer the controller" in cluster[old].read_log()
             or "Controller epoch moved on" in cluster[old].read_log(), "the old controller stepped down")
    assert controller_of(zk_client) == new and int(zk_client.get(zp.CONTROLLER_EPOCH)[0]) == new_epoch
    # it follows the new controller: its own metadata names it, and the states it serves carry the new epoch
    wait_for(lambda: raw_metadata(cluster[old]).controller_id == new, "the new controller in its metadata")
    for p in range(6):
        assert zk_state(zk_client, "rf3", p)["controller_epoch"] in (old_epoch, new_epoch)
