"""TransactionCoordinator without a network: the transaction state machine driven directly on its loop thread.

The host stands in for the broker: __transaction_state partitions and the data partitions are real storage Logs in
a temp dir, and write_txn_markers appends real control batches (Kafka's marker layout) to the data partitions. The
host can hold markers back or fail them, to reach the states a real broker passes through only briefly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kbroker.coordinator import transaction_records as records
from kbroker.coordinator.transaction_coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
    TxnConfig,
)
from kbroker.coordinator.transaction_metadata import (
    MAX_EPOCH,
    IllegalTransactionTransition,
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
    unknown_state_filters,
)
from kbroker.protocol import codec
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import TransactionLogValue
from kbroker.protocol.primitives import I16
from kbroker.protocol.records import build_batch, decode_records, iter_batch_headers
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import StorageError
from kbroker.storage.log import Log

S = TransactionState
NUM_PARTITIONS = 3
TOPICS = {"orders": 3, "payments": 2}
TIMEOUT = 5.0
T0 = 1_700_000_000_000


def read_all(lg: Log) -> list[tuple[Any, list[Any]]]:
    """Every batch of a log: (header, records)."""
    out = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        info = lg.read(offset, 1 << 20)
        if info.records is None or info.records.size == 0:
            break
        data = info.records.read_bytes()
        for pos, h in iter_batch_headers(data):
            out.append((h, decode_records(data, pos)))
            offset = h.base_offset + h.last_offset_delta + 1
    return out


class Host:
    """Leads every __transaction_state partition; markers are real control batches in real logs."""

    def __init__(self, root: Path, flush_messages: int | None = None) -> None:
        self.root = root
        self.logs: dict[tuple[str, int], Log] = {}
        self.lead = True
        self.next_pid = 1000
        self.flush_messages = flush_messages
        self.flushes: list[tuple[str, int, int]] = []
        self.marker_calls: list[tuple[int, int, int, bool, list[tuple[str, int]]]] = []
        self.marker_failures: dict[tuple[str, int], list[ErrorCode]] = {}
        self.deleted: set[tuple[str, int]] = set()
        self.hold_markers = False
        self.marker_exceptions = 0  # the next calls of write_txn_markers raise (the broker's channel broke)
        self.load_gate: Any = None  # threading.Event the load waits on

    def log(self, topic: str, partition: int) -> Log:
        lg = self.logs.get((topic, partition))
        if lg is None:
            config = LogConfig(cleanup_policy="compact" if topic == TRANSACTION_STATE_TOPIC else "delete")
            if self.flush_messages is not None:
                config = dataclasses.replace(config, flush_messages=self.flush_messages)
            lg = self.logs[(topic, partition)] = Log.open(self.root / f"{topic}-{partition}", topic, partition,
                                                          config, clean_shutdown=True)
        return lg

    def txn_log(self, partition: int) -> Log:
        if self.load_gate is not None:
            assert self.load_gate.wait(TIMEOUT)
        return self.log(TRANSACTION_STATE_TOPIC, partition)

    def leads_txn_partition(self, partition: int) -> bool:
        return self.lead

    async def flush_log(self, lg: Log, offset: int) -> None:
        self.flushes.append((lg.topic, lg.partition, offset))
        lg.flush(offset + 1)

    async def generate_producer_id(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def partition_exists(self, topic: str, partition: int) -> bool:
        return (topic, partition) not in self.deleted and 0 <= partition < TOPICS.get(topic, 0)

    async def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                                partitions: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        self.marker_calls.append((producer_id, producer_epoch, coordinator_epoch, commit, list(partitions)))
        while self.hold_markers:
            await asyncio.sleep(0.01)
        if self.marker_exceptions:
            self.marker_exceptions -= 1
            raise ConnectionError("marker channel down")
        out = {}
        for tp in partitions:
            failures = self.marker_failures.get(tp)
            if failures:
                out[tp] = failures.pop(0)
                continue
            try:
                self.log(*tp).append_control(producer_id, producer_epoch, coordinator_epoch, commit,
                                             int(time.time() * 1000), leader_epoch=0)
            except StorageError as e:
                out[tp] = ErrorCode(e.error_code)
                continue
            out[tp] = ErrorCode.NONE
        return out

    def produce_transactional(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                              sequence: int, value: bytes) -> int:
        """A client's transactional batch, as the produce path appends it; returns its offset."""
        batch = build_batch([(None, value, [], int(time.time() * 1000))], producer_id=producer_id,
                            producer_epoch=producer_epoch, base_sequence=sequence, is_transactional=True)
        return int(self.log(topic, partition).append_as_leader(bytearray(batch), int(time.time() * 1000),
                                                               leader_epoch=0).first_offset)

    def markers(self, topic: str, partition: int) -> list[tuple[int, int, bool, int]]:
        """(producer id, epoch, commit, coordinator epoch) of each marker in a data partition."""
        out = []
        for h, recs in read_all(self.log(topic, partition)):
            if h.is_control:
                r = recs[0]
                out.append((h.producer_id, h.producer_epoch, I16.unpack_from(r.key, 2)[0] == 1,
                            struct.unpack_from(">i", r.value, 2)[0]))
        return out

    def txn_records(self) -> list[tuple[str, TransactionMetadata | None]]:
        out = []
        for p in range(NUM_PARTITIONS):
            for _, recs in read_all(self.log(TRANSACTION_STATE_TOPIC, p)):
                for r in recs:
                    rec = records.parse_record(r.key, r.value)
                    out.append((rec.transactional_id, rec.metadata))
        return out

    def close(self) -> None:
        for lg in self.logs.values():
            lg.close()
        self.logs.clear()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Harness:
    def __init__(self, host: Host, clock: Clock | None = None, **config: Any) -> None:
        self.host = host
        self.clock = clock or Clock()
        self.tc = TransactionCoordinator(host, TxnConfig(**{
            "num_partitions": NUM_PARTITIONS, "max_timeout_ms": 60000,
            "abort_timed_out_interval_ms": 3_600_000,
            "remove_expired_interval_ms": 3_600_000, "marker_retry_backoff_ms": 10,
            **config,
        }), time_ms=self.clock)

    def start(self, load: list[int] | None = None) -> Harness:
        self.tc.start(list(range(NUM_PARTITIONS)) if load is None else load)
        deadline = time.monotonic() + TIMEOUT
        while self.on_loop(lambda: bool(self.tc.loading)) and self.host.load_gate is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return self

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(fn(*args), self.tc.loop)

    def run(self, fn: Any, *args: Any) -> Any:
        return self.submit(fn, *args).result(TIMEOUT)

    def on_loop(self, fn: Any) -> Any:
        async def wrapped() -> Any:
            return fn()
        return self.run(wrapped)

    def init(self, tid: str, timeout_ms: int = 10000, pid: int = -1, epoch: int = -1) -> tuple[ErrorCode, int, int]:
        return self.run(self.tc.init_producer_id, tid, timeout_ms, pid, epoch)  # type: ignore[no-any-return]

    def add(self, tid: str, pid: int, epoch: int, *tps: tuple[str, int], verify: bool = False
            ) -> dict[tuple[str, int], ErrorCode]:
        return self.run(self.tc.add_partitions, tid, pid, epoch, list(tps), verify)  # type: ignore[no-any-return]

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> ErrorCode:
        return self.run(self.tc.end_transaction, tid, pid, epoch, commit)  # type: ignore[no-any-return]

    def meta(self, tid: str) -> tuple[S, int, int, frozenset[tuple[str, int]], S | None] | None:
        def get() -> Any:
            m = self.tc.txns.get(tid)
            if m is None:
                return None
            return m.state, m.producer_id, m.producer_epoch, frozenset(m.topic_partitions), m.pending_state
        return self.on_loop(get)  # type: ignore[no-any-return]

    def state(self, tid: str) -> S | None:
        m = self.meta(tid)
        return None if m is None else m[0]

    def wait_state(self, tid: str, state: S) -> None:
        deadline = time.monotonic() + TIMEOUT
        while True:
            m = self.meta(tid)
            if m is not None and m[0] is state and m[4] is None:
                return
            assert time.monotonic() < deadline, f"{tid} is {m}, not {state}"
            time.sleep(0.01)

    def stop(self) -> None:
        self.tc.stop()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(tmp_path)
    yield h
    h.close()


