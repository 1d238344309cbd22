"""Real confluent-kafka sessions (idempotent produce, a group consuming and committing, a transaction) recorded
through the proxy in front of Apache Kafka 3.9 and replayed byte for byte against kbroker: every answer equal after
normalisation, apart from the rows labelled with a known.REPLAY reason. The long run is
`python -m tests.differential.replay`."""

from __future__ import annotations

import pytest

from tests.differential import known
from tests.differential.harness import Tally
from tests.differential.replay import SESSIONS, record, replay, unexplained
from tests.zookeeper import zookeeper_missing


def test_replayed_client_sessions_match_kafka() -> None:
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is the recorded client")
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    from bench.peers.maven import ArtifactUnavailable
    from tests.differential.session import brokers

    try:
        with brokers() as (kbroker, kafka):
            exchanges = record(kafka, list(SESSIONS), "ci")
            tally = replay(kbroker, exchanges, Tally(keep=5))
    except ArtifactUnavailable as e:
        pytest.skip(f"Apache Kafka 3.9 cannot be fetched here: {e}")
    apis = {api for api, _ in tally.rows}
    # the sessions really exercised the group, idempotence and transaction paths
    assert {
        "JoinGroup",
        "SyncGroup",
        "OffsetCommit",
        "Fetch",
        "Produce",
        "AddPartitionsToTxn",
        "EndTxn",
    } <= apis
    assert all(label in known.REPLAY for label in ("Kafka transient", "ApiVersions"))
    assert unexplained(tally) == 0, tally.table()
