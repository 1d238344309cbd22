"""KIP-848 consumer groups compared with Apache Kafka 3.9, 4.2 and 4.4 in KRaft mode (`python -m
tests.differential.kip848 [--kafka 4.4]`): out of the default run (a KRaft Kafka JVM per version, 10-15 s
each); KBROKER_DIFFERENTIAL_KIP848=1 runs it."""

from __future__ import annotations

import os

import pytest

from tests.differential import kip848


@pytest.mark.skipif(
    os.environ.get("KBROKER_DIFFERENTIAL_KIP848") != "1",
    reason="starts Apache Kafka in KRaft mode (10-15 s a version): set KBROKER_DIFFERENTIAL_KIP848=1",
)
@pytest.mark.parametrize(("version", "least"), [("3.9", 12), ("4.2.0", 38), ("4.4", 38)])
def test_kip848_groups_answer_as_kafka(version: str, least: int) -> None:
    from bench.peers.maven import ArtifactUnavailable

    try:
        with kip848.kraft_pair(version) as pair:
            tally = kip848.run(pair, version)
    except ArtifactUnavailable as e:
        pytest.skip(f"Apache Kafka {version} cannot be fetched here: {e}")
    assert tally.unexplained() == 0, tally.table()
    assert sum(r.compared for r in tally.rows.values()) >= least
