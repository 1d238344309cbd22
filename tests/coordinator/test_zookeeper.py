"""Several kbroker processes sharing one real ZooKeeper (zookeeper.connect), driven by real clients.

The tests of this module share one ZooKeeper and one two-broker cluster and run in file order: the
last ones kill and restart brokers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kazoo.client import KazooClient
from kbroker.coordinator import zk_paths as zp

from tests.broker_process import BrokerProcess, free_port
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

SESSION_MS = 4000
PARTITIONS = 6


def zk_overrides(zk: ZooKeeperServer, broker_id: int, **extra: str) -> dict[str, str]:
    return {
        "zookeeper.connect": zk.connect,
        "broker.id": str(broker_id),
        "zookeeper.session.timeout.ms": str(SESSION_MS),
        "zookeeper.connection.timeout.ms": "5000",
        "num.partitions": "1",
        **extra,
    }


class Cluster:
    def __init__(self, zk: ZooKeeperServer, base: Path) -> None:
        self.zk = zk
        self.base = base
        self.b1 = BrokerProcess(base / "b1", zk_overrides(zk, 1))
        self.b2 = BrokerProcess(base / "b2", zk_overrides(zk, 2))

    def stop(self) -> None:
        for b in (self.b1, self.b2):
            try:
                b.stop()
            except RuntimeError:
                b.kill()


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(zookeeper, tmp_path_factory.mktemp("zkcluster"))
    c.b1.start()  # first up: the controller
    c.b2.start()
    wait_for(lambda: broker_ids(c.b1) == {1, 2} and broker_ids(c.b2) == {1, 2}, "both brokers registered")
    yield c
    c.stop()


def wait_for(cond, what: str, timeout: float = 15.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if cond():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001  (a broker still starting or already gone: ask again)
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what}")


def describe_cluster(b: BrokerProcess) -> dict:  # type: ignore[type-arg]
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=5000)
    try:
        return admin.describe_cluster()  # type: ignore[no-any-return]
    finally:
        admin.close()


def broker_ids(b: BrokerProcess) -> set[int]:
    return {x["broker_id"] for x in describe_cluster(b)["brokers"]}


def brokers_and_controller(b: BrokerProcess) -> tuple[set[int], int]:
    """Through librdkafka, which asks only the given broker (kafka-python's admin client follows the controller)."""
    md = confluent_metadata(b, "__probe_topic_absent")
    return set(md.brokers), md.controller_id


def confluent_metadata(b: BrokerProcess, topic: str):  # type: ignore[no-untyped-def]
    # One topic: librdkafka's all-topics Metadata v12 request does not parse yet (see the report).
    return AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(topic=topic, timeout=10)


def consume_all(b: BrokerProcess, topic: str, partitions: int, expected: int, timeout: float = 15.0) -> dict[int, list[bytes]]:
    consumer = KafkaConsumer(
        bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False, consumer_timeout_ms=1000
    )
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        got: dict[int, list[bytes]] = {}
        deadline = time.monotonic() + timeout
        while sum(map(len, got.values())) < expected and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                got.setdefault(tp.partition, []).extend(m.value for m in msgs)
        return got
    finally:
        consumer.close()


def produce_to_every_partition(b: BrokerProcess, topic: str, partitions: int, per_partition: int) -> None:
    errors: list[object] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for part in range(partitions):
        for i in range(per_partition):
            p.produce(topic, f"{topic}-{part}-{i}".encode(), partition=part,
                      on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert p.flush(30) == 0
    assert not errors, errors


# ---------------------------------------------------------------- cluster formation


def test_both_brokers_in_metadata_with_one_cluster_id(cluster: Cluster, zk_client: KazooClient) -> None:
    d1, d2 = describe_cluster(cluster.b1), describe_cluster(cluster.b2)
    cid = zp.loads(zk_client.get(zp.CLUSTER_ID)[0])["id"]
    assert len(cid) == 22
    assert d1["cluster_id"] == d2["cluster_id"] == cid
    ports = {x["broker_id"]: x["port"] for x in d1["brokers"]}
    assert ports == {1: cluster.b1.port, 2: cluster.b2.port}
    assert d1["controller_id"] == d2["controller_id"] == 1

    # librdkafka sees the same two brokers and cluster id through either broker
    for b in (cluster.b1, cluster.b2):
        md = confluent_metadata(b, "__probe_topic_absent")
        assert {(i, m.port) for i, m in md.brokers.items()} == {(1, cluster.b1.port), (2, cluster.b2.port)}
        assert md.cluster_id == cid
        assert md.controller_id == 1

    # Kafka's registration document, as a ZK-mode Kafka broker writes it
    reg = zp.loads(zk_client.get(zp.broker_path(2))[0])
    assert reg["endpoints"] == [f"PLAINTEXT://127.0.0.1:{cluster.b2.port}"]
    assert reg["version"] == 5 and reg["port"] == cluster.b2.port and reg["host"] == "127.0.0.1"
    assert zk_client.get(zp.broker_path(2))[1].ephemeralOwner != 0
    assert zp.loads(zk_client.get(zp.CONTROLLER)[0])["brokerid"] == 1


def test_topic_created_on_one_broker_is_served_by_both(cluster: Cluster, zk_client: KazooClient) -> None:
    topic = "zk-shared"
    # Created through broker 2: librdkafka sends CreateTopics to the controller (broker 1)
    admin = AdminClient({"bootstrap.servers": cluster.b2.bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, PARTITIONS, 1, config={"retention.ms": "3600000"})], operation_timeout=10
    )
    futures[topic].result(15)

    for b in (cluster.b1, cluster.b2):
        md = wait_for_topic(b, topic)
        leaders = [md.topics[topic].partitions[p].leader for p in range(PARTITIONS)]
        assert sorted(set(leaders)) == [1, 2], leaders

    # ZooKeeper holds Kafka's layout
    doc = zp.loads(zk_client.get(zp.topic_path(topic))[0])
    assert doc["version"] == 3 and len(doc["topic_id"]) == 22
    assert doc["partitions"] == {str(p): [leaders[p]] for p in range(PARTITIONS)}
    state = zp.loads(zk_client.get(zp.partition_state_path(topic, 0))[0])
    assert state["leader"] == leaders[0] and state["isr"] == [leaders[0]]
    assert zp.parse_config(zk_client.get(zp.topic_config_path(topic))[0]) == {"retention.ms": "3600000"}

    # Produce to every partition (librdkafka routes each to its leader), read back through kafka-python
    produce_to_every_partition(cluster.b1, topic, PARTITIONS, 5)
    got = consume_all(cluster.b2, topic, PARTITIONS, PARTITIONS * 5)
    assert {p: len(v) for p, v in got.items()} == {p: 5 for p in range(PARTITIONS)}
    for p, values in got.items():
        assert values == [f"{topic}-{p}-{i}".encode() for i in range(5)]


def wait_for_topic(b: BrokerProcess, topic: str):  # type: ignore[no-untyped-def]
    holder = {}

    def seen() -> bool:
        md = confluent_metadata(b, topic)
        t = md.topics.get(topic)
        if t is None or t.error is not None or len(t.partitions) != PARTITIONS:
            return False
        holder["md"] = md
        return True

    wait_for(seen, f"{topic} in the metadata of broker {b.bootstrap}")
    return holder["md"]


def test_fetch_from_the_broker_not_leading_is_not_leader(cluster: Cluster) -> None:
    from kbroker.protocol.messages import FetchRequest  # noqa: PLC0415

    from tests.clients import RawClient  # noqa: PLC0415

    md = confluent_metadata(cluster.b1, "zk-shared")
    leaders = {p: m.leader for p, m in md.topics["zk-shared"].partitions.items()}
    for b, me in ((cluster.b1, 1), (cluster.b2, 2)):
        req = FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
            topics=[FetchRequest.FetchTopic(topic="zk-shared", partitions=[
                FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 16)
                for p in range(PARTITIONS)
            ])],
        )
        with RawClient(b.bootstrap) as raw:
            resp = raw.request(1, 4, req)
        codes = {pd.partition_index: pd.error_code for pd in resp.responses[0].partitions}
        assert codes == {p: 0 if leaders[p] == me else 6 for p in range(PARTITIONS)}  # 6: NOT_LEADER_OR_FOLLOWER


