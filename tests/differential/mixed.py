"""`python -m tests.differential.mixed [--kbroker-first]`: a probe of a mixed cluster, one Apache Kafka 3.9 broker (id 1) and one
kbroker (id 0) on one ZooKeeper; prints what each sees and whether a replicated topic takes and serves records."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from kbroker.protocol import records as R
from kbroker.protocol.messages import ProduceRequest

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess


def _describe(name: str, bootstrap: str, topic: str) -> str:
    try:
        with WireClient(bootstrap, timeout=10) as c:
            md = c.metadata([topic])
    except Exception as e:  # noqa: BLE001 - a probe reports whatever went wrong
        return f"{name}: metadata failed: {type(e).__name__}: {e}"
    brokers = sorted(b.node_id for b in md.brokers)
    parts = [
        (p.partition_index, p.error_code, p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
        for t in md.topics
        for p in t.partitions
    ]
    return f"{name}: controller {md.controller_id}, brokers {brokers}, {topic} partitions {parts}"


def _produce(bootstrap: str, partition: int) -> tuple[bool, str]:
    """acks=all to the partition's leader: success means the follower of the other kind caught up (high watermark)."""
    now = int(time.time() * 1000)
    req = ProduceRequest(
        acks=-1,
        timeout_ms=10000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="mixed",
                partition_data=[
                    ProduceRequest.PartitionProduceData(
                        index=partition,
                        records=R.build_batch([(b"k", b"v%d" % i, [], now) for i in range(3)]),
                    )
                ],
            )
        ],
    )
    try:
        with WireClient(bootstrap, timeout=15) as c:
            part = c.request(0, 9, req).responses[0].partition_responses[0]
    except Exception as e:  # noqa: BLE001 - a probe reports whatever went wrong
        return False, f"failed: {type(e).__name__}: {e}"
    return part.error_code == 0, f"error {part.error_code}, base offset {part.base_offset}"


def main(kbroker_first: bool = False) -> int:
    from bench.peers.kafka import KafkaPeer
    from bench.peers.maven import ArtifactUnavailable
    from bench.peers.zookeeper import ZooKeeperServer

    with tempfile.TemporaryDirectory(prefix="mixed-") as tmp:
        root = Path(tmp)
        zk = ZooKeeperServer(root / "zk").start()
        kafka = KafkaPeer(
            "3.9",
            mode="zk",
            zookeeper=zk.connect,
            broker_id=1,
            base=root / "kafka",
            overrides={
                "inter.broker.protocol.version": "3.9",
                "offsets.topic.replication.factor": "2",
                "default.replication.factor": "2",
            },
        )
        ours = BrokerProcess(
            root / "kbroker",
            overrides={"zookeeper.connect": zk.connect, "broker.id": "0", "default.replication.factor": "2"},
        )
        try:
            if kbroker_first:  # the first broker up takes /controller: kbroker drives Kafka's replicas
                ours.start()
                time.sleep(3)
            try:
                kafka.start()
            except ArtifactUnavailable as e:
                print(f"Kafka 3.9 is unavailable here: {e}", file=sys.stderr)
                return 2
            if not kbroker_first:
                ours.start()
            time.sleep(5)
            controller = (
                ours.bootstrap if kbroker_first else kafka.bootstrap
            )  # ZooKeeper mode: to the controller
            with WireClient(controller) as c:
                try:
                    c.create_topic("mixed", partitions=2, replication_factor=2)
                    print(f"CreateTopics via the controller ({'kbroker' if kbroker_first else 'kafka'}): ok")
                    ok = True
                except Exception as e:  # noqa: BLE001
                    print(f"CreateTopics via the controller: {e}")
                    ok = False
            time.sleep(5)
            by_id = {0: ("kbroker", ours.bootstrap), 1: ("kafka", kafka.bootstrap)}
            with WireClient(kafka.bootstrap) as c:
                leaders = {
                    p.partition_index: p.leader_id for t in c.metadata(["mixed"]).topics for p in t.partitions
                }
            for partition, leader in sorted(leaders.items()):
                kind, address = by_id[leader]
                produced, text = _produce(address, partition)
                ok = ok and produced
                print(f"produce acks=all to mixed-{partition} (leader {kind}): {text}")
            print(_describe("kafka", kafka.bootstrap, "mixed"))
            print(_describe("kbroker", ours.bootstrap, "mixed"))
            print("kbroker log tail:\n" + ours.read_log()[-1500:])
            print("kafka log tail:\n" + kafka.read_log(1500))
        finally:
            ours.stop()
            kafka.stop()
            zk.stop()
    return 0 if ok and len(leaders) == 2 else 1


if __name__ == "__main__":
    sys.exit(main(kbroker_first="--kbroker-first" in sys.argv[1:]))
