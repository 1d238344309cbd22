"""The share-group soak (tests/broker/share/soak.py) as a short seeded pass: 3,000 records to 5 ShareConsumers on
2 partitions with explicit acknowledgement, a tenth released and a fiftieth rejected, one consumer killed with
kill -9 while holding a batch. The long run is `python -m tests.broker.share.soak --records 100000`."""

from __future__ import annotations

from pathlib import Path

from tests.broker.share.soak import run_soak


def test_at_least_once_through_a_consumer_kill(tmp_path: Path) -> None:
    r = run_soak(tmp_path, 3000, seed=7, timeout=90)
    assert (r["accepted"], r["rejected"]) == (3000 - 60, 60)
    assert r["held_by_killed"] > 0, "the killed consumer held no records: the kill tested nothing"
    assert r["released"] > 0
