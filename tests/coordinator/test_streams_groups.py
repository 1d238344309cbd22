"""KIP-1071 streams groups over raw requests: StreamsGroupHeartbeat's answers and error codes (unknown member,
fenced epoch, invalid topology, invalid requests), internal topic creation, StreamsGroupDescribe and ListGroups,
compared with Apache Kafka 4.4.0's answers to the same requests (tests/coordinator/streams_heartbeat_scenario.py;
`python -m tests.coordinator.streams_heartbeat_scenario` runs it on both brokers side by side)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import ApiVersionsRequest, ListGroupsRequest, StreamsGroupDescribeRequest

from tests.broker_process import BrokerProcess
from tests.clients import RawClient
from tests.coordinator.streams_heartbeat_scenario import (
    HB,
    heartbeat,
    join,
    kafka_answers,
    run,
    tasks,
    topology,
    wait_coordinator,
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("streams-groups"), {"offsets.topic.num.partitions": "3"}
    ).start()
    yield b
    b.stop()


def test_heartbeat_answers_as_kafka_4_4(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("streams-src", 2, 1)])["streams-src"].result(30)
    assert run(broker.bootstrap, "streams-src", "streams-app") == kafka_answers("streams-app")
    # The changelog topic was created by the broker with the source's partition count.
    md = admin.list_topics("streams-app-store-changelog", timeout=10)
    assert len(md.topics["streams-app-store-changelog"].partitions) == 2


def advertised(bootstrap: str) -> dict[int, tuple[int, int]]:
    with RawClient(bootstrap) as raw:
        return {
            k.api_key: (k.min_version, k.max_version)
            for k in raw.request(18, 3, ApiVersionsRequest()).api_keys
        }


def test_streams_apis_advertised_only_when_the_protocol_is_on(broker: BrokerProcess, tmp_path: Path) -> None:
    on = advertised(broker.bootstrap)
    assert (on[88], on[89]) == ((0, 1), (0, 1))
    off = BrokerProcess(
        tmp_path / "off", {"group.coordinator.rebalance.protocols": "classic,consumer"}
    ).start()
    try:
        assert not {88, 89} & set(advertised(off.bootstrap))
    finally:
        off.stop()


def test_a_member_that_does_not_revoke_is_fenced_after_its_rebalance_timeout(broker: BrokerProcess) -> None:
    """m1 owns both tasks; m2 joins: one task moves, withheld from m2 while m1 still owns it. m1 never reports it
    revoked: after its rebalance timeout (1 s) it is fenced, and m2 gets both tasks."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("revoke-src", 2, 1)])["revoke-src"].result(30)
    group = "revoke-app"
    both = [HB.TaskIds(subtopology_id="0", partitions=[0, 1])]
    with RawClient(broker.bootstrap, timeout=30) as raw:
        wait_coordinator(raw, group)
        j = join(raw, group, "m1", topology("revoke-src", group), rebalance_timeout_ms=1000)
        assert j.error_code == 0
        e1 = j.member_epoch

        def beat(member: str, epoch: int, owned: list[Any]) -> Any:
            return heartbeat(
                raw,
                group_id=group,
                member_id=member,
                member_epoch=epoch,
                active_tasks=owned,
                standby_tasks=[],
                warmup_tasks=[],
            )

        deadline = time.monotonic() + 20
        while True:
            r = beat("m1", e1, [])
            e1 = r.member_epoch
            if tasks(r.active_tasks) == {"0": [0, 1]}:
                break
            assert time.monotonic() < deadline, r
            time.sleep(0.3)
        j2 = join(raw, group, "m2", topology("revoke-src", group))
        assert (j2.error_code, tasks(j2.active_tasks)) == (0, {})  # its task is still m1's
        r = beat("m1", e1, both)
        assert r.error_code == 0 and r.member_epoch == e1  # revoking: the epoch waits for the revocation
        kept = tasks(r.active_tasks)
        assert kept is not None and len(kept["0"]) == 1
        time.sleep(1.5)
        assert beat("m1", e1, both).error_code == ErrorCode.UNKNOWN_MEMBER_ID
        e2, got = j2.member_epoch, None
        deadline = time.monotonic() + 10
        while got != {"0": [0, 1]}:
            r = beat("m2", e2, [])
            assert r.error_code == 0 and time.monotonic() < deadline, r
            e2, got = r.member_epoch, tasks(r.active_tasks) if r.active_tasks is not None else got
            time.sleep(0.2)


