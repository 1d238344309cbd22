from __future__ import annotations

import time
from pathlib import Path

import pytest
from kbroker.storage.checkpoints import OffsetCheckpointFile
from kbroker.storage.config import TOPIC_CONFIG_KEYS, LogConfig
from kbroker.storage.manager import LogManager

from tests.storage.storage_helpers import NOW, batch, kv_batch, read_all


def _manager(tmp_path: Path, n_dirs: int = 2, **kw) -> LogManager:
    dirs = [str(tmp_path / f"d{i}") for i in range(n_dirs)]
    mgr = LogManager(dirs, LogConfig(segment_bytes=500, file_delete_delay_ms=0), **kw)
    mgr.startup()
    return mgr


def test_create_spreads_over_dirs_and_restart_restores(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    logs = [mgr.get_or_create_log("orders", p, mgr.default_config) for p in range(4)]
    assert mgr.get_or_create_log("orders", 0, mgr.default_config) is logs[0]
    assert {log.dir.parent.name for log in logs} == {"d0", "d1"}
    for i, log in enumerate(logs):
        for _ in range(10 + i):
            log.append_as_leader(batch(2), NOW)
    logs[1].delete_records_before(7)
    mgr.shutdown()
    assert (tmp_path / "d0" / ".kafka_cleanshutdown").exists()
    rp = OffsetCheckpointFile(tmp_path / logs[0].dir.parent.name / "recovery-point-offset-checkpoint").read()
    assert rp[("orders", 0)] == 20

    mgr = _manager(tmp_path)
    try:
        assert not (tmp_path / "d0" / ".kafka_cleanshutdown").exists()  # removed after loading
        assert sorted(p for _, p in [(log.topic, log.partition) for log in mgr.logs()]) == [0, 1, 2, 3]
        for p in range(4):
            log = mgr.get_log("orders", p)
            assert log is not None and log.log_end_offset == 2 * (10 + p) == log.high_watermark
        assert mgr.get_log("orders", 1).log_start_offset == 7
        assert mgr.get_log("nope", 0) is None
    finally:
        mgr.shutdown()


def test_unclean_restart_recovers_torn_tail(tmp_path: Path, caplog) -> None:
    mgr = _manager(tmp_path, n_dirs=1)
    log = mgr.get_or_create_log("t", 0, mgr.default_config)
    for _ in range(10):
        log.append_as_leader(batch(2), NOW)
    mgr.checkpoint()
    path, leo = log.active_segment.log_path, log.log_end_offset
    # simulate a crash: no shutdown, no marker, garbage tail
    log.close()
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x99\x00\x00")
    mgr2 = LogManager([str(tmp_path / "d0")], mgr.default_config)
    with caplog.at_level("WARNING", logger="kbroker.storage"):
        mgr2.startup()
    try:
        log = mgr2.get_log("t", 0)
        assert log is not None and log.log_end_offset == leo
        assert "t-0" in caplog.text and "Truncated" in caplog.text
    finally:
        mgr2.shutdown()


def test_delete_log_renames_then_removes(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, n_dirs=1)
    log = mgr.get_or_create_log("gone", 0, mgr.default_config.replace(file_delete_delay_ms=60_000))
    log.append_as_leader(batch(3), NOW)
    in_flight = log.read(0, 1000).records
    mgr.delete_log("gone", 0)
    assert mgr.get_log("gone", 0) is None
    assert not (tmp_path / "d0" / "gone-0").exists()
    pending = [p for p in (tmp_path / "d0").iterdir() if p.name.endswith("-delete")]
    assert len(pending) == 1 and pending[0].name.startswith("gone-0.")
    assert len(in_flight.read_bytes()) == in_flight.size  # fd still valid
    mgr.delete_pending_files()
    assert pending[0].exists()  # delay not over
    mgr.delete_pending_files(force=True)
    assert not pending[0].exists()
    # a new log with the same name starts from scratch
    fresh = mgr.get_or_create_log("gone", 0, mgr.default_config)
    assert fresh.log_end_offset == 0
    mgr.shutdown()


def test_leftover_delete_dirs_removed_on_startup(tmp_path: Path) -> None:
    d = tmp_path / "d0"
    (d / ("x-3." + "a" * 32 + "-delete")).mkdir(parents=True)
    mgr = _manager(tmp_path, n_dirs=1)
    try:
        assert not (d / ("x-3." + "a" * 32 + "-delete")).exists()
        assert mgr.logs() == []
    finally:
        mgr.shutdown()


def test_topic_configs_and_background_threads(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, n_dirs=1, retention_check_interval_ms=20, flush_check_interval_ms=20,
                   flush_offset_checkpoint_interval_ms=20, cleaner_backoff_ms=20)
    compact = mgr.default_config.replace(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0)
    clog = mgr.get_or_create_log("c", 0, compact)
    dlog = mgr.get_or_create_log("d", 0, mgr.default_config)
    for i in range(40):
        clog.append_as_leader(kv_batch([(b"k", b"%d" % i)]), NOW)
        dlog.append_as_leader(batch(2, ts=NOW), NOW)
    mgr.update_topic_config("d", LogConfig.from_topic_configs(mgr.default_config, {"retention.ms": "1000",
                                                                                   "flush.ms": "0"}))
    assert dlog.config.retention_ms == 1000
    mgr.start_background()
    try:
        deadline = time.time() + 5
        while time.time() < deadline and (len(dlog.segments) > 1 or clog.cleaner_checkpoint == 0
                                          or dlog.unflushed_messages):
            time.sleep(0.02)
        assert len(dlog.segments) == 1 and dlog.log_start_offset == dlog.active_segment.base_offset
        assert clog.cleaner_checkpoint == clog.active_segment.base_offset
        assert dlog.unflushed_messages == 0
        assert len(read_all(clog)) < 40
    finally:
        mgr.shutdown()
    cleaner_cp = OffsetCheckpointFile(tmp_path / "d0" / "cleaner-offset-checkpoint").read()
    assert cleaner_cp[("c", 0)] == clog.cleaner_checkpoint


def test_config_parsing() -> None:
    base = LogConfig()
    assert LogConfig.TOPIC_CONFIG_KEYS == TOPIC_CONFIG_KEYS and "cleanup.policy" in TOPIC_CONFIG_KEYS
    assert len(TOPIC_CONFIG_KEYS) == 34  # every topic config Kafka 3.9 knows
    cfg = LogConfig.from_topic_configs(base, {"cleanup.policy": "compact,delete", "retention.ms": "-1",
                                              "message.timestamp.type": "LogAppendTime",
                                              "min.cleanable.dirty.ratio": "0.1", "segment.bytes": "1024",
                                              "unknown.key": "x"})
    assert cfg.compact and cfg.delete and cfg.retention_ms == -1 and cfg.log_append_time
    assert cfg.min_cleanable_dirty_ratio == 0.1 and cfg.segment_bytes == 1024
    assert base.segment_bytes == 1073741824  # base untouched
    assert base.message_downconversion_enable
    off = LogConfig.from_topic_configs(base, {"message.downconversion.enable": "FALSE"})
    assert not off.message_downconversion_enable
    assert off.to_topic_configs()["message.downconversion.enable"] == "false"
    for key, bad in [("segment.bytes", "abc"), ("retention.ms", "-2"), ("cleanup.policy", "shred"),
                     ("min.cleanable.dirty.ratio", "1.5"), ("message.timestamp.type", "Now"),
                     ("segment.bytes", "10"), ("message.downconversion.enable", "yes")]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            LogConfig.from_topic_configs(base, {key: bad})


def test_checkpoint_file_format(tmp_path: Path) -> None:
    f = OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint")
    assert f.read() == {}
    f.write({("b", 1): 10, ("a.b-c", 0): 5})
    assert f.path.read_text() == "0\n2\na.b-c 0 5\nb 1 10\n"
    assert f.read() == {("b", 1): 10, ("a.b-c", 0): 5}
    assert not list(tmp_path.glob("*.tmp"))
    f.path.write_text("0\n3\na 0 1\n")
    assert f.read() == {}  # malformed -> ignored
