"""The follower's half of a KIP-227 fetch session, as pure logic (the cluster tests in
tests/coordinator/test_replication_data.py run it against real leaders)."""

from __future__ import annotations

from kbroker.broker.replica_fetcher import FollowerFetchSession
from kbroker.protocol.messages import FetchRequest

F = FetchRequest.FetchPartition


def fp(partition: int, offset: int, epoch: int = 1) -> FetchRequest.FetchPartition:
    return F(partition=partition, fetch_offset=offset, current_leader_epoch=epoch, last_fetched_epoch=epoch)


def test_full_fetch_opens_the_session_then_only_moved_partitions_travel() -> None:
    s = FollowerFetchSession()
    wanted = {("t", 0): fp(0, 10), ("t", 1): fp(1, 20), ("u", 0): fp(0, 5)}
    send, forgotten, session_id, epoch = s.request(wanted)
    assert (send, forgotten, session_id, epoch) == (wanted, [], 0, 0)
    s.answered(77, send, forgotten)

    moved = {**wanted, ("t", 1): fp(1, 25)}
    assert s.request(moved) == ({("t", 1): fp(1, 25)}, [], 77, 1)
    s.answered(77, {("t", 1): fp(1, 25)}, [])
    # Nothing moved: an empty incremental fetch (a long poll on the whole session).
    assert s.request(moved) == ({}, [], 77, 2)
    s.answered(77, {}, [])
    # A partition leaves (it became leader here, or is backing off) and a new one arrives; an epoch change travels.
    later = {("t", 0): fp(0, 10, epoch=2), ("v", 3): fp(3, 0)}
    assert s.request(later) == ({("t", 0): fp(0, 10, epoch=2), ("v", 3): fp(3, 0)}, [("t", 1), ("u", 0)], 77, 3)
    s.answered(77, {("t", 0): fp(0, 10, epoch=2), ("v", 3): fp(3, 0)}, [("t", 1), ("u", 0)])
    assert s.request(later) == ({}, [], 77, 4)


def test_a_failure_or_a_leader_without_room_means_full_fetches() -> None:
    s = FollowerFetchSession()
    wanted = {("t", 0): fp(0, 10)}
    s.answered(5, *s.request(wanted)[:2])
    assert s.request(wanted)[2:] == (5, 1)
    s.failed()  # the next fetch is full with epoch 0: the leader closes session 5 and may open another
    assert s.request(wanted) == (wanted, [], 5, 0)
    s.answered(0, wanted, [])  # no room in the leader's cache: sessionless, every fetch full
    assert s.request(wanted) == (wanted, [], 0, 0)
    s.answered(0, wanted, [])
    assert s.request(wanted) == (wanted, [], 0, 0)


def test_the_epoch_wraps_past_int32_max_to_1() -> None:
    s = FollowerFetchSession()
    wanted = {("t", 0): fp(0, 10)}
    s.answered(9, *s.request(wanted)[:2])
    s.epoch = 2**31 - 1
    s.answered(9, {}, [])
    assert s.request(wanted)[2:] == (9, 1)