def test_config_change_and_delete_seen_by_the_other_broker(cluster: Cluster, zk_client: KazooClient) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType  # noqa: PLC0415
    from kafka.admin import NewTopic as KNewTopic  # noqa: PLC0415

    topic = "zk-to-delete"
    a1 = KafkaAdminClient(bootstrap_servers=cluster.b1.bootstrap)
    a2 = KafkaAdminClient(bootstrap_servers=cluster.b2.bootstrap)
    try:
        a1.create_topics([KNewTopic(topic, 2, 1)])
        wait_for(lambda: topic in a2.list_topics(), f"{topic} seen by broker 2")
        produce_to_every_partition(cluster.b2, topic, 2, 1)
        logs2 = cluster.b2.data_dir / "logs"
        assert any(d.name.startswith(f"{topic}-") for d in logs2.iterdir())

        a2.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={"cleanup.policy": "compact"})])

        def compact_on_b1() -> bool:
            res = a1.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            return bool(res["topic"][topic]["cleanup.policy"]["value"] == "compact")

        wait_for(compact_on_b1, "cleanup.policy=compact seen through broker 1")

        a1.delete_topics([topic])
        wait_for(lambda: topic not in a2.list_topics(), f"{topic} gone from broker 2")
        assert not zk_client.exists(zp.topic_path(topic))
        assert not zk_client.exists(zp.topic_config_path(topic))
        # broker 2 dropped its local logs of the topic deleted through broker 1
        wait_for(
            lambda: not any(d.name.startswith(f"{topic}-") and d.name.count(".") == 0 for d in logs2.iterdir()),
            "broker 2's logs of the deleted topic renamed for deletion",
        )
    finally:
        a1.close()
        a2.close()


