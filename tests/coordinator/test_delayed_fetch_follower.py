"""A follower's Fetch parked on its leader (broker/delayed_fetch.py), on a real two-broker cluster, with the leader
answering followers on its direct path (follower_fetch._FollowerPoll) and on the general one
(KBROKER_FOLLOWER_FETCH_DIRECT=0: handle_fetch's long poll): with replica.fetch.wait.max.ms at 20 s, a record
produced is replicated well before that (the parked Fetch woken by the append), and when the follower dies its
parked Fetch leaves the leader's purgatory at once (Kafka's DelayedOperationPurgatory gauges back to 0), not at the
end of its wait."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.test_metrics import scrape, value
from tests.broker_process import BrokerProcess, free_port, wait_all_registered, wait_for_port
from tests.coordinator.test_replication_paths import wait_for
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

WAIT_MS = 20_000


def _delayed(port: int) -> float:
    return value(
        scrape(port), "kafka_server_delayedoperationpurgatory_numdelayedoperations", delayedOperation="Fetch"
    )


@pytest.mark.parametrize("direct", ["1", "0"])
def test_a_parked_follower_fetch_is_woken_and_released(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory, direct: str
) -> None:
    base = tmp_path_factory.mktemp(f"follower{direct}")
    # One ZooKeeper for the module: other broker ids and another topic each time.
    lead, follow = (1, 2) if direct == "1" else (3, 4)
    topic = f"parked-follower-{direct}"
    port = free_port()
    common = {
        "zookeeper.connect": zookeeper.connect,
        "zookeeper.session.timeout.ms": "4000",
        "replica.fetch.wait.max.ms": str(WAIT_MS),
        "auto.leader.rebalance.enable": "false",
    }
    leader = BrokerProcess(
        base / "b1",
        {**common, "broker.id": str(lead), "metrics.port": str(port)},
        env={"KBROKER_FOLLOWER_FETCH_DIRECT": direct},
    )
    follower = BrokerProcess(base / "b2", {**common, "broker.id": str(follow)})
    brokers = [leader, follower]
    try:
        for b in brokers:
            b.start()
        wait_all_registered(brokers, timeout=30)
        wait_for_port(port)
        admin = AdminClient({"bootstrap.servers": leader.bootstrap})

        def created() -> bool:
            # Retried: the controller of the module's last cluster may hold ZooKeeper until its session expires.
            try:
                admin.create_topics([NewTopic(topic, 1, replica_assignment=[[lead, follow]])])[topic].result(
                    30
                )
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            return True

        wait_for(created, "the topic created")

        def in_sync() -> bool:
            md = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions[0]
            return md.leader == lead and set(md.isrs) == {lead, follow}

        wait_for(in_sync, "the follower in the ISR")
        # The follower's Fetch parks for up to 20 s; a record produced with acks=all needs it woken.
        wait_for(lambda: _delayed(port) >= 1, "the follower's Fetch parked on the leader", timeout=30)
        p = Producer({"bootstrap.servers": leader.bootstrap, "acks": "all", "linger.ms": 0})
        errors: list[object] = []
        t0 = time.monotonic()
        p.produce(topic, value=b"v", partition=0, on_delivery=lambda err, _m: errors.append(err))
        assert p.flush(15) == 0 and errors == [None]
        assert time.monotonic() - t0 < 5.0, "replicated when woken, not after replica.fetch.wait.max.ms"
        wait_for(lambda: _delayed(port) >= 1, "the follower's next Fetch parked", timeout=30)
        follower.kill()
        t0 = time.monotonic()
        wait_for(
            lambda: _delayed(port) == 0, "the dead follower's Fetch out of the leader's purgatory", timeout=10
        )
        assert time.monotonic() - t0 < 5.0, "released when its connection closed, not at its deadline"
    finally:
        leader.stop()  # cleanly: out of ZooKeeper (it may be the controller) for the next cluster of the module
        follower.kill()
