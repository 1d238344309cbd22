"""Log.append_fetched (the replica fetcher's append, with its one-batch path) against the general append_as_follower:
the same fetched records give the same outcome, log bytes, indexes, leader epochs and log end, and the one-batch
path takes exactly the answers it is meant to. Runs on the compiled write and scan, and on their Python references
under KBROKER_PURE_PYTHON=1."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    build_batch,
    one_replicated_batch,
    parse_batch_header,
    set_base_offset,
    set_partition_leader_epoch,
)
from kbroker.storage import log_replica
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.storage.storage_helpers import NOW, read_all


def _mostly(common: Any, *rare: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from((common,) * 4 * max(1, len(rare)) + rare)


# One fetch answer's records for a partition: (batches, offset gap before them, leader epoch step, producer id,
# codec, records per batch, cut bytes off the end, flipped byte, a control batch, bytes type)
fetches = st.tuples(
    _mostly(1, 2, 3, 0),
    _mostly(0, 3, -1, -3),
    _mostly(0, 1, -1),
    _mostly(-1, 1000),
    _mostly(COMPRESSION_NONE, COMPRESSION_GZIP),
    st.integers(1, 5),
    _mostly(0, 1, 30, 70),
    _mostly(None, 5, 13, 30, 64, 90),
    _mostly(False, True),
    st.sampled_from(("bytes", "bytearray", "memoryview")),
)
configs = st.fixed_dictionaries(
    {"segment_bytes": _mostly(1 << 30, 300, 700), "index_interval_bytes": _mostly(4096, 1, 150)}
)


def _records(op: tuple[Any, ...], leo: int, epoch: int, i: int) -> tuple[bytes | bytearray | memoryview, int]:
    nbatches, gap, epoch_step, pid, codec, n, cut, flip, control, kind = op
    epoch = max(0, epoch + epoch_step)
    offset = max(0, leo + gap)
    data = bytearray()
    for b in range(nbatches):
        recs = [(f"k{j}".encode(), b"v" * (j + 3 * b + 5), [], NOW + 1000 * i + j) for j in range(n)]
        kw: dict[str, Any] = {"compression": codec}
        if pid >= 0:
            kw.update(producer_id=pid, producer_epoch=0, base_sequence=1000 * i + 10 * b)
        if control and b == 0:
            kw.update(producer_id=max(pid, 7), producer_epoch=0, is_control=True, is_transactional=True)
            recs = recs[:1]
        raw = bytearray(build_batch(recs, **kw))
        set_base_offset(raw, 0, offset)
        set_partition_leader_epoch(raw, 0, epoch)
        offset = parse_batch_header(raw).next_offset
        data += raw
    if cut:
        data = data[: max(0, len(data) - cut)]
    if flip is not None and flip < len(data):
        data[flip] ^= 0x5A
    out = bytes(data) if kind == "bytes" else data if kind == "bytearray" else memoryview(bytes(data))
    return out, epoch


def _outcome(lg: Log, records: bytes | bytearray | memoryview, fetched: bool) -> Any:
    try:
        if fetched:
            lg.append_fetched(records)
        else:
            lg.append_as_follower(records)
        return None
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return (type(e).__name__, str(e).replace(str(lg.dir.parent), "DIR"))


def _state(lg: Log) -> tuple[Any, ...]:
    for seg in lg.segments:
        seg.index.flush()
        seg.time_index.flush()
    files = sorted(
        (p.name, p.read_bytes()) for p in lg.dir.iterdir() if p.suffix in (".log", ".index", ".timeindex")
    )
    return (
        lg.log_end_offset,
        files,
        [tuple(e) for e in lg.leader_epoch_cache.entries],
        lg.producer_state.map_end_offset,
        sorted((pid, e.producer_epoch, e.last_seq) for pid, e in lg.producer_state.producers.items()),
        [r.offset for r in read_all(lg)],
        [s.base_offset for s in lg.segments],
    )


def _run(
    root: Path, config: dict[str, Any], ops: list[tuple[Any, ...]], fetched: bool, taken: list[bool] | None
) -> tuple[list[Any], tuple[Any, ...]]:
    lg = Log.open(
        root / ("fetched" if fetched else "general") / "t-0",
        "t",
        0,
        LogConfig().replace(**config),
        clean_shutdown=True,
    )
    lg.become_follower(0)
    answers = []
    epoch = 0
    try:
        for i, op in enumerate(ops):
            records, epoch = _records(op, lg.log_end_offset, epoch, i)
            if taken is not None:
                # The one-batch path on its own: exactly the answers it is meant for (the rest left untouched).
                leo, files = lg.log_end_offset, _state(lg)[1]
                took = lg._append_fetched_plain(records)
                h = one_replicated_batch(records)
                assert took == (h is not None and h.producer_id < 0 and h.base_offset >= leo)
                if not took:
                    assert (lg.log_end_offset, _state(lg)[1]) == (leo, files)
                taken.append(took)
                answers.append(None if took else _outcome(lg, records, False))
            else:
                answers.append(_outcome(lg, records, fetched))
        return answers, _state(lg)
    finally:
        lg.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs, ops=st.lists(fetches, min_size=1, max_size=25))
def test_append_fetched_matches_append_as_follower(
    config: dict[str, Any], ops: list[tuple[Any, ...]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        general = _run(Path(tmp), config, ops, False, None)
        fetched = _run(Path(tmp), config, ops, True, None)
        taken: list[bool] = []
        direct = _run(Path(tmp) / "direct", config, ops, True, taken)
    assert fetched == general
    assert direct == general


def test_one_batch_path_is_taken_and_can_be_switched_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plain batch goes through the one-batch path; with KBROKER_FOLLOWER_PLAIN_APPEND=0's switch it does not."""
    calls: list[bool] = []
    original = Log._append_fetched_plain

    def counted(self: Log, records: Any) -> bool:
        calls.append(original(self, records))
        return calls[-1]

    monkeypatch.setattr(Log, "_append_fetched_plain", counted)
    lg = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    try:
        raw = bytearray(build_batch([(b"k", b"v", [], NOW)]))
        set_partition_leader_epoch(raw, 0, 3)
        lg.append_fetched(bytes(raw))
        monkeypatch.setattr(log_replica, "FOLLOWER_PLAIN_APPEND", False)
        set_base_offset(raw, 0, 1)
        lg.append_fetched(bytes(raw))
        assert calls == [True]
        assert lg.log_end_offset == 2
        assert [tuple(e) for e in lg.leader_epoch_cache.entries] == [(3, 0)]
    finally:
        lg.close()