def test_group_config_set_on_one_broker_is_seen_by_the_other(cluster: Cluster, zk_client: KazooClient) -> None:
    """Group configs (resource type 32) live in /config/groups/<group id, percent-encoded>: kbroker's place for
    them in ZooKeeper mode, where Kafka 3.9 has none."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType  # noqa: PLC0415
    from kafka.admin import ConfigResource as KpConfigResource  # noqa: PLC0415
    from kafka.admin import ConfigResourceType  # noqa: PLC0415

    group, key = "zk/group", "consumer.heartbeat.interval.ms"
    a1 = AdminClient({"bootstrap.servers": cluster.b1.bootstrap})  # kept alive until each result is in

    def alter(op: AlterConfigOpType, value: str | None) -> None:
        res = ConfigResource(ResourceType.GROUP, group,
                             incremental_configs=[ConfigEntry(key, value, incremental_operation=op)])
        [f] = a1.incremental_alter_configs([res]).values()
        f.result(10)

    a2 = KafkaAdminClient(bootstrap_servers=cluster.b2.bootstrap)
    try:
        def on_b2() -> str:
            res = a2.describe_configs([KpConfigResource(ConfigResourceType.GROUP, group)], config_filter="all")
            return str(res["group"][group][key]["value"])

        alter(AlterConfigOpType.SET, "6000")
        assert zp.parse_config(zk_client.get(zp.group_config_path(group))[0]) == {key: "6000"}
        assert zp.group_config_path(group) == "/config/groups/zk%2Fgroup"
        wait_for(lambda: on_b2() == "6000", "the group config seen through broker 2")
        alter(AlterConfigOpType.DELETE, None)
        assert not zk_client.exists(zp.group_config_path(group))
        wait_for(lambda: on_b2() == "5000", "the group config's removal seen through broker 2")
    finally:
        a2.close()


# ---------------------------------------------------------------- failures


def test_second_broker_with_same_id_fails(cluster: Cluster, tmp_path: Path) -> None:
    dup = BrokerProcess(tmp_path / "dup", zk_overrides(cluster.zk, 2))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 1"):
        dup.start()
    assert time.monotonic() - t0 < 15
    log = dup.read_log()
    assert "broker.id 2 is already registered" in log, log[-2000:]
    # the cluster is untouched
    assert broker_ids(cluster.b1) == {1, 2}
    assert cluster.b2.alive()


def test_zookeeper_down_at_startup_fails_within_timeout(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    b = BrokerProcess(
        tmp_path / "nozk",
        {"zookeeper.connect": f"127.0.0.1:{port}", "broker.id": "7", "zookeeper.connection.timeout.ms": "2000"},
    )
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 1"):
        b.start(timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed < 12, elapsed
    log = b.read_log()
    assert "not reachable" in log  # the retry lines
    assert f"Timed out waiting for connection to ZooKeeper at 127.0.0.1:{port}" in log, log[-2000:]


def test_chroot_is_created_and_is_a_separate_cluster(cluster: Cluster, zk_client: KazooClient, tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "chroot", zk_overrides(cluster.zk, 1, **{"zookeeper.connect": cluster.zk.connect + "/kb/c2"}))
    b.start()
    try:
        assert brokers_and_controller(b) == ({1}, 1)
        assert zk_client.get_children("/kb/c2/brokers/ids") == ["1"]
        own = zp.loads(zk_client.get("/kb/c2" + zp.CLUSTER_ID)[0])["id"]
        assert describe_cluster(b)["cluster_id"] == own != describe_cluster(cluster.b2)["cluster_id"]
    finally:
        b.stop()


def test_killed_controller_leaves_and_controller_moves(cluster: Cluster, zk_client: KazooClient) -> None:
    assert brokers_and_controller(cluster.b2) == ({1, 2}, 1)
    cluster.b1.kill()  # kill -9: its session lingers until the session timeout
    elapsed = wait_for(
        lambda: brokers_and_controller(cluster.b2) == ({2}, 2),
        "broker 1 gone and broker 2 controller",
        timeout=SESSION_MS / 1000 + 10,
    )
    assert elapsed < SESSION_MS / 1000 + 6
    assert zp.loads(zk_client.get(zp.CONTROLLER)[0])["brokerid"] == 2
    md = confluent_metadata(cluster.b2, "zk-shared")
    assert set(md.brokers) == {2} and md.controller_id == 2
    # topics survive in ZooKeeper: broker 2 still serves its own partitions
    assert len(md.topics["zk-shared"].partitions) == PARTITIONS

    # Broker 1 comes back (same port, same log dir): topics from ZooKeeper, data from disk
    cluster.b1.start()
    wait_for(lambda: brokers_and_controller(cluster.b2) == ({1, 2}, 2), "broker 1 registered again")
    assert brokers_and_controller(cluster.b1) == ({1, 2}, 2)
    got = consume_all(cluster.b1, "zk-shared", PARTITIONS, PARTITIONS * 5)
    assert {p: len(v) for p, v in got.items()} == {p: 5 for p in range(PARTITIONS)}


def test_restart_right_after_kill_waits_for_its_stale_registration(cluster: Cluster) -> None:
    cluster.b2.kill()
    t0 = time.monotonic()
    cluster.b2.start(timeout=SESSION_MS / 1000 + 15)
    assert time.monotonic() - t0 < SESSION_MS / 1000 + 8
    log = cluster.b2.read_log()
    assert log.count("startup waits up to") == 1, log[-3000:]
    assert "stale registration of broker.id 2 expired after" in log, log[-3000:]
    wait_for(lambda: brokers_and_controller(cluster.b1) == ({1, 2}, 1), "both brokers registered after the restart")
    got = consume_all(cluster.b2, "zk-shared", PARTITIONS, PARTITIONS * 5)
    assert sum(map(len, got.values())) == PARTITIONS * 5


def test_session_expiry_re_registers(cluster: Cluster) -> None:
    """Broker 1 frozen past its session timeout: ZooKeeper expires it; thawed, it registers again."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    assert cluster.b1.proc is not None
    os.kill(cluster.b1.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: brokers_and_controller(cluster.b2)[0] == {2}, "broker 1's session expired",
                 timeout=SESSION_MS / 1000 + 10)
        assert brokers_and_controller(cluster.b2) == ({2}, 2)
    finally:
        os.kill(cluster.b1.proc.pid, signal.SIGCONT)
    wait_for(lambda: brokers_and_controller(cluster.b2) == ({1, 2}, 2), "broker 1 registered again")
    log = cluster.b1.read_log()
    assert "session expired" in log, log[-3000:]
    # it still serves its partitions
    got = consume_all(cluster.b2, "zk-shared", PARTITIONS, PARTITIONS * 5)
    assert sum(map(len, got.values())) == PARTITIONS * 5


