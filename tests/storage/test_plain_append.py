"""Log._append_plain (the leader's fast path for the common client append) against the general append_as_leader:
the same appends give the same answers, errors, log bytes and producer state; with the compiled one-call append
(storage/leader_append.append_plain) and without it (the fast path's steps one by one)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kbroker.protocol.control_records import EndTxnMarker, build_end_txn_marker_batch
from kbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    TIMESTAMP_LOG_APPEND_TIME,
    build_batch,
)
from kbroker.storage import log as log_module
from kbroker.storage import segment as segment_module
from kbroker.storage.config import LogConfig
from kbroker.storage.errors import TransactionCoordinatorFencedError
from kbroker.storage.log import Log
from kbroker.storage.producer_state import VerificationGuard, encode_snapshot

from tests.storage.storage_helpers import NOW

PIDS = (-1, 1000, 1000, 1000, 1001)
ONE_CALL = log_module._append_one  # None without the C: the comparisons then cover the steps only


def _mostly(common: Any, *rare: Any) -> st.SearchStrategy[Any]:
    """common four times in five: the fast path's case must be frequent for the comparison to mean something."""
    return st.sampled_from((common,) * 4 * max(1, len(rare)) + rare)


# One append: (producer, epoch, sequence step, records, keyed, timestamp shift, transactional, codec, LogAppendTime
# mark, leader epoch, writable buffer, flipped byte, verification guard: None (verification off), "own" (the
# coordinator confirmed this producer's transaction), "none" (it did not: Kafka's sentinel guard))
appends = st.tuples(
    st.sampled_from(PIDS),
    _mostly(0, 1, 2),
    _mostly(0, -1, -2, 1, "dup", "zero", "neg"),
    st.integers(1, 4),
    _mostly(True, False),
    _mostly(0, -10_000_000, 10_000_000),
    st.sampled_from((False, False, True, True)),
    st.sampled_from((COMPRESSION_NONE, COMPRESSION_GZIP)),
    _mostly(False, True),
    _mostly(1, None, 0, 2),
    st.booleans(),
    _mostly(None, 13, 30, 70),
    st.sampled_from((None, "own", "own", "none")),
)
# The same, biased to transactions: two producers at their epochs, mostly in sequence and transactional, whole
# batches, so that the fast path opens, continues and (after a marker) reopens transactions often.
txn_appends = st.tuples(
    st.sampled_from((1000, 1000, 1001)),
    st.just(0),
    _mostly(0, 1, "dup"),
    st.integers(1, 3),
    st.just(True),
    _mostly(0, 10_000_000),
    _mostly(True, False),
    st.sampled_from((COMPRESSION_NONE, COMPRESSION_GZIP)),
    st.just(False),
    _mostly(1, None),
    st.booleans(),
    st.just(None),
    st.sampled_from((None, "own", "own", "none")),
)
# A COMMIT or ABORT marker the coordinator writes: ("marker", producer, epoch, commit, coordinator epoch)
markers = st.tuples(
    st.just("marker"), st.sampled_from((1000, 1001)), _mostly(0, 1, 2), st.booleans(), _mostly(0, 1, -1)
)
txn_markers = st.tuples(
    st.just("marker"), st.sampled_from((1000, 1001)), st.just(0), st.booleans(), _mostly(0, -1)
)

configs = st.fixed_dictionaries(
    {
        "cleanup_policy": _mostly("delete", "compact"),
        "message_timestamp_difference_max_ms": _mostly(2**63 - 1, 1_000_000),
        "max_message_bytes": _mostly(1048588, 200),
        "compression_type": _mostly("producer", "gzip"),
        "message_timestamp_type": _mostly("CreateTime", "LogAppendTime"),
        "segment_bytes": _mostly(1 << 30, 600),
        "index_interval_bytes": _mostly(4096, 1),
    }
)


def _outcome(lg: Log, records: bytes | bytearray, now: int, leader_epoch: int | None, guard: Any) -> Any:
    try:
        return lg.append_as_leader(records, now, leader_epoch=leader_epoch, verification_guard=guard)
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return (type(e).__name__, str(e).replace(str(lg.dir.parent), "DIR"))


def _marker(lg: Log, op: tuple[Any, ...], now: int, shared: bool = False) -> Any:
    """shared: the marker batch built once outside the log and handed in (as TxnMarkerChannel writes one
    transaction's markers to many partitions), else append_control builds it."""
    _, pid, epoch, commit, coordinator_epoch = op
    kw: dict[str, Any] = {}
    if shared:
        kw = {
            "template": build_end_txn_marker_batch(pid, epoch, coordinator_epoch, commit, now),
            "marker": EndTxnMarker(commit, coordinator_epoch),
        }
    try:
        return lg.append_control(pid, epoch, coordinator_epoch, commit, now, leader_epoch=1, **kw)
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return (type(e).__name__, str(e).replace(str(lg.dir.parent), "DIR"))


