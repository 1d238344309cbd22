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


def test_metadata_changes_on_a_full_log_dir_are_all_or_nothing(small_disk: Path, tmp_path: Path) -> None:
    # Issue 39: CreateTopics used to answer UNKNOWN_SERVER_ERROR yet create the topic in memory (gone after a
    # restart, with acknowledged records orphaned); AlterConfigs, DeleteTopics and CreatePartitions closed the
    # connection and took effect until a restart. Now each answers KAFKA_STORAGE_ERROR and changes nothing.
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
    )

    props = {"log.dirs": str(small_disk / "logs"), "auto.create.topics.enable": "false"}
    b = BrokerProcess(tmp_path / "broker", props)
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(15)
        p = KafkaProducer(bootstrap_servers=b.bootstrap, acks=1, retries=0)
        assert p.send("kept", value=b"before").get(10).offset == 0
        filler = small_disk / "filler"
        _fill(filler)

        def storage_error(future: object) -> None:
            with pytest.raises(KafkaException) as e:
                future.result(15)  # type: ignore[attr-defined]
            assert e.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR, e.value

        storage_error(admin.create_topics([NewTopic("new-on-full", 2, 1)])["new-on-full"])
        storage_error(admin.create_partitions([NewPartitions("kept", 3)])["kept"])
        resource = ConfigResource("topic", "kept")
        storage_error(admin.incremental_alter_configs([ConfigResource("topic", "kept", incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])])[resource])
        storage_error(admin.delete_topics(["kept"])["kept"])

        def unchanged() -> None:
            topics = admin.list_topics(timeout=15).topics
            assert "new-on-full" not in topics and len(topics["kept"].partitions) == 1
            described = next(iter(admin.describe_configs([resource]).values())).result(15)
            assert described["retention.ms"].value == "604800000"
            c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, auto_offset_reset="earliest",
                              consumer_timeout_ms=3000)
            c.assign([KTP("kept", 0)])
            assert [m.value for m in c][:1] == [b"before"]
            c.close()

        # the broker keeps serving, and nothing changed, now and after a restart
        assert b.alive()
        unchanged()
        p.close()
        b.stop()
        b.start()
        unchanged()
        # once there is room again, the same changes go through
        filler.unlink()
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("new-on-full", 2, 1)])["new-on-full"].result(15)
        admin.create_partitions([NewPartitions("kept", 3)])["kept"].result(15)
        assert len(admin.list_topics(timeout=15).topics["kept"].partitions) == 3
        # no request failed unexpectedly (storage tasks on the full disk log their errors, that is expected)
        log_text = b.read_log()
        assert "handlers/" not in log_text and "admin_manager.py" not in log_text, log_text[-4000:]
        assert "metadata_store.py" not in log_text and "network.py" not in log_text, log_text[-4000:]
    finally:
        b.kill()
