"""KIP-848 consumer groups compared with Apache Kafka in KRaft mode (3.9 by default, whose ZooKeeper mode has no
ConsumerGroupHeartbeat; `--kafka 4.4` for Kafka 4.x): a member joins, heartbeats, is fenced for a wrong epoch,
commits offsets with its member epoch, is described, and leaves; an unknown member and a second member follow.
Against Kafka 4.x, ConsumerGroupHeartbeat v1 sequences follow (client-generated member ids, KIP-1082): a fenced
member rejoining with epoch 0, a leave and a heartbeat after it, static members (replacement, an instance id still
owned, a static leave and return) and a regex subscription.

`python -m tests.differential.kip848` prints the table (exit 1 on a difference, 2 when Kafka cannot be had);
tests/differential/test_kip848.py runs it under KBROKER_DIFFERENTIAL_KIP848=1."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kbroker.protocol.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    CreateTopicsRequest,
    FindCoordinatorRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
)

from tests.broker_process import BrokerProcess
from tests.differential import known
from tests.differential.generate import TOPICS
from tests.differential.harness import Pair, Tally
from tests.differential.session import COMMON

HEARTBEAT, DESCRIBE, OFFSET_COMMIT, OFFSET_FETCH = 68, 69, 8, 9
GROUP = "diff-848"
GROUP_V1, GROUP_STATIC, GROUP_REGEX = "diff-848-v1", "diff-848-static", "diff-848-regex"
# Kafka 3.9 serves KIP-848 groups in KRaft mode with the consumer protocol enabled (early access, on by default
# from 4.0); kbroker serves them always.
KRAFT = {k: v for k, v in COMMON.items() if k != "broker.id"} | {
    "group.coordinator.rebalance.protocols": "classic,consumer",
}


def kafka_overrides(version: str) -> dict[str, str]:
    """KRAFT, and for Kafka 4.4+ no batching of target assignments: Kafka 4.4 (not 4.2) computes a group's next
    target assignment at most once per group.consumer.assignment.interval.ms (1 s by default), so a member joining
    within a second of the last assignment is answered with none; kbroker computes it at once."""
    from bench.peers.kafka import full_version

    major, minor = (int(x) for x in full_version(version).split(".")[:2])
    if (major, minor) >= (4, 4):
        return KRAFT | {"group.consumer.assignment.interval.ms": "0"}
    return dict(KRAFT)


def serves_v1(version: str) -> bool:
    """Kafka 4.0 added ConsumerGroupHeartbeat v1 (KIP-848 GA, regex subscriptions)."""
    from bench.peers.kafka import full_version

    return int(full_version(version).split(".")[0]) >= 4


@contextlib.contextmanager
def kraft_pair(version: str = "3.9") -> Iterator[Pair]:
    """kbroker and Kafka (3.9 by default; KRaft, KIP-848 enabled) side by side; raises ArtifactUnavailable without
    Kafka."""
    from bench.peers.kafka import KafkaPeer

    with tempfile.TemporaryDirectory(prefix="differential-kip848-") as tmp:
        ours = BrokerProcess(Path(tmp) / "kbroker", overrides=dict(COMMON))
        ours.start()
        try:
            with KafkaPeer(
                version, mode="kraft", overrides=kafka_overrides(version), base=Path(tmp) / "kafka"
            ) as kafka:
                pair = Pair(ours.bootstrap, kafka.bootstrap, classify=known.kip848_classifier(version))
                try:
                    yield pair
                finally:
                    pair.close()
        finally:
            ours.stop()


def heartbeat(
    member: str,
    epoch: int,
    topics: list[str] | None = None,
    group: str = GROUP,
    instance: str | None = None,
    regex: str | None = None,
) -> ConsumerGroupHeartbeatRequest:
    return ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        instance_id=instance,
        rebalance_timeout_ms=5000 if epoch == 0 else -1,
        subscribed_topic_names=topics,
        subscribed_topic_regex=regex,
        topic_partitions=[] if epoch == 0 else None,
    )


def commit(member: str, epoch: int) -> OffsetCommitRequest:
    P = OffsetCommitRequest.OffsetCommitRequestPartition
    return OffsetCommitRequest(
        group_id=GROUP,
        generation_id_or_member_epoch=epoch,
        member_id=member,
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name="diff-b", partitions=[P(partition_index=0, committed_offset=4, committed_metadata="")]
            )
        ],
    )


def warm_up(pair: Pair, timeout: float = 60.0) -> None:
    """Kafka loads __consumer_offsets after the first FindCoordinator and answers NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS until then; a client retries, so the group's coordinator is awaited uncompared."""
    deadline = time.monotonic() + timeout
    groups = [GROUP, GROUP_V1, GROUP_STATIC, GROUP_REGEX]
    for target in (pair.ours, pair.theirs):
        while time.monotonic() < deadline:
            found = target.send(10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=groups))
            described = target.send(DESCRIBE, 0, ConsumerGroupDescribeRequest(group_ids=groups))
            codes = [c.error_code for c in getattr(found, "coordinators", [])]
            codes += [g.error_code for g in getattr(described, "groups", [])]
            if codes and not set(codes) & {14, 15, 16}:  # loading, not available, not coordinator
                break
            time.sleep(0.5)