def _state(lg: Log) -> tuple[Any, ...]:
    files = sorted(
        (p.name, p.read_bytes())
        for p in lg.dir.iterdir()
        if p.suffix in (".log", ".index", ".timeindex", ".txnindex")
    )
    for seg in lg.segments:
        seg.index.flush()
        seg.time_index.flush()
    producers = encode_snapshot(0, sorted(lg.producer_state.producers.values(), key=lambda e: e.producer_id))
    return (
        lg.log_end_offset,
        lg.high_watermark,
        files,
        producers,
        dict(lg.producer_state.ongoing_txns),
        lg.last_stable_offset,
        lg.fetch_state,
        lg.collect_aborted_transactions(0, lg.log_end_offset),
        [tuple(e) for e in lg.leader_epoch_cache.entries],
    )


def _run(
    config: dict[str, Any],
    ops: list[tuple[Any, ...]],
    plain: bool,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_call: bool = True,
) -> tuple[list[Any], tuple[Any, ...]]:
    monkeypatch.setattr(log_module, "PLAIN_APPEND", plain)
    monkeypatch.setattr(log_module, "_append_one", ONE_CALL if one_call else None)
    lg = Log.open(
        root / ("plain" if plain else "general") / ("one" if one_call else "steps") / "t-0",
        "t",
        0,
        LogConfig().replace(**config),
        clean_shutdown=True,
    )
    lg.leader_epoch = 1
    next_seq: dict[tuple[int, int], int] = {}
    last: dict[int, tuple[int, int]] = {}
    answers = []
    try:
        for i, op in enumerate(ops):
            if op[0] == "marker":
                # The fast path's run writes its markers from a shared batch, the general path's builds each.
                answers.append(_marker(lg, op, NOW + i, shared=plain))
                continue
            (
                pid,
                epoch,
                step,
                n,
                keyed,
                shift,
                txn,
                codec,
                lat,
                leader_epoch,
                writable,
                flip,
                guard,
            ) = op
            if step == "dup" and pid in last:
                seq, n = last[pid]
            elif step == "zero":
                seq = 0
            elif step == "neg":
                seq = -1
            else:
                seq = max(0, next_seq.get((pid, epoch), 0) + (step if isinstance(step, int) else 0))
            recs = [
                ((f"k{j}".encode() if keyed or j else None), b"v" * (j + 5), [], NOW + shift + j)
                for j in range(n)
            ]
            kw: dict[str, Any] = {"compression": codec, "is_transactional": txn and pid >= 0}
            if lat:
                kw["timestamp_type"] = TIMESTAMP_LOG_APPEND_TIME
            if pid >= 0:
                kw.update(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
            raw = bytearray(build_batch(recs, **kw))
            if flip is not None and flip < len(raw):
                raw[flip] ^= 0x5A
            verification = None if guard is None else VerificationGuard(pid if guard == "own" else -1)
            answers.append(_outcome(lg, raw if writable else bytes(raw), NOW + i, leader_epoch, verification))
            # A refused batch leaves the producer's sequence where it was (a client retries or bumps its epoch), so
            # one refusal does not send the rest of the run down the general path's sequence errors.
            if pid >= 0 and seq >= 0 and not isinstance(answers[-1], tuple):
                next_seq[(pid, epoch)] = seq + n
                last[pid] = (seq, n)
        return answers, _state(lg)
    finally:
        lg.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs, ops=st.lists(appends | markers, min_size=1, max_size=20))
