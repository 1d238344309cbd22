"""Leader epochs (leader-epoch-checkpoint, Kafka's end-offset rules), follower appends, the high watermark
and its replication-offset-checkpoint."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
from kbroker.protocol.records import CorruptRecordError, iter_batch_headers
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import NotLeaderOrFollowerError
from kbroker.storage.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT,
    EpochEntry,
    LeaderEpochFileCache,
    read_checkpoint,
    write_checkpoint,
)
from kbroker.storage.log import Log
from kbroker.storage.log_replica import UnexpectedAppendOffsetError
from kbroker.storage.manager import LogManager

from tests.storage.storage_helpers import NOW, batch, read_all

PID = 4242


def pbatch(seq: int, n: int = 1) -> bytes:
    return batch(n, producer_id=PID, producer_epoch=0, base_sequence=seq)


def replicate(leader: Log, follower: Log) -> None:
    """What a replica fetcher does: the leader's bytes from the follower's log end, appended unchanged."""
    while follower.log_end_offset < leader.log_end_offset:
        info = leader.read(follower.log_end_offset, 1 << 20)
        assert info.records is not None
        follower.append_as_follower(info.records.read_bytes())


# -- the cache ---------------------------------------------------------------------------------


def test_checkpoint_file_is_kafkas_text_format(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path, "t-0")
    cache.assign(0, 0)
    cache.assign(0, 5)  # same epoch, later offset: nothing to record
    cache.assign(3, 10)
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n2\n0 0\n3 10\n"
    assert LeaderEpochFileCache(tmp_path, "t-0").entries == [EpochEntry(0, 0), EpochEntry(3, 10)]


def test_end_offset_for_follows_kafkas_rules(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path, "t-0")
    for epoch, start in ((1, 0), (3, 10), (5, 20)):
        cache.assign(epoch, start)
    leo = 30
    assert cache.end_offset_for(5, leo) == (5, 30)  # the latest epoch ends at the log end
    assert cache.end_offset_for(3, leo) == (3, 20)
    assert cache.end_offset_for(4, leo) == (3, 20)  # unknown epoch: the one below it, ending where 5 starts
    assert cache.end_offset_for(2, leo) == (1, 10)
    assert cache.end_offset_for(0, leo) == (0, 0)  # older than anything: the first known epoch's start
    assert cache.end_offset_for(6, leo) == (-1, -1)
    assert cache.end_offset_for(-1, leo) == (-1, -1)
    assert LeaderEpochFileCache(tmp_path / "empty", "t-1").end_offset_for(0, 0) == (-1, -1)


def test_assign_truncation_and_start_moves(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path, "t-0")
    for epoch, start in ((1, 0), (3, 10), (5, 20)):
        cache.assign(epoch, start)
    cache.assign(4, 15)  # a lower epoch than the latest: entries that would break monotonicity go
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(4, 15)]
    cache.truncate_from_end(15)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]
    cache.truncate_from_end(40)  # nothing starts at or after 40
    assert cache.latest_epoch == 3
    cache.truncate_from_start(12)
    assert cache.entries == [EpochEntry(3, 12)]
    assert LeaderEpochFileCache(tmp_path, "t-0").entries == [EpochEntry(3, 12)]
    assert cache.epoch_for_offset(11) == -1 and cache.epoch_for_offset(100) == 3


# -- the log -----------------------------------------------------------------------------------


def test_leader_appends_stamp_epochs_and_truncation_follows(make_log) -> None:  # type: ignore[no-untyped-def]
    log: Log = make_log()
    log.append_as_leader(batch(3), NOW, leader_epoch=0)
    log.append_as_leader(batch(2), NOW, leader_epoch=2)
    log.append_as_leader(batch(2), NOW, leader_epoch=2)
    data = log.read(0, 1 << 20).records.read_bytes()  # type: ignore[union-attr]
    assert [h.partition_leader_epoch for _, h in iter_batch_headers(data)] == [0, 2, 2]
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(2, 3)]
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(1) == (0, 3)
    assert log.end_offset_for_epoch(2) == (2, 7)
    log.truncate_to(3)
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0)]
    assert log.end_offset_for_epoch(0) == (0, 3)


def test_appends_that_lost_a_race_with_a_leadership_change_are_refused(make_log) -> None:  # type: ignore[no-untyped-def]
    # The broker reads a partition's leader epoch and then appends; LeaderAndIsr is handled on another thread. An
    # append stamped with the old epoch landing where the new epoch starts left a batch of epoch 5 at the offset
    # epoch 6 starts at: the followers truncated it and fetched it again forever, and an acks=all Produce waited
    # its whole timeout (the controlled-shutdown test, 30 s).
    log: Log = make_log()
    assert log.become_leader(5) == 0
    log.append_as_leader(batch(2), NOW, leader_epoch=5)
    assert log.become_leader(6) == 2
    with pytest.raises(NotLeaderOrFollowerError):
        log.append_as_leader(batch(1), NOW, leader_epoch=5)
    log.append_as_leader(batch(1), NOW, leader_epoch=6)
    log.become_follower(7)
    with pytest.raises(NotLeaderOrFollowerError):
        log.append_as_leader(batch(1), NOW, leader_epoch=7)
    assert log.log_end_offset == 3
    assert log.leader_epoch_cache.entries == [EpochEntry(5, 0), EpochEntry(6, 2)]
    assert log.end_offset_for_epoch(5) == (5, 2)


def test_every_batch_lies_in_its_epoch_while_leadership_changes_concurrently(make_log) -> None:  # type: ignore[no-untyped-def]
    log: Log = make_log()
    log.become_leader(0)
    current = [0]
    done = threading.Event()
    refused = 0
    attempts = 0

    def appender() -> None:
        nonlocal refused, attempts
        while not done.is_set():
            epoch = current[0]  # read apart from the append, as ReplicaManager does
            try:
                log.append_as_leader(batch(1), NOW, leader_epoch=epoch)
            except NotLeaderOrFollowerError:
                refused += 1
            attempts += 1

    t = threading.Thread(target=appender)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads interleave inside the append, not once per 5 ms
    t.start()
    try:
        for epoch in range(1, 300):
            # At least one append between two epoch changes, however the threads are scheduled: on a loaded CI
            # machine the 299 changes once all went by before the appender's first attempt, leaving the log empty.
            seen = attempts
            while attempts == seen and t.is_alive():
                time.sleep(0)
            log.become_leader(epoch)
            current[0] = epoch
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(interval)
    print(f"{refused} appends refused, {log.log_end_offset} appended over 299 leader epochs")
    assert log.log_end_offset > 0
    data = log.read(0, 1 << 30).records.read_bytes()  # type: ignore[union-attr]
    for _, h in iter_batch_headers(data):
        epoch, end = log.end_offset_for_epoch(h.partition_leader_epoch)
        assert epoch == h.partition_leader_epoch and h.base_offset < end, (h.base_offset, h.partition_leader_epoch)


def test_epoch_cache_survives_reopen_and_unclean_truncation(make_log, log_dir: Path) -> None:  # type: ignore[no-untyped-def]
    log: Log = make_log()
    log.append_as_leader(batch(2), NOW, leader_epoch=1)
    log.append_as_leader(batch(2), NOW, leader_epoch=4)
    log.flush()
    log.close()
    # A crash lost the batch of epoch 4 although the epoch file, written first, has it.
    seg = log_dir / f"{0:020d}.log"
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 5)
    reopened = Log.open(log_dir, "topic", 0, LogConfig(), clean_shutdown=False)
    try:
        assert reopened.log_end_offset == 2
        assert reopened.leader_epoch_cache.entries == [EpochEntry(1, 0)]
    finally:
        reopened.close()


def test_epoch_changes_skip_fsync_and_the_flush_makes_them_durable(make_log, log_dir: Path,  # type: ignore[no-untyped-def]
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A LeaderAndIsr starts an epoch on every partition it names: two fsyncs each held it up to a second on a busy
    # disk (Kafka 3.7 dropped them too, KAFKA-15046).
    log: Log = make_log()
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    log.become_leader(3)
    log.append_as_leader(batch(2), NOW, leader_epoch=3)
    log.become_leader(4)
    assert synced == []
    assert read_checkpoint(log_dir / LEADER_EPOCH_CHECKPOINT) == [EpochEntry(3, 0), EpochEntry(4, 2)]
    log.flush()
    assert len(synced) >= 2  # the segment, and the checkpoint before the recovery point moved
    count = len(synced)
    log.flush()
    assert len(synced) == count  # nothing changed since


@pytest.mark.parametrize("stale", [[EpochEntry(1, 0)], [EpochEntry(1, 0), EpochEntry(7, 2)]],
                         ids=["newest entry lost", "truncation lost"])
def test_recovery_rebuilds_epochs_an_unsynced_checkpoint_lost(log_dir: Path, stale: list[EpochEntry]) -> None:
    log = Log.open(log_dir, "topic", 0, LogConfig(), clean_shutdown=True)
    log.append_as_leader(batch(2), NOW, leader_epoch=1)
    log.flush()
    recovery_point = log.recovery_point
    log.become_leader(5)
    log.append_as_leader(batch(3), NOW, leader_epoch=5)
    log.append_as_leader(batch(1), NOW, leader_epoch=5)
    for seg in log.segments:
        seg.flush()  # the batches reached the disk; the checkpoint's last write did not:
    write_checkpoint(log_dir / LEADER_EPOCH_CHECKPOINT, stale)
    log._closed = True  # a crash: nothing of close() runs
    reopened = Log.open(log_dir, "topic", 0, LogConfig(), recovery_point=recovery_point, clean_shutdown=False)
    try:
        assert reopened.log_end_offset == 6
        assert reopened.leader_epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(5, 2)]
        assert reopened.end_offset_for_epoch(1) == (1, 2)
    finally:
        reopened.close()
        for seg in log.segments:
            seg.close()


def test_follower_keeps_offsets_epochs_and_producer_state(tmp_path: Path) -> None:
    leader = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    follower = Log.open(tmp_path / "f" / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    try:
        leader.append_as_leader(pbatch(0, 2), NOW, leader_epoch=1)
        leader.append_as_leader(batch(1), NOW, leader_epoch=1)
        leader.append_as_leader(pbatch(2, 3), NOW, leader_epoch=3)
        replicate(leader, follower)
        assert follower.log_end_offset == leader.log_end_offset == 6
        assert [(r.offset, r.key) for r in read_all(follower)] == [(r.offset, r.key) for r in read_all(leader)]
        assert follower.leader_epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(3, 3)]
        # The follower's producer state knows the producer: as the next leader it answers a retry with the
        # original offsets and takes the next sequence.
        retry = follower.append_as_leader(pbatch(2, 3), NOW, leader_epoch=5)
        assert (retry.first_offset, retry.last_offset, follower.log_end_offset) == (3, 5, 6)
        nxt = follower.append_as_leader(pbatch(5, 1), NOW, leader_epoch=5)
        assert nxt.first_offset == 6
        with pytest.raises(UnexpectedAppendOffsetError):
            follower.append_as_follower(leader.read(0, 1 << 20).records.read_bytes())  # type: ignore[union-attr]
    finally:
        leader.close()
        follower.close()


def test_follower_append_checks_crcs_and_stops_at_a_partial_batch(tmp_path: Path) -> None:
    """Kafka's replication append: whole batches up to a partial one at the end (a leader may cut its answer at
    replica.fetch.max.bytes); a CRC that does not match fails the whole append."""
    leader = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    follower = Log.open(tmp_path / "f" / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    try:
        for n in (2, 1, 3):
            leader.append_as_leader(batch(n), NOW, leader_epoch=2)
        data = leader.read(0, 1 << 20).records.read_bytes()  # type: ignore[union-attr]
        sizes = [h.batch_length + 12 for _, h in iter_batch_headers(data)]
        assert follower.append_as_follower(data[:10]) is None  # not even a header
        info = follower.append_as_follower(data[: sizes[0] + sizes[1] + 30])
        assert info is not None and (info.first_offset, info.last_offset) == (0, 2)
        assert follower.log_end_offset == 3
        corrupt = bytearray(data[sizes[0] + sizes[1]:])
        corrupt[-1] ^= 0xFF
        with pytest.raises(CorruptRecordError):
            follower.append_as_follower(corrupt)
        assert follower.log_end_offset == 3
        follower.append_as_follower(data[sizes[0] + sizes[1]:])
        assert [r.offset for r in read_all(follower)] == list(range(6))
        assert follower.leader_epoch_cache.entries == [EpochEntry(2, 0)]
    finally:
        leader.close()
        follower.close()


def test_diverged_follower_truncates_to_the_epoch_boundary(tmp_path: Path) -> None:
    # Epoch 1: both have offsets 0-1. The old leader then took 0-2 more under epoch 1 that never replicated,
    # while the new leader (epoch 2) wrote its own.
    old = Log.open(tmp_path / "old" / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    new = Log.open(tmp_path / "new" / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    try:
        old.append_as_leader(batch(2), NOW, leader_epoch=1)
        replicate(old, new)
        old.append_as_leader(batch(3, key="lost"), NOW, leader_epoch=1)
        new.append_as_leader(batch(1, key="new"), NOW, leader_epoch=2)
        new.append_as_leader(batch(1, key="new2"), NOW, leader_epoch=2)
        epoch, end = new.end_offset_for_epoch(old.latest_epoch)
        assert (epoch, end) == (1, 2)
        old.truncate_to(min(end, old.log_end_offset))
        replicate(new, old)
        assert [(r.offset, r.key) for r in read_all(old)] == [(r.offset, r.key) for r in read_all(new)]
        assert old.leader_epoch_cache.entries == new.leader_epoch_cache.entries == [EpochEntry(1, 0),
                                                                                     EpochEntry(2, 2)]
    finally:
        old.close()
        new.close()


def test_high_watermark_of_a_replicated_log(make_log) -> None:  # type: ignore[no-untyped-def]
    log: Log = make_log()
    log.append_as_leader(batch(2), NOW, leader_epoch=0)
    assert log.high_watermark == 2  # one replica: committed on append
    log.set_hw_tracks_leo(False)
    log.append_as_leader(batch(3), NOW, leader_epoch=0)
    assert (log.high_watermark, log.log_end_offset) == (2, 5)
    assert log.read(0, 1 << 20, max_offset=log.high_watermark).records is not None
    assert log.maybe_increment_high_watermark(4) and log.high_watermark == 4
    assert not log.maybe_increment_high_watermark(3) and log.high_watermark == 4
    log.maybe_increment_high_watermark(99)
    assert log.high_watermark == 5
    assert log.update_high_watermark(1) == 1  # a follower takes the leader's, even backwards
    log.set_hw_tracks_leo(True)
    assert log.high_watermark == 5


def test_fetch_state_moves_with_every_offset_a_fetch_answers(make_log) -> None:  # type: ignore[no-untyped-def]
    """A leader leaves a follower's idle partition unread while Log.fetch_state stays the same: each change of the
    log end, high watermark, log start or last stable offset must change it."""
    log: Log = make_log()
    log.set_hw_tracks_leo(False)
    seen = [log.fetch_state]

    def moved() -> None:
        state = log.fetch_state
        assert state not in seen
        assert state[:3] == (log.log_end_offset, log.high_watermark, log.log_start_offset)
        seen.append(state)

    log.append_as_leader(batch(3), NOW, leader_epoch=0)
    moved()
    log.maybe_increment_high_watermark(3)
    moved()
    txn = {"producer_id": 9, "producer_epoch": 0, "is_transactional": True}
    log.append_as_leader(batch(1, base_sequence=0, **txn), NOW, leader_epoch=0)
    moved()
    log.maybe_increment_high_watermark(4)  # the transaction holds the last stable offset at 3
    lso = log.last_stable_offset
    moved()
    log.append_control(9, 0, 0, True, NOW, leader_epoch=0)
    moved()
    log.maybe_increment_high_watermark(5)
    assert log.last_stable_offset != lso
    moved()
    log.delete_records_before(2)
    moved()
    log.truncate_to(4)
    moved()


def test_replication_offset_checkpoint(tmp_path: Path) -> None:
    dirs = [str(tmp_path / "logs")]
    mgr = LogManager(dirs, LogConfig(), high_watermark_checkpoint_interval_ms=5000)
    mgr.startup()
    log = mgr.get_or_create_log("t", 0)
    log.set_hw_tracks_leo(False)
    log.append_as_leader(batch(5), NOW, leader_epoch=0)
    log.maybe_increment_high_watermark(3)
    mgr.shutdown()
    assert (tmp_path / "logs" / "replication-offset-checkpoint").read_text() == "0\n1\nt 0 3\n"
    mgr = LogManager(dirs, LogConfig(), high_watermark_checkpoint_interval_ms=5000)
    mgr.startup()
    try:
        restored = mgr.get_log("t", 0)
        assert restored is not None
        assert (restored.high_watermark, restored.log_end_offset) == (3, 5)
    finally:
        mgr.shutdown()
    # The single-node default keeps no such file and starts with everything committed.
    mgr = LogManager(dirs, LogConfig())
    mgr.startup()
    try:
        assert mgr.get_log("t", 0).high_watermark == 5  # type: ignore[union-attr]
    finally:
        mgr.shutdown()