@pytest.fixture
def harness(host: Host) -> Iterator[Harness]:
    h = Harness(host).start()
    yield h
    h.stop()


def reopen(old: Harness, **config: Any) -> Harness:
    """A fresh coordinator (and freshly opened logs) over the same directory: the broker restarted."""
    old.stop()
    old.host.close()
    return Harness(old.host, old.clock, **config).start()


def all_ok(res: dict[tuple[str, int], ErrorCode]) -> bool:
    return all(e is ErrorCode.NONE for e in res.values())


# ------------------------------------------------------------ records


def kafka_value_v0(pid: int, epoch: int, timeout: int, status: int, partitions: dict[str, list[int]] | None,
                   last_update: int, start: int) -> bytes:
    """TransactionLogValue v0 laid out by hand from Kafka's schema (non-flexible: int16-length strings,
    int32-count arrays, -1 for a null array)."""
    out = struct.pack(">hqhib", 0, pid, epoch, timeout, status)
    if partitions is None:
        out += struct.pack(">i", -1)
    else:
        out += struct.pack(">i", len(partitions))
        for topic, ids in partitions.items():
            t = topic.encode()
            out += struct.pack(">h", len(t)) + t + struct.pack(">i", len(ids)) + b"".join(struct.pack(">i", i)
                                                                                       for i in ids)
    return out + struct.pack(">qq", last_update, start)


def transit(state: S, partitions: frozenset[tuple[str, int]] = frozenset(), start: int = -1) -> TxnTransitMetadata:
    return TxnTransitMetadata(4242, -1, 7, -1, 60000, state, partitions, start, T0 + 5)


def test_key_bytes_are_kafkas_version_0() -> None:
    assert records.key_bytes("tx-1") == struct.pack(">hh", 0, 4) + b"tx-1"
    assert records.parse_key(records.key_bytes("tx-ü")) == "tx-ü"


