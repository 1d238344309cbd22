"""broker.fetch_session without a broker: Kafka's FetchSessionCache eviction rules (FetchSessionCacheTest's cases),
the FetchManager's choice of context, and what an incremental response keeps."""

from __future__ import annotations

from kbroker.broker.fetch_session import (
    FINAL_EPOCH,
    INT32_MAX,
    INVALID_SESSION_ID,
    CachedPartition,
    FetchManager,
    FetchSessionCache,
    FullFetchContext,
    IncrementalFetchContext,
    SessionErrorContext,
    SessionlessFetchContext,
    next_epoch,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import FetchRequest, FetchResponse

EVICTION_MS = 120_000


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def parts(n: int, topic: str = "t") -> dict:
    return {(topic, i): CachedPartition(topic, b"\0" * 16, i, FetchRequest.FetchPartition(partition=i))
            for i in range(n)}


def create(cache: FetchSessionCache, now: int, privileged: bool, size: int) -> int:
    return cache.maybe_create_session(now, privileged, size, False, lambda: parts(size))


def pd(partition: int, hw: int = 10, records: bytes = b"", error: int = 0, log_start: int = 0) -> FetchResponse.PartitionData:
    return FetchResponse.PartitionData(partition_index=partition, error_code=error, high_watermark=hw,
                                       last_stable_offset=hw, log_start_offset=log_start, records=records)


def test_next_epoch_wraps_and_final_stays_final():
    assert next_epoch(0) == 1
    assert next_epoch(INT32_MAX) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_a_session_is_created_while_there_is_room_and_counted():
    cache = FetchSessionCache(3)
    ids = [create(cache, 0, False, n) for n in (1, 2, 3)]
    assert INVALID_SESSION_ID not in ids and len(set(ids)) == 3
    assert cache.size == 3 and cache.total_partitions == 6
    assert cache.get(ids[0]).epoch == 1
    cache.remove(ids[1])
    assert cache.size == 2 and cache.total_partitions == 4


def test_recent_sessions_are_not_evicted_by_a_larger_unprivileged_one():
    cache = FetchSessionCache(2)
    a, b = create(cache, 0, False, 1), create(cache, 10, False, 1)
    # Younger than the eviction time: neither is evictable by an unprivileged session, however large.
    assert create(cache, 20, False, 100) == INVALID_SESSION_ID
    assert set(cache.sessions) == {a, b} and cache.evictions == 0


def test_a_privileged_session_evicts_the_smallest_unprivileged_one():
    cache = FetchSessionCache(2)
    a = create(cache, 0, False, 5)
    b = create(cache, 10, False, 3)
    c = create(cache, 20, True, 1)
    assert c != INVALID_SESSION_ID and b not in cache.sessions
    assert set(cache.sessions) == {a, c} and cache.evictions == 1
    # Privileged sessions are never evicted by another privileged one while they are young.
    full = FetchSessionCache(1)
    create(full, 0, True, 1)
    assert create(full, 10, True, 50) == INVALID_SESSION_ID


def test_a_stale_session_is_evicted_by_anyone():
    cache = FetchSessionCache(2)
    a = create(cache, 0, True, 100)
    b = create(cache, 1, False, 100)
    cache.touch(cache.get(b), EVICTION_MS)  # b used recently, a not since its creation
    c = create(cache, EVICTION_MS + 1, False, 1)
    assert c != INVALID_SESSION_ID and set(cache.sessions) == {b, c} and a not in cache.sessions


def test_an_older_session_is_evicted_by_one_with_more_partitions_not_fewer():
    cache = FetchSessionCache(2)
    a = create(cache, 0, False, 10)
    b = create(cache, 0, False, 20)
    now = EVICTION_MS + 1
    # Touched after the eviction time: both are evictable by all, and neither is stale.
    cache.touch(cache.get(a), now)
    cache.touch(cache.get(b), now)
    assert create(cache, now + 1, False, 10) == INVALID_SESSION_ID  # equal size: never
    assert create(cache, now + 1, False, 5) == INVALID_SESSION_ID
    c = create(cache, now + 1, False, 11)
    assert c != INVALID_SESSION_ID and set(cache.sessions) == {b, c}
    assert cache.total_partitions == 31


def test_an_unprivileged_session_evicts_a_privileged_one_only_when_stale():
    cache = FetchSessionCache(1)
    a = create(cache, 0, True, 5)
    cache.touch(cache.get(a), EVICTION_MS + 1)  # old enough to be evictable by all, but privileged ranks higher
    assert create(cache, EVICTION_MS + 2, False, 50) == INVALID_SESSION_ID
    assert create(cache, 2 * EVICTION_MS + 2, False, 1) != INVALID_SESSION_ID
    assert a not in cache.sessions and cache.evictions == 1


def test_zero_slots_never_creates_a_session():
    cache = FetchSessionCache(0)
    assert create(cache, 0, True, 1) == INVALID_SESSION_ID


def test_manager_contexts_and_session_errors():
    clock = Clock()
    manager = FetchManager(FetchSessionCache(10, clock_ms=clock))
    data = parts(3)
    full = manager.new_context(12, 0, 0, False, data, [], {})
    assert isinstance(full, FullFetchContext)
    err, sid, sent = full.update_and_generate([(cp, pd(cp.partition)) for cp in full.partitions()])
    assert err == 0 and sid != INVALID_SESSION_ID and len(sent) == 3

    assert isinstance(manager.new_context(12, 0, FINAL_EPOCH, False, parts(1), [], {}), SessionlessFetchContext)
    unknown = manager.new_context(12, sid + 1 if sid < INT32_MAX else 1, 1, False, {}, [], {})
    assert isinstance(unknown, SessionErrorContext) and unknown.error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    wrong = manager.new_context(12, sid, 5, False, {}, [], {})
    assert isinstance(wrong, SessionErrorContext) and wrong.error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    ids = manager.new_context(13, sid, 1, False, {}, [], {})
    assert isinstance(ids, SessionErrorContext) and ids.error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR

    inc = manager.new_context(12, sid, 1, False, {}, [("t", 2)], {})
    assert isinstance(inc, IncrementalFetchContext)
    assert [cp.partition for cp in inc.partitions()] == [0, 1]
    # Nothing changed: nothing sent. Then partition 1 gets records and partition 0 an error.
    assert inc.update_and_generate([(cp, pd(cp.partition)) for cp in inc.partitions()]) == (0, sid, [])
    inc = manager.new_context(12, sid, 2, False, {}, [], {})
    err, _, sent = inc.update_and_generate([(inc.partitions()[0], pd(0, error=6)),
                                            (inc.partitions()[1], pd(1, records=b"x" * 70))])
    assert [p.partition_index for _, p in sent] == [0, 1]
    # Partition 1 returned records: read last from now on (round robin); partition 0's error is sent again,
    # and once gone, partition 0 is sent again with its (unchanged) high watermark.
    inc = manager.new_context(12, sid, 3, False, {}, [], {})
    assert [cp.partition for cp in inc.partitions()] == [0, 1]
    inc = manager.new_context(12, sid, 4, False, {}, [], {})  # a second request: the first is now stale
    _, _, sent = inc.update_and_generate([(cp, pd(cp.partition)) for cp in inc.partitions()])
    assert [p.partition_index for _, p in sent] == [0]

    # A log start offset change is sent; a request that forgets every partition closes the session.
    inc = manager.new_context(12, sid, 5, False, {}, [], {})
    _, _, sent = inc.update_and_generate([(cp, pd(cp.partition, log_start=3 * cp.partition))
                                          for cp in inc.partitions()])
    assert [p.partition_index for _, p in sent] == [1]
    last = manager.new_context(12, sid, 6, False, {}, [("t", 0), ("t", 1)], {})
    assert isinstance(last, SessionlessFetchContext)
    assert manager.cache.get(sid) is None and manager.cache.total_partitions == 0


def test_an_epoch_overtaken_while_reading_answers_invalid_epoch():
    manager = FetchManager(FetchSessionCache(10))
    full = manager.new_context(12, 0, 0, False, parts(1), [], {})
    _, sid, _ = full.update_and_generate([(cp, pd(0)) for cp in full.partitions()])
    first = manager.new_context(12, sid, 1, False, {}, [], {})
    manager.new_context(12, sid, 2, False, {}, [], {})
    err, got_sid, sent = first.update_and_generate([(cp, pd(0, records=b"x" * 70)) for cp in first.partitions()])
    assert (err, got_sid, sent) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, sid, [])
    assert first.throttled() == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, sid)


