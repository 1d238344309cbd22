"""Replication's data path with three real brokers on a real ZooKeeper: acks=all and min.insync.replicas, a
follower catching up 100,000 records and rejoining the ISR, a diverged follower truncating to the new leader's
epoch boundary, and idempotent producers keeping their sequence state across a leader change.

The tests share one cluster and run in file order; each leaves all three brokers running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ProduceRequest
from kbroker.protocol.records import build_batch
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.broker_process import BrokerProcess, free_port, wait_all_registered
from tests.clients import RawClient
from tests.storage.storage_helpers import read_all
from tests.zookeeper import ZooKeeperServer, zookeeper_missing

pytestmark = pytest.mark.skipif(zookeeper_missing() is not None, reason=zookeeper_missing() or "")

SESSION_MS = 4000
LAG_MS = 2000


class Cluster:
    def __init__(self, zk: ZooKeeperServer, base: Path) -> None:
        self.metrics_port = free_port()  # broker 1's Prometheus endpoint
        self.brokers = {
            i: BrokerProcess(base / f"b{i}", {
                "zookeeper.connect": zk.connect, "broker.id": str(i),
                "zookeeper.session.timeout.ms": str(SESSION_MS), "zookeeper.connection.timeout.ms": "5000",
                "replica.lag.time.max.ms": str(LAG_MS), "replica.fetch.backoff.ms": "200",
                "auto.leader.rebalance.enable": "false", "offsets.topic.replication.factor": "3",
                "transaction.state.log.replication.factor": "3",
                **({"metrics.port": str(self.metrics_port), "metrics.host": "127.0.0.1"} if i == 1 else {}),
            }) for i in (1, 2, 3)
        }

    def __getitem__(self, i: int) -> BrokerProcess:
        return self.brokers[i]

    def live(self) -> list[BrokerProcess]:
        return [b for b in self.brokers.values() if b.alive()]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.live())

    def partition(self, topic: str, p: int = 0) -> Any:
        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic=topic, timeout=10)
        return md.topics[topic].partitions[p]

    def wait_isr(self, topic: str, isr: set[int], leader: int | None = None, timeout: float = 60.0) -> None:
        def ok() -> bool:
            part = self.partition(topic)
            return set(part.isrs) == isr and (leader is None or part.leader == leader)
        wait_for(ok, f"{topic}-0 ISR {sorted(isr)} (leader {leader})", timeout)

    def restart(self, i: int) -> None:
        self.brokers[i].start()
        # A broker always lists itself; the others (the controller among them) list it only once its new
        # registration is in ZooKeeper, which after a kill -9 waits for the old session to expire.
        wait_for(lambda: all(i in AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=5).brokers
                             for b in self.live()), f"broker {i} registered, as every live broker sees it")

    def stop(self) -> None:
        for b in self.brokers.values():
            if b.proc is not None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(zookeeper, tmp_path_factory.mktemp("replication"))
    try:
        for b in c.brokers.values():
            b.start()
        wait_all_registered(list(c.brokers.values()), timeout=30)
        yield c
    finally:
        c.stop()


def wait_for(cond, what: str, timeout: float = 30.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if cond():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001  (a broker still starting or gone: ask again)
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what}")


def create_topic(c: Cluster, name: str, replicas: list[int], **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[replicas], config=configs)]).values():
        f.result(20)
    c.wait_isr(name, set(replicas), leader=replicas[0])


def raw_produce(b: BrokerProcess, topic: str, values: list[bytes], acks: int = -1) -> tuple[int, int]:
    """One Produce v9 to the broker: (error code, base offset)."""
    batch = build_batch([(None, v, [], int(time.time() * 1000)) for v in values])
    req = ProduceRequest(transactional_id=None, acks=acks, timeout_ms=10000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.PartitionProduceData(index=0, records=batch)])])
    with RawClient(b.bootstrap) as client:
        resp = client.request(0, 9, req)
    pr = resp.responses[0].partition_responses[0]
    return pr.error_code, pr.base_offset


def produce_when_leader(b: BrokerProcess, topic: str, values: list[bytes]) -> tuple[int, int]:
    """raw_produce, retried while the broker has not yet heard it leads (Metadata may come first)."""
    result: list[tuple[int, int]] = []

    def attempt() -> bool:
        result[:] = [raw_produce(b, topic, values)]
        return result[0][0] != ErrorCode.NOT_LEADER_OR_FOLLOWER
    wait_for(attempt, f"broker to lead {topic}-0", 20)
    return result[0]


def under_replicated(c: Cluster) -> float:
    """Broker 1's kafka_server_replicamanager_underreplicatedpartitions."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("kafka_server_replicamanager_underreplicatedpartitions "):
            return float(line.split()[1])
    raise AssertionError("no underreplicatedpartitions metric")