def test_value_bytes_are_kafkas_version_0() -> None:
    tps = frozenset({("orders", 2), ("orders", 0), ("payments", 1)})
    assert records.value_bytes(transit(S.ONGOING, tps, T0)) == kafka_value_v0(
        4242, 7, 60000, 1, {"orders": [0, 2], "payments": [1]}, T0 + 5, T0)
    # Empty writes a null partition list, as Kafka's valueToBytes.
    assert records.value_bytes(transit(S.EMPTY)) == kafka_value_v0(4242, 7, 60000, 0, None, T0 + 5, -1)
    assert records.value_bytes(transit(S.COMPLETE_COMMIT, start=T0)) == kafka_value_v0(
        4242, 7, 60000, 4, {}, T0 + 5, T0)
    with pytest.raises(ValueError):
        records.value_bytes(transit(S.EMPTY, tps))


@pytest.mark.parametrize("state", [S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_COMMIT,
                                   S.COMPLETE_ABORT])
def test_value_round_trip(state: S) -> None:
    tps = frozenset() if state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT) else frozenset(
        {("orders", 1), ("payments", 0)})
    m = records.parse_value("tx", records.value_bytes(transit(state, tps, T0)))
    assert (m.transactional_id, m.producer_id, m.producer_epoch, m.txn_timeout_ms, m.state) == (
        "tx", 4242, 7, 60000, state)
    assert m.topic_partitions == set(tps)
    assert (m.txn_start_timestamp, m.txn_last_update_timestamp) == (T0, T0 + 5)
    # v0 carries no previous producer id or epoch.
    assert (m.last_producer_id, m.last_producer_epoch, m.pending_state) == (-1, -1, None)


def test_flexible_value_version_1_is_read() -> None:
    v = TransactionLogValue(producer_id=9, producer_epoch=3, transaction_timeout_ms=1000, transaction_status=2,
                            transaction_partitions=[TransactionLogValue.PartitionsSchema("orders", [0, 1])],
                            transaction_last_update_timestamp_ms=T0, transaction_start_timestamp_ms=T0 - 1)
    data = bytearray(I16.pack(1))
    codec.encode(v, 1, data)
    m = records.parse_value("tx", bytes(data))
    assert (m.state, m.producer_id, m.topic_partitions) == (S.PREPARE_COMMIT, 9, {("orders", 0), ("orders", 1)})
    with pytest.raises(records.UnknownTxnRecordVersion):
        records.parse_value("tx", I16.pack(2) + bytes(data[2:]))
    assert records.parse_record(records.key_bytes("tx"), None) == records.TxnRecord("tx", None)


# ------------------------------------------------------------ metadata transitions


def test_transition_rules() -> None:
    m = TransactionMetadata("tx", 5, -1, 1000, S.EMPTY, txn_last_update_timestamp=T0)
    t = m.prepare_increment_producer_epoch(1000, None, T0)
    assert isinstance(t, TxnTransitMetadata) and t.producer_epoch == 0
    with pytest.raises(IllegalTransactionTransition):
        m.prepare_add_partitions({("orders", 0)}, T0)  # a transition is pending
    m.complete_transition_to(t)
    with pytest.raises(IllegalTransactionTransition):
        m.prepare_abort_or_commit(S.PREPARE_COMMIT, T0)  # Empty -> PrepareCommit is no transition
    m.pending_state = None
    t = m.prepare_add_partitions({("orders", 0)}, T0 + 1)
    m.complete_transition_to(t)
    assert (m.state, m.txn_start_timestamp, m.topic_partitions) == (S.ONGOING, T0 + 1, {("orders", 0)})
    with pytest.raises(IllegalTransactionTransition):
        m.prepare_dead()  # an Ongoing transactional id never expires
    m.pending_state = None
    bad = TxnTransitMetadata(5, 5, 3, -1, 1000, S.PREPARE_COMMIT, frozenset(), T0 + 1, T0 + 2)
    m.prepare_abort_or_commit(S.PREPARE_COMMIT, T0 + 2)
    with pytest.raises(IllegalTransactionTransition):
        m.complete_transition_to(bad)  # the epoch and partitions of the write do not match
    assert unknown_state_filters(["Ongoing", "Bogus", "PrepareEpochFence"]) == ["Bogus"]


# ------------------------------------------------------------ init, fencing, errors


