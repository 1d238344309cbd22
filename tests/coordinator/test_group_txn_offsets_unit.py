"""Transactional offset commits in the GroupCoordinator (KIP-98 / KIP-447), driven directly on its loop.

The offsets log is a real storage Log; transaction markers are real control batches appended to it, followed
by the coordinator's complete_txn as the broker calls it after writing a marker. Broker-level tests with real
transactional clients live with the transaction handlers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kbroker.coordinator.group_coordinator import partition_for
from kbroker.coordinator.group_metadata import GroupState, OffsetAndMetadata
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.records import decode_records, iter_batch_headers

from tests.coordinator.test_group_coordinator_unit import NUM_PARTITIONS, FakeHost, Harness, wait_for

TP0, TP1 = ("orders", 0), ("orders", 1)
PID, EPOCH = 4000, 3


@pytest.fixture
def host(tmp_path: Path) -> Iterator[FakeHost]:
    h = FakeHost(tmp_path)
    yield h
    h.close()


@pytest.fixture
def h(host: FakeHost) -> Iterator[Harness]:
    harness = Harness(host).start()
    yield harness
    harness.stop()


def oam(offset: int, metadata: str = "") -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, 7, metadata, int(time.time() * 1000))


def txn_commit(h: Harness, gid: str, offsets: dict[tuple[str, int], int], *, pid: int = PID, epoch: int = EPOCH,
               generation: int = -1, member_id: str = "", instance_id: str | None = None
               ) -> dict[tuple[str, int], ErrorCode]:
    return h.run(h.gc.txn_commit_offsets, gid, pid, epoch, generation, member_id, instance_id,
                 {tp: oam(o) for tp, o in offsets.items()})


def write_marker(host: FakeHost, gid: str, pid: int, commit: bool, epoch: int = EPOCH) -> int:
    """Append the transaction marker to the group's offsets partition, as the broker does."""
    p = partition_for(gid, NUM_PARTITIONS)
    host.offsets_log(p).append_control(pid, epoch, 0, commit, int(time.time() * 1000), leader_epoch=0)
    return p


def end_txn(h: Harness, host: FakeHost, gid: str, commit: bool, pid: int = PID) -> None:
    p = write_marker(host, gid, pid, commit)
    h.on_loop(lambda: h.gc.complete_txn(pid, p, commit))


def fetched(h: Harness, gid: str, tps: list[tuple[str, int]] | None = None, require_stable: bool = False
            ) -> dict[tuple[str, int], int | ErrorCode | None]:
    err, got = h.run(h.gc.fetch_offsets, gid, tps, require_stable)
    assert err == ErrorCode.NONE
    return {tp: o if o is None or isinstance(o, ErrorCode) else o.offset for tp, o in got.items()}


def loaded(host: FakeHost) -> Harness:
    hx = Harness(host).start(list(range(NUM_PARTITIONS)))
    wait_for(lambda: not hx.on_loop(lambda: set(hx.gc.loading)), what="load")
    return hx


# ---------------------------------------------------------------- commit / abort


