"""Remembered Metadata answers (broker/metadata_answers.py) on three real brokers sharing a real ZooKeeper: after a
topic is created, gets partitions, has its leaders moved, loses a broker and is deleted, no broker answers a request
it has answered before (and so remembered) with what was true before the change.

Each check asks each broker a probe first: Metadata for the topic and a missing one, an answer with an error and so
built anew every time (the broker's state as it is). Then the same broker's answer to the requests asked before the
change (the same bytes on the same connection: remembered) must show no older state than the probe did, and
confluent-kafka and kafka-python (asking whichever broker they like) must see what every broker's probe shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka import KafkaAdminClient, TopicPartition
from kbroker.protocol.messages import MetadataRequest

from tests.broker_process import BrokerProcess, wait_all_registered
from tests.clients import RawClient
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

BROKERS = (1, 2, 3)
TOPIC = "ma-cluster"
ABSENT = "ma-cluster-absent"
T = MetadataRequest.MetadataRequestTopic
# (leader, leader epoch, replicas, isr) by partition; None: the topic is unknown to the broker.
View = dict[int, tuple[int, int, tuple[int, ...], tuple[int, ...]]] | None


@pytest.fixture(scope="module")
def cluster(
    zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, BrokerProcess]]:
    base: Path = tmp_path_factory.mktemp("answers-cluster")
    brokers = {
        b: BrokerProcess(
            base / f"b{b}",
            {
                "zookeeper.connect": zookeeper.connect,
                "broker.id": str(b),
                "zookeeper.session.timeout.ms": "3000",
                "auto.create.topics.enable": "false",
                "auto.leader.rebalance.enable": "false",
                "controlled.shutdown.retry.backoff.ms": "200",
            },
            env={"KBROKER_METADATA_CACHE": "1"},
        )
        for b in BROKERS
    }
    for b in BROKERS:
        brokers[b].start()
    wait_all_registered(list(brokers.values()), timeout=15)
    yield brokers
    for b in brokers.values():
        b.stop()


def _view(resp: Any, topic: str) -> tuple[list[int], View]:
    brokers = sorted(b.node_id for b in resp.brokers)
    t = next(t for t in resp.topics if t.name == topic)
    if t.error_code:
        return brokers, None
    return brokers, {
        p.partition_index: (p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes))
        for p in t.partitions
    }


def probe(b: BrokerProcess) -> tuple[list[int], View]:
    """The broker's state now: an answer with an error (the absent topic) is never remembered."""
    with RawClient(b.bootstrap) as raw:
        resp = raw.request(
            3, 12, MetadataRequest(topics=[T(name=TOPIC), T(name=ABSENT)], allow_auto_topic_creation=False)
        )
    return _view(resp, TOPIC)


class Asker:
    """The same two requests asked again and again on one connection to one broker: the topic, and all topics."""

    def __init__(self, b: BrokerProcess) -> None:
        self.broker = b
        self.raw: RawClient | None = None

    def ask(self) -> tuple[tuple[list[int], View], bool]:
        if self.raw is None:
            self.raw = RawClient(self.broker.bootstrap)
        one = self.raw.request(
            3, 12, MetadataRequest(topics=[T(name=TOPIC)], allow_auto_topic_creation=False)
        )
        every = self.raw.request(3, 12, MetadataRequest(topics=None, allow_auto_topic_creation=False))
        return _view(one, TOPIC), TOPIC in {t.name for t in every.topics}

    def close(self) -> None:
        if self.raw is not None:
            self.raw.sock.close()
            self.raw = None


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except OSError:  # a broker still starting or stopping: ask again (a failed check is raised)
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def no_stale_answer(
    cluster: dict[int, BrokerProcess], askers: dict[int, Asker], settled: Callable[[View], bool], what: str
) -> tuple[list[int], View]:
    """Until every live broker's probe shows the change (`settled`) and all agree; meanwhile and then, each
    broker's remembered answers are never older than its probe just before. The final common view."""
    live = [b for b in BROKERS if cluster[b].alive()]

    def checked(b: int) -> tuple[list[int], View]:
        before = probe(cluster[b])
        (brokers, view), listed = askers[b].ask()
        after = probe(cluster[b])
        if before == after:  # nothing changed meanwhile: the remembered answers must be exactly the probe's
            assert (brokers, view) == before, (what, b, before, (brokers, view))
            assert listed == (view is not None), (what, b, listed, view)
        return after

    def all_settled() -> bool:
        views = [checked(b) for b in live]
        return all(v == views[0] and settled(v[1]) for v in views)

    wait_for(all_settled, what)
    return checked(live[0])