def test_init_bumps_epoch_and_fences_the_old_producer(harness: Harness) -> None:
    err, pid, epoch = harness.init("tx")
    assert (err, epoch) == (ErrorCode.NONE, 0) and pid > 1000
    assert harness.init("tx") == (ErrorCode.NONE, pid, 1)
    assert harness.add("tx", pid, 0, ("orders", 0)) == {("orders", 0): ErrorCode.PRODUCER_FENCED}
    assert harness.end("tx", pid, 0, True) is ErrorCode.PRODUCER_FENCED
    assert harness.add("tx", pid + 1, 1, ("orders", 0)) == {("orders", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    assert harness.add("nope", pid, 1, ("orders", 0)) == {("orders", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    assert harness.end("nope", pid, 1, True) is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    # Each transactional id gets its own producer id.
    assert harness.init("other")[1] not in (pid, -1)
    recs = [(tid, m.state, m.producer_epoch) for tid, m in harness.host.txn_records() if m is not None]
    assert [r for r in recs if r[0] == "tx"] == [("tx", S.EMPTY, 0), ("tx", S.EMPTY, 1)]


def test_init_argument_errors(harness: Harness) -> None:
    assert harness.init("tx", 0)[0] is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert harness.init("tx", 60001)[0] is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert harness.init("") == (ErrorCode.INVALID_REQUEST, -1, -1)
    assert harness.init("tx", 1000, 5, -1)[0] is ErrorCode.INVALID_REQUEST
    assert harness.add("", 1, 0, ("orders", 0)) == {("orders", 0): ErrorCode.INVALID_REQUEST}
    assert harness.end("", 1, 0, True) is ErrorCode.INVALID_REQUEST
    # No transactional id: an idempotent producer id at epoch 0, nothing stored.
    err, pid, epoch = harness.run(harness.tc.init_producer_id, None, 1000)
    assert (err, epoch) == (ErrorCode.NONE, 0) and pid > 0
    assert harness.host.txn_records() == []


def test_not_coordinator_and_loading(host: Host) -> None:
    import threading
    host.load_gate = threading.Event()
    h = Harness(host).start()
    try:
        assert h.init("tx")[0] is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert h.end("tx", 1, 0, True) is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert h.run(h.tc.list_transactions, [], [], -1) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, [], [])
        [d] = h.run(h.tc.describe_transactions, ["tx"])
        assert d.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        host.load_gate.set()
        host.load_gate = None
        deadline = time.monotonic() + TIMEOUT
        while h.on_loop(lambda: bool(h.tc.loading)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert h.init("tx")[0] is ErrorCode.NONE
        host.lead = False
        assert h.init("tx")[0] is ErrorCode.NOT_COORDINATOR
        assert h.add("tx", 1, 0, ("orders", 0)) == {("orders", 0): ErrorCode.NOT_COORDINATOR}
        assert h.on_loop(lambda: h.tc.coordinator_error("tx")) is ErrorCode.NOT_COORDINATOR
    finally:
        if host.load_gate is not None:
            host.load_gate.set()
        h.stop()


# ------------------------------------------------------------ commit / abort


@pytest.mark.parametrize("commit", [True, False])
def test_transaction_writes_markers_then_completes(harness: Harness, commit: bool) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0), ("orders", 2)))
    assert harness.meta("tx")[:4] == (S.ONGOING, pid, epoch, frozenset({("orders", 0), ("orders", 2)}))
    # Already in the transaction: answered without a write.
    n = len(host.txn_records())
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    assert len(host.txn_records()) == n
    assert all_ok(harness.add("tx", pid, epoch, ("payments", 1)))
    assert harness.end("tx", pid, epoch, commit) is ErrorCode.NONE
    harness.wait_state("tx", S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    for tp in [("orders", 0), ("orders", 2), ("payments", 1)]:
        assert host.markers(*tp) == [(pid, epoch, commit, 0)]
    assert host.markers("orders", 1) == []
    prepare, complete = (S.PREPARE_COMMIT, S.COMPLETE_COMMIT) if commit else (S.PREPARE_ABORT, S.COMPLETE_ABORT)
    states = [(m.state, frozenset(m.topic_partitions)) for tid, m in host.txn_records() if m is not None]
    all_tps = frozenset({("orders", 0), ("orders", 2), ("payments", 1)})
    assert states == [(S.EMPTY, frozenset()), (S.ONGOING, frozenset({("orders", 0), ("orders", 2)})),
                      (S.ONGOING, all_tps), (prepare, all_tps), (complete, frozenset())]
    # A retry of the same outcome succeeds; the other outcome is not a legal transition.
    assert harness.end("tx", pid, epoch, commit) is ErrorCode.NONE
    assert harness.end("tx", pid, epoch, not commit) is ErrorCode.INVALID_TXN_STATE
    # The next transaction starts from the completed one with the same epoch.
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 1)))
    assert harness.state("tx") is S.ONGOING