def setup_topics(pair: Pair) -> None:
    """diff-a and diff-b on both, uncompared: the topic configs Kafka 4.x lists differ from 3.9's (new configs,
    new defaults), which is no KIP-848 matter (the ZooKeeper-mode run compares CreateTopics)."""
    Topic = CreateTopicsRequest.CreatableTopic
    req = CreateTopicsRequest(
        topics=[Topic(name=n, num_partitions=p, replication_factor=1) for n, p in TOPICS.items()],
        timeout_ms=10000,
    )
    for target in (pair.ours, pair.theirs):
        target.send(19, 5, req)


def run(pair: Pair, version: str = "3.9") -> Tally:
    """The sequences; each side's generated member id is threaded to its own requests. The v1 sequences run
    when Kafka serves ConsumerGroupHeartbeat v1 (4.0+)."""
    setup_topics(pair)
    warm_up(pair)
    run_v0(pair)
    if serves_v1(version):
        run_v1(pair)
        run_static(pair)
        run_regex(pair)
    return pair.tally


def run_v0(pair: Pair) -> None:
    """ConsumerGroupHeartbeat v0 (Kafka 3.9's): broker-generated member ids."""
    ours, theirs, _ = pair.both(HEARTBEAT, 0, heartbeat("", 0, ["diff-b"]))
    ids: tuple[str, str] = (getattr(ours, "member_id", "") or "", getattr(theirs, "member_id", "") or "")
    epochs: tuple[int, int] = (getattr(ours, "member_epoch", 0), getattr(theirs, "member_epoch", 0))

    def each(api: int, version: int, build: Any, *args: Any) -> tuple[Any, Any]:
        a, b, _ = pair.each(api, version, build(ids[0], epochs[0], *args), build(ids[1], epochs[1], *args))
        return a, b

    each(HEARTBEAT, 0, heartbeat)  # steady: the same epoch, no new assignment
    each(HEARTBEAT, 0, lambda m, e: heartbeat(m, e + 5))  # FENCED_MEMBER_EPOCH
    pair.both(HEARTBEAT, 0, heartbeat("not-a-member", 1))  # UNKNOWN_MEMBER_ID
    each(OFFSET_COMMIT, 9, commit)  # the member's epoch
    each(OFFSET_COMMIT, 9, lambda m, e: commit(m, e + 1))  # STALE_MEMBER_EPOCH
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    each(
        OFFSET_FETCH,
        9,
        lambda m, e: OffsetFetchRequest(
            groups=[
                G(
                    group_id=GROUP,
                    member_id=m,
                    member_epoch=e,
                    topics=[
                        OffsetFetchRequest.OffsetFetchRequestTopics(name="diff-b", partition_indexes=[0, 1])
                    ],
                )
            ]
        ),
    )
    describe = ConsumerGroupDescribeRequest(
        group_ids=[GROUP, "diff-848-none"], include_authorized_operations=False
    )
    pair.both(DESCRIBE, 0, describe)
    # a second member subscribing to another topic joins: the group epoch moves on
    second, _, _ = pair.both(HEARTBEAT, 0, heartbeat("", 0, ["diff-a"]))
    pair.both(DESCRIBE, 0, describe)
    each(HEARTBEAT, 0, lambda m, e: heartbeat(m, -1))  # the first member leaves
    pair.both(DESCRIBE, 0, describe)


class Members:
    """v1 heartbeats with each side's own last member epoch per member id, so that one difference in epochs
    does not make every later request differ."""

    def __init__(self, pair: Pair, group: str) -> None:
        self.pair, self.group = pair, group
        self.epochs: dict[str, tuple[int, int]] = {}

    def heartbeat(self, member: str, epoch: int | Callable[[int], int], **fields: Any) -> tuple[Any, Any]:
        """epoch: the same for both sides, or a function of each side's last epoch of the member."""
        last = self.epochs.get(member, (0, 0))
        sides = (epoch(last[0]), epoch(last[1])) if callable(epoch) else (epoch, epoch)
        ours, theirs, _ = self.pair.each(
            HEARTBEAT,
            1,
            heartbeat(member, sides[0], group=self.group, **fields),
            heartbeat(member, sides[1], group=self.group, **fields),
        )
        self.epochs[member] = (_epoch(ours, last[0]), _epoch(theirs, last[1]))
        return ours, theirs

    def describe(self) -> None:
        self.pair.both(
            DESCRIBE,
            0,
            ConsumerGroupDescribeRequest(group_ids=[self.group], include_authorized_operations=False),
        )