def consume(c: Cluster, topic: str, count: int, timeout: float = 60.0) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "replication-tests",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(10000, 0.5):
                if m.error() is None:
                    out.append((m.offset(), m.value()))
        return out
    finally:
        consumer.close()


def local_copy(b: BrokerProcess, topic: str, dest: Path) -> Log:
    """Open a copy of a broker's log of topic-0 (the broker keeps writing to its own)."""
    shutil.copytree(b.data_dir / "logs" / f"{topic}-0", dest / f"{topic}-0")
    return Log.open(dest / f"{topic}-0", topic, 0, LogConfig(), clean_shutdown=False)


# ---------------------------------------------------------------- acks=all and min.insync.replicas


def test_acks_all_waits_for_the_isr_and_refuses_below_min_insync(cluster: Cluster) -> None:
    create_topic(cluster, "acks-all", [1, 2, 3], **{"min.insync.replicas": "2"})
    code, base = produce_when_leader(cluster[1], "acks-all", [b"a", b"b"])
    assert (code, base) == (ErrorCode.NONE, 0)
    # The answer came once the followers had the batch: the high watermark is past it.
    assert [v for _, v in consume(cluster, "acks-all", 2)] == [b"a", b"b"]

    cluster[2].kill()
    cluster[3].kill()
    cluster.wait_isr("acks-all", {1}, leader=1, timeout=30)
    time.sleep(0.5)  # the leader applies the shrunk ISR from the controller's AlterPartition answer
    code, _ = raw_produce(cluster[1], "acks-all", [b"c"])
    assert code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert under_replicated(cluster) >= 1
    # acks=1 does not ask for the ISR.
    assert raw_produce(cluster[1], "acks-all", [b"d"], acks=1) == (ErrorCode.NONE, 2)

    cluster.restart(2)
    cluster.restart(3)
    cluster.wait_isr("acks-all", {1, 2, 3}, leader=1)
    assert raw_produce(cluster[1], "acks-all", [b"e"]) == (ErrorCode.NONE, 3)
    wait_for(lambda: under_replicated(cluster) == 0, "no under-replicated partition on broker 1")


def set_cluster_default(b: BrokerProcess, broker_id: int, key: str, value: str | None, resource: str = "") -> None:
    """IncrementalAlterConfigs (kafka-python's protocol classes) on the default BROKER resource "" (or `resource`, a
    broker's own): SET, or DELETE for None, as `kafka-configs --entity-type brokers --entity-default` does."""
    from kafka.protocol.admin.configs import IncrementalAlterConfigsRequest

    from tests.clients import KpRaw

    with KpRaw(b.bootstrap) as raw:
        resp = raw.send(IncrementalAlterConfigsRequest(resources=[(4, resource, [(key, 0 if value else 1, value)])],
                                                       validate_only=False), node_id=broker_id)
    assert [(r.error_code, r.error_message) for r in resp.responses] == [(0, None)]


def broker_config_synonyms(b: BrokerProcess, broker_id: int, key: str) -> list[tuple[str, str, int]]:
    from kafka.protocol.admin.configs import DescribeConfigsRequest

    from tests.clients import KpRaw

    with KpRaw(b.bootstrap) as raw:
        resp = raw.send(DescribeConfigsRequest(resources=[(4, str(broker_id), [key])], include_synonyms=True),
                        node_id=broker_id)
    [r] = resp.results
    [c] = r.configs
    return [(s.name, s.value, s.source) for s in c.synonyms]