def test_committed_and_aborted_data_become_stable(harness: Harness) -> None:
    """With the real storage marker path: open transactions hold the partition's LSO until their marker."""
    host = harness.host
    _, pid, epoch = harness.init("committer")
    _, zpid, zepoch = harness.init("zombie", timeout_ms=1000)
    assert all_ok(harness.add("committer", pid, epoch, ("orders", 0), ("payments", 0)))
    assert all_ok(harness.add("zombie", zpid, zepoch, ("orders", 0)))
    orders = host.log("orders", 0)
    first = host.produce_transactional("orders", 0, pid, epoch, 0, b"c0")
    zombie_first = host.produce_transactional("orders", 0, zpid, zepoch, 0, b"z0")
    host.produce_transactional("payments", 0, pid, epoch, 0, b"c1")
    assert orders.last_stable_offset == first
    assert harness.end("committer", pid, epoch, True) is ErrorCode.NONE
    harness.wait_state("committer", S.COMPLETE_COMMIT)
    assert orders.last_stable_offset == zombie_first  # the zombie's transaction is still open
    assert host.log("payments", 0).last_stable_offset == host.log("payments", 0).high_watermark
    # The zombie's producer never ends its transaction: the timeout aborts it and the partition is stable again.
    harness.clock.now += 1001
    harness.run(harness.tc.abort_timed_out_transactions)
    harness.wait_state("zombie", S.COMPLETE_ABORT)
    assert orders.last_stable_offset == orders.high_watermark == orders.log_end_offset
    [aborted] = orders.collect_aborted_transactions(0, orders.log_end_offset)
    assert (aborted.producer_id, aborted.first_offset) == (zpid, zombie_first)
    # The zombie's late write is refused by the partition: its epoch is fenced there too.
    with pytest.raises(StorageError) as e:
        host.produce_transactional("orders", 0, zpid, zepoch, 1, b"z1")
    assert e.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH


def test_end_without_transaction_is_invalid_txn_state(harness: Harness) -> None:
    _, pid, epoch = harness.init("tx")
    assert harness.end("tx", pid, epoch, True) is ErrorCode.INVALID_TXN_STATE
    assert harness.end("tx", pid, epoch, False) is ErrorCode.INVALID_TXN_STATE


def test_concurrent_transactions_while_markers_are_written(harness: Harness) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    host.hold_markers = True
    assert harness.end("tx", pid, epoch, True) is ErrorCode.NONE
    assert harness.meta("tx")[0::4] == (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
    assert harness.init("tx")[0] is ErrorCode.CONCURRENT_TRANSACTIONS
    assert harness.add("tx", pid, epoch, ("orders", 1)) == {("orders", 1): ErrorCode.CONCURRENT_TRANSACTIONS}
    assert harness.add("tx", pid, epoch, ("orders", 0), verify=True) == {
        ("orders", 0): ErrorCode.CONCURRENT_TRANSACTIONS}
    assert harness.end("tx", pid, epoch, True) is ErrorCode.CONCURRENT_TRANSACTIONS
    assert harness.end("tx", pid, epoch, False) is ErrorCode.CONCURRENT_TRANSACTIONS
    host.hold_markers = False
    harness.wait_state("tx", S.COMPLETE_COMMIT)
    assert harness.init("tx") == (ErrorCode.NONE, pid, epoch + 1)


def test_add_partitions_waits_briefly_for_the_previous_markers(harness: Harness) -> None:
    """The next transaction's first AddPartitionsToTxn, sent right after EndTxn was answered, waits for the
    markers instead of answering CONCURRENT_TRANSACTIONS (which costs librdkafka a retry backoff)."""
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    host.hold_markers = True
    assert harness.end("tx", pid, epoch, True) is ErrorCode.NONE
    release = threading.Timer(0.2, setattr, (host, "hold_markers", False))
    release.start()
    try:
        assert all_ok(harness.add("tx", pid, epoch, ("orders", 1)))
    finally:
        release.cancel()
    assert harness.meta("tx")[0::3] == (S.ONGOING, frozenset({("orders", 1)}))


def test_end_abort_while_prepare_abort_is_concurrent_and_commit_invalid(harness: Harness) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    host.hold_markers = True
    assert harness.end("tx", pid, epoch, False) is ErrorCode.NONE
    assert harness.end("tx", pid, epoch, False) is ErrorCode.CONCURRENT_TRANSACTIONS
    host.hold_markers = False
    harness.wait_state("tx", S.COMPLETE_ABORT)
    assert harness.end("tx", pid, epoch, True) is ErrorCode.INVALID_TXN_STATE


def test_init_during_open_transaction_aborts_it_under_a_bumped_epoch(harness: Harness) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0), ("payments", 0)))
    # A new instance of the producer: the open transaction is aborted first, the client retries.
    assert harness.init("tx") == (ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1)
    harness.wait_state("tx", S.COMPLETE_ABORT)
    assert host.markers("orders", 0) == [(pid, epoch + 1, False, 0)]
    assert host.markers("payments", 0) == [(pid, epoch + 1, False, 0)]
    assert harness.init("tx") == (ErrorCode.NONE, pid, epoch + 2)
    # The zombie is fenced everywhere.
    assert harness.end("tx", pid, epoch, True) is ErrorCode.PRODUCER_FENCED
    assert harness.add("tx", pid, epoch, ("orders", 0)) == {("orders", 0): ErrorCode.PRODUCER_FENCED}
    assert harness.add("tx", pid, epoch, ("orders", 0), verify=True) == {("orders", 0): ErrorCode.PRODUCER_FENCED}