def test_plain_append_matches_general(
    config: dict[str, Any], ops: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _compare(config, ops, monkeypatch)


def _compare(config: dict[str, Any], ops: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plain = _run(config, ops, True, Path(tmp), monkeypatch)
        general = _run(config, ops, False, Path(tmp), monkeypatch)
        steps = (
            _run(config, ops, True, Path(tmp), monkeypatch, one_call=False) if ONE_CALL is not None else plain
        )
    assert plain[0] == general[0] == steps[0]
    assert plain[1] == general[1] == steps[1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs, ops=st.lists(txn_appends | txn_appends | txn_markers, min_size=2, max_size=30))
def test_plain_append_of_transactions_matches_general(
    config: dict[str, Any], ops: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _compare(config, ops, monkeypatch)


def _taken(monkeypatch: pytest.MonkeyPatch, fast_path: str) -> list[bool]:
    """Whether each call of the Log's fast path took the append (True) or left it to the general path."""
    calls: list[bool] = []
    original = getattr(Log, fast_path)

    def counted(self: Log, *args: Any) -> Any:
        info = original(self, *args)
        calls.append(info is not None)
        return info

    monkeypatch.setattr(Log, fast_path, counted)
    return calls


def test_plain_append_takes_the_common_append(make_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path serves an idempotent producer's batches after its first (else the test above compares the
    general path with itself)."""
    lg = make_log()
    calls = _taken(monkeypatch, "_append_plain")
    for seq in range(0, 9, 3):
        batch = bytearray(
            build_batch([(None, b"v", [], NOW)] * 3, producer_id=7, producer_epoch=0, base_sequence=seq)
        )
        assert lg.append_as_leader(batch, NOW).first_offset == seq
    assert calls == [False, True, True]
    entry = lg.producer_state.last_entry(7)
    assert entry is not None and [
        (m.first_seq, m.last_seq, m.first_offset) for m in entry.batch_metadata
    ] == [(0, 2, 0), (3, 5, 3), (6, 8, 6)]


def test_plain_append_takes_transactional_appends(make_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A known producer's transactional batches take the fast path: the one that opens its transaction here (with
    the coordinator's guard, or verification off) and those that continue it; the producer's first batch, one the
    coordinator did not confirm, and a plain batch inside the transaction take the general path, which refuses the
    last two. The transaction's first offset, the last stable offset and the aborted-transaction index are the
    general path's; the ABORT marker takes Log._append_marker."""
    lg = make_log()
    calls = _taken(monkeypatch, "_append_plain")
    markers = _taken(monkeypatch, "_append_marker")
    seq = 0

    def send(txn: bool, guard: VerificationGuard | None) -> Any:
        nonlocal seq
        batch = bytearray(
            build_batch(
                [(None, b"v", [], NOW)] * 2,
                producer_id=7,
                producer_epoch=0,
                base_sequence=seq,
                is_transactional=txn,
            )
        )
        try:
            info = lg.append_as_leader(batch, NOW, verification_guard=guard)
        except Exception as e:  # noqa: BLE001 - the refusal is the answer checked
            return type(e).__name__
        seq += 2
        return info.first_offset

    first = build_batch([(None, b"v", [], NOW)], producer_id=7, producer_epoch=0, base_sequence=0)
    lg.append_as_leader(bytearray(first), NOW)  # the producer's first batch here: the general path
    seq = 1
    assert send(True, VerificationGuard()) == "InvalidTxnStateError"  # not confirmed by the coordinator
    assert send(True, VerificationGuard(7)) == 1
    assert (lg.producer_state.ongoing_txns, lg.last_stable_offset) == ({1: 7}, 1)
    assert send(True, VerificationGuard()) == 3  # inside its open transaction: no confirmation needed
    assert send(False, None) == "InvalidTxnStateError"
    lg.append_control(7, 0, 0, False, NOW)  # ABORT at 5
    assert (lg.producer_state.ongoing_txns, lg.last_stable_offset) == ({}, 6)
    assert [
        (t.producer_id, t.first_offset, t.last_offset) for t in lg.collect_aborted_transactions(0, 6)
    ] == [(7, 1, 5)]
    assert send(True, None) == 6  # verification off: opens the next transaction
    assert lg.producer_state.ongoing_txns == {6: 7}
    assert calls == [False, False, True, True, False, True]
    # The marker took the light append; a stale coordinator epoch is the general path's error.
    assert markers == [True]
    with pytest.raises(TransactionCoordinatorFencedError):
        lg.append_control(7, 0, -1, True, NOW)
    assert markers == [True, False] and lg.producer_state.ongoing_txns == {6: 7}


def test_plain_append_of_compressed_batches_keeps_transactions(make_log: Any) -> None:
    """A compressed batch takes the fast path after its general validation, transactional or not; a plain batch
    inside the transaction is refused as in the general path."""
    lg = make_log()
    answers = []
    for seq, txn in ((0, False), (3, False), (6, True), (9, False)):
        batch = bytearray(
            build_batch(
                [(b"k", b"v", [], NOW)] * 3,
                producer_id=7,
                producer_epoch=0,
                base_sequence=seq,
                compression=COMPRESSION_GZIP,
                is_transactional=txn,
            )
        )
        try:
            answers.append(lg.append_as_leader(batch, NOW).first_offset)
        except Exception as e:  # noqa: BLE001 - the refusal is the answer checked
            answers.append(type(e).__name__)
    assert answers == [0, 3, 6, "InvalidTxnStateError"]
    assert lg.producer_state.ongoing_txns == {6: 7}


def test_plain_append_takes_the_one_call(make_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the C built, an idempotent producer's next batches and batches without a producer are appended by the
    one call, and what it declines (the producer's first batch, a retry, a gap) by the steps or the general path,
    with the same answers: the one call must be what serves the common case."""
    if ONE_CALL is None:
        pytest.skip("protocol/_batch_scan.c not built or switched off")
    taken: list[bool] = []

    def counted(*args: Any) -> Any:
        written = ONE_CALL(*args)
        taken.append(written is not None)
        return written

    monkeypatch.setattr(segment_module, "append_plain", counted)
    lg = make_log()
    answers = []
    for pid, seq in ((7, 0), (7, 3), (7, 6), (7, 6), (7, 10), (-1, -1), (7, 9)):
        kw = {"producer_id": pid, "producer_epoch": 0, "base_sequence": seq} if pid >= 0 else {}
        batch = bytearray(build_batch([(None, b"v", [], NOW)] * 3, **kw))
        try:
            answers.append(lg.append_as_leader(batch, NOW).first_offset)
        except Exception as e:  # noqa: BLE001 - the refusal is the answer checked
            answers.append(type(e).__name__)
    assert answers == [0, 3, 6, 6, "OutOfOrderSequenceError", 9, 12]  # a retry answers its first append
    assert taken == [False, True, True, False, False, True, True]
