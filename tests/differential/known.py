"""Differences from Apache Kafka 3.9 the differential harness expects, each with its reason (docs/differences-from-kafka.md
states them for users)."""

from __future__ import annotations

import copy
from typing import Any

from tests.differential.harness import CLOSED, TIMEOUT, Tally

# ApiVersions: api key -> why kbroker's advertised range differs from Kafka 3.9's (ZooKeeper mode).
API_VERSIONS: dict[int, str] = {
    38: "delegation tokens are not supported",
    39: "delegation tokens are not supported",
    40: "delegation tokens are not supported",
    41: "delegation tokens are not supported",
    57: "UpdateFeatures: kbroker has no finalized feature levels to update",
    58: "Envelope: KRaft request forwarding, not used by kbroker",
    67: "AllocateProducerIds: KRaft controller RPC; kbroker allocates producer id blocks in ZooKeeper or locally",
    68: "ConsumerGroupHeartbeat v1 (Kafka 4.0's) is served too, because librdkafka speaks only v1",
    75: "DescribeTopicPartitions is served (Kafka 3.9 answers it in KRaft mode only)",
    **dict.fromkeys(
        (76, 77, 78, 79, 83, 84, 85, 86, 87, 90, 91, 92),
        "share groups (KIP-932, Kafka 4.x's specs) are served; Kafka 3.9 has none",
    ),
    **dict.fromkeys((88, 89), "streams groups (KIP-1071, Kafka 4.4's specs) are served; Kafka 3.9 has none"),
}

# Stateful scenarios: API -> why its answers in tests/differential/scenarios.py differ from Kafka 3.9's.
SCENARIOS: dict[str, str] = {}

# Generated requests: reason -> why kbroker deliberately answers otherwise than Kafka 3.9 (ZooKeeper mode). The long
# run (`python -m tests.differential`) counts an answer pair that generated_reason() below puts under one of them in
# a row "API (known: reason)"; every other difference is one to fix.
GENERATED: dict[str, str] = {
    "ListOffsets v0": "Kafka 3.9 refuses the -1 (latest) and -2 (earliest) timestamps in v0 with UNSUPPORTED_VERSION "
    "(its timestampMinSupportedVersion starts at v1); kbroker keeps answering the 0.8-0.10 clients that send v0",
    "OffsetFetch v0": "Kafka 3.9 in ZooKeeper mode reads v0 offsets from ZooKeeper (unknown partitions "
    "UNKNOWN_TOPIC_OR_PARTITION); kbroker keeps no ZooKeeper offsets and answers v0 from __consumer_offsets",
    "KIP-848": "ConsumerGroupHeartbeat and ConsumerGroupDescribe: KIP-848 groups are served; Kafka 3.9 in ZooKeeper "
    "mode answers UNSUPPORTED_VERSION",
    "auto-created topic": "Kafka 3.9 in ZooKeeper mode creates an auto-created topic asynchronously and answers "
    "LEADER_NOT_AVAILABLE without partitions until the controller has elected its leaders; kbroker creates it "
    "before answering, so the client gets its partitions at once",
    "null record set": "Kafka 3.9 never answers a Produce whose null record set it would append, nor one failing as "
    "a whole while it names a null record set (NullPointerException in ProduceRequest.partitionSizes); kbroker "
    "answers the partition INVALID_RECORD (v3+) or CORRUPT_MESSAGE",
    "Kafka never answers": "Kafka 3.9 fails while reading the request and never answers it (an AlterConfigs or "
    "IncrementalAlterConfigs resource type it does not know, an OffsetFetch v8+ naming no group, a "
    "DescribeUserScramCredentials with a null user list); kbroker answers it",
    "OffsetCommit v0": "Kafka 3.9 in ZooKeeper mode writes an OffsetCommit v0 to ZooKeeper without a group check; "
    "kbroker keeps it in __consumer_offsets like a v1 commit without generation (a group with members refuses it "
    "UNKNOWN_MEMBER_ID), so later OffsetFetch v1+ answers list those offsets and DescribeLogDirs counts their "
    "bytes in kbroker only",
    "ApiVersions": "the advertised ranges of API_VERSIONS above, and finalized_features_epoch: 0 in Kafka (its "
    "ZooKeeper feature znode), -1 in a standalone kbroker with no finalized features",
}