def test_verify_only_checks_partitions_without_writing(harness: Harness) -> None:
    _, pid, epoch = harness.init("tx")
    assert harness.add("tx", pid, epoch, ("orders", 0), verify=True) == {
        ("orders", 0): ErrorCode.TRANSACTION_ABORTABLE}
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    n = len(harness.host.txn_records())
    assert harness.add("tx", pid, epoch, ("orders", 0), ("orders", 1), verify=True) == {
        ("orders", 0): ErrorCode.NONE, ("orders", 1): ErrorCode.TRANSACTION_ABORTABLE}
    assert len(harness.host.txn_records()) == n
    assert harness.meta("tx")[3] == frozenset({("orders", 0)})
    assert harness.add("tx", pid + 7, epoch, ("orders", 0), verify=True) == {
        ("orders", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}


# ------------------------------------------------------------ KIP-360 and producer id rotation


def test_kip360_expected_epoch(harness: Harness) -> None:
    _, pid, epoch = harness.init("tx")
    # The current producer bumps its own epoch (after an abortable error).
    assert harness.init("tx", 10000, pid, epoch) == (ErrorCode.NONE, pid, epoch + 1)
    # Its retry of that call (answer lost) gets the same epoch again.
    assert harness.init("tx", 10000, pid, epoch) == (ErrorCode.NONE, pid, epoch + 1)
    # An older epoch, or a producer id the transactional id never had, is fenced.
    assert harness.init("tx", 10000, pid, epoch - 1 if epoch else 5)[0] is ErrorCode.PRODUCER_FENCED
    assert harness.init("tx", 10000, pid + 99, 0)[0] is ErrorCode.PRODUCER_FENCED
    # A new instance (no expected epoch) forgets the previous epoch: the old retry is fenced now.
    assert harness.init("tx") == (ErrorCode.NONE, pid, epoch + 2)
    assert harness.init("tx", 10000, pid, epoch)[0] is ErrorCode.PRODUCER_FENCED


def write_state(host: Host, tid: str, state: S, pid: int, epoch: int,
                partitions: frozenset[tuple[str, int]] = frozenset(), start: int = -1) -> None:
    from kbroker.coordinator.transaction_coordinator import partition_for
    t = TxnTransitMetadata(pid, -1, epoch, -1, 10000, state, partitions, start, T0)
    batch = build_batch([(records.key_bytes(tid), records.value_bytes(t), [], T0)])
    host.log(TRANSACTION_STATE_TOPIC, partition_for(tid, NUM_PARTITIONS)).append_as_leader(
        batch, T0, leader_epoch=0, from_client=False)


def test_exhausted_epoch_rotates_the_producer_id(host: Host) -> None:
    write_state(host, "tx", S.COMPLETE_COMMIT, 77, MAX_EPOCH - 2, start=T0)
    write_state(host, "tx2", S.EMPTY, 88, MAX_EPOCH - 1)
    h = Harness(host).start()
    try:
        assert h.init("tx") == (ErrorCode.NONE, 77, MAX_EPOCH - 1)
        err, new_pid, epoch = h.init("tx")
        assert (err, epoch) == (ErrorCode.NONE, 0) and new_pid != 77
        assert h.on_loop(lambda: (h.tc.txns["tx"].last_producer_id, h.tc.txns["tx"].last_producer_epoch)) == (77, -1)
        # KIP-360 with an exhausted expected epoch: rotation, and its retry gets the same new producer id.
        err, pid2, epoch2 = h.init("tx2", 10000, 88, MAX_EPOCH - 1)
        assert (err, epoch2) == (ErrorCode.NONE, 0) and pid2 not in (88, new_pid)
        assert h.init("tx2", 10000, 88, MAX_EPOCH - 1) == (ErrorCode.NONE, pid2, 0)
    finally:
        h.stop()


def test_fencing_at_the_last_epoch_then_rotation(host: Host) -> None:
    write_state(host, "tx", S.ONGOING, 77, MAX_EPOCH - 1, frozenset({("orders", 0)}), T0)
    h = Harness(host).start()
    try:
        assert h.init("tx")[0] is ErrorCode.CONCURRENT_TRANSACTIONS
        h.wait_state("tx", S.COMPLETE_ABORT)
        assert host.markers("orders", 0) == [(77, MAX_EPOCH, False, 0)]
        err, pid, epoch = h.init("tx")
        assert (err, epoch) == (ErrorCode.NONE, 0) and pid != 77
    finally:
        h.stop()


# ------------------------------------------------------------ timeouts and expiration


def test_timed_out_transaction_is_aborted_and_producer_fenced(harness: Harness) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx", timeout_ms=1000)
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 1)))
    harness.clock.now += 1000
    harness.run(harness.tc.abort_timed_out_transactions)
    assert harness.state("tx") is S.ONGOING  # not yet: start + timeout must be passed
    harness.clock.now += 1
    harness.run(harness.tc.abort_timed_out_transactions)
    harness.wait_state("tx", S.COMPLETE_ABORT)
    assert host.markers("orders", 1) == [(pid, epoch + 1, False, 0)]
    assert harness.end("tx", pid, epoch, True) is ErrorCode.PRODUCER_FENCED
    assert harness.add("tx", pid, epoch, ("orders", 1)) == {("orders", 1): ErrorCode.PRODUCER_FENCED}
    assert harness.init("tx") == (ErrorCode.NONE, pid, epoch + 2)