def test_cluster_wide_dynamic_min_insync_replicas_applies_on_every_broker(cluster: Cluster) -> None:
    """Kafka 4.x clients' admin tools set min.insync.replicas cluster-wide (the default BROKER resource): set through
    broker 3, it holds at once on the leaders on brokers 1 and 2 (ZooKeeper's config change notification), a topic
    override still wins, and deleting it restores the static value."""
    create_topic(cluster, "mis-default-1", [1, 2])
    create_topic(cluster, "mis-default-2", [2, 1])
    create_topic(cluster, "mis-override", [1, 2], **{"min.insync.replicas": "1"})
    assert produce_when_leader(cluster[1], "mis-default-1", [b"a"]) == (ErrorCode.NONE, 0)
    assert produce_when_leader(cluster[2], "mis-default-2", [b"a"]) == (ErrorCode.NONE, 0)
    set_cluster_default(cluster[3], 3, "min.insync.replicas", "3")
    try:
        # Two replicas in sync, three required: refused on both leaders once the change notification arrived.
        for b, topic in ((cluster[1], "mis-default-1"), (cluster[2], "mis-default-2")):
            wait_for(lambda b=b, topic=topic: raw_produce(b, topic, [b"x"])[0] == ErrorCode.NOT_ENOUGH_REPLICAS,
                     f"NOT_ENOUGH_REPLICAS from the leader of {topic}", 20)
        assert raw_produce(cluster[1], "mis-override", [b"y"]) == (ErrorCode.NONE, 0)
    finally:
        set_cluster_default(cluster[3], 3, "min.insync.replicas", None)
    wait_for(lambda: raw_produce(cluster[1], "mis-default-1", [b"z"])[0] == ErrorCode.NONE,
             "acks=all accepted again on broker 1", 20)
    assert raw_produce(cluster[2], "mis-default-2", [b"z"])[0] == ErrorCode.NONE


def test_a_brokers_own_dynamic_config_overrides_the_default_on_that_broker_only(cluster: Cluster) -> None:
    """Kafka's per-broker dynamic config (resource name = the broker id, sent to that broker, stored in
    /config/brokers/<id>) wins over the cluster-wide default on that broker and nowhere else."""
    create_topic(cluster, "mis-own-1", [1, 2])
    create_topic(cluster, "mis-own-2", [2, 1])
    set_cluster_default(cluster[1], 1, "min.insync.replicas", "1")
    set_cluster_default(cluster[1], 1, "min.insync.replicas", "3", resource="1")
    try:
        wait_for(lambda: raw_produce(cluster[1], "mis-own-1", [b"x"])[0] == ErrorCode.NOT_ENOUGH_REPLICAS,
                 "NOT_ENOUGH_REPLICAS from broker 1", 20)
        assert produce_when_leader(cluster[2], "mis-own-2", [b"x"])[0] == ErrorCode.NONE
        # DYNAMIC_BROKER_CONFIG (2) ahead of DYNAMIC_DEFAULT_BROKER_CONFIG (3), then the default (5).
        assert broker_config_synonyms(cluster[1], 1, "min.insync.replicas") == [
            ("min.insync.replicas", "3", 2), ("min.insync.replicas", "1", 3), ("min.insync.replicas", "1", 5)]
        assert broker_config_synonyms(cluster[2], 2, "min.insync.replicas")[0] == ("min.insync.replicas", "1", 3)
    finally:
        set_cluster_default(cluster[1], 1, "min.insync.replicas", None, resource="1")
        set_cluster_default(cluster[1], 1, "min.insync.replicas", None)
    wait_for(lambda: raw_produce(cluster[1], "mis-own-1", [b"z"])[0] == ErrorCode.NONE, "broker 1 accepts again", 20)


