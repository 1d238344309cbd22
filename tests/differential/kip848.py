"""KIP-848 consumer groups compared with Apache Kafka 3.9 in KRaft mode (its ZooKeeper mode has no
ConsumerGroupHeartbeat): a member joins, heartbeats, is fenced for a wrong epoch, commits offsets with its member
epoch, is described, and leaves; an unknown member and a second member follow.

`python -m tests.differential.kip848` prints the table (exit 1 on a difference, 2 when Kafka cannot be had);
tests/differential/test_kip848.py runs it under KBROKER_DIFFERENTIAL_KIP848=1."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kbroker.protocol.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    FindCoordinatorRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
)

from tests.broker_process import BrokerProcess
from tests.differential import known
from tests.differential.harness import Pair, Tally
from tests.differential.session import COMMON, create_topics

HEARTBEAT, DESCRIBE, OFFSET_COMMIT, OFFSET_FETCH = 68, 69, 8, 9
GROUP = "diff-848"
# Kafka 3.9 serves KIP-848 groups in KRaft mode with the consumer protocol enabled (early access, on by default
# from 4.0); kbroker serves them always.
KRAFT = {k: v for k, v in COMMON.items() if k != "broker.id"} | {
    "group.coordinator.rebalance.protocols": "classic,consumer",
}


@contextlib.contextmanager
def kraft_pair(version: str = "3.9") -> Iterator[Pair]:
    """kbroker and Kafka (3.9 by default; KRaft, KIP-848 enabled) side by side; raises ArtifactUnavailable without
    Kafka."""
    from bench.peers.kafka import KafkaPeer

    with tempfile.TemporaryDirectory(prefix="differential-kip848-") as tmp:
        ours = BrokerProcess(Path(tmp) / "kbroker", overrides=dict(COMMON))
        ours.start()
        try:
            with KafkaPeer(version, mode="kraft", overrides=dict(KRAFT), base=Path(tmp) / "kafka") as kafka:
                pair = Pair(ours.bootstrap, kafka.bootstrap, classify=known.kip848_reason)
                try:
                    yield pair
                finally:
                    pair.close()
        finally:
            ours.stop()


def heartbeat(member: str, epoch: int, topics: list[str] | None = None) -> ConsumerGroupHeartbeatRequest:
    return ConsumerGroupHeartbeatRequest(
        group_id=GROUP,
        member_id=member,
        member_epoch=epoch,
        rebalance_timeout_ms=5000 if epoch == 0 else -1,
        subscribed_topic_names=topics,
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
    for target in (pair.ours, pair.theirs):
        while time.monotonic() < deadline:
            found = target.send(10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=[GROUP]))
            described = target.send(DESCRIBE, 0, ConsumerGroupDescribeRequest(group_ids=[GROUP]))
            codes = [c.error_code for c in getattr(found, "coordinators", [])]
            codes += [g.error_code for g in getattr(described, "groups", [])]
            if codes and not set(codes) & {14, 15, 16}:  # loading, not available, not coordinator
                break
            time.sleep(0.5)


def run(pair: Pair) -> Tally:
    """The sequence; each side's generated member id is threaded to its own requests."""
    create_topics(pair)
    warm_up(pair)
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
    return pair.tally


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
            tally = run(pair)
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