def test_abort_sweep_runs_on_its_interval(host: Host) -> None:
    h = Harness(host, abort_timed_out_interval_ms=20).start()
    try:
        _, pid, epoch = h.init("tx", timeout_ms=1000)
        assert all_ok(h.add("tx", pid, epoch, ("orders", 0)))
        h.clock.now += 5000
        h.wait_state("tx", S.COMPLETE_ABORT)
        assert h.meta("tx")[2] == epoch + 1
    finally:
        h.stop()


def test_idle_transactional_ids_expire_with_a_tombstone(harness: Harness) -> None:
    host = harness.host
    expiry = 604800000
    _, pid, epoch = harness.init("idle")
    _, pid2, epoch2 = harness.init("open")
    assert all_ok(harness.add("open", pid2, epoch2, ("orders", 0)))
    harness.clock.now += expiry - 1
    harness.run(harness.tc.expire_transactional_ids)
    assert harness.state("idle") is S.EMPTY
    harness.clock.now += 1
    harness.run(harness.tc.expire_transactional_ids)
    assert harness.meta("idle") is None
    assert harness.state("open") is S.ONGOING  # an open transaction never expires (it times out)
    assert ("idle", None) in host.txn_records()
    [d] = harness.run(harness.tc.describe_transactions, ["idle"])
    assert d.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    assert harness.add("idle", pid, epoch, ("orders", 0)) == {("orders", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    # After a restart the tombstone keeps it gone; a new init starts over with a new producer id.
    h2 = reopen(harness)
    try:
        assert h2.meta("idle") is None
        err, new_pid, new_epoch = h2.init("idle")
        assert (err, new_epoch) == (ErrorCode.NONE, 0) and new_pid != pid
    finally:
        h2.stop()


# ------------------------------------------------------------ reload


def test_reload_every_state(harness: Harness) -> None:
    host = harness.host
    ids = {}
    for tid in ["empty", "ongoing", "prep-commit", "prep-abort", "commit", "abort"]:
        ids[tid] = harness.init(tid, timeout_ms=2000)[1:]
    for tid in ["ongoing", "prep-commit", "prep-abort", "commit", "abort"]:
        assert all_ok(harness.add(tid, *ids[tid], ("orders", 0), ("payments", 1)))
    assert harness.end("commit", *ids["commit"], True) is ErrorCode.NONE
    assert harness.end("abort", *ids["abort"], False) is ErrorCode.NONE
    harness.wait_state("commit", S.COMPLETE_COMMIT)
    harness.wait_state("abort", S.COMPLETE_ABORT)
    host.hold_markers = True  # the broker dies before these markers are written
    assert harness.end("prep-commit", *ids["prep-commit"], True) is ErrorCode.NONE
    assert harness.end("prep-abort", *ids["prep-abort"], False) is ErrorCode.NONE
    harness.stop()
    host.hold_markers = False
    last = {tid: m.state for tid, m in host.txn_records() if m is not None}
    assert (last["prep-commit"], last["prep-abort"]) == (S.PREPARE_COMMIT, S.PREPARE_ABORT)
    assert (*ids["prep-commit"], True, 0) not in host.markers("orders", 0)

    h2 = reopen(harness)
    try:
        expected = {"empty": S.EMPTY, "ongoing": S.ONGOING, "commit": S.COMPLETE_COMMIT, "abort": S.COMPLETE_ABORT}
        for tid, state in expected.items():
            assert h2.meta(tid)[:3] == (state, *ids[tid])
        assert h2.meta("ongoing")[3] == frozenset({("orders", 0), ("payments", 1)})
        # Loaded Prepare* states finish: markers again, then Complete*.
        h2.wait_state("prep-commit", S.COMPLETE_COMMIT)
        h2.wait_state("prep-abort", S.COMPLETE_ABORT)
        for tp in [("orders", 0), ("payments", 1)]:
            markers = host.markers(*tp)
            assert (*ids["prep-commit"], True, 0) in markers
            assert (*ids["prep-abort"], False, 0) in markers
        # The loaded Ongoing transaction times out like any other.
        h2.clock.now += 2001
        h2.run(h2.tc.abort_timed_out_transactions)
        h2.wait_state("ongoing", S.COMPLETE_ABORT)
        pid, epoch = ids["ongoing"]
        assert h2.end("ongoing", pid, epoch, True) is ErrorCode.PRODUCER_FENCED
        assert h2.init("empty") == (ErrorCode.NONE, ids["empty"][0], ids["empty"][1] + 1)
        assert h2.init("commit") == (ErrorCode.NONE, ids["commit"][0], ids["commit"][1] + 1)
    finally:
        h2.stop()


def test_prepare_commit_loaded_completes_even_with_marker_retries(host: Host) -> None:
    write_state(host, "tx", S.PREPARE_COMMIT, 55, 3, frozenset({("orders", 0), ("orders", 1)}), T0)
    host.marker_failures[("orders", 1)] = [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT]
    h = Harness(host).start()
    try:
        h.wait_state("tx", S.COMPLETE_COMMIT)
        assert host.markers("orders", 0) == [(55, 3, True, 0)]
        assert host.markers("orders", 1) == [(55, 3, True, 0)]
        tries = [c[4] for c in host.marker_calls]
        assert tries == [[("orders", 0), ("orders", 1)], [("orders", 1)], [("orders", 1)]]
    finally:
        h.stop()


def test_marker_channel_failures_are_retried(harness: Harness) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    host.marker_exceptions = 2
    assert harness.end("tx", pid, epoch, False) is ErrorCode.NONE
    harness.wait_state("tx", S.COMPLETE_ABORT)
    assert len(host.marker_calls) == 3
    assert host.markers("orders", 0) == [(pid, epoch, False, 0)]


def test_markers_for_deleted_partitions_count_as_written(harness: Harness) -> None:
    host = harness.host
    _, pid, epoch = harness.init("tx")
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0), ("payments", 0)))
    host.deleted.add(("payments", 0))
    host.marker_failures[("payments", 0)] = [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 100
    assert harness.end("tx", pid, epoch, True) is ErrorCode.NONE
    harness.wait_state("tx", S.COMPLETE_COMMIT)
    assert host.markers("orders", 0) == [(pid, epoch, True, 0)]
    assert host.markers("payments", 0) == []


# ------------------------------------------------------------ describe, list, flush


def test_describe_and_list(harness: Harness) -> None:
    _, pid, epoch = harness.init("a", timeout_ms=3000)
    _, pid_b, _ = harness.init("b")
    harness.clock.now += 10
    assert all_ok(harness.add("a", pid, epoch, ("orders", 2), ("orders", 0), ("payments", 1)))
    a, missing, empty = harness.run(harness.tc.describe_transactions, ["a", "missing", ""])
    assert (a.error_code, a.producer_id, a.producer_epoch, a.transaction_state, a.transaction_timeout_ms,
            a.transaction_start_time_ms) == (0, pid, epoch, "Ongoing", 3000, T0 + 10)
    assert [(t.topic, t.partitions) for t in a.topics] == [("orders", [0, 2]), ("payments", [1])]
    assert missing.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    # Kafka 3.9 leaves the schema's defaults in an answer in error.
    assert (missing.producer_id, missing.producer_epoch, missing.transaction_start_time_ms) == (0, 0, 0)
    assert empty.error_code == ErrorCode.INVALID_REQUEST

    def listed(states: list[str], pids: list[int], duration: int = -1) -> list[tuple[str, int, str]]:
        err, unknown, out = harness.run(harness.tc.list_transactions, states, pids, duration)
        assert err is ErrorCode.NONE and unknown == [s for s in states if s == "Bogus"]
        return sorted((t.transactional_id, t.producer_id, t.transaction_state) for t in out)

    assert listed([], []) == [("a", pid, "Ongoing"), ("b", pid_b, "Empty")]
    assert listed(["Ongoing"], []) == [("a", pid, "Ongoing")]
    assert listed(["Bogus"], []) == []
    assert listed([], [pid_b]) == [("b", pid_b, "Empty")]
    harness.clock.now += 100
    assert listed(["Ongoing"], [], 99) == [("a", pid, "Ongoing")]
    assert listed(["Ongoing"], [], 100) == []


def test_writes_honour_the_flush_policy(tmp_path: Path) -> None:
    host = Host(tmp_path, flush_messages=1)
    h = Harness(host).start()
    try:
        _, pid, epoch = h.init("tx")
        assert all_ok(h.add("tx", pid, epoch, ("orders", 0)))
        assert h.end("tx", pid, epoch, True) is ErrorCode.NONE
        h.wait_state("tx", S.COMPLETE_COMMIT)
        txn_flushes = [f for f in host.flushes if f[0] == TRANSACTION_STATE_TOPIC]
        assert [f[2] for f in txn_flushes] == [0, 1, 2, 3]
    finally:
        h.stop()
        host.close()
    lazy = Host(tmp_path / "lazy")
    h = Harness(lazy).start()
    try:
        assert h.init("tx")[0] is ErrorCode.NONE
        assert lazy.flushes == []
    finally:
        h.stop()
        lazy.close()


def test_verify_partitions_now_answers_a_settled_transaction_off_the_loop(harness: Harness) -> None:
    """The produce path's synchronous verification agrees with verify_only on the loop, and declines (None)
    whenever the answer needs the loop: another producer or epoch, no open transaction, an unknown id."""
    tc = harness.tc
    _, pid, epoch = harness.init("tx")
    assert tc.verify_partitions_now("tx", pid, epoch, [("orders", 0)]) is None  # Empty: nothing to verify against
    assert all_ok(harness.add("tx", pid, epoch, ("orders", 0)))
    tps = [("orders", 0), ("orders", 1)]
    now = tc.verify_partitions_now("tx", pid, epoch, tps)
    assert now == {("orders", 0): ErrorCode.NONE, ("orders", 1): ErrorCode.TRANSACTION_ABORTABLE}
    assert now == harness.add("tx", pid, epoch, *tps, verify=True)
    assert tc.verify_partitions_now("tx", pid, epoch + 1, tps) is None
    assert tc.verify_partitions_now("tx", pid + 1, epoch, tps) is None
    assert tc.verify_partitions_now("unknown", pid, epoch, tps) is None
