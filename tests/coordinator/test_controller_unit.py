"""Pure parts of the controller: Kafka's replica assignment and leader election rules, checked against the
cases of Kafka's AdminUtilsTest and PartitionLeaderElectionAlgorithmsTest."""

from __future__ import annotations

from kbroker.broker.admin_manager import assign_replicas_rack_unaware
from kbroker.coordinator.controller_context import (
    ControllerContext,
    Reassignment,
    controlled_shutdown_leader,
    elect_offline,
    imbalanced_partitions,
    initial_state,
    offline_leader,
    preferred_leader,
    reassign_leader,
    without_replicas,
)
from kbroker.coordinator.zk_paths import LeaderIsrState


def test_rack_unaware_assignment_matches_kafka() -> None:
    # AdminUtilsTest.testReplicaAssignment: brokers 0-4, 10 partitions, RF 3, fixed start index 0
    assert assign_replicas_rack_unaware([0, 1, 2, 3, 4], 10, 3, start_index=0) == [
        [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
        [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    ]
    # new partitions continue where the topic left off (AdminZkClient.addPartitions)
    assert assign_replicas_rack_unaware([0, 1, 2, 3, 4], 5, 3, start_index=0, start_partition=5) == [
        [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    ]
    # random start: still every broker once per partition and leaders spread evenly
    for _ in range(20):
        a = assign_replicas_rack_unaware([1, 2, 3], 6, 3)
        assert all(sorted(r) == [1, 2, 3] for r in a)
        assert sorted(r[0] for r in a) == [1, 1, 2, 2, 3, 3]


def test_leader_election_rules() -> None:
    # offline: first live ISR member in assignment order; unclean falls back to any live replica
    assert offline_leader([1, 2, 3], [3, 2], {2, 3}, unclean=False) == 2
    assert offline_leader([1, 2, 3], [1], {2, 3}, unclean=False) is None
    assert offline_leader([1, 2, 3], [1], {2, 3}, unclean=True) == 2
    # preferred: only the first replica, and only when live and in sync
    assert preferred_leader([2, 1], [1, 2], {1, 2}) == 2
    assert preferred_leader([2, 1], [1], {1, 2}) is None
    # reassignment: first target replica live and in sync
    assert reassign_leader([3, 2], [2, 3, 1], {1, 2, 3}) == 3
    # controlled shutdown: skips brokers shutting down
    assert controlled_shutdown_leader([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1, 2}) == 3


def test_state_transitions() -> None:
    st = LeaderIsrState(1, 4, [1, 2, 3], controller_epoch=1, version=7)
    new = elect_offline(st, [1, 2, 3], {2, 3}, unclean=False, controller_epoch=2)
    assert new == LeaderIsrState(2, 5, [2, 3], 2, 7)  # the version is the one the write expects
    # unclean: the new leader alone in the ISR
    lonely = LeaderIsrState(1, 4, [1], 1, 7)
    assert elect_offline(lonely, [1, 2], {2}, unclean=True, controller_epoch=2) == LeaderIsrState(2, 5, [2], 2, 7)
    # the last ISR member stays when its broker goes, and the partition has no leader
    assert without_replicas(lonely, {1}, 2) == LeaderIsrState(-1, 5, [1], 2, 7)
    assert without_replicas(st, {3}, 2) == LeaderIsrState(1, 5, [1, 2], 2, 7)
    assert initial_state([3, 1, 2], {1, 2}, 2) == LeaderIsrState(1, 0, [1, 2], 2, 0)
    assert initial_state([3], {1, 2}, 2) is None


def test_reassignment_sets_and_imbalance() -> None:
    r = Reassignment(original=[1, 2, 3], target=[3, 4, 5])
    assert (r.replicas, r.adding, r.removing) == ([3, 4, 5, 1, 2], [4, 5], [1, 2])
    ctx = ControllerContext(1, 0, live_brokers={1: 10, 2: 11})
    ctx.assignments["t"] = [[1, 2], [1, 2], [2, 1]]
    ctx.states = {("t", 0): LeaderIsrState(2, 1, [1, 2], 1), ("t", 1): LeaderIsrState(1, 1, [1, 2], 1),
                  ("t", 2): LeaderIsrState(2, 1, [2, 1], 1)}
    # broker 1 prefers two partitions and leads one: 50% imbalance
    assert imbalanced_partitions(ctx, 10) == [("t", 0)]
    assert imbalanced_partitions(ctx, 50) == []


def test_replicas_in_failed_log_dirs_are_offline() -> None:
    # Kafka's ControllerContext.isReplicaOnline: a live broker's replica in a failed log dir is offline; the
    # broker's other replicas stay online, and an offline replica cannot lead
    ctx = ControllerContext(1, 0, live_brokers={1: 10, 2: 11, 3: 12})
    ctx.assignments["t"] = [[1, 2, 3], [1, 2, 3]]
    ctx.replicas_on_offline_dirs[1] = {("t", 0)}
    assert not ctx.is_replica_online(1, ("t", 0)) and ctx.is_replica_online(1, ("t", 1))
    assert ctx.online_replicas(("t", 0)) == [2, 3] and ctx.online_replicas(("t", 1)) == [1, 2, 3]
    ctx.shutting_down.add(3)
    assert ctx.eligible_replicas(("t", 0)) == {2}
    st = LeaderIsrState(1, 4, [1, 2, 3], 1, 7)
    assert elect_offline(st, ctx.replicas(("t", 0)), ctx.eligible_replicas(("t", 0)), False, 2) == LeaderIsrState(
        2, 5, [2], 2, 7
    )
