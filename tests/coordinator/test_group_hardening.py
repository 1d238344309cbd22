"""Group coordinator hardening against a real broker (issue 12): internal topics refuse client writes, one
unreadable record in __consumer_offsets costs only itself, empty groups keep their protocol type, and session
timeouts expire members at their deadline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.coordinator.group_metadata import OffsetAndMetadata
from kbroker.coordinator.group_records import group_key, offset_key, offset_value
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    OffsetFetchRequest,
    ProduceRequest,
    SyncGroupRequest,
)
from kbroker.protocol.records import build_batch
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.broker_process import BrokerProcess
from tests.clients import Msg, ProduceFailed, RawClient, ck_conf, ck_produce, wait_until

T = 15
OFFSETS_PARTITIONS = 3
TOPIC = "orders"


@pytest.fixture
def b(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "broker", {
        "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
        "group.min.session.timeout.ms": "500",
    }).start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until its future resolves
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(T)
    yield broker
    broker.stop()


def restart(b: BrokerProcess) -> None:
    b.stop()
    b.start()


def commit(b: BrokerProcess, group: str, offsets: dict[int, int]) -> None:
    c = Consumer(ck_conf(b.bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def committed(b: BrokerProcess, group: str) -> dict[int, int]:
    c = Consumer(ck_conf(b.bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        got = c.committed([TopicPartition(TOPIC, p) for p in range(2)], timeout=T)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got if tp.offset >= 0}


def same_partition_groups(n: int) -> list[str]:
    target = partition_for("group-0", OFFSETS_PARTITIONS)
    return [g for g in (f"group-{i}" for i in range(100)) if partition_for(g, OFFSETS_PARTITIONS) == target][:n]


def forged_offset(group: str, offset: int) -> tuple[bytes, bytes]:
    return offset_key(group, TOPIC, 0), offset_value(OffsetAndMetadata(offset, -1, "forged", int(time.time() * 1000)))


# ---------------------------------------------------------------- internal topics


def test_clients_cannot_write_internal_topics(b: BrokerProcess) -> None:
    commit(b, "victim", {0: 5})
    key, value = forged_offset("victim", 999)
    p = partition_for("victim", OFFSETS_PARTITIONS)
    with pytest.raises(ProduceFailed) as failed:
        ck_produce(b.bootstrap, "__consumer_offsets", [Msg(key, value, partition=p)])
    assert failed.value.errors[0].code() == KafkaError.TOPIC_EXCEPTION

    batch = build_batch([(key, value, [], int(time.time() * 1000))])
    with RawClient(b.bootstrap) as c:
        # No transaction has run, so __transaction_state does not exist yet: Kafka's KafkaApis answers an unknown
        # partition before it looks at what the topic is.
        for topic, expected in (
                ("__consumer_offsets", (ErrorCode.INVALID_TOPIC_EXCEPTION, "Cannot append to internal topic __consumer_offsets")),
                ("__transaction_state", (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None))):
            resp = c.request(0, 9, ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
                ProduceRequest.TopicProduceData(name=topic, partition_data=[
                    ProduceRequest.PartitionProduceData(index=p, records=batch)])]))
            r = resp.responses[0].partition_responses[0]
            assert (r.error_code, r.error_message) == expected, topic
    assert committed(b, "victim") == {0: 5}
    restart(b)
    assert committed(b, "victim") == {0: 5}


def test_unreadable_record_costs_only_itself(b: BrokerProcess) -> None:
    first, second = same_partition_groups(2)
    commit(b, first, {0: 11, 1: 12})
    commit(b, second, {0: 21})
    b.stop()
    # Damaged records as an older broker let a client write them: a truncated offset key, an offset value that
    # does not parse, a group value that does not parse. The broker is down, so the log is ours.
    p = partition_for(first, OFFSETS_PARTITIONS)
    lg = Log.open(b.data_dir / "logs" / f"__consumer_offsets-{p}", "__consumer_offsets", p,
                  LogConfig(cleanup_policy="compact"), clean_shutdown=True)
    try:
        now = int(time.time() * 1000)
        key, _ = forged_offset(first, 0)
        lg.append_as_leader(build_batch([
            (b"\x00\x01\x00\x05gro", b"junk", [], now),
            (key, b"\x00\x03\x00", [], now),
            (group_key(second), b"\x00\x03\xff\xff\xff", [], now),
        ]), now, leader_epoch=0, from_client=False)
        lg.flush(lg.log_end_offset)
    finally:
        lg.close()
    b.start()
    assert committed(b, first) == {0: 11, 1: 12}
    assert committed(b, second) == {0: 21}
    log_text = b.read_log()
    assert not re.search(r"Loading __consumer_offsets-\d+ failed", log_text)
    assert log_text.count("Skipping unreadable record at offset") == 3
    # the partition keeps working and loads again after the next restart
    commit(b, second, {1: 22})
    restart(b)
    assert committed(b, first) == {0: 11, 1: 12}
    assert committed(b, second) == {0: 21, 1: 22}


# ---------------------------------------------------------------- protocol type of empty groups


def _listing(admin: AdminClient, group: str) -> object:
    listed = admin.list_consumer_groups(request_timeout=10).result(T).valid
    return next((g for g in listed if g.group_id == group), None)


def test_empty_consumer_group_is_not_a_simple_group(b: BrokerProcess) -> None:
    c = Consumer(ck_conf(b.bootstrap, **{"group.id": "typed", "enable.auto.commit": False,
                                         "session.timeout.ms": 6000}))
    try:
        c.subscribe([TOPIC])
        wait_until(lambda: (c.poll(0.2), c.assignment())[1], timeout=T, what="assignment")
    finally:
        c.close()  # LeaveGroup: the group becomes empty
    commit(b, "simple", {0: 1})
    for _ in range(2):
        admin = AdminClient({"bootstrap.servers": b.bootstrap})  # a fresh client after the restart

        def described(group: str) -> object:
            return admin.describe_consumer_groups([group], request_timeout=10)[group].result(T)  # noqa: B023

        wait_until(lambda: str(described("typed").state).endswith("EMPTY"), timeout=T, what="empty group")
        assert described("typed").is_simple_consumer_group is False
        assert _listing(admin, "typed").is_simple_consumer_group is False  # type: ignore[attr-defined]
        assert described("simple").is_simple_consumer_group is True
        assert _listing(admin, "simple").is_simple_consumer_group is True  # type: ignore[attr-defined]
        restart(b)  # the stored group metadata keeps the type too


# ---------------------------------------------------------------- session timeout


def test_member_expires_at_its_session_deadline(b: BrokerProcess) -> None:
    session_ms = 1000
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]
    with RawClient(b.bootstrap) as c:
        def join(member_id: str) -> object:
            return c.request(11, 5, JoinGroupRequest(
                group_id="timed", session_timeout_ms=session_ms, rebalance_timeout_ms=session_ms,
                member_id=member_id, group_instance_id=None, protocol_type="consumer", protocols=protocols))

        r = join("")
        assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED
        r = join(r.member_id)
        assert r.error_code == ErrorCode.NONE
        sync = c.request(14, 3, SyncGroupRequest(
            group_id="timed", generation_id=r.generation_id, member_id=r.member_id, group_instance_id=None,
            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=r.member_id, assignment=b"")]))
        # the session restarted when the broker handled the SyncGroup, before this moment
        synced = time.monotonic()
        assert sync.error_code == ErrorCode.NONE

        def delete_at(t: float) -> int:
            time.sleep(max(0.0, t - time.monotonic()))
            resp = c.request(42, 2, DeleteGroupsRequest(groups_names=["timed"]))
            return int(resp.results[0].error_code)

        assert delete_at(synced + session_ms / 1000 - 0.4) == ErrorCode.NON_EMPTY_GROUP
        # a sweep every 250 ms expired the member up to 250 ms late; a timer at the deadline does not
        assert delete_at(synced + session_ms / 1000 + 0.1) == ErrorCode.NONE


def test_member_that_never_syncs_leaves_after_the_rebalance_timeout(b: BrokerProcess) -> None:
    """Kafka's pending-sync expiry: a member that joined but sends no SyncGroup within the rebalance timeout is
    removed (its session is far longer), and the group rebalances to Empty."""
    rebalance_ms = 600
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]
    with RawClient(b.bootstrap) as c:
        def join(member_id: str) -> object:
            return c.request(11, 5, JoinGroupRequest(
                group_id="unsynced", session_timeout_ms=30000, rebalance_timeout_ms=rebalance_ms,
                member_id=member_id, group_instance_id=None, protocol_type="consumer", protocols=protocols))

        def state() -> str:
            return str(c.request(15, 5, DescribeGroupsRequest(groups=["unsynced"])).groups[0].group_state)

        r = join("")
        r = join(r.member_id)
        assert r.error_code == ErrorCode.NONE
        joined = time.monotonic()
        assert state() == "CompletingRebalance"
        wait_until(lambda: state() == "Empty", timeout=T, what="the unsynced member removed")
        assert time.monotonic() - joined >= rebalance_ms / 1000 - 0.1
        sync = c.request(14, 3, SyncGroupRequest(
            group_id="unsynced", generation_id=r.generation_id, member_id=r.member_id, group_instance_id=None,
            assignments=[]))
        assert sync.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_deleting_a_topic_removes_its_offsets_and_empty_groups(b: BrokerProcess) -> None:
    """Kafka's onPartitionsDeleted: a deleted topic's offsets leave every group, and each empty group left without
    offsets is removed, so a topic created again under the name starts without the old offsets."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("doomed", 1, 1)])["doomed"].result(T)
    commit(b, "keeps", {0: 3})  # offsets of another topic: stays
    c = Consumer(ck_conf(b.bootstrap, **{"group.id": "doomed-only", "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition("doomed", 0, 7)], asynchronous=False)
    finally:
        c.close()
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]
    with RawClient(b.bootstrap) as raw:

        def join(member_id: str) -> Any:
            return raw.request(
                11,
                5,
                JoinGroupRequest(
                    group_id="emptied",
                    session_timeout_ms=30000,
                    rebalance_timeout_ms=5000,
                    member_id=member_id,
                    protocol_type="consumer",
                    protocols=protocols,
                ),
            )

        member = join(join("").member_id).member_id
        raw.request(13, 4, LeaveGroupRequest(group_id="emptied", members=[LeaveGroupRequest.MemberIdentity(member_id=member)]))

        def groups() -> set[str]:
            return {g.group_id for g in raw.request(16, 4, ListGroupsRequest(states_filter=[], types_filter=[])).groups}

        assert groups() == {"keeps", "doomed-only", "emptied"}
        admin.delete_topics(["doomed"])["doomed"].result(T)
        wait_until(lambda: groups() == {"keeps"}, timeout=T, what="the emptied groups removed")
        admin.create_topics([NewTopic("doomed", 1, 1)])["doomed"].result(T)
        G = OffsetFetchRequest.OffsetFetchRequestGroup
        fetched = raw.request(
            9,
            8,
            OffsetFetchRequest(
                groups=[G(group_id="doomed-only", topics=[OffsetFetchRequest.OffsetFetchRequestTopics(name="doomed", partition_indexes=[0])])]
            ),
        )
        assert fetched.groups[0].topics[0].partitions[0].committed_offset == -1
    assert committed(b, "keeps") == {0: 3}