def test_internal_topics_need_create_permission(tmp_path: Path) -> None:
    """With an authorizer, a member that may not CREATE the changelog topic (on the cluster or the topic) gets
    MISSING_INTERNAL_TOPICS naming it, and the topic is not created (Kafka's KafkaApis.streamsGroupHeartbeat)."""
    b = BrokerProcess(
        tmp_path / "acl",
        {
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
            "offsets.topic.num.partitions": "1",
        },
    ).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("acl-src", 2, 1)])["acl-src"].result(30)
        deny = [
            AclBinding(
                rtype, name, pattern, "User:ANONYMOUS", "*", AclOperation.CREATE, AclPermissionType.DENY
            )
            for rtype, name, pattern in (
                (ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL),
                (ResourceType.TOPIC, "acl-app-", ResourcePatternType.PREFIXED),
            )
        ]
        for f in admin.create_acls(deny).values():
            f.result(30)
        with RawClient(b.bootstrap, timeout=30) as raw:
            wait_coordinator(raw, "acl-app")
            r = join(raw, "acl-app", "m1", topology("acl-src", "acl-app"))
        assert r.error_code == 0
        missing = [s.status_detail for s in r.status if s.status_code == 3]
        assert len(missing) == 1 and "Unauthorized to CREATE on topics acl-app-store-changelog" in missing[0]
        assert "acl-app-store-changelog" not in admin.list_topics(timeout=10).topics
    finally:
        b.stop()


def test_an_empty_group_takes_the_next_members_topology(broker: BrokerProcess) -> None:
    """A redeployed application may change its topology: the first member of the empty group brings it."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic("topo-a", 1, 1), NewTopic("topo-b", 1, 1)]).values():
        f.result(30)
    group = "topo-app"
    with RawClient(broker.bootstrap, timeout=30) as raw:
        wait_coordinator(raw, group)

        def sources() -> list[str]:
            d = raw.request(89, 0, StreamsGroupDescribeRequest(group_ids=[group]))
            return [t for s in d.groups[0].topology.subtopologies for t in s.source_topics]

        j = join(raw, group, "m1", topology("topo-a", group))
        assert j.error_code == 0 and sources() == ["topo-a"]
        # A second member's topology does not replace the group's while it has members.
        assert join(raw, group, "m2", topology("topo-b", group)).error_code == 0
        assert sources() == ["topo-a"]
        for m in ("m1", "m2"):
            assert heartbeat(raw, group_id=group, member_id=m, member_epoch=-1).error_code == 0
        assert join(raw, group, "m3", topology("topo-b", group)).error_code == 0
        assert sources() == ["topo-b"]


def test_an_empty_streams_group_becomes_classic_for_a_classic_member(broker: BrokerProcess) -> None:
    """An application going back to group.protocol=classic: the empty streams group is converted, as in Kafka."""
    from confluent_kafka import Consumer

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("conv-src", 2, 1)])["conv-src"].result(30)
    group = "conv-app"
    with RawClient(broker.bootstrap, timeout=30) as raw:
        wait_coordinator(raw, group)
        assert join(raw, group, "m1", topology("conv-src", group)).error_code == 0
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "session.timeout.ms": 6000})
        try:
            assert heartbeat(raw, group_id=group, member_id="m1", member_epoch=-1).error_code == 0
            c.subscribe(["conv-src"])
            deadline = time.monotonic() + 30
            while not c.assignment():
                assert time.monotonic() < deadline, "the classic member got no partitions"
                c.poll(0.2)
            assert sorted(tp.partition for tp in c.assignment()) == [0, 1]
        finally:
            c.close()
        lg = raw.request(16, 5, ListGroupsRequest(states_filter=[], types_filter=[]))
        assert [(g.group_type, g.protocol_type) for g in lg.groups if g.group_id == group] == [
            ("classic", "consumer")
        ]
