"""KIP-848 consumer groups compared with Apache Kafka 3.9 in KRaft mode (`python -m tests.differential.kip848`): out of
the default run (a KRaft Kafka JVM besides the ZooKeeper-mode one the other differential tests start, about 30 s);
KBROKER_DIFFERENTIAL_KIP848=1 runs it."""

from __future__ import annotations

import os

import pytest

from tests.differential import kip848


@pytest.mark.skipif(
    os.environ.get("KBROKER_DIFFERENTIAL_KIP848") != "1",
    reason="starts Apache Kafka 3.9 in KRaft mode (about 30 s): set KBROKER_DIFFERENTIAL_KIP848=1",
)
def test_kip848_groups_answer_as_kafka() -> None:
    from bench.peers.maven import ArtifactUnavailable

    try:
        with kip848.kraft_pair() as pair:
            tally = kip848.run(pair)
    except ArtifactUnavailable as e:
        pytest.skip(f"Apache Kafka 3.9 cannot be fetched here: {e}")
    assert tally.unexplained() == 0, tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= 12