def test_commit_applies_pending_offsets_at_the_marker(h: Harness, host: FakeHost) -> None:
    assert h.commit("g", -1, "", {TP0: 5}) == {TP0: ErrorCode.NONE}
    assert txn_commit(h, "g", {TP0: 10, TP1: 11}) == {TP0: ErrorCode.NONE, TP1: ErrorCode.NONE}
    # before the marker: the committed offsets are unchanged; require_stable answers UNSTABLE_OFFSET_COMMIT
    assert fetched(h, "g", [TP0, TP1]) == {TP0: 5, TP1: None}
    assert fetched(h, "g", [TP0, TP1], require_stable=True) == {
        TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT, TP1: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert fetched(h, "g", None, require_stable=True) == {TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    end_txn(h, host, "g", commit=True)
    assert fetched(h, "g", [TP0, TP1], require_stable=True) == {TP0: 10, TP1: 11}
    assert h.on_loop(lambda: h.gc.groups["g"].pending_txn_offsets) == {}
    assert h.on_loop(lambda: dict(h.gc.txn_groups)) == {}


def test_abort_drops_pending_offsets(h: Harness, host: FakeHost) -> None:
    h.commit("g", -1, "", {TP0: 5})
    txn_commit(h, "g", {TP0: 10, TP1: 11})
    end_txn(h, host, "g", commit=False)
    assert fetched(h, "g", [TP0, TP1], require_stable=True) == {TP0: 5, TP1: None}


def test_offsets_batch_is_one_transactional_batch_of_the_producer(h: Harness, host: FakeHost) -> None:
    txn_commit(h, "g", {TP0: 10, TP1: 11, ("payments", 1): 12})
    lg = host.offsets_log(partition_for("g", NUM_PARTITIONS))
    data = lg.read(0, 1 << 20).records.read_bytes()
    batches = list(iter_batch_headers(data))
    assert len(batches) == 1
    pos, header = batches[0]
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, EPOCH, -1)
    assert len(decode_records(data, pos)) == 3


def test_marker_only_completes_groups_of_its_partition(h: Harness, host: FakeHost) -> None:
    a = "group-a"
    b = next(f"group-{i}" for i in range(100)
             if partition_for(f"group-{i}", NUM_PARTITIONS) != partition_for(a, NUM_PARTITIONS))
    txn_commit(h, a, {TP0: 1})
    txn_commit(h, b, {TP0: 2})
    end_txn(h, host, a, commit=True)
    assert fetched(h, a, [TP0], require_stable=True) == {TP0: 1}
    assert fetched(h, b, [TP0], require_stable=True) == {TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    end_txn(h, host, b, commit=True)
    assert fetched(h, b, [TP0], require_stable=True) == {TP0: 2}


def test_newer_plain_commit_wins_over_an_older_transactional_one(h: Harness, host: FakeHost) -> None:
    txn_commit(h, "g", {TP0: 10, TP1: 11})
    assert h.commit("g", -1, "", {TP0: 20}) == {TP0: ErrorCode.NONE}
    end_txn(h, host, "g", commit=True)
    # TP0's plain commit was written after the transactional one: it stays (Kafka compares record offsets)
    assert fetched(h, "g", [TP0, TP1]) == {TP0: 20, TP1: 11}


def test_two_producers_complete_independently(h: Harness, host: FakeHost) -> None:
    txn_commit(h, "g", {TP0: 1}, pid=1)
    txn_commit(h, "g", {TP1: 2}, pid=2)
    end_txn(h, host, "g", commit=False, pid=1)
    assert fetched(h, "g", [TP0, TP1], require_stable=True) == {TP0: None, TP1: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    end_txn(h, host, "g", commit=True, pid=2)
    assert fetched(h, "g", [TP0, TP1], require_stable=True) == {TP0: None, TP1: 2}


# ---------------------------------------------------------------- validation


def test_member_checks(h: Harness) -> None:
    a = h.stable_single("live", instance_id="i-a")
    gen = a.generation_id
    # KIP-447: generation -1 and no member id skip the member checks, even in a Stable group
    assert txn_commit(h, "live", {TP0: 1}) == {TP0: ErrorCode.NONE}
    assert txn_commit(h, "live", {TP0: 1}, generation=gen, member_id=a.member_id, instance_id="i-a") == {
        TP0: ErrorCode.NONE}
    assert txn_commit(h, "live", {TP0: 1}, generation=gen, member_id="stranger") == {TP0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert txn_commit(h, "live", {TP0: 1}, generation=gen + 1, member_id=a.member_id) == {
        TP0: ErrorCode.ILLEGAL_GENERATION}
    # a member id without its generation: Kafka's validateOffsetCommit checks the generation too
    assert txn_commit(h, "live", {TP0: 1}, generation=-1, member_id=a.member_id) == {
        TP0: ErrorCode.ILLEGAL_GENERATION}
    assert txn_commit(h, "live", {TP0: 1}, generation=gen, member_id="old-id", instance_id="i-a") == {
        TP0: ErrorCode.FENCED_INSTANCE_ID}
    # a missing group is created as a simple group only for a commit that passes the checks
    assert txn_commit(h, "new", {TP0: 1}, generation=3, member_id="m") == {TP0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert h.group("new") is None
    assert txn_commit(h, "new", {TP0: 1}) == {TP0: ErrorCode.NONE}
    assert h.state("new") is GroupState.EMPTY
    assert txn_commit(h, "", {TP0: 1}) == {TP0: ErrorCode.INVALID_GROUP_ID}


def test_partition_errors_and_fenced_epoch(h: Harness, host: FakeHost) -> None:
    res = h.run(h.gc.txn_commit_offsets, "g", PID, EPOCH, -1, "", None,
                {TP0: oam(1), ("nope", 0): oam(1), TP1: oam(1, "x" * 4097)})
    assert res == {TP0: ErrorCode.NONE, ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                   TP1: ErrorCode.OFFSET_METADATA_TOO_LARGE}
    end_txn(h, host, "g", commit=True)
    # the producer's epoch in __consumer_offsets is now EPOCH: an older epoch is a zombie
    assert txn_commit(h, "g", {TP0: 2}, epoch=EPOCH - 1) == {TP0: ErrorCode.INVALID_PRODUCER_EPOCH}
    host.lead = False
    assert txn_commit(h, "g", {TP0: 2}) == {TP0: ErrorCode.NOT_COORDINATOR}


# ---------------------------------------------------------------- reload


def test_reload_replays_markers_by_producer(host: FakeHost) -> None:
    h1 = Harness(host).start()
    try:
        h1.commit("g", -1, "", {TP0: 1, TP1: 1})
        txn_commit(h1, "g", {TP0: 10}, pid=1)
        txn_commit(h1, "g", {TP1: 20}, pid=2)
        txn_commit(h1, "g", {("payments", 0): 30}, pid=3)
        end_txn(h1, host, "g", commit=True, pid=1)
        end_txn(h1, host, "g", commit=False, pid=2)
        txn_commit(h1, "other", {TP0: 40}, pid=3)  # no marker yet: pending across the restart
    finally:
        h1.stop()
    h2 = loaded(host)
    try:
        assert fetched(h2, "g", [TP0, TP1, ("payments", 0)], require_stable=True) == {
            TP0: 10, TP1: 1, ("payments", 0): ErrorCode.UNSTABLE_OFFSET_COMMIT}
        assert fetched(h2, "other", [TP0], require_stable=True) == {TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
        end_txn(h2, host, "g", commit=True, pid=3)
        end_txn(h2, host, "other", commit=True, pid=3)
        assert fetched(h2, "g", [("payments", 0)], require_stable=True) == {("payments", 0): 30}
        assert fetched(h2, "other", [TP0], require_stable=True) == {TP0: 40}
    finally:
        h2.stop()
    h3 = loaded(host)
    try:
        assert fetched(h3, "g", None, require_stable=True) == {TP0: 10, TP1: 1, ("payments", 0): 30}
        assert fetched(h3, "other", None, require_stable=True) == {TP0: 40}
    finally:
        h3.stop()


def test_marker_written_while_loading_is_replayed(host: FakeHost) -> None:
    h1 = Harness(host).start()
    try:
        txn_commit(h1, "g", {TP0: 10})
    finally:
        h1.stop()
    hx = Harness(host).start()
    try:
        p = partition_for("g", NUM_PARTITIONS)
        # the partition is still loading when the marker lands: complete_txn leaves it to the loader
        hx.on_loop(lambda: hx.gc.loading.add(p))
        write_marker(host, "g", PID, commit=True)
        hx.on_loop(lambda: hx.gc.complete_txn(PID, p, True))
        hx.run(hx.gc._load_all, [p])
        assert fetched(hx, "g", [TP0], require_stable=True) == {TP0: 10}
    finally:
        hx.stop()


# ---------------------------------------------------------------- deletion and expiry


def test_delete_group_takes_pending_offsets_along(host: FakeHost) -> None:
    h1 = Harness(host).start()
    try:
        h1.commit("g", -1, "", {TP0: 1})
        txn_commit(h1, "g", {TP0: 10, TP1: 11})
        assert h1.run(h1.gc.delete_groups, ["g"]) == {"g": ErrorCode.NONE}
        assert h1.group("g") is None
        end_txn(h1, host, "g", commit=True)  # a marker after the deletion brings nothing back
        assert h1.group("g") is None
    finally:
        h1.stop()
    h2 = loaded(host)
    try:
        assert h2.group("g") is None
        assert fetched(h2, "g", [TP0, TP1], require_stable=True) == {TP0: None, TP1: None}
    finally:
        h2.stop()


def test_delete_offsets_removes_pending_offsets(h: Harness, host: FakeHost) -> None:
    txn_commit(h, "g", {TP0: 10, TP1: 11})
    err, res = h.run(h.gc.delete_offsets, "g", [TP0])
    assert (err, res) == (ErrorCode.NONE, {TP0: ErrorCode.NONE})
    end_txn(h, host, "g", commit=True)
    assert fetched(h, "g", [TP0, TP1]) == {TP0: None, TP1: 11}


def test_expiry_keeps_offsets_with_pending_commits_and_their_group(host: FakeHost) -> None:
    hx = Harness(host, offsets_retention_ms=0).start()
    try:
        hx.commit("g", -1, "", {TP0: 1, TP1: 1})
        txn_commit(hx, "g", {TP0: 10})
        hx.run(hx.gc._expire_offsets)
        # TP1 expired; TP0 has a pending transactional commit, so it and the group stay
        assert hx.state("g") is GroupState.EMPTY
        assert fetched(hx, "g", None) == {TP0: 1}
        end_txn(hx, host, "g", commit=True)
        assert fetched(hx, "g", None) == {TP0: 10}
        hx.run(hx.gc._expire_offsets)
        assert hx.group("g") is None
        # a group holding only pending offsets is not expired either
        txn_commit(hx, "p", {TP0: 3})
        hx.run(hx.gc._expire_offsets)
        assert hx.state("p") is GroupState.EMPTY
    finally:
        hx.stop()
