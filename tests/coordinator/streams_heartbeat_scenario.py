"""One scenario of raw StreamsGroupHeartbeat / StreamsGroupDescribe / ListGroups requests (KIP-1071) and the
answers that matter, run against kbroker and against Apache Kafka 4.4 by test_streams_groups.py."""

from __future__ import annotations

import time
from typing import Any

from kbroker.protocol.messages import (
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    OffsetCommitRequest,
    StreamsGroupDescribeRequest,
    StreamsGroupHeartbeatRequest,
    SyncGroupRequest,
)

from tests.clients import RawClient

HB = StreamsGroupHeartbeatRequest
Topology = HB.Topology


def topology(source: str, app: str, changelog_partitions: int = 0) -> Any:
    """One subtopology reading `source` with a state store (its changelog created by the broker)."""
    return Topology(
        epoch=0,
        subtopologies=[
            HB.Subtopology(
                subtopology_id="0",
                source_topics=[source],
                source_topic_regex=[],
                repartition_sink_topics=[],
                repartition_source_topics=[],
                copartition_groups=[],
                state_changelog_topics=[
                    HB.TopicInfo(
                        name=f"{app}-store-changelog",
                        partitions=changelog_partitions,
                        replication_factor=0,
                        topic_configs=[],
                    )
                ],
            )
        ],
    )


def heartbeat(raw: RawClient, **fields: Any) -> Any:
    req = HB(**{"rebalance_timeout_ms": -1, "endpoint_information_epoch": 0, **fields})
    return raw.request(88, 1, req)


def join(raw: RawClient, group: str, member: str, topo: Any, rebalance_timeout_ms: int = 30000) -> Any:
    """Retried while the coordinator loads or moves (COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, ...)."""
    deadline = time.monotonic() + 30
    while True:
        r = heartbeat(
            raw,
            group_id=group,
            member_id=member,
            member_epoch=0,
            rebalance_timeout_ms=rebalance_timeout_ms,
            topology=topo,
            active_tasks=[],
            standby_tasks=[],
            warmup_tasks=[],
            process_id=member + "-p",
            client_tags=[],
        )
        if r.error_code not in (14, 15, 16) or time.monotonic() > deadline:
            return r
        time.sleep(0.3)


def tasks(ids: list[Any] | None) -> dict[str, list[int]] | None:
    return None if ids is None else {t.subtopology_id: sorted(t.partitions) for t in ids}