# Replayed client sessions (tests/differential/replay.py): label -> why such answers differ. The replay counts them
# under their label instead of the API's own row.
REPLAY: dict[str, str] = {
    "Kafka transient": "Kafka answered a retriable error of its asynchronous start (COORDINATOR_LOAD_IN_PROGRESS, "
    "COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, LEADER_NOT_AVAILABLE while it creates an internal or auto-created "
    "topic); the client retried, and the replay sends the retry's first attempt to kbroker, which is ready at once",
    "ApiVersions": GENERATED["ApiVersions"],
    # -- replay sessions of kafka-python, aiokafka and the Java client (kp-*, aio-*, java-* in sessions.py) --
    "Kafka completing a transaction": "Kafka answered CONCURRENT_TRANSACTIONS to an AddPartitionsToTxn (or "
    "InitProducerId) sent right after EndTxn: Kafka 3.9 answers EndTxn once PrepareCommit/PrepareAbort is written "
    "and sends the markers afterwards, refusing the next transaction until they are written; kbroker writes the "
    "markers before it answers EndTxn, so the client's first attempt succeeds (the client retries either way)",
    "Kafka auto-creating": "Kafka 3.9 answered UNKNOWN_TOPIC_OR_PARTITION to a Metadata request allowing "
    "auto-creation while its own creation of that topic was still in flight (seen under load; the client asks "
    "again); kbroker creates the topic before answering, as under GENERATED's auto-created topics",
}


UNSUPPORTED_VERSION, LEADER_NOT_AVAILABLE, GROUP_ID_NOT_FOUND = 35, 5, 69
METADATA, OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_LOG_DIRS = 3, 8, 9, 35


class GeneratedReasons:
    """Puts a differing answer pair under the GENERATED reason it falls under, or None (a difference to fix or
    explain). Each rule names the exact shape of the deliberate difference, so anything else in the same answers
    stays counted. It sees every answer pair (Pair calls it for identical ones too), to remember what a
    deliberate difference left behind: the offsets OffsetCommit v0 stored in kbroker and not in Kafka (ZooKeeper)."""

    def __init__(self) -> None:
        self.v0_commits: set[tuple[str, str, int]] = set()  # (group, topic, partition)
        self.auto_created: set[str] = set()  # topics a Metadata request created in kbroker and not in Kafka

    def __call__(self, api_key: int, version: int, request: Any, ours: Any, theirs: Any) -> str | None:
        if api_key == OFFSET_COMMIT and version == 0 and not isinstance(ours, str):
            self.v0_commits |= {
                (request.group_id, t.name, p.partition_index)
                for t in ours.topics
                for p in t.partitions
                if p.error_code == 0
            }
        if api_key == METADATA and not isinstance(ours, str) and not isinstance(theirs, str):
            known = {t.name for t in theirs.topics if not t.error_code}
            self.auto_created |= {t.name for t in ours.topics if not t.error_code and t.name not in known}
        return generated_reason(api_key, version, request, ours, theirs, self.v0_commits, self.auto_created)


def generated_reason(
    api_key: int,
    version: int,
    request: Any,
    ours: Any,
    theirs: Any,
    v0_commits: set[tuple[str, str, int]] | frozenset[tuple[str, str, int]] = frozenset(),
    auto_created: set[str] | frozenset[str] = frozenset(),
) -> str | None:
    """GeneratedReasons without memory (v0_commits: the offsets OffsetCommit v0 stored in kbroker only)."""
    never = theirs in (TIMEOUT, CLOSED) and not isinstance(ours, str)
    if api_key == 0 and never and _null_records(request):
        return "null record set"
    if never and (
        (api_key in (33, 44) and any(r.resource_type not in (2, 4, 8, 16) for r in request.resources))
        or (api_key == OFFSET_FETCH and version >= 8 and not request.groups)
        or (api_key == 50 and request.users is None)
    ):
        return "Kafka never answers"
    if isinstance(ours, str) or isinstance(theirs, str):
        return None
    if api_key == 68 and theirs.error_code == UNSUPPORTED_VERSION:
        return "KIP-848"
    if api_key == 69 and all(g.error_code == UNSUPPORTED_VERSION for g in theirs.groups):
        return "KIP-848"
    if api_key == 2 and version == 0:
        return "ListOffsets v0"
    if api_key == OFFSET_FETCH and version == 0:
        return "OffsetFetch v0"
    if api_key == OFFSET_COMMIT and version == 0:
        return "OffsetCommit v0"
    if api_key == 18:
        return "ApiVersions"  # the ranges are compared by themselves (API_VERSIONS)
    if api_key == METADATA and _auto_created(ours, theirs, auto_created):
        return "auto-created topic"
    if (
        v0_commits
        and api_key == OFFSET_FETCH
        and Tally.same(_without_v0_offsets(request, ours, theirs, v0_commits), theirs)
    ):
        return "OffsetCommit v0"
    if (
        v0_commits
        and api_key == DESCRIBE_LOG_DIRS
        and Tally.same(_v0_sizes(ours, theirs, v0_commits), theirs)
    ):
        return "OffsetCommit v0"
    return None


