"""Online migration between classic and KIP-848 consumer groups against a real kbroker: confluent-kafka classic
members (cooperative-sticky, then range) consume under produce, a group.protocol=consumer member joins (the group
is upgraded, partitions spread over the three) and leaves (the group is downgraded, the classic members go on);
kafka-python as a classic member of a mixed group across a kill -9 of the broker; the policy's errors on raw
frames. The Java client's side is tests/java/test_java_consumer_group_migration.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    DescribeGroupsRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    SyncGroupRequest,
)
from kbroker.protocol.primitives import I16

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, wait_until
from tests.group_helpers import committed, describe, kip848_broker, once_loaded, produce_steadily

OVERRIDES = kip848_broker(**{"group.initial.rebalance.delay.ms": "200", "group.min.session.timeout.ms": "1000"})
PARTITIONS = 6


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), OVERRIDES)
    b.start()
    yield b
    b.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


class Member(threading.Thread):
    """A confluent-kafka consumer polling on its own thread; it remembers (time, partition, offset) per record."""

    def __init__(self, bootstrap: str, group: str, topic: str, **conf: Any) -> None:
        super().__init__(daemon=True)
        # The classic session settings do not apply to group.protocol=consumer (the broker sets them).
        classic = {} if conf.get("group.protocol") == "consumer" else {"session.timeout.ms": 6000,
                                                                      "heartbeat.interval.ms": 300}
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                           "auto.commit.interval.ms": 200, **classic, **conf})
        self.topic = topic
        self.records: list[tuple[float, int, int]] = []
        self.errors: list[Any] = []
        self.stop = threading.Event()

    def run(self) -> None:
        self.c.subscribe([self.topic])
        while not self.stop.is_set():
            m = self.c.poll(0.1)
            if m is None:
                continue
            if m.error():
                self.errors.append(m.error())
                continue
            self.records.append((time.monotonic(), m.partition(), m.offset()))
        self.c.close()

    def since(self, t: float) -> int:
        return sum(1 for r in self.records if r[0] >= t)


def group_type(bootstrap: str, group: str) -> str | None:
    def answer() -> Any:
        with RawClient(bootstrap) as raw:
            return raw.request(16, 5, ListGroupsRequest())

    resp = once_loaded(answer)
    return next((g.group_type for g in resp.groups if g.group_id == group), None)


def assert_contiguous(consumed: dict[int, set[int]], commits: dict[int, int], produced: int) -> None:
    """What the group consumed covers, per partition, every offset below its committed offset, and the committed
    offsets are the ends of the partitions: nothing lost (duplicates are at-least-once redeliveries)."""
    assert commits == {p: produced // PARTITIONS for p in range(PARTITIONS)}
    for p, end in commits.items():
        missing = set(range(end)) - consumed.get(p, set())
        assert not missing, f"partition {p}: offsets {sorted(missing)[:10]} never consumed"


# ---------------------------------------------------------------- confluent-kafka


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_classic_group_upgrades_then_downgrades_under_produce(broker: BrokerProcess, topic_name: str,
                                                              strategy: str) -> None:
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = "mig-" + topic_name
    total = 1500
    producer = produce_steadily(broker.bootstrap, topic_name, total, 300, PARTITIONS)
    classic = [Member(broker.bootstrap, group, topic_name, **{"partition.assignment.strategy": strategy})
               for _ in range(2)]
    modern: Member | None = None
    try:
        for m in classic:
            m.start()
        wait_until(lambda: all(m.records for m in classic), timeout=20, what="both classic members consume")
        assert group_type(broker.bootstrap, group) == "classic"

        joined = time.monotonic()
        modern = Member(broker.bootstrap, group, topic_name, **{"group.protocol": "consumer"})
        modern.start()
        wait_until(lambda: modern.records, timeout=20, what="the consumer-protocol member gets partitions")
        assert group_type(broker.bootstrap, group) == "consumer"
        d = wait_until(lambda: (lambda g: g if g.group_state == "Stable" else None)(
            describe(broker.bootstrap, group)), timeout=20, what="the mixed group is Stable")
        assert len(d.members) == 3
        owned = [sum(len(tp.partitions) for tp in m.assignment.topic_partitions) for m in d.members]
        assert sorted(owned) == [2, 2, 2]
        t_mixed = time.monotonic()
        time.sleep(1.5)
        wait_until(lambda: all(m.since(t_mixed) for m in [*classic, modern]), timeout=20,
                   what="all three members consume in the mixed group")
        # Exclusive hand-over: a partition the consumer member got was not consumed by a classic member after
        # it (the classic member revoked it first); in the Stable mixed group no partition has two consumers.
        for p in {r[1] for r in modern.records}:
            first = min(r[0] for r in modern.records if r[1] == p)
            late = [r for m in classic for r in m.records if r[1] == p and r[0] > first + 0.3]
            assert not late, f"partition {p} consumed by a classic member after the consumer member got it"
        t_end = time.monotonic()
        windows = [{r[1] for r in m.records if t_mixed <= r[0] <= t_end} for m in [*classic, modern]]
        assert all(windows) and sum(len(w) for w in windows) == len(set().union(*windows)) == PARTITIONS

        modern.stop.set()
        modern.join(15)
        left = time.monotonic()
        wait_until(lambda: group_type(broker.bootstrap, group) == "classic", timeout=20, what="downgrade")
        producer.join(60)
        wait_until(lambda: all(m.since(left) for m in classic), timeout=20,
                   what="the classic members consume after the downgrade")

        def consumed() -> dict[int, set[int]]:
            out: dict[int, set[int]] = {}
            for m in [*classic, modern]:
                for _, p, o in m.records:
                    out.setdefault(p, set()).add(o)
            return out

        wait_until(lambda: sum(len(v) for v in consumed().values()) == total, timeout=30, what="every record")
        time.sleep(0.6)  # auto commit
        for m in classic:
            m.stop.set()
            m.join(15)
        with RawClient(broker.bootstrap) as raw:
            [dg] = raw.request(15, 5, DescribeGroupsRequest(groups=[group])).groups
        assert (dg.protocol_type, dg.group_state) == ("consumer", "Empty")
        assert_contiguous(consumed(), committed(broker.bootstrap, group, topic_name, PARTITIONS), total)
        assert not [e for m in [*classic, modern] for e in m.errors if e.fatal()]
        assert joined < left
        log = broker.read_log()
        assert f"Classic group {group} upgraded to a consumer group" in log
        assert f"consumer group {group}; the group is downgraded to a classic group" in log
    finally:
        for m in [*classic, *([modern] if modern else [])]:
            m.stop.set()


# ---------------------------------------------------------------- kafka-python + kill -9


def test_mixed_group_survives_a_broker_kill(tmp_path: Path, topic_name: str) -> None:
    # Sessions long enough for two restarts on a loaded machine, and the librdkafka member reconnecting at most a
    # second apart (its default backoff grows to 10 s while the broker is down, beyond a 6 s session).
    b = BrokerProcess(tmp_path / "broker", {**OVERRIDES, "group.consumer.session.timeout.ms": "15000"})
    b.start()
    stop = threading.Event()
    kp_records: list[tuple[float, int, int]] = []

    def kafka_python_member() -> None:
        c = KafkaConsumer(topic_name, bootstrap_servers=b.bootstrap, group_id=group, auto_offset_reset="earliest",
                          auto_commit_interval_ms=200, session_timeout_ms=10000, heartbeat_interval_ms=300,
                          max_poll_interval_ms=20000)
        try:
            while not stop.is_set():
                for recs in c.poll(timeout_ms=100).values():
                    kp_records.extend((time.monotonic(), r.partition, r.offset) for r in recs)
        finally:
            c.close()

    group = "mixkill-" + topic_name
    modern: Member | None = None
    kp = threading.Thread(target=kafka_python_member, daemon=True)
    try:
        create_topic(b.bootstrap, topic_name, PARTITIONS)
        producer = produce_steadily(b.bootstrap, topic_name, 600, 600, PARTITIONS)
        kp.start()
        wait_until(lambda: kp_records, timeout=30, what="kafka-python consumes")
        modern = Member(b.bootstrap, group, topic_name, **{"group.protocol": "consumer",
                                                           "metadata.recovery.strategy": "none",
                                                           "reconnect.backoff.max.ms": 1000})
        modern.start()
        producer.join(30)
        d = wait_until(lambda: (lambda g: g if g.group_state == "Stable" and len(g.members) == 2 else None)(
            describe(b.bootstrap, group)), timeout=30, what="a Stable mixed group")
        assert all(m.assignment.topic_partitions for m in d.members)
        b.kill()
        b.start()
        after = describe(b.bootstrap, group)
        # Both members came back from __consumer_offsets, the classic one with its classic metadata.
        assert {m.member_id for m in after.members} == {m.member_id for m in d.members}
        assert after.group_epoch == d.group_epoch
        restarted = time.monotonic()
        producer = produce_steadily(b.bootstrap, topic_name, 600, 600, PARTITIONS)
        producer.join(30)
        assert modern is not None
        m2 = modern
        wait_until(lambda: m2.since(restarted) and any(r[0] >= restarted for r in kp_records), timeout=40,
                   what="both members consume after the restart")
        consumed: dict[int, set[int]] = {}
        wait_until(lambda: sum(len(v) for v in _merge(consumed, kp_records, m2.records).values()) == 1200,
                   timeout=30, what="every record")
        assert group_type(b.bootstrap, group) == "consumer"
        # The classic member's heartbeats were accepted after the restart: it kept its member id, so its classic
        # metadata came back from the records.
        assert {m.member_id for m in describe(b.bootstrap, group).members} == {m.member_id for m in d.members}
        # The consumer member leaves: the group is downgraded, and comes back classic after another kill -9.
        m2.stop.set()
        m2.join(15)
        wait_until(lambda: group_type(b.bootstrap, group) == "classic", timeout=20, what="downgrade")

        def described() -> Any:
            def answer() -> Any:
                with RawClient(b.bootstrap) as raw:
                    return raw.request(15, 5, DescribeGroupsRequest(groups=[group])).groups[0]

            return once_loaded(answer)

        stable = wait_until(lambda: (lambda g: g if g.group_state == "Stable" else None)(described()), timeout=20,
                            what="the classic group is Stable")
        [kp_id] = [m.member_id for m in stable.members]
        b.kill()
        b.start()
        assert [m.member_id for m in described().members] == [kp_id] and group_type(b.bootstrap, group) == "classic"
        restarted = time.monotonic()
        produce_steadily(b.bootstrap, topic_name, 600, 600, PARTITIONS).join(30)
        wait_until(lambda: sum(len(v) for v in _merge(consumed, kp_records, m2.records).values()) == 1800,
                   timeout=40, what="every record, the last ones by the classic member alone")
        assert any(r[0] >= restarted for r in kp_records)
        assert [m.member_id for m in described().members] == [kp_id]
        time.sleep(0.6)  # auto commit
        stop.set()
        kp.join(15)
        assert_contiguous(consumed, committed(b.bootstrap, group, topic_name, PARTITIONS), 1800)
    finally:
        stop.set()
        if modern is not None:
            modern.stop.set()
        kp.join(15)
        b.kill()


def _merge(out: dict[int, set[int]], *lists: list[tuple[float, int, int]]) -> dict[int, set[int]]:
    out.clear()
    for records in lists:
        for _, p, o in list(records):
            out.setdefault(p, set()).add(o)
    return out


# ---------------------------------------------------------------- policy and errors (raw frames)


def subscription(topics: list[str]) -> bytes:
    out = bytearray(I16.pack(1))
    codec.encode(ConsumerProtocolSubscription(topics=topics), 1, out)
    return bytes(out)


def encode_assignment(by_topic: dict[str, set[int]]) -> bytes:
    out = bytearray(I16.pack(1))
    codec.encode(ConsumerProtocolAssignment(assigned_partitions=[
        ConsumerProtocolAssignment.TopicPartition(topic=t, partitions=sorted(ps)) for t, ps in by_topic.items()]),
        1, out)
    return bytes(out)


def decode_assignment(data: bytes) -> dict[str, set[int]]:
    (version,) = I16.unpack_from(data, 0)
    a, _ = codec.decode(ConsumerProtocolAssignment, version, data, 2)
    return {tp.topic: set(tp.partitions) for tp in a.assigned_partitions}


def test_disabled_policy_keeps_the_groups_apart(tmp_path: Path, topic_name: str) -> None:
    b = BrokerProcess(tmp_path / "broker", {**OVERRIDES, "group.consumer.migration.policy": "DISABLED"})
    b.start()
    try:
        create_topic(b.bootstrap, topic_name, 2)
        classic = Member(b.bootstrap, "classic-" + topic_name, topic_name)
        classic.start()
        wait_until(lambda: group_type(b.bootstrap, "classic-" + topic_name) == "classic", timeout=20,
                   what="a classic group")
        with RawClient(b.bootstrap) as raw:
            wait_until(lambda: raw.request(15, 5, DescribeGroupsRequest(groups=["classic-" + topic_name]))
                       .groups[0].group_state == "Stable", timeout=20, what="Stable")
            r = raw.request(68, 0, ConsumerGroupHeartbeatRequest(
                group_id="classic-" + topic_name, member_id=str(uuid.uuid4()), member_epoch=0,
                rebalance_timeout_ms=5000, subscribed_topic_names=[topic_name], topic_partitions=[]))
            assert r.error_code == ErrorCode.GROUP_ID_NOT_FOUND
            r = raw.request(68, 0, ConsumerGroupHeartbeatRequest(
                group_id="modern-" + topic_name, member_id=str(uuid.uuid4()), member_epoch=0,
                rebalance_timeout_ms=5000, subscribed_topic_names=[topic_name], topic_partitions=[]))
            assert r.error_code == 0
            j = raw.request(11, 5, JoinGroupRequest(
                group_id="modern-" + topic_name, session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="",
                protocol_type="consumer",
                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                                     metadata=subscription([topic_name]))]))
            assert j.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        classic.stop.set()
        classic.join(15)
    finally:
        b.kill()


def test_an_invalid_policy_stops_the_broker(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "broker", {"group.consumer.migration.policy": "sideways"})
    with pytest.raises(Exception):  # noqa: B017 - the process fails to start; its log names the key
        b.start()
    assert "group.consumer.migration.policy" in b.read_log()


def test_classic_requests_to_a_mixed_group(broker: BrokerProcess, topic_name: str) -> None:
    """A raw classic member in a consumer group: MEMBER_ID_REQUIRED, then its assignment through JoinGroup /
    SyncGroup with generation = member epoch, Heartbeat errors, and OffsetCommit with its generation."""

    create_topic(broker.bootstrap, topic_name, 2)
    group = "rawmix-" + topic_name
    modern = Member(broker.bootstrap, group, topic_name, **{"group.protocol": "consumer"})
    modern.start()
    try:
        wait_until(lambda: describe(broker.bootstrap, group).group_state == "Stable", timeout=20, what="Stable")
        protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription([topic_name]))]
        with RawClient(broker.bootstrap) as raw:
            def join(member_id: str) -> Any:
                return raw.request(11, 5, JoinGroupRequest(
                    group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id=member_id,
                    protocol_type="consumer", protocols=protocols))

            first = join("")
            assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id
            mid = first.member_id
            j = join(mid)
            assert (j.error_code, j.protocol_name, j.leader, j.members) == (0, "range", "", [])
            s = raw.request(14, 3, SyncGroupRequest(group_id=group, generation_id=j.generation_id + 7,
                                                    member_id=mid, assignments=[]))
            assert s.error_code == ErrorCode.ILLEGAL_GENERATION
            assert raw.request(12, 3, HeartbeatRequest(group_id=group, generation_id=j.generation_id,
                                                       member_id="nobody")).error_code == ErrorCode.UNKNOWN_MEMBER_ID
            # The consumer member must release a partition first: the classic one rejoins until it has it.
            deadline = time.monotonic() + 20
            assigned: bytes = b""
            while time.monotonic() < deadline:
                hb = raw.request(12, 3, HeartbeatRequest(group_id=group, generation_id=j.generation_id,
                                                         member_id=mid))
                if hb.error_code == ErrorCode.REBALANCE_IN_PROGRESS:
                    j = join(mid)
                    assert j.error_code == 0
                    continue
                assert hb.error_code == 0
                s = raw.request(14, 3, SyncGroupRequest(group_id=group, generation_id=j.generation_id,
                                                        member_id=mid, assignments=[]))
                assert s.error_code in (0, ErrorCode.REBALANCE_IN_PROGRESS)
                if s.error_code == 0 and len(s.assignment) > 10:
                    assigned = bytes(s.assignment)
                    break
                time.sleep(0.3)
            assert assigned, "the classic member never got a partition"
            got = decode_assignment(assigned)
            assert list(got) == [topic_name] and len(got[topic_name]) == 1
            [p] = got[topic_name]
            R = OffsetCommitRequest
            c = raw.request(8, 8, R(group_id=group, generation_id_or_member_epoch=j.generation_id, member_id=mid,
                                    topics=[R.OffsetCommitRequestTopic(name=topic_name, partitions=[
                                        R.OffsetCommitRequestPartition(partition_index=p, committed_offset=0)])]))
            assert c.topics[0].partitions[0].error_code == 0
            stale = raw.request(8, 8, R(group_id=group, generation_id_or_member_epoch=j.generation_id - 1,
                                        member_id=mid, topics=[R.OffsetCommitRequestTopic(name=topic_name, partitions=[
                                            R.OffsetCommitRequestPartition(partition_index=p, committed_offset=0)])]))
            assert stale.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
            d = describe(broker.bootstrap, group)
            assert len(d.members) == 2
            lv = raw.request(13, 3, LeaveGroupRequest(group_id=group, members=[
                LeaveGroupRequest.MemberIdentity(member_id=mid), LeaveGroupRequest.MemberIdentity(member_id="x")]))
            assert [m.error_code for m in lv.members] == [0, ErrorCode.UNKNOWN_MEMBER_ID]
        wait_until(lambda: len(describe(broker.bootstrap, group).members) == 1, timeout=10, what="classic left")
        assert group_type(broker.bootstrap, group) == "consumer"
    finally:
        modern.stop.set()
        modern.join(15)


def test_classic_members_are_fenced_by_their_timeouts(broker: BrokerProcess, topic_name: str) -> None:
    """A classic member of a consumer group that does not rejoin within its rebalance timeout when told to, or
    stops heartbeating for its own session timeout, is fenced; the consumer member gets the partitions back."""

    create_topic(broker.bootstrap, topic_name, 2)
    group = "fence-" + topic_name
    modern = Member(broker.bootstrap, group, topic_name, **{"group.protocol": "consumer"})
    modern.start()
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription([topic_name]))]
    try:
        wait_until(lambda: describe(broker.bootstrap, group).group_state == "Stable", timeout=20, what="Stable")
        with RawClient(broker.bootstrap) as raw:
            def join(member_id: str) -> Any:
                return raw.request(11, 5, JoinGroupRequest(
                    group_id=group, session_timeout_ms=1500, rebalance_timeout_ms=1500, member_id=member_id,
                    protocol_type="consumer", protocols=protocols))

            # 1. Told to rejoin (its partition was released), it keeps heartbeating without rejoining.
            j = join(join("").member_id)
            assert j.error_code == 0
            sync = raw.request(14, 3, SyncGroupRequest(group_id=group, generation_id=j.generation_id,
                                                       member_id=j.member_id, assignments=[]))
            assert sync.error_code == 0
            told = wait_until(lambda: raw.request(12, 3, HeartbeatRequest(
                group_id=group, generation_id=j.generation_id, member_id=j.member_id)).error_code
                == ErrorCode.REBALANCE_IN_PROGRESS, timeout=10, what="REBALANCE_IN_PROGRESS")
            assert told
            t0 = time.monotonic()
            wait_until(lambda: raw.request(12, 3, HeartbeatRequest(
                group_id=group, generation_id=j.generation_id, member_id=j.member_id)).error_code
                == ErrorCode.UNKNOWN_MEMBER_ID, timeout=10, interval=0.2, what="fenced after its rebalance timeout")
            assert time.monotonic() - t0 >= 1.0
            wait_until(lambda: len(describe(broker.bootstrap, group).members) == 1, timeout=10, what="one member")
            # 2. It stops heartbeating: its own session timeout (1.5 s, not the consumer group's 6 s) fences it.
            j = join(join("").member_id)
            assert j.error_code == 0
            assert raw.request(14, 3, SyncGroupRequest(group_id=group, generation_id=j.generation_id,
                                                       member_id=j.member_id, assignments=[])).error_code == 0
            t0 = time.monotonic()
            wait_until(lambda: len(describe(broker.bootstrap, group).members) == 1 and time.monotonic() - t0 > 0.5,
                       timeout=5, interval=0.1, what="fenced after its session timeout")
            assert time.monotonic() - t0 < 4.5
        assert group_type(broker.bootstrap, group) == "consumer"
        d = wait_until(lambda: (lambda g: g if g.group_state == "Stable" else None)(
            describe(broker.bootstrap, group)), timeout=10, what="Stable again")
        assert sum(len(tp.partitions) for tp in d.members[0].assignment.topic_partitions) == 2
        log = broker.read_log()
        assert "did not rejoin within its rebalance timeout in consumer group " + group in log
        assert "session timeout (1500 ms) expired in consumer group " + group in log
    finally:
        modern.stop.set()
        modern.join(15)


def test_classic_groups_that_cannot_be_upgraded(broker: BrokerProcess, topic_name: str) -> None:
    """Kafka's validateOnlineUpgrade: a group of another protocol type, or whose embedded consumer protocol cannot
    be read, stays classic and the joining heartbeat gets GROUP_ID_NOT_FOUND."""

    create_topic(broker.bootstrap, topic_name, 1)
    with RawClient(broker.bootstrap) as raw:
        for group, ptype, assignment in (("connect-" + topic_name, "connect", b""),
                                         ("garbled-" + topic_name, "consumer", b"\x00\x00\xff")):
            j = raw.request(11, 3, JoinGroupRequest(
                group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
                protocol_type=ptype, protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                    name="range", metadata=subscription([topic_name]))]))
            assert j.error_code == 0 and j.leader == j.member_id
            s = raw.request(14, 3, SyncGroupRequest(
                group_id=group, generation_id=j.generation_id, member_id=j.member_id,
                assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=j.member_id,
                                                                         assignment=assignment)]))
            assert s.error_code == 0
            r = raw.request(68, 0, ConsumerGroupHeartbeatRequest(
                group_id=group, member_id=str(uuid.uuid4()), member_epoch=0, rebalance_timeout_ms=5000,
                subscribed_topic_names=[topic_name], topic_partitions=[]))
            assert r.error_code == ErrorCode.GROUP_ID_NOT_FOUND, (group, r)
            [dg] = raw.request(15, 5, DescribeGroupsRequest(groups=[group])).groups
            assert (dg.group_state, dg.protocol_type, [m.member_id for m in dg.members]) == (
                "Stable", ptype, [j.member_id])
    assert "malformed embedded consumer protocol" in broker.read_log()


def test_a_classic_static_member_replacing_the_last_consumer_member_downgrades(broker: BrokerProcess,
                                                                               topic_name: str) -> None:
    """A rolling downgrade with static membership: the consumer-protocol instance leaves temporarily (epoch -2),
    the same group.instance.id comes back as a classic member and replaces it; the group is a classic group again
    at once, Stable, and the classic instance gets the partitions of the one it replaced."""

    create_topic(broker.bootstrap, topic_name, 2)
    group = "static-" + topic_name
    classic = Member(broker.bootstrap, group, topic_name)
    classic.start()
    TP = ConsumerGroupHeartbeatRequest.TopicPartitions
    try:
        wait_until(lambda: classic.records or group_type(broker.bootstrap, group) == "classic", timeout=20,
                   what="a classic group")
        with RawClient(broker.bootstrap) as raw:
            wait_until(lambda: raw.request(15, 5, DescribeGroupsRequest(groups=[group])).groups[0].group_state
                       == "Stable", timeout=20, what="Stable")
            md = raw.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)]))
            tid = bytes(md.topics[0].topic_id)
            mid = str(uuid.uuid4())

            def heartbeat(epoch: int, owned: list[int] | None, **extra: Any) -> Any:
                return raw.request(68, 0, ConsumerGroupHeartbeatRequest(
                    group_id=group, member_id=mid, member_epoch=epoch, instance_id="inst-1",
                    topic_partitions=None if owned is None else [TP(topic_id=tid, partitions=owned)] if owned
                    else [], **{"rebalance_timeout_ms": -1, **extra}))

            r = heartbeat(0, [], rebalance_timeout_ms=5000, subscribed_topic_names=[topic_name])
            assert r.error_code == 0 and group_type(broker.bootstrap, group) == "consumer"
            owned: list[int] = []
            deadline = time.monotonic() + 20
            while not (owned and describe(broker.bootstrap, group).group_state == "Stable"):
                assert time.monotonic() < deadline, "the static consumer member never got its partition"
                if r.assignment is not None:
                    owned = sorted(p for t in r.assignment.topic_partitions for p in t.partitions)
                time.sleep(0.2)
                r = heartbeat(r.member_epoch, owned)
                assert r.error_code == 0
            assert heartbeat(-2, None).error_code == 0
            j = raw.request(11, 5, JoinGroupRequest(
                group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="",
                group_instance_id="inst-1", protocol_type="consumer",
                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                                     metadata=subscription([topic_name]))]))
            assert j.error_code == 0 and j.member_id != mid
            assert group_type(broker.bootstrap, group) == "classic"
            [dg] = raw.request(15, 5, DescribeGroupsRequest(groups=[group])).groups
            assert dg.group_state == "Stable" and j.member_id in {m.member_id for m in dg.members}
            s = raw.request(14, 3, SyncGroupRequest(group_id=group, generation_id=j.generation_id,
                                                    member_id=j.member_id, group_instance_id="inst-1",
                                                    assignments=[]))
            assert s.error_code == 0
            assert sorted(decode_assignment(bytes(s.assignment)).get(topic_name, set())) == owned
        assert "is replaced by a classic static member in consumer group " + group in broker.read_log()
    finally:
        classic.stop.set()
        classic.join(15)


def test_a_consumer_member_takes_over_a_classic_static_member(broker: BrokerProcess, topic_name: str) -> None:
    """A rolling upgrade with static membership: a classic static member does not leave when it stops, and the
    group.protocol=consumer instance with its group.instance.id replaces it (no UNRELEASED_INSTANCE_ID), taking
    its partitions; the old instance is fenced."""

    create_topic(broker.bootstrap, topic_name, 2)
    group = "takeover-" + topic_name
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription([topic_name]))]
    with RawClient(broker.bootstrap) as raw:
        j = raw.request(11, 5, JoinGroupRequest(
            group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
            group_instance_id="inst-a", protocol_type="consumer", protocols=protocols))
        assert j.error_code == 0 and j.leader == j.member_id
        assignment = encode_assignment({topic_name: {0, 1}})
        assert raw.request(14, 3, SyncGroupRequest(
            group_id=group, generation_id=j.generation_id, member_id=j.member_id, group_instance_id="inst-a",
            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=j.member_id, assignment=assignment)]
        )).error_code == 0
        r = raw.request(68, 0, ConsumerGroupHeartbeatRequest(
            group_id=group, member_id=str(uuid.uuid4()), member_epoch=0, instance_id="inst-a",
            rebalance_timeout_ms=5000, subscribed_topic_names=[topic_name], topic_partitions=[]))
        assert r.error_code == 0, r
        assert sorted(p for t in r.assignment.topic_partitions for p in t.partitions) == [0, 1]
        assert group_type(broker.bootstrap, group) == "consumer"
        assert [m.member_id for m in describe(broker.bootstrap, group).members] == [r.member_id]
        old = raw.request(12, 3, HeartbeatRequest(group_id=group, generation_id=j.generation_id,
                                                  member_id=j.member_id, group_instance_id="inst-a"))
        assert old.error_code == ErrorCode.FENCED_INSTANCE_ID