def _epoch(answer: Any, last: int) -> int:
    return int(answer.member_epoch) if getattr(answer, "error_code", 1) == 0 else last


def same(e: int) -> int:
    return e


def run_v1(pair: Pair) -> None:
    """ConsumerGroupHeartbeat v1 (Kafka 4.0's): the member names itself (KIP-1082); a new group's epochs, a fenced
    member rejoining with epoch 0 (KAFKA-19233), a leave and what follows it."""
    g = Members(pair, GROUP_V1)
    a, b = "member-a-0000000000001", "member-b-0000000000001"
    g.heartbeat("", 0, topics=["diff-b"])  # INVALID_REQUEST: v1 wants the member id from the client
    g.heartbeat(a, 0, topics=["diff-b"])
    g.describe()
    g.heartbeat(a, same)  # steady
    g.heartbeat(b, 0, topics=["diff-b"])  # a second member: partitions move from a to b
    g.describe()
    g.heartbeat(a, same)  # a revokes what b is to get
    g.heartbeat(a, lambda e: e + 7)  # FENCED_MEMBER_EPOCH
    g.heartbeat(a, 0, topics=["diff-b"])  # a fenced member rejoins with epoch 0
    g.heartbeat("member-z-0000000000001", 3)  # UNKNOWN_MEMBER_ID
    g.describe()
    g.heartbeat(b, -1)  # leaves
    g.heartbeat(b, 1)  # after leaving: UNKNOWN_MEMBER_ID
    g.heartbeat(a, -1)  # the last member leaves
    g.describe()  # Empty: the epochs an empty group keeps


def run_static(pair: Pair) -> None:
    """Static members (an instance id): a second member id for an instance still owned (UNRELEASED_INSTANCE_ID),
    a static leave (-2), the instance's return under a new member id (it takes over the epoch and assignment)
    and the replaced member id's heartbeat."""
    g = Members(pair, GROUP_STATIC)
    s1, s2, s3 = "static-1-000000000001", "static-2-000000000001", "static-3-000000000001"
    g.heartbeat(s1, 0, topics=["diff-b"], instance="i-1")
    g.heartbeat(s2, 0, topics=["diff-b"], instance="i-1")  # UNRELEASED_INSTANCE_ID
    g.heartbeat("static-4-000000000001", 0, topics=["diff-a"], instance="i-2")  # a second static member
    g.describe()
    g.heartbeat(s1, -2, instance="i-1")  # a static leave: the member stays, epoch -2
    g.describe()
    g.heartbeat(s3, 0, topics=["diff-b"], instance="i-1")  # i-1 back as s3
    g.epochs[s1] = g.epochs.get(s3, (0, 0))
    g.heartbeat(s1, same, instance="i-1")  # the replaced member id: FENCED_INSTANCE_ID
    g.describe()


def run_regex(pair: Pair) -> None:
    """A regex subscription (v1), and an invalid one. Kafka resolves a regex off the request path, so its member's
    first answer carries no assignment (tests/differential/known.py); Kafka's member heartbeats (uncompared) until
    it is assigned, then both are compared."""
    g = Members(pair, GROUP_REGEX)
    member = "regex-1-0000000000001"
    g.heartbeat(member, 0, regex="diff-.*")
    g.heartbeat("regex-2-0000000000001", 0, regex="diff-[(")  # INVALID_REGULAR_EXPRESSION
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        theirs = pair.theirs.send(HEARTBEAT, 1, heartbeat(member, g.epochs[member][1], group=GROUP_REGEX))
        if getattr(theirs, "error_code", 1) != 0:
            break
        g.epochs[member] = (g.epochs[member][0], int(theirs.member_epoch))
        if theirs.assignment is not None and theirs.assignment.topic_partitions:
            break
        time.sleep(0.3)
    g.heartbeat(member, same)  # steady
    g.describe()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential.kip848", description=__doc__)
    parser.add_argument("--examples-shown", type=int, default=5, help="differences shown per API and version")
    parser.add_argument("--kafka", default="3.9", help="the Kafka release to compare with (KRaft mode)")
    parser.add_argument(
        "--dump", type=argparse.FileType("w"), help="write every difference in full to this file"
    )
    args = parser.parse_args(argv)
    from bench.peers.maven import ArtifactUnavailable

    try:
        with kraft_pair(args.kafka) as pair:
            pair.tally = Tally(args.examples_shown, args.dump)
            tally = run(pair, args.kafka)
    except ArtifactUnavailable as e:
        print(f"Kafka {args.kafka} is unavailable here: {e}", file=sys.stderr)
        return 2
    print(
        f"KIP-848 consumer groups: kbroker vs Kafka {args.kafka} (KRaft, consumer rebalance protocol enabled)"
    )
    print(tally.table())
    print(f"\n{tally.unexplained()} differences without a reason in tests/differential/known.py")
    return 1 if tally.unexplained() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
