"""The controller's view of the cluster (Kafka's ControllerContext) and its leader election rules
(Kafka's PartitionLeaderElectionAlgorithms). Pure data and functions: no ZooKeeper, no network.

Only the controller's event thread touches a ControllerContext, so it needs no lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbroker.coordinator.zk_paths import LeaderIsrState
from kbroker.storage.manager import TopicPartition

NO_LEADER = -1


@dataclass
class Reassignment:
    """A reassignment in progress: RS = target + original replicas leaving (Kafka's ReplicaAssignment)."""

    original: list[int]
    target: list[int]

    @property
    def replicas(self) -> list[int]:
        return list(dict.fromkeys(self.target + self.original))

    @property
    def adding(self) -> list[int]:
        return [b for b in self.target if b not in self.original]

    @property
    def removing(self) -> list[int]:
        return [b for b in self.original if b not in self.target]


@dataclass
class ControllerContext:
    epoch: int
    epoch_zk_version: int
    # broker id -> broker epoch (czxid of /brokers/ids/<id>)
    live_brokers: dict[int, int] = field(default_factory=dict)
    shutting_down: set[int] = field(default_factory=set)
    topic_ids: dict[str, bytes] = field(default_factory=dict)
    # topic -> replicas of each partition as in the assignment znode (RS while a partition is reassigned)
    assignments: dict[str, list[list[int]]] = field(default_factory=dict)
    states: dict[TopicPartition, LeaderIsrState] = field(default_factory=dict)
    reassignments: dict[TopicPartition, Reassignment] = field(default_factory=dict)
    # broker id -> its replicas in failed log dirs, from its LeaderAndIsr answers (Kafka's replicasOnOfflineDirs);
    # forgotten when the broker goes or registers again
    replicas_on_offline_dirs: dict[int, set[TopicPartition]] = field(default_factory=dict)

    def replicas(self, tp: TopicPartition) -> list[int]:
        parts = self.assignments.get(tp[0])
        return list(parts[tp[1]]) if parts is not None and 0 <= tp[1] < len(parts) else []

    def partitions(self) -> list[TopicPartition]:
        return [(t, p) for t, parts in sorted(self.assignments.items()) for p in range(len(parts))]

    def is_live(self, broker_id: int) -> bool:
        return broker_id in self.live_brokers

    def is_eligible(self, broker_id: int) -> bool:
        """Live and not shutting down: may lead and stay in the ISR."""
        return broker_id in self.live_brokers and broker_id not in self.shutting_down

    def is_replica_online(self, broker_id: int, tp: TopicPartition) -> bool:
        """Kafka's isReplicaOnline: the broker is live and the replica's log dir has not failed."""
        return broker_id in self.live_brokers and tp not in self.replicas_on_offline_dirs.get(broker_id, ())

    def online_replicas(self, tp: TopicPartition) -> list[int]:
        """The replicas LeaderAndIsr goes to."""
        return [b for b in self.replicas(tp) if self.is_replica_online(b, tp)]

    def eligible_replicas(self, tp: TopicPartition) -> set[int]:
        """Online replicas of brokers not shutting down: those that may lead tp."""
        return {b for b in self.online_replicas(tp) if b not in self.shutting_down}

    def partitions_on(self, broker_id: int) -> list[TopicPartition]:
        return [tp for tp in self.partitions() if broker_id in self.replicas(tp)]

    def has_live_leader(self, tp: TopicPartition) -> bool:
        st = self.states.get(tp)
        return st is not None and self.is_replica_online(st.leader, tp)


# ---------------------------------------------------------------- leader election (pure)


def offline_leader(assignment: list[int], isr: list[int], live: set[int], unclean: bool) -> int | None:
    """First live replica (in assignment order) that is in the ISR; with unclean election, any live replica."""
    for b in assignment:
        if b in live and b in isr:
            return b
    if unclean:
        for b in assignment:
            if b in live:
                return b
    return None


def reassign_leader(target: list[int], isr: list[int], live: set[int]) -> int | None:
    for b in target:
        if b in live and b in isr:
            return b
    return None


def preferred_leader(assignment: list[int], isr: list[int], live: set[int]) -> int | None:
    if assignment and assignment[0] in live and assignment[0] in isr:
        return assignment[0]
    return None


def controlled_shutdown_leader(assignment: list[int], isr: list[int], live: set[int],
                               shutting_down: set[int]) -> int | None:
    for b in assignment:
        if b in live and b in isr and b not in shutting_down:
            return b
    return None


def elect_offline(state: LeaderIsrState, assignment: list[int], live: set[int], unclean: bool,
                  controller_epoch: int) -> LeaderIsrState | None:
    """Kafka's OfflinePartitionLeaderElectionStrategy with its new ISR: the live ISR members, or only the
    new leader when it came from outside the ISR (unclean)."""
    leader = offline_leader(assignment, state.isr, live, unclean)
    if leader is None:
        return None
    isr = [b for b in state.isr if b in live] if leader in state.isr else [leader]
    return LeaderIsrState(leader, state.leader_epoch + 1, isr, controller_epoch, state.version)


def initial_state(assignment: list[int], live: set[int], controller_epoch: int) -> LeaderIsrState | None:
    """NewPartition -> OnlinePartition: the first live replica leads, every live replica is in the ISR."""
    isr = [b for b in assignment if b in live]
    if not isr:
        return None
    return LeaderIsrState(isr[0], 0, isr, controller_epoch, 0)


def without_replicas(state: LeaderIsrState, gone: set[int], controller_epoch: int) -> LeaderIsrState:
    """Kafka's removeReplicasFromIsr: the ISR never becomes empty (its last member stays, so it can lead
    again cleanly when it returns); a leader that is gone leaves the partition without a leader."""
    isr = [b for b in state.isr if b not in gone]
    if not isr:
        isr = list(state.isr)[-1:]
    leader = NO_LEADER if state.leader in gone else state.leader
    return LeaderIsrState(leader, state.leader_epoch + 1, isr, controller_epoch, state.version)


def imbalanced_partitions(ctx: ControllerContext, per_broker_percentage: int) -> list[TopicPartition]:
    """Kafka's checkAndTriggerAutoLeaderRebalance: for each broker whose share of partitions it prefers but
    does not lead exceeds leader.imbalance.per.broker.percentage, those partitions (when it can lead them)."""
    preferred_of: dict[int, list[TopicPartition]] = {}
    for tp in ctx.partitions():
        replicas = ctx.replicas(tp)
        if replicas and tp not in ctx.reassignments:
            preferred_of.setdefault(replicas[0], []).append(tp)
    out: list[TopicPartition] = []
    for broker, tps in sorted(preferred_of.items()):
        if not ctx.is_eligible(broker):
            continue
        not_led = [tp for tp in tps if tp in ctx.states and ctx.states[tp].leader != broker]
        if tps and len(not_led) * 100 / len(tps) > per_broker_percentage:
            out += [tp for tp in not_led if broker in ctx.states[tp].isr]
    return out