def answered(raw: RawClient) -> bool:
    """Whether response bytes wait on the socket (without reading them)."""
    timeout = raw.sock.gettimeout()
    raw.sock.setblocking(False)  # with a timeout set, recv would wait for data despite MSG_DONTWAIT
    try:
        return bool(raw.sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        raw.sock.settimeout(timeout)


def test_a_produce_waiting_for_the_isr_does_not_hold_up_the_next_one(cluster: Cluster) -> None:
    """Produce pipelining: while an acks=all Produce waits for a stopped follower, the next Produce on the same
    connection is appended; the answers still come back in request order."""
    from kbroker.protocol import codec

    create_topic(cluster, "pipelined", [1, 2])
    assert produce_when_leader(cluster[1], "pipelined", [b"warm"]) == (ErrorCode.NONE, 0)
    segment = cluster[1].data_dir / "logs" / "pipelined-0" / "00000000000000000000.log"

    def request(acks: int, value: bytes) -> tuple[ProduceRequest, int]:
        batch = build_batch([(None, value, [], int(time.time() * 1000))])
        return ProduceRequest(transactional_id=None, acks=acks, timeout_ms=30000, topic_data=[
            ProduceRequest.TopicProduceData(name="pipelined", partition_data=[
                ProduceRequest.PartitionProduceData(index=0, records=batch)])]), len(batch)

    (first, n1), (second, n2) = request(-1, b"a"), request(1, b"b")
    assert cluster[2].proc is not None
    os.kill(cluster[2].proc.pid, signal.SIGSTOP)
    try:
        size = segment.stat().st_size
        with RawClient(cluster[1].bootstrap, timeout=30) as raw:
            raw.send_bytes(raw.frame(0, 9, first) + raw.frame(0, 9, second))
            # Both batches are in the leader's log while the first is not answered (follower 2 is stopped, and
            # the ISR shrinks only after replica.lag.time.max.ms)...
            while segment.stat().st_size < size + n1 + n2:
                time.sleep(0.005)
            assert not answered(raw), "the second batch was appended only after the first was answered"
            os.kill(cluster[2].proc.pid, signal.SIGCONT)
            # ... and the answers arrive in request order once follower 2 has the first batch.
            answers = [codec.decode_response(0, 9, raw.recv_frame()) for _ in range(2)]
        got = [(cid, r.responses[0].partition_responses[0].error_code, r.responses[0].partition_responses[0].base_offset)
               for cid, r in answers]
        assert got == [(raw.correlation_id - 1, ErrorCode.NONE, 1), (raw.correlation_id, ErrorCode.NONE, 2)]
    finally:
        os.kill(cluster[2].proc.pid, signal.SIGCONT)
    cluster.wait_isr("pipelined", {1, 2}, leader=1)


def test_an_acks_all_answer_completes_each_partition_on_its_own(cluster: Cluster) -> None:
    """The direct path's DelayedProduce: one Produce naming a partition whose follower answers and one whose
    follower is stopped gets, after its timeout, the first partition's offsets and REQUEST_TIMED_OUT for the second
    (before the ISR shrinks: replica.lag.time.max.ms is longer), in bytes the reference encoder gives that answer."""
    from kbroker.broker import produce_codec
    from kbroker.protocol import codec

    create_topic(cluster, "delayed-ok", [1, 2])
    create_topic(cluster, "delayed-stuck", [1, 3])
    for topic in ("delayed-ok", "delayed-stuck"):
        assert produce_when_leader(cluster[1], topic, [b"warm"]) == (ErrorCode.NONE, 0)
    batch = build_batch([(None, b"x", [], int(time.time() * 1000))])
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=LAG_MS // 4, topic_data=[
        ProduceRequest.TopicProduceData(name=t, partition_data=[ProduceRequest.PartitionProduceData(index=0,
                                                                                                    records=batch)])
        for t in ("delayed-ok", "delayed-stuck")])
    assert cluster[3].proc is not None
    os.kill(cluster[3].proc.pid, signal.SIGSTOP)
    try:
        with RawClient(cluster[1].bootstrap, timeout=30) as raw:
            t0 = time.monotonic()
            raw.send_bytes(raw.frame(0, 9, req))
            frame = raw.recv_frame()
            waited = time.monotonic() - t0
    finally:
        os.kill(cluster[3].proc.pid, signal.SIGCONT)
    assert waited >= LAG_MS // 4 / 1000 - 0.05, "answered before its timeout"
    expected = [("delayed-ok", [(0, ErrorCode.NONE, 1, -1, 0, None, None)]),
                ("delayed-stuck", [(0, ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, None, None)])]
    (correlation_id,) = struct.unpack_from(">i", frame, 0)
    assert bytes(frame) == bytes(produce_codec.encode_response_py(correlation_id, 9, 0, expected)[4:]), \
        codec.decode_response(0, 9, frame)
    cluster.wait_isr("delayed-stuck", {1, 3}, leader=1)


def test_an_idempotent_producers_requests_are_appended_one_at_a_time(cluster: Cluster) -> None:
    """Requests with a producer id are not pipelined: the second waits, unappended, until the first is answered
    (the Java idempotent producer's sequence bookkeeping expects Kafka's one request at a time)."""
    from kbroker.protocol import codec
    from kbroker.protocol.messages import InitProducerIdRequest

    create_topic(cluster, "one-at-a-time", [1, 2])
    assert produce_when_leader(cluster[1], "one-at-a-time", [b"warm"]) == (ErrorCode.NONE, 0)
    segment = cluster[1].data_dir / "logs" / "one-at-a-time-0" / "00000000000000000000.log"
    with RawClient(cluster[1].bootstrap, timeout=30) as raw:
        pid = raw.request(22, 4, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                                       producer_id=-1, producer_epoch=-1))
        assert pid.error_code == ErrorCode.NONE

        def request(seq: int) -> tuple[ProduceRequest, int]:
            batch = build_batch([(None, b"%d" % seq, [], int(time.time() * 1000))], producer_id=pid.producer_id,
                                producer_epoch=pid.producer_epoch, base_sequence=seq)
            return ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
                ProduceRequest.TopicProduceData(name="one-at-a-time", partition_data=[
                    ProduceRequest.PartitionProduceData(index=0, records=batch)])]), len(batch)

        (first, n1), (second, n2) = request(0), request(1)
        assert cluster[2].proc is not None
        os.kill(cluster[2].proc.pid, signal.SIGSTOP)
        try:
            size = segment.stat().st_size
            raw.send_bytes(raw.frame(0, 9, first) + raw.frame(0, 9, second))
            # Whenever the second batch is in the log, the first one's answer is already on its way.
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                both = segment.stat().st_size == size + n1 + n2
                assert not both or answered(raw), "the second batch went in while the first waited"
                time.sleep(0.005)
            os.kill(cluster[2].proc.pid, signal.SIGCONT)
            answers = [codec.decode_response(0, 9, raw.recv_frame()) for _ in range(2)]
        finally:
            os.kill(cluster[2].proc.pid, signal.SIGCONT)
    got = [(cid, r.responses[0].partition_responses[0].error_code, r.responses[0].partition_responses[0].base_offset)
           for cid, r in answers]
    assert got == [(raw.correlation_id - 1, ErrorCode.NONE, 1), (raw.correlation_id, ErrorCode.NONE, 2)]
    assert segment.stat().st_size == size + n1 + n2
    cluster.wait_isr("one-at-a-time", {1, 2}, leader=1)


