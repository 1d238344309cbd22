"""bench.peers.tansu starts a real Tansu broker (memory:// engine) that librdkafka round-trips records through;
skipped with the reason when this machine has no Tansu build with that engine (it is never built in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench.peers.tansu import ArtifactUnavailable, TansuPeer
from tests.clients import Msg, ck_consume, ck_produce


def test_tansu_round_trips_records(tmp_path: Path) -> None:
    peer = TansuPeer(base=tmp_path / "tansu")
    try:
        try:
            peer.start()
        except ArtifactUnavailable as e:
            pytest.skip(f"Tansu cannot run here: {e}")
        admin = AdminClient({"bootstrap.servers": peer.bootstrap})
        admin.create_topics([NewTopic("peer-tansu", num_partitions=2, replication_factor=1)])[
            "peer-tansu"
        ].result(30)
        msgs = [Msg(f"k{i}".encode(), f"v{i}".encode(), partition=i % 2) for i in range(20)]
        delivered = ck_produce(peer.bootstrap, "peer-tansu", msgs)
        assert sorted((r.partition, r.offset) for r in delivered) == sorted(
            (i % 2, i // 2) for i in range(20)
        )
        got = ck_consume(peer.bootstrap, "peer-tansu", range(2), len(msgs), timeout=30)
        assert sorted((r.partition, r.key, r.value) for r in got) == sorted(
            (m.partition, m.key, m.value) for m in msgs
        )
    finally:
        peer.close()