def wait_coordinator(raw: RawClient, group: str) -> None:
    """FindCoordinator until the group's coordinator is ready (this single broker)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if raw.request(10, 3, FindCoordinatorRequest(key=group, key_type=0)).error_code == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"no coordinator for {group}")


def run(bootstrap: str, source: str, group: str) -> list[tuple[Any, ...]]:
    """The answers, step by step: (step, error code, what else the step checks). `source` has 2 partitions."""
    out: list[tuple[Any, ...]] = []
    with RawClient(bootstrap, timeout=30) as raw:
        for g in (group, group + "-bad", group + "-missing", "no-such-streams-group"):
            wait_coordinator(raw, g)
        j = join(raw, group, "m1", topology(source, group))
        out.append(
            ("join", j.error_code, j.member_epoch > 0, sorted({s.status_code for s in j.status or []}))
        )
        epoch = j.member_epoch
        # The broker creates the changelog topic; within a few heartbeats the member owns both tasks.
        active = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = heartbeat(
                raw,
                group_id=group,
                member_id="m1",
                member_epoch=epoch,
                active_tasks=[],
                standby_tasks=[],
                warmup_tasks=[],
            )
            epoch = r.member_epoch
            if r.active_tasks is not None:
                active = tasks(r.active_tasks)
            if active == {"0": [0, 1]} and not r.status:
                break
            time.sleep(0.3)
        out.append(("assigned", active))
        owned = [HB.TaskIds(subtopology_id="0", partitions=[0, 1])]
        r = heartbeat(
            raw,
            group_id=group,
            member_id="m1",
            member_epoch=epoch,
            active_tasks=owned,
            standby_tasks=[],
            warmup_tasks=[],
        )
        out.append(("steady", r.error_code, r.member_epoch == epoch))

        def commit(member: str, member_epoch: int, version: int = 9) -> int:
            OC = OffsetCommitRequest
            req = OC(
                group_id=group,
                generation_id_or_member_epoch=member_epoch,
                member_id=member,
                topics=[
                    OC.OffsetCommitRequestTopic(
                        name=source,
                        partitions=[OC.OffsetCommitRequestPartition(partition_index=0, committed_offset=0)],
                    )
                ],
            )
            return int(raw.request(8, version, req).topics[0].partitions[0].error_code)

        # Offset commits of a streams member: its epoch; an older one only for tasks it had by then.
        out.append(
            (
                "commit",
                commit("m1", epoch),
                commit("m1", epoch + 1),
                commit("m1", epoch - 1),
                commit("nobody", epoch),
                commit("m1", epoch, version=8),
            )
        )
        jg = JoinGroupRequest(
            group_id=group,
            session_timeout_ms=10000,
            rebalance_timeout_ms=10000,
            member_id="",
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        )
        sg = SyncGroupRequest(group_id=group, generation_id=1, member_id="m1", assignments=[])
        hbc = HeartbeatRequest(group_id=group, generation_id=1, member_id="m1")
        lv = LeaveGroupRequest(group_id=group, members=[LeaveGroupRequest.MemberIdentity(member_id="x")])
        out.append(
            (
                "classic apis",
                raw.request(11, 5, jg).error_code,
                raw.request(14, 3, sg).error_code,
                raw.request(12, 3, hbc).error_code,
                raw.request(13, 3, lv).error_code,
            )
        )
        r = heartbeat(raw, group_id=group, member_id="nobody", member_epoch=epoch)
        out.append(("unknown member", r.error_code))
        r = heartbeat(raw, group_id=group, member_id="m1", member_epoch=epoch + 10)
        out.append(("greater epoch", r.error_code))
        r = heartbeat(raw, group_id="no-such-streams-group", member_id="m9", member_epoch=3)
        out.append(("unknown group", r.error_code))
        r = join(raw, group + "-bad", "m2", topology(source, group + "-bad", changelog_partitions=3))
        out.append(("changelog with partitions", r.error_code))
        r = heartbeat(
            raw,
            group_id=group,
            member_id="m3",
            member_epoch=0,
            rebalance_timeout_ms=30000,
            active_tasks=[],
            standby_tasks=[],
            warmup_tasks=[],
        )
        out.append(("join without topology", r.error_code, r.error_message))
        r = heartbeat(raw, group_id=group, member_id="", member_epoch=1)
        out.append(("empty member id", r.error_code, r.error_message))
        r = heartbeat(raw, group_id=group, member_id="m1", member_epoch=-5)
        out.append(("epoch -5", r.error_code))
        r = heartbeat(
            raw,
            group_id=group,
            member_id="m4",
            member_epoch=0,
            rebalance_timeout_ms=30000,
            topology=topology(source, group),
            active_tasks=owned,
            standby_tasks=[],
            warmup_tasks=[],
        )
        out.append(("join owning tasks", r.error_code, r.error_message))
        r = join(raw, group + "-missing", "m5", topology(source + "-absent", group + "-missing"))
        out.append(("missing source topic", r.error_code, sorted({s.status_code for s in r.status or []})))
        d = raw.request(89, 0, StreamsGroupDescribeRequest(group_ids=[group, "no-such-streams-group"]))
        # Kafka answers the groups in the order of their coordinator shards: compared sorted.
        mine = next(g for g in d.groups if g.group_id == group)
        out.append(
            (
                "describe",
                sorted((g.group_id, g.error_code) for g in d.groups),
                [(m.member_id, tasks(m.assignment.active_tasks)) for m in mine.members],
            )
        )
        d1 = raw.request(
            89, 1, StreamsGroupDescribeRequest(group_ids=[group], include_topology_description=True)
        )
        out.append(("describe v1", d1.groups[0].topology_description_status, d1.groups[0].assignor_name))
        lg = raw.request(16, 5, ListGroupsRequest(states_filter=[], types_filter=["streams"]))
        out.append(
            (
                "list",
                sorted((g.group_id, g.group_type, g.protocol_type) for g in lg.groups if g.group_id == group),
            )
        )
        r = heartbeat(raw, group_id=group, member_id="m1", member_epoch=-1)
        out.append(("leave", r.error_code, r.member_epoch))
        r = heartbeat(raw, group_id=group, member_id="m1", member_epoch=epoch)
        out.append(("after leave", r.error_code))
    return out


# Apache Kafka 4.4.0's answers (KRaft, defaults), as `python -m tests.coordinator.streams_heartbeat_scenario` prints
# them next to kbroker's. Status codes: 1 MISSING_SOURCE_TOPICS, 3 MISSING_INTERNAL_TOPICS, 5 ASSIGNMENT_DELAYED.
def kafka_answers(group: str) -> list[tuple[Any, ...]]:
    return [
        ("join", 0, True, [3, 5]),
        ("assigned", {"0": [0, 1]}),
        ("steady", 0, True),
        # the member's epoch; a greater one and one older than the tasks' assignment: STALE_MEMBER_EPOCH;
        # an unknown member; OffsetCommit v8: UNSUPPORTED_VERSION
        ("commit", 0, 113, 113, 25, 35),
        # JoinGroup INCONSISTENT_GROUP_PROTOCOL, SyncGroup and Heartbeat UNKNOWN_MEMBER_ID, LeaveGroup NONE
        ("classic apis", 23, 25, 25, 0),
        ("unknown member", 25),  # UNKNOWN_MEMBER_ID
        ("greater epoch", 110),  # FENCED_MEMBER_EPOCH
        ("unknown group", 69),  # GROUP_ID_NOT_FOUND
        ("changelog with partitions", 130),  # STREAMS_INVALID_TOPOLOGY
        ("join without topology", 42, "Topology must be non-null when (re-)joining."),  # INVALID_REQUEST
        ("empty member id", 42, "MemberId can't be empty."),
        ("epoch -5", 42),
        ("join owning tasks", 42, "ActiveTasks must be empty when (re-)joining."),
        ("missing source topic", 0, [1, 5]),
        ("describe", sorted([(group, 0), ("no-such-streams-group", 69)]), [("m1", {"0": [0, 1]})]),
        ("describe v1", 1, "sticky"),  # TopologyDescriptionStatus NOT_STORED
        ("list", [(group, "streams", "streams")]),
        ("leave", 0, -1),
        ("after leave", 25),
    ]


def main() -> int:
    """Runs the scenario on a kbroker and on an Apache Kafka 4.4 broker and prints where their answers differ."""
    import tempfile
    from pathlib import Path

    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.peers.kafka import KafkaPeer
    from tests.broker_process import BrokerProcess

    answers = {}
    with tempfile.TemporaryDirectory() as d:
        kb = BrokerProcess(Path(d) / "kbroker", {"offsets.topic.num.partitions": "3"}).start()
        try:
            with KafkaPeer("4") as kafka:
                for name, bootstrap in (("kbroker", kb.bootstrap), ("kafka", kafka.bootstrap)):
                    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the topic exists
                    admin.create_topics([NewTopic("src", 2, 1)])["src"].result(30)
                    answers[name] = run(bootstrap, "src", "app")
        finally:
            kb.stop()
    same = True
    for k, a in zip(answers["kbroker"], answers["kafka"], strict=True):
        mark = "  " if k == a else "!="
        same = same and k == a
        print(f"{mark} kbroker {k}\n   kafka   {a}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