# ---------------------------------------------------------------- catching up


def test_offline_follower_catches_up_100k_records_and_rejoins_the_isr(cluster: Cluster, tmp_path: Path) -> None:
    create_topic(cluster, "catch-up", [1, 2, 3], **{"min.insync.replicas": "2"})
    cluster[3].kill()
    cluster.wait_isr("catch-up", {1, 2}, leader=1, timeout=30)

    n = 100_000
    errors: list[Any] = []
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20,
                  "batch.num.messages": 10000, "queue.buffering.max.messages": 200000})
    for i in range(n):
        p.produce("catch-up", b"%d" % i, partition=0, on_delivery=lambda e, m: errors.append(e) if e else None)
        if i % 20000 == 0:
            p.poll(0)
    assert p.flush(60) == 0 and not errors, errors[:3]

    t0 = time.monotonic()
    cluster.restart(3)
    cluster.wait_isr("catch-up", {1, 2, 3}, leader=1, timeout=90)
    print(f"follower 3 caught up {n} records and rejoined the ISR in {time.monotonic() - t0:.1f} s")
    # Rejoining needs its log end at the high watermark: every record is there, at the leader's offsets.
    log = local_copy(cluster[3], "catch-up", tmp_path)
    try:
        assert log.log_end_offset == n
        recs = read_all(log)
        assert [r.offset for r in recs] == list(range(n))
        assert [r.value for r in recs[:3]] == [b"0", b"1", b"2"] and recs[-1].value == b"%d" % (n - 1)
    finally:
        log.close()


# ---------------------------------------------------------------- divergence


def test_diverged_follower_truncates_to_the_new_leaders_epoch_boundary(cluster: Cluster, tmp_path: Path) -> None:
    create_topic(cluster, "diverge", [1, 2])
    assert produce_when_leader(cluster[1], "diverge", [b"v%d" % i for i in range(10)]) == (ErrorCode.NONE, 0)
    # Broker 2 stops fetching; the leader takes 5 records only it will ever have, and dies before the
    # ISR shrinks (replica.lag.time.max.ms), so broker 2 is elected cleanly.
    b1, b2 = cluster[1], cluster[2]
    assert b2.proc is not None
    os.kill(b2.proc.pid, signal.SIGSTOP)
    try:
        # A fetch broker 2 sent just before it stopped may still wait at the leader (replica.fetch.wait.max.ms,
        # 500 ms): let it be answered empty first, or it would carry the "lost" records to broker 2's socket.
        time.sleep(0.8)
        assert raw_produce(b1, "diverge", [b"lost%d" % i for i in range(5)], acks=1) == (ErrorCode.NONE, 10)
        b1.kill()
    finally:
        os.kill(b2.proc.pid, signal.SIGCONT)
    cluster.wait_isr("diverge", {2}, leader=2, timeout=60)
    assert produce_when_leader(b2, "diverge", [b"new%d" % i for i in range(3)]) == (ErrorCode.NONE, 10)

    cluster.restart(1)
    cluster.wait_isr("diverge", {1, 2}, leader=2)
    log = local_copy(b1, "diverge", tmp_path)
    try:
        values = [r.value for r in read_all(log)]
        assert values == [b"v%d" % i for i in range(10)] + [b"new%d" % i for i in range(3)]
        epochs = log.leader_epoch_cache.entries
        assert [e.start_offset for e in epochs] == [0, 10] and epochs[1].epoch > epochs[0].epoch
    finally:
        log.close()
    assert "truncating diverge-0 from 15 to 10" in b1.read_log()