def _without_v0_offsets(request: Any, ours: Any, theirs: Any, v0_commits: Any) -> Any:
    """kbroker's OffsetFetch answer with each offset only an OffsetCommit v0 stored taken as Kafka answers it
    (nothing committed), or left out where Kafka lists the group's offsets and has none there."""
    ours = copy.deepcopy(ours)

    def patch(group: str, topics: list[Any], theirs_topics: list[Any], named: bool) -> list[Any]:
        kafka = {(t.name, p.partition_index): p for t in theirs_topics for p in t.partitions}
        for t in topics:
            kept = []
            for p in t.partitions:
                if (group, t.name, p.partition_index) not in v0_commits:
                    kept.append(p)
                elif (t.name, p.partition_index) in kafka:
                    kept.append(kafka[(t.name, p.partition_index)])
                elif named:
                    kept.append(p)
            t.partitions = kept
        return [t for t in topics if t.partitions or named]

    if request.groups:  # v8+: one answer per group, in the request's order
        for asked, g, k in zip(request.groups, ours.groups, theirs.groups, strict=False):
            g.topics = patch(asked.group_id, g.topics, k.topics, asked.topics is not None)
    else:
        ours.topics = patch(request.group_id, ours.topics, theirs.topics, request.topics is not None)
    return ours


def _v0_sizes(ours: Any, theirs: Any, v0_commits: Any) -> Any:
    """kbroker's DescribeLogDirs answer with the sizes of the __consumer_offsets partitions holding an OffsetCommit
    v0 (kbroker's extra record batches) taken from Kafka's answer."""
    from kbroker.coordinator.group_coordinator import partition_for

    partitions = {partition_for(g, 50) for g, _, _ in v0_commits}  # session.COMMON: 50 offsets partitions
    kafka = {
        (t.name, p.partition_index): p.partition_size
        for r in theirs.results
        for t in r.topics
        for p in t.partitions
    }
    ours = copy.deepcopy(ours)
    for r in ours.results:
        for t in r.topics:
            for p in t.partitions:
                if t.name == "__consumer_offsets" and p.partition_index in partitions:
                    p.partition_size = kafka.get((t.name, p.partition_index), p.partition_size)
    return ours


def _null_records(request: Any) -> bool:
    return any(p.records is None for t in request.topic_data for p in t.partition_data)


def _auto_created(ours: Any, theirs: Any, auto_created: set[str] | frozenset[str] = frozenset()) -> bool:
    """Kafka's answer equals kbroker's once each topic Kafka is still creating takes kbroker's entry of that name
    (created, with its partitions): an entry LEADER_NOT_AVAILABLE (without partitions, or with partitions still
    without a leader), or, in a listing of all topics, a topic an earlier request auto-created that Kafka's
    metadata does not show yet."""
    mine = {t.name: t for t in ours.topics}
    kafka = {t.name for t in theirs.topics}

    def creating(t: Any) -> bool:
        waiting = t.error_code == LEADER_NOT_AVAILABLE and not t.partitions
        leaderless = any(p.error_code == LEADER_NOT_AVAILABLE for p in t.partitions)
        return (waiting or leaderless) and t.name in mine and not mine[t.name].error_code

    patched = copy.copy(theirs)
    patched.topics = [mine[t.name] if creating(t) else t for t in theirs.topics]
    missing = [t for n, t in mine.items() if n not in kafka and n in auto_created] if theirs.topics else []
    patched.topics += missing
    return (any(creating(t) for t in theirs.topics) or bool(missing)) and Tally.same(ours, patched)


# KIP-848 groups compared with Kafka in KRaft mode (tests/differential/kip848.py): reason -> why.
KIP848: dict[str, str] = {
    "Kafka 3.9 early access": "Kafka 3.9's consumer group coordinator is an early-access release: its "
    "ConsumerGroupDescribe answers an unknown group id once more (GROUP_ID_NOT_FOUND, one answer per coordinator "
    "shard) beside the groups it found; kbroker answers each group once, as Kafka 4.x",
    "Kafka 4.4 epochs of a v0 group": "Kafka 4.4 creates every group at epoch 1 with an empty target assignment at "
    "epoch 1 (KAFKA-20268, so that a member can wait on epoch 1 while its first assignment is computed off the "
    "request path), so a group's first join makes it epoch 2; Kafka 3.9-4.2 create it at 0 (first join: 1). "
    "kbroker creates a group as the release whose ConsumerGroupHeartbeat version created it: v1 (Kafka 4.x's) as "
    "Kafka 4.4, v0 (Kafka 3.9's) as Kafka 3.9, so a v0 group's epochs are one lower than Kafka 4.4's",
    "Kafka 4.0-4.2 epochs of a v1 group": "the other side of the reason above: Kafka before 4.4 creates a group at "
    "epoch 0 whatever the version, kbroker a v1-created group as Kafka 4.4, so its epochs are one higher than Kafka "
    "4.2's; and Kafka before 4.4 leaves an emptied group's assignment epoch behind its group epoch (KAFKA-20442)",
    "Kafka 4.x regex resolution": "Kafka 4.x resolves a member's SubscribedTopicRegex on a background thread: the "
    "heartbeat that brings the regex is answered before it is resolved (the group's current epoch, no partitions) "
    "and a later heartbeat gets the assignment; kbroker resolves the regex in the request (its first answer "
    "carries the assignment, the epochs are the same once Kafka has resolved it)",
}


