"""Real client sessions recorded through the proxy in front of Apache Kafka 3.9 and replayed byte for byte against
kbroker: every answer equal after normalisation, apart from the rows labelled with a known.REPLAY reason. CI records
confluent-kafka's three sessions and one seeded session per other client (kafka-python, aiokafka, the Java client;
KBROKER_REPLAY_SEED picks another); the long run is `python -m tests.differential.replay`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from tests.differential import known
from tests.differential.harness import Tally
from tests.differential.replay import record, replay, unexplained
from tests.differential.sessions import CONFLUENT, SESSIONS, SessionUnavailable, seeded_subset
from tests.zookeeper import zookeeper_missing

# seed 39 picks kafka-python's group (after its producer), aiokafka's transactions and the Java AdminClient
SEED = int(os.environ.get("KBROKER_REPLAY_SEED", "39"))


@pytest.fixture(scope="module")
def brokers() -> Iterator[tuple[str, str]]:
    """(kbroker, Kafka 3.9) shared by the module's tests: each records its own topics and groups."""
    why = zookeeper_missing()
    if why:
        pytest.skip(why)
    from bench.peers.maven import ArtifactUnavailable
    from tests.differential.session import brokers as start

    with contextlib.ExitStack() as stack:
        try:
            pair = stack.enter_context(start())
        except ArtifactUnavailable as e:
            pytest.skip(f"Apache Kafka 3.9 cannot be fetched here: {e}")
        yield pair


def test_replayed_confluent_sessions_match_kafka(brokers: tuple[str, str]) -> None:
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is the recorded client")
    kbroker, kafka = brokers
    tally = replay(kbroker, record(kafka, CONFLUENT, "ci"), Tally(keep=5))
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


# what each kind of session must have sent (the group session records its producer first)
EXERCISED = {
    "produce": {"InitProducerId", "Produce"},
    "idempotent": {"InitProducerId", "Produce"},
    "group": {"Produce", "JoinGroup", "SyncGroup", "OffsetFetch", "Fetch", "OffsetCommit", "LeaveGroup"},
    "transaction": {"InitProducerId", "AddPartitionsToTxn", "Produce", "EndTxn"},
    "admin": {"CreateTopics", "DescribeConfigs", "DeleteTopics"},
}


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "java"])
def test_replayed_session_of_each_client_matches_kafka(brokers: tuple[str, str], client: str) -> None:
    names = seeded_subset(SEED, (client,))
    kbroker, kafka = brokers
    try:
        exchanges = record(kafka, names, f"ci{SEED}")
    except SessionUnavailable as e:
        pytest.skip(f"{client}: {e}")
    tally = replay(kbroker, exchanges, Tally(keep=5))
    apis = {api.split(" (")[0] for api, _ in tally.rows}
    kind = names[-1].split("-", 1)[1]
    assert EXERCISED[kind] <= apis, f"{names} sent only {sorted(apis)}"
    assert all(SESSIONS[n].client == client for n in names)
    assert unexplained(tally) == 0, f"{names}\n{tally.table()}"