# ---------------------------------------------------------------- idempotent producers across failover


def test_idempotent_producer_keeps_its_sequence_state_across_a_leader_change(cluster: Cluster) -> None:
    create_topic(cluster, "idem", [2, 3, 1], **{"min.insync.replicas": "2"})
    n = 3000
    errors: list[Any] = []
    acked: list[int] = []
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 2, "message.timeout.ms": 60000, "retry.backoff.ms": 100})

    def on_delivery(err: Any, m: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append(int(m.value()))

    def produce() -> None:
        for i in range(n):
            p.produce("idem", b"%d" % i, partition=0, on_delivery=on_delivery)
            p.poll(0)
            if i % 100 == 0:
                time.sleep(0.02)
        p.flush(90)

    t = threading.Thread(target=produce)
    t.start()
    wait_for(lambda: len(acked) >= n // 3, "a third acknowledged", 30)
    cluster[2].kill()  # the leader, with batches in flight
    t.join(120)
    assert not t.is_alive()
    assert not errors, errors[:3]
    assert len(acked) == n
    values = [v for _, v in consume(cluster, "idem", n)]
    assert values == [b"%d" % i for i in range(n)]  # no duplicate, no gap, in order
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "replication-tests"})
    try:
        assert c.get_watermark_offsets(TopicPartition("idem", 0), timeout=10) == (0, n)
    finally:
        c.close()
    cluster.restart(2)
    cluster.wait_isr("idem", {1, 2, 3})


# ---------------------------------------------------------------- the group coordinator moves with its partition


def test_committed_offsets_move_with_their_offsets_partition(cluster: Cluster) -> None:
    create_topic(cluster, "grp", [1, 2, 3])
    assert produce_when_leader(cluster[1], "grp", [b"m%d" % i for i in range(10)]) == (ErrorCode.NONE, 0)
    group = "moving-group"

    def committed() -> int:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            return int(c.committed([TopicPartition("grp", 0)], timeout=5)[0].offset)
        finally:
            c.close()

    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition("grp", 0, 7)], asynchronous=False)
    finally:
        c.close()
    assert committed() == 7
    offsets_partition = partition_for(group, 50)
    coordinator = cluster.partition("__consumer_offsets", offsets_partition).leader
    cluster[coordinator].kill()
    # A new leader of the partition loads the group from its replica of the log.
    wait_for(lambda: cluster.partition("__consumer_offsets", offsets_partition).leader not in (coordinator, -1),
             "a new leader of the group's __consumer_offsets partition", 60)
    assert wait_for(lambda: committed() == 7, "the committed offset from the new coordinator", 30) >= 0
    cluster.restart(coordinator)


# ---------------------------------------------------------------- transactions across a leader change