def kip848_classifier(version: str) -> Any:
    """The classifier of a comparison against Kafka `version`: the KIP848 reason of a differing answer pair."""
    from bench.peers.kafka import full_version

    kafka = tuple(int(x) for x in full_version(version).split(".")[:2])
    major = kafka[0]

    def classify(api_key: int, version: int, request: Any, ours: Any, theirs: Any) -> str | None:
        if isinstance(ours, str) or isinstance(theirs, str):
            return None
        if major < 4:
            return _kafka39_describe(api_key, ours, theirs)
        return _kafka4_epochs(api_key, version, request, ours, theirs, kafka) or _kafka4_regex(
            api_key, version, request, ours, theirs
        )

    return classify


def _kafka39_describe(api_key: int, ours: Any, theirs: Any) -> str | None:
    if api_key != 69:
        return None
    patched = copy.deepcopy(theirs)
    found = {g.group_id for g in patched.groups if g.error_code != GROUP_ID_NOT_FOUND}
    seen: set[str] = set()
    groups = []
    for g in patched.groups:
        if g.error_code == GROUP_ID_NOT_FOUND and (g.group_id in found or g.group_id in seen):
            continue  # the early-access coordinator's other answers for a group id (one per coordinator shard)
        seen.add(g.group_id)
        groups.append(g)
    patched.groups = groups
    return "Kafka 3.9 early access" if Tally.same(ours, patched) else None


V0_GROUP = "diff-848"  # kip848.GROUP, the group the v0 sequence creates
V1_GROUPS = ("diff-848-v1", "diff-848-static", "diff-848-regex")  # the groups kip848's v1 sequences create


def _kafka4_epochs(
    api_key: int, version: int, request: Any, ours: Any, theirs: Any, kafka: tuple[int, int]
) -> str | None:
    """Kafka 4.4's epochs of the group a v0 heartbeat created, one lower, are kbroker's; Kafka 4.0-4.2's epochs of
    a group v1 heartbeats created, one higher (an emptied group's assignment epoch at its group epoch), are."""
    if kafka >= (4, 4):
        groups, shift, reason = (V0_GROUP,), -1, "Kafka 4.4 epochs of a v0 group"
    else:
        groups, shift, reason = V1_GROUPS, 1, "Kafka 4.0-4.2 epochs of a v1 group"
    named = {getattr(request, "group_id", None), *getattr(request, "group_ids", [])}
    if not named & set(groups):
        return None
    patched = copy.deepcopy(theirs)
    if api_key == 68:
        if version != (0 if shift < 0 else 1) or patched.error_code:
            return None
        if patched.member_epoch > 0:
            patched.member_epoch += shift
    elif api_key == 69:
        for g in patched.groups:
            if g.group_id in groups and g.error_code == 0:
                g.group_epoch += shift
                g.assignment_epoch += shift
                if shift > 0 and g.group_state == "Empty":
                    g.assignment_epoch = g.group_epoch
                for m in g.members:
                    if m.member_epoch > 0:
                        m.member_epoch += shift
    else:
        return None
    return reason if Tally.same(ours, patched) else None


def _kafka4_regex(api_key: int, version: int, request: Any, ours: Any, theirs: Any) -> str | None:
    """Kafka's answer to the heartbeat bringing a regex, before it resolved it: kbroker's, less the partitions
    and the epoch its resolution bumps."""
    if api_key != 68 or not getattr(request, "subscribed_topic_regex", None) or request.member_epoch != 0:
        return None
    if (
        ours.error_code
        or theirs.error_code
        or theirs.assignment is None
        or theirs.assignment.topic_partitions
    ):
        return None
    patched = copy.deepcopy(theirs)
    patched.member_epoch, patched.assignment = ours.member_epoch, ours.assignment
    return "Kafka 4.x regex resolution" if Tally.same(ours, patched) else None
