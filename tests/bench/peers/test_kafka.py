"""bench.peers.kafka starts real Apache Kafka brokers (3.9 on ZooKeeper, 4.x on KRaft) that librdkafka round-trips
records through, and a KRaft broker comes back with its data after kill -9."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench.peers.kafka import ArtifactUnavailable, KafkaPeer
from tests.clients import Msg, ck_consume, ck_produce

MSGS = [
    Msg(f"k{i}".encode(), f"value {i}".encode() * (i + 1), (("h", str(i).encode()),), partition=i % 3)
    for i in range(30)
]


def _started(peer: KafkaPeer) -> KafkaPeer:
    try:
        return peer.start()
    except ArtifactUnavailable as e:
        peer.close()
        pytest.skip(f"Apache Kafka {peer.version} cannot run here: {e}")


def _create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(60)


def _round_trip(peer: KafkaPeer, topic: str) -> None:
    delivered = ck_produce(peer.bootstrap, topic, MSGS)
    assert sorted((r.partition, r.offset) for r in delivered) == sorted((i % 3, i // 3) for i in range(30))
    got = ck_consume(peer.bootstrap, topic, range(3), len(MSGS), timeout=60)
    assert sorted((r.partition, r.key, r.value, r.headers) for r in got) == sorted(
        (m.partition, m.key, m.value, m.headers) for m in MSGS
    )


@pytest.fixture
def kraft(tmp_path: Path) -> Iterator[KafkaPeer]:
    peer = _started(KafkaPeer("4", mode="kraft", base=tmp_path / "kafka"))
    yield peer
    peer.close()


def test_kafka_39_on_zookeeper_round_trips_records(tmp_path: Path) -> None:
    peer = _started(KafkaPeer("3.9", mode="zk", base=tmp_path / "kafka"))
    try:
        assert peer.mode == "zk" and peer.zookeeper and peer.started_in is not None
        assert (peer.log_dirs / "meta.properties").read_text().count("broker.id=0") == 1
        _create_topic(peer.bootstrap, "peer-zk")
        _round_trip(peer, "peer-zk")
    finally:
        peer.close()


def test_kafka_4_on_kraft_round_trips_records_and_survives_kill(kraft: KafkaPeer) -> None:
    assert kraft.version.startswith("4.") and kraft.bootstrap == f"127.0.0.1:{kraft.port}"
    _create_topic(kraft.bootstrap, "peer-kraft")
    _round_trip(kraft, "peer-kraft")
    kraft.kill()
    kraft.start()  # the same node on its formatted metadata log, same port
    got = ck_consume(kraft.bootstrap, "peer-kraft", range(3), len(MSGS), timeout=60)
    assert len(got) == len(MSGS)


def test_zookeeper_mode_is_refused_for_kafka_4() -> None:
    with pytest.raises(ValueError, match="no ZooKeeper mode"):
        KafkaPeer("4", mode="zk")