def test_transactional_producer_continues_after_its_partitions_leader_dies(cluster: Cluster) -> None:
    create_topic(cluster, "txn-moves", [3, 1, 2], **{"min.insync.replicas": "2"})
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "replicated-txn", "acks": "all",
                  "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(100):
        p.produce("txn-moves", b"t1-%d" % i, partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(50):
        p.produce("txn-moves", b"t2-%d" % i, partition=0)
    p.flush(30)
    cluster[3].kill()  # the partition's leader, with the producer's open transaction in its log
    for i in range(50, 100):
        p.produce("txn-moves", b"t2-%d" % i, partition=0)
    p.commit_transaction(60)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "replication-tests-txn",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition("txn-moves", 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 200 and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(1000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    assert got == [b"t1-%d" % i for i in range(100)] + [b"t2-%d" % i for i in range(100)]
    cluster.restart(3)
    cluster.wait_isr("txn-moves", {1, 2, 3})


# ---------------------------------------------------------------- a leader epoch bump keeps the coordinator's groups


def test_a_leader_epoch_bump_while_leading_keeps_the_loaded_groups(cluster: Cluster) -> None:
    """Found by the replication chaos test: a follower's controlled shutdown bumps the leader epoch of a
    __consumer_offsets partition whose leader stays; reloading it then replaced the live group, and members waiting
    in JoinGroup never got an answer (their consumers hung for the rebalance timeout)."""
    create_topic(cluster, "epoch-bump", [1, 2, 3])
    group = "epoch-bump-group"
    p = partition_for(group, 50)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("epoch-bump", 0, 1)], asynchronous=False)
        wait_for(lambda: len(cluster.partition("__consumer_offsets", p).isrs) == 3, "the group's partition in sync")
        part = cluster.partition("__consumer_offsets", p)
        leader, follower = part.leader, next(b for b in part.isrs if b != part.leader)

        def count(text: str) -> int:
            return cluster[leader].read_log().count(text)
        loads, epochs = count(f"records of __consumer_offsets-{p} "), count(f"__consumer_offsets-{p}: leader at epoch")
        cluster[follower].stop()  # controlled shutdown: the ISR shrinks and the leader epoch grows, same leader
        try:
            wait_for(lambda: count(f"__consumer_offsets-{p}: leader at epoch") > epochs, "the leader's new epoch")
            assert cluster.partition("__consumer_offsets", p).leader == leader
            consumer.commit(offsets=[TopicPartition("epoch-bump", 0, 2)], asynchronous=False)
            assert consumer.committed([TopicPartition("epoch-bump", 0)], timeout=10)[0].offset == 2
            assert count(f"records of __consumer_offsets-{p} ") == loads  # the live group was not reloaded
        finally:
            cluster.restart(follower)
    finally:
        consumer.close()


# ---------------------------------------------------------------- the transaction coordinator's broker dies


def test_transactions_survive_the_loss_of_their_coordinators_broker(cluster: Cluster) -> None:
    """kill -9 of the broker leading the transactional ids' __transaction_state partition: its new leader loads
    them from the replicated log. An open transaction commits through the new coordinator, a dead producer's open
    transaction is aborted by it after transaction.timeout.ms (read_committed consumers move on), and a new producer
    with the same id fences the old one there."""
    from confluent_kafka import KafkaException

    from tests.txn_support import find_coordinator, txn_app

    tid = "coord-moves"
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "acks": "all",
                  "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
    p.init_transactions(30)
    coordinator, _, _ = find_coordinator(cluster.live()[0].bootstrap, tid)
    n_state = len(AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(
        topic="__transaction_state", timeout=10).topics["__transaction_state"].partitions)
    # A second transactional id on the same coordinator, for the producer that dies with its transaction open.
    hung_tid = next(t for t in (f"coord-moves-dead-{i}" for i in range(500))
                    if cluster.partition("__transaction_state", partition_for(t, n_state)).leader == coordinator)
    data_leader = next(b for b in (1, 2, 3) if b != coordinator)
    create_topic(cluster, "txn-coord", [data_leader, *(b for b in (1, 2, 3) if b != data_leader)],
                 **{"min.insync.replicas": "2"})
    hung = txn_app("hang", cluster.bootstrap, "txn-coord", "0", hung_tid, "5000", "20")
    try:
        assert hung.stdout is not None
        assert hung.stdout.readline().strip() == "READY"
        p.begin_transaction()
        for i in range(50):
            p.produce("txn-coord", b"a-%d" % i, partition=0)
        p.flush(30)
        t0 = time.monotonic()
        cluster[coordinator].kill()
        hung.kill()  # the other producer dies too, its transaction (20 records, 5 s timeout) left open
        for i in range(50, 100):
            p.produce("txn-coord", b"a-%d" % i, partition=0)
        p.commit_transaction(60)
        print(f"commit through the new coordinator {time.monotonic() - t0:.1f} s after the kill")
        new_coordinator, _, _ = find_coordinator(cluster.live()[0].bootstrap, tid)
        assert new_coordinator != coordinator
        p.begin_transaction()
        p.produce("txn-coord", b"aborted", partition=0)
        p.abort_transaction(30)

        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "coord-moves-reader",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            consumer.assign([TopicPartition("txn-coord", 0, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 90
            while len(got) < 100 and time.monotonic() < deadline:
                got += [m.value() for m in consumer.consume(1000, 0.5) if m.error() is None]
        finally:
            consumer.close()
        # The dead producer's records came first; the committed ones are readable once its transaction is aborted.
        assert got == [b"a-%d" % i for i in range(100)]
        print(f"read_committed past the dead producer's transaction {time.monotonic() - t0:.1f} s after the kill")

        p2 = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "acks": "all"})
        p2.init_transactions(30)  # bumps the epoch on the new coordinator: p is a zombie now
        p.begin_transaction()
        p.produce("txn-coord", b"zombie", partition=0)
        with pytest.raises(KafkaException):
            p.commit_transaction(30)
        p2.begin_transaction()
        p2.produce("txn-coord", b"after-fence", partition=0)
        p2.commit_transaction(30)
        # read_uncommitted: the dead producer's 20, the 100, the aborted one, and then only p2's record
        assert [v for _, v in consume(cluster, "txn-coord", 122, timeout=30)
                if v in (b"zombie", b"after-fence")] == [b"after-fence"]
    finally:
        hung.kill()
        cluster.restart(coordinator)
        cluster.wait_isr("txn-coord", {1, 2, 3})


# ---------------------------------------------------------------- follower fetch sessions (KIP-227)


def fetch_session_gauges(c: Cluster) -> tuple[float, float]:
    """Broker 1's (incremental fetch sessions, partitions cached in them)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics", timeout=10).read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("kafka_server_fetchsessioncache_")}
    return (values["kafka_server_fetchsessioncache_numincrementalfetchsessions"],
            values["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"])


def test_followers_fetch_in_incremental_sessions(cluster: Cluster) -> None:
    """Each follower keeps one KIP-227 session with broker 1 for everything broker 1 leads, and fetches within it
    name only partitions whose position moved: data produced to any of 8 partitions is replicated (acks=all
    answers, the high watermarks reach the log ends) and a follower restarted mid-way opens a new session."""
    name = "follower-sessions"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=8, replica_assignment=[[1, 2, 3]] * 8)]).values():
        f.result(20)

    def full_isrs() -> bool:
        md = admin.list_topics(topic=name, timeout=10).topics[name]
        return len(md.partitions) == 8 and all(p.leader == 1 and len(p.isrs) == 3 for p in md.partitions.values())

    wait_for(full_isrs, f"{name}: 8 partitions led by broker 1 with full ISRs")
    wait_for(lambda: fetch_session_gauges(cluster)[0] >= 2 and fetch_session_gauges(cluster)[1] >= 16,
             "both followers in a fetch session with broker 1 holding the 8 partitions")

    def produce(start: int, end: int) -> None:
        errors: list[Any] = []
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 0})
        for i in range(start, end):
            p.produce(name, value=b"%d" % i, partition=i % 8,
                      on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
            p.poll(0)
        assert p.flush(30) == 0 and errors == []

    def high_watermarks() -> list[int]:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "follower-sessions"})
        try:
            return [c.get_watermark_offsets(TopicPartition(name, i), timeout=10)[1] for i in range(8)]
        finally:
            c.close()

    produce(0, 800)
    assert high_watermarks() == [100] * 8  # acks=all answered: every follower had each batch

    cluster[3].kill()
    cluster.restart(3)
    produce(800, 1600)
    wait_for(full_isrs, f"{name}: broker 3 back in every ISR")
    produce(1600, 2400)
    assert high_watermarks() == [300] * 8
    wait_for(lambda: fetch_session_gauges(cluster)[0] >= 2, "the restarted follower in a new session")


def test_an_idle_partition_stays_in_the_isr_while_its_followers_fetch_for_others(cluster: Cluster) -> None:
    """Most of a follower's fetch session is idle partitions. In an incremental fetch the leader answers nothing
    for them and, when nothing moved since the last read, does not read them again; it still counts each fetch as
    the follower's, caught up. For three times replica.lag.time.max.ms one partition takes acks=all data
    (confluent-kafka) while the other takes none: the idle one keeps its whole ISR, and then takes an acks=all
    record at once (kafka-python)."""
    from kafka import KafkaProducer

    name = "idle-in-session"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=2, replica_assignment=[[1, 2, 3]] * 2)]).values():
        f.result(20)

    def isrs() -> list[set[int]]:
        md = admin.list_topics(topic=name, timeout=10).topics[name]
        return [set(md.partitions[i].isrs) for i in range(2)]

    wait_for(lambda: isrs() == [{1, 2, 3}] * 2, f"{name}: both partitions with full ISRs")
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    seen: list[list[set[int]]] = []
    sent = 0
    deadline = time.monotonic() + 3 * LAG_MS / 1000
    while time.monotonic() < deadline:
        for _ in range(20):
            p.produce(name, b"busy", partition=0)
        sent += 20
        assert p.flush(10) == 0
        seen.append(isrs())
        time.sleep(0.05)
    assert all(s == [{1, 2, 3}] * 2 for s in seen), seen
    kp = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", request_timeout_ms=10000)
    try:
        t0 = time.monotonic()
        md = kp.send(name, b"late", partition=1).get(timeout=10)
        took = time.monotonic() - t0
    finally:
        kp.close()
    assert md.offset == 0 and took < 2.0, took
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": name})
    try:
        assert [c.get_watermark_offsets(TopicPartition(name, i), timeout=10)[1] for i in range(2)] == [sent, 1]
    finally:
        c.close()
