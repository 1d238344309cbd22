"""KIP-848 consumer groups (group.protocol=consumer) with confluent-kafka (librdkafka) and raw frames against a
real kbroker process: partitions move between live members without stopping the others, regex subscriptions,
committed offsets, a kill -9 of the broker, and the error codes of ConsumerGroupHeartbeat."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    ListGroupsRequest,
    MetadataRequest,
)

from tests.broker_process import BrokerProcess
from tests.clients import RawClient, wait_until
from tests.group_helpers import committed, describe, end_offsets, kip848_broker, produce_steadily

OVERRIDES = kip848_broker()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), OVERRIDES)
    b.start()
    yield b
    b.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def consumer(bootstrap: str, group: str, **conf: Any) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                     "auto.offset.reset": "earliest", "auto.commit.interval.ms": 200,
                     "topic.metadata.refresh.interval.ms": 500, **conf})


class Member(threading.Thread):
    """One consumer polling on its own thread; it remembers (time, partition, offset, value) of each record."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], **conf: Any) -> None:
        super().__init__(daemon=True)
        self.c = consumer(bootstrap, group, **conf)
        self.topics = topics
        self.records: list[tuple[float, str, int, int, bytes]] = []
        self.stop = threading.Event()
        self.errors: list[Any] = []

    def run(self) -> None:
        self.c.subscribe(self.topics)
        while not self.stop.is_set():
            m = self.c.poll(0.1)
            if m is None:
                continue
            if m.error():
                self.errors.append(m.error())
                continue
            self.records.append((time.monotonic(), m.topic(), m.partition(), m.offset(), m.value()))
        self.c.close()

    def values(self) -> set[bytes]:
        return {r[4] for r in self.records}

    def partitions_since(self, t: float) -> set[int]:
        return {r[2] for r in self.records if r[0] >= t}

    def max_gap(self, start: float, end: float) -> float:
        times = [start] + [r[0] for r in self.records if start <= r[0] <= end] + [end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


# ---------------------------------------------------------------- confluent-kafka


def test_three_members_one_leaves_others_keep_consuming(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 6)
    group = "g-" + topic_name
    total = 3000
    producer = produce_steadily(broker.bootstrap, topic_name, total, 500, 6)
    members = [Member(broker.bootstrap, group, [topic_name]) for _ in range(3)]
    for m in members:
        m.start()
    a, b, c = members
    def recent(m: Member) -> set[int]:
        return m.partitions_since(time.monotonic() - 0.5)

    wait_until(lambda: [len(recent(m)) for m in members] == [2, 2, 2] and describe(
        broker.bootstrap, group).group_state == "Stable", timeout=20, what="every member consuming two partitions")
    moved = recent(c)
    c.stop.set()
    c.join(15)
    closed_at = time.monotonic()
    # a and b take over c's partitions ...
    wait_until(lambda: moved <= a.partitions_since(closed_at) | b.partitions_since(closed_at), timeout=20,
               what="c's partitions consumed by a and b")
    took_over = time.monotonic()
    producer.join(60)
    wait_until(lambda: a.values() | b.values() | c.values() == {str(i).encode() for i in range(total)},
               timeout=30, what="every record consumed")
    # ... while they never stopped consuming their own (the producer writes every partition ~80 times a second)
    for m in (a, b):
        assert m.max_gap(closed_at - 1, took_over) < 1.5, "a member stopped consuming during the move"
        assert len(m.partitions_since(took_over)) == 3
    d = describe(broker.bootstrap, group)
    assert (d.error_code, len(d.members), d.assignor_name) == (0, 2, "uniform")
    for m in (a, b):
        m.stop.set()
        m.join(15)
    assert committed(broker.bootstrap, group, topic_name, 6) == end_offsets(broker.bootstrap, topic_name, 6)
    assert not [e for m in members for e in m.errors if e.fatal()]


def test_regex_subscription_picks_up_a_topic_created_later(broker: BrokerProcess, topic_name: str) -> None:
    prefix = f"rx-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, f"{prefix}-a", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(f"{prefix}-a", b"first")
    p.flush(10)
    m = Member(broker.bootstrap, "g-" + prefix, [f"^{prefix}-.*"])
    m.start()
    try:
        wait_until(lambda: b"first" in m.values(), timeout=20, what="the record of the first topic")
        epoch = describe(broker.bootstrap, "g-" + prefix).group_epoch
        create_topic(broker.bootstrap, f"{prefix}-b", 3)
        p.produce(f"{prefix}-b", b"later", partition=2)
        p.flush(10)
        wait_until(lambda: b"later" in m.values(), timeout=30, what="the record of the topic created later")
        d = describe(broker.bootstrap, "g-" + prefix)
        assert d.group_epoch > epoch
        [member] = d.members
        # librdkafka sends its regex subscriptions as one alternation: "(^rx-...-.*)"
        assert member.subscribed_topic_regex in (f"^{prefix}-.*", f"(^{prefix}-.*)")
        assert {t.topic_name: sorted(t.partitions) for t in member.assignment.topic_partitions} == {
            f"{prefix}-a": [0, 1], f"{prefix}-b": [0, 1, 2]}
    finally:
        m.stop.set()
        m.join(15)


def test_list_groups_shows_the_consumer_type(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    group = "g-" + topic_name
    m = Member(broker.bootstrap, group, [topic_name])
    m.start()
    try:
        wait_until(lambda: describe(broker.bootstrap, group).group_state == "Stable", timeout=20, what="Stable")
        with RawClient(broker.bootstrap) as raw:
            listed = raw.request(16, 5, ListGroupsRequest(types_filter=["consumer"]))
            classic = raw.request(16, 5, ListGroupsRequest(types_filter=["classic"]))
        assert [(g.group_type, g.group_state, g.protocol_type) for g in listed.groups if g.group_id == group] == [
            ("consumer", "Stable", "consumer")]
        assert group not in {g.group_id for g in classic.groups}
    finally:
        m.stop.set()
        m.join(15)


# ---------------------------------------------------------------- raw frames


def topic_id(bootstrap: str, topic: str) -> bytes:
    with RawClient(bootstrap) as raw:
        md = raw.request(3, 12, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    return bytes(md.topics[0].topic_id)


def hb(raw: RawClient, version: int = 0, **fields: Any) -> Any:
    req = ConsumerGroupHeartbeatRequest(**{"rebalance_timeout_ms": -1, **fields})
    return raw.request(68, version, req)


def test_heartbeat_error_codes(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, 2)
    tid = topic_id(broker.bootstrap, topic_name)
    group = "g-" + topic_name
    TP = ConsumerGroupHeartbeatRequest.TopicPartitions
    with RawClient(broker.bootstrap) as raw:
        j = hb(raw, group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=5000,
               subscribed_topic_names=[topic_name], topic_partitions=[])
        assert (j.error_code, j.member_epoch, j.heartbeat_interval_ms) == (0, 1, 300)
        assert j.member_id and [(bytes(t.topic_id), t.partitions) for t in j.assignment.topic_partitions] == [
            (tid, [0, 1])]
        mid = j.member_id
        ok = hb(raw, group_id=group, member_id=mid, member_epoch=1, topic_partitions=[TP(topic_id=tid,
                                                                                         partitions=[0, 1])])
        assert (ok.error_code, ok.member_epoch, ok.assignment) == (0, 1, None)
        r = hb(raw, group_id=group, member_id="nobody", member_epoch=1)
        assert r.error_code == ErrorCode.UNKNOWN_MEMBER_ID and "nobody" in r.error_message
        r = hb(raw, group_id=group, member_id=mid, member_epoch=7)
        assert r.error_code == ErrorCode.FENCED_MEMBER_EPOCH
        r = hb(raw, group_id=group, member_id="", member_epoch=0, subscribed_topic_names=[topic_name],
               topic_partitions=[])
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST,
                                                   "RebalanceTimeoutMs must be provided in first request.")
        r = hb(raw, group_id="", member_id="x", member_epoch=1)
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
        r = hb(raw, group_id=group, member_id="", member_epoch=3)
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
        r = hb(raw, group_id=group, member_id=mid, member_epoch=-5)
        assert r.error_code == ErrorCode.INVALID_REQUEST
        r = hb(raw, group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=5000,
               subscribed_topic_names=[topic_name], topic_partitions=[], server_assignor="nope")
        assert r.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
        r = hb(raw, 1, group_id=group, member_id=str(uuid.uuid4()), member_epoch=0, rebalance_timeout_ms=5000,
               subscribed_topic_regex="[", topic_partitions=[])
        assert r.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
        # a classic heartbeat for the consumer group's member
        from kbroker.protocol.messages import HeartbeatRequest
        assert raw.request(12, 4, HeartbeatRequest(group_id=group, generation_id=1, member_id=mid)).error_code == (
            ErrorCode.UNKNOWN_MEMBER_ID)
        left = hb(raw, group_id=group, member_id=mid, member_epoch=-1)
        assert (left.error_code, left.member_epoch) == (0, -1)
        assert hb(raw, group_id=group, member_id=mid, member_epoch=1).error_code == ErrorCode.UNKNOWN_MEMBER_ID
        d = raw.request(69, 0, ConsumerGroupDescribeRequest(group_ids=[group, "no-such-group"]))
        assert [(g.group_id, g.error_code, g.group_state) for g in d.groups] == [
            (group, 0, "Empty"), ("no-such-group", ErrorCode.GROUP_ID_NOT_FOUND, "")]


def test_v1_groups_follow_kafka_4_4_epochs(broker: BrokerProcess, topic_name: str) -> None:
    """ConsumerGroupHeartbeat v1 (Kafka 4.x's) creates a group as Kafka 4.4 does (epoch 1 with an empty assignment,
    so the first join makes it 2; KAFKA-20268), wants the member's own id (KIP-1082), and an emptied group's
    assignment epoch follows its group epoch (KAFKA-20442); figures from tests/differential/kip848.py."""
    create_topic(broker.bootstrap, topic_name, 2)
    tid = topic_id(broker.bootstrap, topic_name)
    group = "g1-" + topic_name
    join = {"member_epoch": 0, "rebalance_timeout_ms": 5000, "subscribed_topic_names": [topic_name],
            "topic_partitions": []}
    with RawClient(broker.bootstrap) as raw:
        r = hb(raw, 1, group_id=group, member_id="", **join)
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
        mid = str(uuid.uuid4())
        j = hb(raw, 1, group_id=group, member_id=mid, **join)
        assert (j.error_code, j.member_id, j.member_epoch) == (0, mid, 2)
        assert [(bytes(t.topic_id), t.partitions) for t in j.assignment.topic_partitions] == [(tid, [0, 1])]
        (g,) = raw.request(69, 0, ConsumerGroupDescribeRequest(group_ids=[group])).groups
        assert (g.group_state, g.group_epoch, g.assignment_epoch) == ("Stable", 2, 2)
        assert [(m.member_epoch, m.subscribed_topic_regex) for m in g.members] == [(2, "")]
        assert hb(raw, 1, group_id=group, member_id=mid, member_epoch=-1).error_code == 0
        (g,) = raw.request(69, 0, ConsumerGroupDescribeRequest(group_ids=[group])).groups
        assert (g.group_state, g.group_epoch, g.assignment_epoch, g.members) == ("Empty", 3, 3, [])
        # v0 (Kafka 3.9's) creates a group as Kafka 3.9 does: the first join makes it epoch 1
        j = hb(raw, 0, group_id="g0-" + topic_name, member_id="", **join)
        assert (j.error_code, j.member_epoch) == (0, 1)


# ---------------------------------------------------------------- broker restart


def test_members_continue_after_the_broker_is_killed(tmp_path: Path, topic_name: str) -> None:
    # A session long enough for a restart on a loaded machine, and reconnects at most a second apart: librdkafka's
    # default backoff grows to 10 s while the broker is down, longer than the tests' 6 s sessions.
    b = BrokerProcess(tmp_path / "broker", kip848_broker(session_ms=15000))
    b.start()
    members: list[Member] = []
    try:
        create_topic(b.bootstrap, topic_name, 4)
        group = "g-" + topic_name
        producer = produce_steadily(b.bootstrap, topic_name, 800, 400, 4)
        members = [Member(b.bootstrap, group, [topic_name], **{"metadata.recovery.strategy": "none",
                                                                "reconnect.backoff.max.ms": 1000})
                   for _ in range(2)]
        for m in members:
            m.start()
        producer.join(30)
        wait_until(lambda: len(members[0].values() | members[1].values()) == 800, timeout=30, what="800 records")
        time.sleep(0.5)  # auto commit
        before = describe(b.bootstrap, group)
        assert before.group_state == "Stable"
        committed_before = committed(b.bootstrap, group, topic_name, 4)
        assert committed_before == end_offsets(b.bootstrap, topic_name, 4)
        b.kill()
        b.start()
        after = describe(b.bootstrap, group)
        # the group came back from __consumer_offsets: same members, epochs and assignment
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert {m.member_id: m.member_epoch for m in after.members} == {
            m.member_id: m.member_epoch for m in before.members}
        assert committed(b.bootstrap, group, topic_name, 4) == committed_before
        restarted = time.monotonic()
        producer = produce_steadily(b.bootstrap, topic_name, 400, 400, 4)
        producer.join(30)
        wait_until(lambda: sum(len([r for r in m.records if r[0] >= restarted]) for m in members) >= 400,
                   timeout=30, what="records produced after the restart")
        assert {m.member_id for m in describe(b.bootstrap, group).members} == {m.member_id for m in before.members}
        for m in members:
            m.stop.set()
            m.join(15)
        assert committed(b.bootstrap, group, topic_name, 4) == end_offsets(b.bootstrap, topic_name, 4)
    finally:
        for m in members:
            m.stop.set()
        b.kill()