def clients_see(cluster: dict[int, BrokerProcess], expected: tuple[list[int], View]) -> None:
    """confluent-kafka and kafka-python, bootstrapped on each live broker, see the settled state at once."""
    brokers, view = expected
    for b in BROKERS:
        if not cluster[b].alive():
            continue
        ck = AdminClient({"bootstrap.servers": cluster[b].bootstrap})
        md = ck.list_topics(timeout=10)
        assert sorted(md.brokers) == brokers
        assert (TOPIC in md.topics) == (view is not None)
        t = ck.list_topics(topic=TOPIC, timeout=10).topics[TOPIC]
        if view is None:
            assert t.error is not None
        else:
            assert {p: (pm.leader, tuple(pm.replicas), tuple(pm.isrs)) for p, pm in t.partitions.items()} == {
                p: (leader, replicas, isr) for p, (leader, _, replicas, isr) in view.items()
            }
        kp = KafkaAdminClient(bootstrap_servers=cluster[b].bootstrap, request_timeout_ms=10000)
        try:
            assert (TOPIC in kp.list_topics()) == (view is not None)
            if view is not None:
                (d,) = kp.describe_topics([TOPIC])
                assert {
                    p["partition_index"]: (p["leader_id"], tuple(p["replica_nodes"]), tuple(p["isr_nodes"]))
                    for p in d["partitions"]
                } == {p: (leader, replicas, isr) for p, (leader, _, replicas, isr) in view.items()}
        finally:
            kp.close()


def test_no_broker_answers_from_before_a_change(cluster: dict[int, BrokerProcess]) -> None:
    askers = {b: Asker(cluster[b]) for b in BROKERS}
    try:
        for a in askers.values():
            a.ask()  # remembered from now on (an unknown topic is an error: its answer is not)
        ck = AdminClient({"bootstrap.servers": cluster[1].bootstrap})

        def led(n: int) -> Callable[[View], bool]:
            return lambda v: v is not None and len(v) == n and all(leader >= 0 for leader, *_ in v.values())

        ck.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC].result(15)
        clients_see(cluster, no_stale_answer(cluster, askers, led(3), "created"))
        ck.create_partitions([NewPartitions(TOPIC, 5)])[TOPIC].result(15)
        state = no_stale_answer(cluster, askers, led(5), "partitions added")
        clients_see(cluster, state)

        # A leader moved: partition 0's replicas reordered, then the preferred leader elected.
        assert state[1] is not None
        leader0, epoch0, replicas0, _ = state[1][0]
        reordered = [*replicas0[1:], replicas0[0]]
        kp = KafkaAdminClient(bootstrap_servers=cluster[2].bootstrap, request_timeout_ms=10000)
        try:
            kp.alter_partition_reassignments({TopicPartition(TOPIC, 0): reordered})
        finally:
            kp.close()
        wait_for(
            lambda: probe(cluster[3])[1] is not None and probe(cluster[3])[1][0][2] == tuple(reordered),  # type: ignore[index]
            "reassignment done",
        )
        errors = ck.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition(TOPIC, 0)]).result(15)
        assert errors[CKTopicPartition(TOPIC, 0)] is None
        state = no_stale_answer(
            cluster,
            askers,
            lambda v: v is not None and v[0][0] == reordered[0] and v[0][1] > epoch0,
            "leader moved",
        )
        assert state[1] is not None and state[1][0][0] != leader0
        clients_see(cluster, state)

        # A broker goes (controlled shutdown: its leaderships move first) and comes back.
        gone = 3
        cluster[gone].stop()
        askers[gone].close()
        state = no_stale_answer(
            cluster,
            askers,
            lambda v: (
                v is not None
                and all(leader not in (gone, -1) and gone not in isr for leader, _, _, isr in v.values())
            ),
            "broker 3 gone",
        )
        assert state[0] == [1, 2]
        clients_see(cluster, state)
        cluster[gone].start()
        state = no_stale_answer(
            cluster,
            askers,
            lambda v: v is not None and all(sorted(isr) == [1, 2, 3] for *_, isr in v.values()),
            "broker 3 back in every ISR",
        )
        assert state[0] == [1, 2, 3]
        clients_see(cluster, state)

        ck.delete_topics([TOPIC])[TOPIC].result(15)
        state = no_stale_answer(cluster, askers, lambda v: v is None, "deleted")
        clients_see(cluster, state)
    finally:
        for a in askers.values():
            a.close()
