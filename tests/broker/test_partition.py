"""The leader's high watermark and ISR changes (broker/partition.py), as pure logic on a real log: the cluster
tests (tests/coordinator/test_replication_*.py) run the same code between broker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kbroker.broker.partition import Partition
from kbroker.coordinator.metadata_store import PartitionState
from kbroker.protocol.errors import ErrorCode
from kbroker.storage.config import LogConfig
from kbroker.storage.log import Log

from tests.storage.storage_helpers import NOW, batch

LEADER = 1


@pytest.fixture
def lg(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True, high_watermark=0)
    yield log
    log.close()


def leader(lg: Log, isr: list[int], replicas: list[int]) -> Partition:
    p = Partition("t", 0, LEADER, lg)
    p.make_leader(PartitionState(leader=LEADER, leader_epoch=1, isr=isr, replicas=replicas, partition_epoch=1), NOW)
    return p


def append(lg: Log, n: int) -> int:
    lg.append_as_leader(batch(n), NOW, leader_epoch=1)
    return lg.log_end_offset


def test_a_joining_follower_holds_the_high_watermark_while_its_isr_change_is_pending(lg: Log) -> None:
    """The proposal leaves with the follower at the high watermark; until the controller answers, the high
    watermark may not pass the follower's log end, or the ISR the controller commits would name a member without
    acknowledged records, and electing it would lose them (found by the chaos test: 784 records)."""
    p = leader(lg, isr=[1, 2], replicas=[1, 2, 3])
    end = append(lg, 10)
    assert p.update_follower_fetch_state(2, end, end, NOW) == (True, None)
    assert lg.high_watermark == 10
    moved, expand = p.update_follower_fetch_state(3, 10, end, NOW)
    assert (moved, expand) == (False, (1, 2, 3))
    end = append(lg, 10)
    # Follower 2 has all 20 records; follower 3, in the pending ISR, only 10.
    assert p.update_follower_fetch_state(2, end, end, NOW) == (False, None)
    assert lg.high_watermark == 10
    assert p.update_follower_fetch_state(3, 15, end, NOW) == (True, None)
    assert lg.high_watermark == 15
    assert p.apply_isr(1, [1, 2, 3], 2) is False
    assert p.update_follower_fetch_state(3, end, end, NOW) == (True, None)
    assert lg.high_watermark == 20


def test_a_leader_alone_in_the_isr_stops_committing_each_append_once_a_follower_joins(lg: Log) -> None:
    p = leader(lg, isr=[1], replicas=[1, 2])
    end = append(lg, 5)
    assert lg.high_watermark == 5  # the whole ISR has it
    assert p.update_follower_fetch_state(2, end, end, NOW) == (False, (1, 2))
    append(lg, 5)
    assert lg.high_watermark == 5  # follower 2 is at 5 and may be in the ISR the controller commits
    # The controller refused: the leader is the whole ISR again, and its appends are committed.
    assert p.clear_pending_isr() is True
    assert lg.high_watermark == 10


def test_a_pending_shrink_keeps_counting_the_leaving_follower(lg: Log) -> None:
    p = leader(lg, isr=[1, 2, 3], replicas=[1, 2, 3])
    end = append(lg, 10)
    p.update_follower_fetch_state(2, end, end, NOW + 50_000)
    assert p.isr_to_shrink(NOW + 60_000, 30_000) == (1, 2)
    assert lg.high_watermark == 0  # follower 3 never fetched: until the shrink is committed, it counts
    assert p.apply_isr(1, [1, 2], 2) is True
    assert lg.high_watermark == 10


def test_a_follower_fetching_again_at_an_idle_log_end_stays_in_the_isr(lg: Log) -> None:
    """The short form for the idle partitions of a follower's fetch session (nothing read, nothing answered):
    the follower stays caught up, so the ISR does not shrink after replica.lag.time.max.ms of idleness."""
    p = leader(lg, isr=[1, 2, 3], replicas=[1, 2, 3])
    end = append(lg, 10)
    p.update_follower_fetch_state(2, end, end, NOW)
    p.update_follower_fetch_state(3, end, end, NOW)
    assert lg.high_watermark == end
    assert p.touch_caught_up_follower(2, end, NOW + 40_000) is True
    assert p.touch_caught_up_follower(3, end, NOW + 40_000) is True
    assert p.isr_to_shrink(NOW + 60_000, 30_000) is None
    assert p.isr_to_shrink(NOW + 80_000, 30_000) == (1,)  # and without a fetch it would have
    p.clear_pending_isr()


def test_the_short_form_refuses_whatever_the_full_one_must_decide(lg: Log) -> None:
    """New data, a follower behind or outside the ISR (it may be added), a pending ISR change, another leader:
    the full update_follower_fetch_state runs instead."""
    p = leader(lg, isr=[1, 2], replicas=[1, 2, 3])
    end = append(lg, 10)
    p.update_follower_fetch_state(2, end, end, NOW)
    append(lg, 1)
    assert p.touch_caught_up_follower(2, end, NOW) is False  # the log moved on
    assert p.touch_caught_up_follower(2, end + 1, NOW) is False  # not where it last fetched from
    p.update_follower_fetch_state(3, end, end, NOW)  # behind; its proposed addition is pending
    end = lg.log_end_offset
    p.update_follower_fetch_state(2, end, end, NOW)
    assert p.touch_caught_up_follower(2, end, NOW) is False  # an ISR change is pending
    p.clear_pending_isr()
    assert p.touch_caught_up_follower(2, end, NOW) is True
    p.update_follower_fetch_state(3, end, end, NOW)
    p.clear_pending_isr()
    assert p.touch_caught_up_follower(3, end, NOW) is False  # outside the ISR: the full form proposes it
    p.make_follower(PartitionState(leader=2, leader_epoch=2, isr=[1, 2], replicas=[1, 2, 3], partition_epoch=2))
    assert p.touch_caught_up_follower(2, end, NOW) is False


def test_acks_all_counts_the_members_the_high_watermark_waited_for(lg: Log) -> None:
    """min.insync.replicas after the append, as Kafka's checkEnoughReplicasReachOffset: the ISR shrank to the leader
    alone, follower 2 is joining again and has the batch: two copies, so no NOT_ENOUGH_REPLICAS_AFTER_APPEND."""
    p = leader(lg, isr=[1], replicas=[1, 2])
    end = append(lg, 5)
    assert p.replication_status(end, 2) is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    p.update_follower_fetch_state(2, end, end, NOW)
    end = append(lg, 5)
    assert p.replication_status(end, 2) is None  # the pending member does not have it yet
    p.update_follower_fetch_state(2, end, end, NOW)
    assert p.replication_status(end, 2) is ErrorCode.NONE


def test_a_leader_reelected_at_a_new_epoch_keeps_its_followers_log_ends(lg: Log) -> None:
    """Another broker's controlled shutdown bumps the epoch of partitions whose leader stays (Kafka's
    resetReplicaState with isNewLeader false): the high watermark moves on with what the followers already have
    instead of waiting for their first fetches at the new epoch, which held acks=all Produce for up to a second."""
    p = leader(lg, isr=[1, 2, 3], replicas=[1, 2, 3])
    end = append(lg, 10)
    p.update_follower_fetch_state(3, end, end, NOW)
    p.update_follower_fetch_state(2, 4, end, NOW)
    assert lg.high_watermark == 4
    # Broker 2 stops: the controller shrinks the ISR to [1, 3] at epoch 2; the leader stays.
    p.make_leader(PartitionState(leader=LEADER, leader_epoch=2, isr=[1, 3], replicas=[1, 2, 3], partition_epoch=2),
                  NOW + 10)
    assert lg.high_watermark == 10
    lg.append_as_leader(batch(5), NOW, leader_epoch=2)
    assert lg.high_watermark == 10  # follower 3 has not fetched the new records yet
    assert p.update_follower_fetch_state(3, 15, 15, NOW + 20) == (True, None)
    assert lg.high_watermark == 15


def test_a_new_leader_knows_nothing_of_its_followers_log_ends(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", "t", 0, LogConfig(), clean_shutdown=True, high_watermark=0)
    try:
        p = Partition("t", 0, LEADER, lg)
        p.make_follower(PartitionState(leader=2, leader_epoch=1, isr=[1, 2], replicas=[1, 2], partition_epoch=1))
        lg.append_as_follower(batch(3, base_offset=0, partition_leader_epoch=1))
        p.make_leader(PartitionState(leader=LEADER, leader_epoch=2, isr=[1, 2], replicas=[1, 2], partition_epoch=2),
                      NOW)
        assert lg.high_watermark == 0  # follower 2's log end is unknown until it fetches
        assert p.update_follower_fetch_state(2, 3, 3, NOW) == (True, None)
        assert lg.high_watermark == 3
    finally:
        lg.close()