def test_zookeeper_outage_keeps_serving(cluster: Cluster) -> None:
    zk = cluster.zk
    zk.stop()
    try:
        # Both brokers keep serving what they know: metadata and produce/consume of their partitions
        time.sleep(1.0)
        assert brokers_and_controller(cluster.b1)[0] == {1, 2}
        produce_to_every_partition(cluster.b1, "zk-shared", PARTITIONS, 1)
        got = consume_all(cluster.b2, "zk-shared", PARTITIONS, PARTITIONS * 6)
        assert sum(map(len, got.values())) == PARTITIONS * 6
    finally:
        zk.start()
    wait_for(lambda: brokers_and_controller(cluster.b1)[0] == {1, 2} and brokers_and_controller(cluster.b2)[0] == {1, 2},
             "both brokers registered after the outage", timeout=SESSION_MS / 1000 + 15)
    for b in (cluster.b1, cluster.b2):
        assert "Lost the connection to ZooKeeper" in b.read_log()


def test_clean_restart_of_both_keeps_topics_and_data(cluster: Cluster) -> None:
    cluster.b1.stop()
    cluster.b2.stop()
    cluster.b2.start()
    cluster.b1.start()
    # broker 2 starts first after the clean stop, so it is the controller
    wait_for(lambda: brokers_and_controller(cluster.b1) == ({1, 2}, 2), "both brokers back")
    wait_for_topic(cluster.b1, "zk-shared")
    got = consume_all(cluster.b1, "zk-shared", PARTITIONS, PARTITIONS * 6)
    assert {p: len(v) for p, v in got.items()} == {p: 6 for p in range(PARTITIONS)}
