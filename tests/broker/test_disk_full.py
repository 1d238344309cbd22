"""A full disk fails produces with KAFKA_STORAGE_ERROR, keeps the broker up and loses nothing acknowledged."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.errors import KafkaStorageError

from tests.broker_process import BrokerProcess


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    chunk = b"\0" * 65536
    with open(path, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
        try:
            os.fsync(f.fileno())
        except OSError:
            pass


def test_disk_full_fails_produce_cleanly_and_recovers(small_disk: Path, tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "broker", {"log.dirs": str(small_disk / "logs"), "log.segment.bytes": "1048576"})
    b.start()
    topic = "on-a-small-disk"
    try:
        p = KafkaProducer(bootstrap_servers=b.bootstrap, enable_idempotence=False, retries=0, acks=1,
                          linger_ms=0)
        acked = [p.send(topic, value=b"before-%d" % i).get(10).offset for i in range(50)]
        assert acked == list(range(50))

        filler = small_disk / "filler"
        _fill(filler)
        with pytest.raises(KafkaStorageError):
            for i in range(200):
                p.send(topic, value=b"x" * 20000 + b"%d" % i).get(10)
        # The broker is still up and still serves reads of what it acknowledged.
        assert b.alive()
        c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, auto_offset_reset="earliest",
                          consumer_timeout_ms=2000)
        c.assign([KTP(topic, 0)])
        values = [m.value for m in c]
        c.close()
        assert values[:50] == [b"before-%d" % i for i in range(50)]

        filler.unlink()
        after = p.send(topic, value=b"after").get(10)
        assert after.offset >= 50
        p.close()
        assert "KAFKA_STORAGE_ERROR" in b.read_log() or "storage error" in b.read_log().lower()
    finally:
        b.kill()
