"""A share group survives its coordinator's kill -9: membership, epochs, subscriptions and the assignment are
written to __consumer_offsets as Kafka's ShareGroup* records and replayed at load, so a confluent-kafka
ShareConsumer keeps its member id and epoch across the restart, and a member that never comes back is removed
when its session times out."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kbroker.protocol.messages import ShareGroupDescribeRequest, ShareGroupHeartbeatRequest

from kbroker_tools.wire import WireClient
from tests.broker_process import BrokerProcess
from tests.clients import wait_until

T = 30


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker"),
        {
            "group.share.heartbeat.interval.ms": "500",
            "group.share.min.heartbeat.interval.ms": "100",
            "group.share.min.session.timeout.ms": "1000",
            "offsets.topic.num.partitions": "2",
            "share.coordinator.state.topic.num.partitions": "2",
        },
    )
    b.start()
    yield b
    b.stop()


def describe(bootstrap: str, group: str) -> object:
    with WireClient(bootstrap) as w:
        return w.request(77, 1, ShareGroupDescribeRequest(group_ids=[group])).groups[0]


def heartbeat(bootstrap: str, group: str, member: str, epoch: int, topics: list[str] | None) -> int:
    with WireClient(bootstrap) as w:
        r = w.request(
            76,
            1,
            ShareGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=epoch, subscribed_topic_names=topics
            ),
        )
    assert r.error_code == 0, r
    return int(r.member_epoch)


def members_view(d: object) -> dict[str, tuple[int, list[str], list[int]]]:
    return {
        m.member_id: (
            m.member_epoch,
            sorted(m.subscribed_topic_names),
            sorted(p for t in m.assignment.topic_partitions for p in t.partitions),
        )
        for m in d.members  # type: ignore[attr-defined]
    }


def test_share_group_survives_a_coordinator_kill(broker: BrokerProcess, topic_name: str) -> None:
    group = "g-" + topic_name
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])  # shared by both members[topic_name].result(T)
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in {"share.auto.offset.reset": "earliest", "share.session.timeout.ms": "6000"}.items()
        ],
    )
    admin.incremental_alter_configs([res])[res].result(T)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce(topic_name, f"a{i}".encode())
    assert p.flush(T) == 0
    # a member that joins and is never heard of again: it must outlive the restart, then time out
    ghost = str(uuid.uuid4())
    ghost_epoch = heartbeat(broker.bootstrap, group, ghost, 0, [topic_name])
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        c.subscribe([topic_name])
        got: list[str] = []
        deadline = time.monotonic() + T
        while len(got) < 10 and time.monotonic() < deadline:
            got += [m.value().decode() for m in c.poll(0.5) if m.error() is None]
            ghost_epoch = heartbeat(broker.bootstrap, group, ghost, ghost_epoch, None)
        assert sorted(got) == sorted(f"a{i}" for i in range(10))
        c.commit_sync()
        ghost_epoch = heartbeat(broker.bootstrap, group, ghost, ghost_epoch, None)  # its session starts again
        before = describe(broker.bootstrap, group)
        members = members_view(before)
        assert len(members) == 2 and ghost in members
        real = next(m for m in members if m != ghost)
        assert members[real][1:] == members[ghost][1:] == ([topic_name], [0])

        broker.kill()
        broker.restart()
        after = wait_until(
            lambda: (d := describe(broker.bootstrap, group)).error_code == 0 and d,
            timeout=T,
            what="the group described after the restart",
        )
        # replayed from __consumer_offsets: the same epochs, members, subscriptions and assignment
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert members_view(after) == members
        assert after.group_state == "Stable"

        # the consumer carries on as the same member at the same epoch (no rejoin) and reads new records
        for i in range(6):
            p.produce(topic_name, f"b{i}".encode())
        assert p.flush(T) == 0
        got = []
        deadline = time.monotonic() + T
        while len(got) < 6 and time.monotonic() < deadline:
            got += [m.value().decode() for m in c.poll(0.5) if m.error() is None]
        assert sorted(got) == sorted(f"b{i}" for i in range(6))
        # the ghost misses its 6 s session (counted from the load) and goes; the consumer stays, same id
        later = wait_until(
            lambda: ghost not in members_view(d := describe(broker.bootstrap, group)) and d,
            timeout=T,
            what="the silent member removed",
        )
        assert list(members_view(later)) == [real]
        assert later.group_epoch == before.group_epoch + 1
    finally:
        c.close()
    # the consumer's leave is written too: after another restart the group is there, empty
    broker.kill()
    broker.restart()
    final = wait_until(
        lambda: (d := describe(broker.bootstrap, group)).error_code == 0 and d, timeout=T, what="described"
    )
    assert (final.group_state, final.members, final.group_epoch) == ("Empty", [], before.group_epoch + 2)
