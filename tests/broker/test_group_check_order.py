"""Classic group APIs check as Kafka's GroupCoordinator does: member, then generation, then the group's state
(issue 39 item 15). An OffsetCommit of an old generation while the group completes a rebalance is ILLEGAL_GENERATION
(clients treat it as harmless), not REBALANCE_IN_PROGRESS, and nothing is committed."""

from __future__ import annotations

import threading
import time
from typing import Any

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

from tests.broker_process import BrokerProcess
from tests.clients import RawClient

PROTOCOLS = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]


def _join(c: RawClient, group: str, member_id: str) -> Any:
    return c.request(
        11,
        5,
        JoinGroupRequest(
            group_id=group,
            session_timeout_ms=10000,
            rebalance_timeout_ms=10000,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=PROTOCOLS,
        ),
    )


def _new_member(c: RawClient, group: str) -> Any:
    r = _join(c, group, "")
    assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED
    return r.member_id


def _commit(
    c: RawClient, group: str, generation: int, member_id: str, topic: str, instance_id: str | None = None
) -> int:
    OC = OffsetCommitRequest
    resp = c.request(
        8,
        8,
        OC(
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member_id,
            group_instance_id=instance_id,
            retention_time_ms=-1,
            topics=[
                OC.OffsetCommitRequestTopic(
                    name=topic,
                    partitions=[
                        OC.OffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=5,
                            committed_leader_epoch=-1,
                            commit_timestamp=-1,
                            committed_metadata="",
                        )
                    ],
                )
            ],
        ),
    )
    return int(resp.topics[0].partitions[0].error_code)


def _heartbeat(c: RawClient, group: str, generation: int, member_id: str) -> int:
    return int(
        c.request(
            12,
            4,
            HeartbeatRequest(
                group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None
            ),
        ).error_code
    )


def _sync(c: RawClient, group: str, generation: int, member_id: str, assignments: list[str]) -> int:
    S = SyncGroupRequest
    return int(
        c.request(
            14,
            5,
            S(
                group_id=group,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[S.SyncGroupRequestAssignment(member_id=m, assignment=b"") for m in assignments],
            ),
        ).error_code
    )


def _committed(bootstrap: str, group: str, topic: str) -> int:
    F = OffsetFetchRequest
    with RawClient(bootstrap) as c:
        resp = c.request(
            9,
            7,
            F(
                group_id=group,
                require_stable=False,
                topics=[F.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])],
            ),
        )
    return int(resp.topics[0].partitions[0].committed_offset)


def test_old_generation_during_completing_rebalance(broker: BrokerProcess, topic_name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    group = f"{topic_name}-g"
    with RawClient(broker.bootstrap, timeout=20) as c1, RawClient(broker.bootstrap, timeout=20) as c2:
        m1 = _new_member(c1, group)
        first = _join(c1, group, m1)
        assert first.error_code == 0 and first.generation_id == 1
        assert _sync(c1, group, 1, m1, [m1]) == 0

        # A second member: the group prepares a rebalance until the first one joins again.
        m2 = _new_member(c2, group)
        second: list[Any] = []
        t = threading.Thread(target=lambda: second.append(_join(c2, group, m2)))
        t.start()
        try:
            # Until the second JoinGroup reaches the broker the group is still stable.
            deadline = time.monotonic() + 15
            while (hb := _heartbeat(c1, group, 1, m1)) == ErrorCode.NONE and time.monotonic() < deadline:
                time.sleep(0.05)
            assert hb == ErrorCode.REBALANCE_IN_PROGRESS
            rejoin = _join(c1, group, m1)
        finally:
            t.join(20)
        assert rejoin.error_code == 0 and rejoin.generation_id == 2 and second[0].generation_id == 2
        # Generation 2 waits for its leader's SyncGroup (CompletingRebalance).
        assert _commit(c1, group, 1, m1, topic_name) == ErrorCode.ILLEGAL_GENERATION
        assert _commit(c2, group, 1, m2, topic_name) == ErrorCode.ILLEGAL_GENERATION
        assert _commit(c1, group, 2, m1, topic_name) == ErrorCode.REBALANCE_IN_PROGRESS
        assert _commit(c1, group, 2, "nobody", topic_name) == ErrorCode.UNKNOWN_MEMBER_ID
        assert _commit(c1, group, 1, "nobody", topic_name) == ErrorCode.UNKNOWN_MEMBER_ID
        assert (
            _commit(c1, group, 2, m1, topic_name, instance_id="unknown-instance")
            == ErrorCode.UNKNOWN_MEMBER_ID
        )
        assert _commit(c1, group, -1, "", topic_name) == ErrorCode.UNKNOWN_MEMBER_ID  # the group is not empty
        assert _heartbeat(c1, group, 1, m1) == ErrorCode.ILLEGAL_GENERATION
        assert _heartbeat(c1, group, 2, m1) == ErrorCode.NONE
        assert _committed(broker.bootstrap, group, topic_name) == -1

        leader = rejoin.leader
        other = m2 if leader == m1 else m1
        lc, oc = (c1, c2) if leader == m1 else (c2, c1)
        follower: list[int] = []
        t = threading.Thread(target=lambda: follower.append(_sync(oc, group, 2, other, [])))
        t.start()
        assert _sync(lc, group, 2, leader, [m1, m2]) == 0
        t.join(20)
        assert follower == [0]
        assert _commit(c1, group, 2, m1, topic_name) == ErrorCode.NONE
    assert _committed(broker.bootstrap, group, topic_name) == 5