def test_a_full_fetch_naming_a_session_closes_it():
    manager = FetchManager(FetchSessionCache(10))
    full = manager.new_context(12, 0, 0, False, parts(2), [], {})
    _, sid, _ = full.update_and_generate([(cp, pd(cp.partition)) for cp in full.partitions()])
    assert isinstance(manager.new_context(12, sid, FINAL_EPOCH, False, parts(2), [], {}), SessionlessFetchContext)
    assert manager.cache.get(sid) is None


def test_topic_id_session_resolves_names_learned_later():
    manager = FetchManager(FetchSessionCache(10))
    tid = b"\1" * 16
    data = {(tid, 0): CachedPartition(None, tid, 0, FetchRequest.FetchPartition(partition=0))}
    full = manager.new_context(17, 0, 0, False, data, [], {})
    _, sid, _ = full.update_and_generate([(cp, pd(0, error=ErrorCode.UNKNOWN_TOPIC_ID)) for cp in full.partitions()])
    inc = manager.new_context(17, sid, 1, False, {}, [], {tid: "late"})
    assert [cp.topic for cp in inc.partitions()] == ["late"]


def test_a_follower_partition_stays_quiet_only_while_nothing_it_was_told_moved(tmp_path):
    """not_quiet: a leader leaves out of a follower's fetch the partitions whose last read found the follower at the
    log end, until the request entry, the log's offsets, the leader epoch or what the session recorded changes."""
    from types import SimpleNamespace

    from kbroker.broker.fetch_session import NOT_QUIET, FollowerQuiet, not_quiet
    from kbroker.storage.config import LogConfig
    from kbroker.storage.log import Log

    from tests.storage.storage_helpers import NOW, batch

    lg = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True)
    try:
        lg.set_hw_tracks_leo(False)
        lg.append_as_leader(batch(2), NOW, leader_epoch=0)
        partition = SimpleNamespace(leader_epoch=0, log=lg)
        cps = list(parts(3).values())
        for cp in cps:
            cp.req = FetchRequest.FetchPartition(partition=cp.partition, fetch_offset=2)
            cp.remember(SimpleNamespace(high_watermark=0, last_stable_offset=0, log_start_offset=0))
        quiet, other, never = cps

        def mark() -> None:
            quiet.follower_quiet = FollowerQuiet(partition, (quiet.req, lg.fetch_state, partition.leader_epoch,
                                                             quiet.high_watermark, quiet.local_log_start_offset,
                                                             quiet.last_stable_offset))

        mark()
        other.follower_quiet = FollowerQuiet(partition, quiet.follower_quiet.expected)  # another request entry
        assert never.follower_quiet is NOT_QUIET
        assert not_quiet(cps) == [other, never]
        lg.maybe_increment_high_watermark(1)  # the follower has not been told the new high watermark
        assert not_quiet(cps) == cps
        mark()
        assert not_quiet([quiet]) == []
        quiet.high_watermark = -1  # the answer carrying the last read was not recorded (an epoch overtaken)
        assert not_quiet([quiet]) == [quiet]
        quiet.high_watermark = 1
        partition.leader_epoch = 1
        assert not_quiet([quiet]) == [quiet]
        partition.leader_epoch = 0
        quiet.req = FetchRequest.FetchPartition(partition=0, fetch_offset=1)  # the follower asked again, elsewhere
        assert not_quiet([quiet]) == [quiet]
    finally:
        lg.close()
