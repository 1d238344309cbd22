"""Differences from Apache Kafka 3.9 the differential harness expects, each with its reason (docs/differences-from-kafka.md
states them for users)."""

from __future__ import annotations

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

# Generated requests: (API, versions) -> why kbroker deliberately answers otherwise than Kafka 3.9 (ZooKeeper mode).
# Not asserted (the CI pass compares only APIs without such differences); the long run's table shows them.
GENERATED: dict[str, str] = {
    "ListOffsets v0": "Kafka 3.9 refuses the -1 (latest) and -2 (earliest) timestamps in v0 with UNSUPPORTED_VERSION "
    "(its timestampMinSupportedVersion starts at v1); kbroker keeps answering the 0.8-0.10 clients that send v0",
    "OffsetFetch v0": "Kafka 3.9 in ZooKeeper mode reads v0 offsets from ZooKeeper (unknown partitions "
    "UNKNOWN_TOPIC_OR_PARTITION); kbroker keeps no ZooKeeper offsets and answers v0 from __consumer_offsets",
    "ConsumerGroupHeartbeat, ConsumerGroupDescribe": "KIP-848 groups are served; Kafka 3.9 in ZooKeeper mode "
    "answers UNSUPPORTED_VERSION",
    "Metadata (auto-created topics)": "Kafka 3.9 in ZooKeeper mode creates an auto-created topic asynchronously and "
    "answers LEADER_NOT_AVAILABLE without partitions until the controller has elected its leaders; kbroker creates it "
    "before answering, so the client gets its partitions at once",
    "Produce (null record set)": "Kafka 3.9 never answers a Produce whose null record set it would append, nor one "
    "failing as a whole while it names a null record set (NullPointerException in ProduceRequest.partitionSizes); "
    "kbroker answers the partition INVALID_RECORD (v3+) or CORRUPT_MESSAGE",
    "ApiVersions v3 finalized_features_epoch": "0 in Kafka (its ZooKeeper feature znode), -1 in a standalone kbroker "
    "with no finalized features",
}

# Replayed client sessions (tests/differential/replay.py): label -> why such answers differ. The replay counts them
# under their label instead of the API's own row.
REPLAY: dict[str, str] = {
    "Kafka transient": "Kafka answered a retriable error of its asynchronous start (COORDINATOR_LOAD_IN_PROGRESS, "
    "COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, LEADER_NOT_AVAILABLE while it creates an internal or auto-created "
    "topic); the client retried, and the replay sends the retry's first attempt to kbroker, which is ready at once",
    "ApiVersions": "the advertised ranges of API_VERSIONS above and finalized_features_epoch of GENERATED",
    # -- replay sessions of kafka-python, aiokafka and the Java client (kp-*, aio-*, java-* in sessions.py) --
    "Kafka completing a transaction": "Kafka answered CONCURRENT_TRANSACTIONS to an AddPartitionsToTxn (or "
    "InitProducerId) sent right after EndTxn: Kafka 3.9 answers EndTxn once PrepareCommit/PrepareAbort is written "
    "and sends the markers afterwards, refusing the next transaction until they are written; kbroker writes the "
    "markers before it answers EndTxn, so the client's first attempt succeeds (the client retries either way)",
    "Kafka auto-creating": "Kafka 3.9 answered UNKNOWN_TOPIC_OR_PARTITION to a Metadata request allowing "
    "auto-creation while its own creation of that topic was still in flight (seen under load; the client asks "
    "again); kbroker creates the topic before answering, as under GENERATED's auto-created topics",
}
