"""Server-side assignors of KIP-848 consumer groups (Kafka's UniformAssignor and RangeAssignor) and the
TargetAssignmentBuilder that runs them. Pure functions of the group's subscriptions: no I/O, no clock.

Assignments name topics by id, as Kafka's do. An assignor gets every member's subscribed topic ids and its
current *target* assignment (for stickiness), and the partition counts of the subscribed topics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

Assignment = dict[bytes, set[int]]
TopicPartitionId = tuple[bytes, int]


@dataclass(frozen=True)
class MemberSubscription:
    subscribed_topic_ids: frozenset[bytes]
    assignment: Assignment = field(default_factory=dict)  # the member's current target assignment
    rack_id: str | None = None


class ConsumerGroupPartitionAssignor(Protocol):
    name: str

    def assign(self, members: dict[str, MemberSubscription], topics: dict[bytes, int]) -> dict[str, Assignment]: ...


def _as_assignment(owned: set[TopicPartitionId]) -> Assignment:
    out: Assignment = {}
    for t, p in owned:
        out.setdefault(t, set()).add(p)
    return out


class UniformAssignor:
    """Balanced and sticky (Kafka's UniformAssignor: OptimizedUniformAssignmentBuilder when every member
    subscribes to the same topics, GeneralUniformAssignmentBuilder otherwise). Partitions stay with their
    current target owner while it still subscribes to the topic; then members' partition counts are evened
    out (at most one apart among members that could take the same partitions), moving as few as it can."""

    name = "uniform"

    def assign(self, members: dict[str, MemberSubscription], topics: dict[bytes, int]) -> dict[str, Assignment]:
        ids = sorted(members)
        owned: dict[str, set[TopicPartitionId]] = {m: set() for m in ids}
        if not ids:
            return {}
        subscribers: dict[bytes, list[str]] = {}
        for m in ids:
            for t in members[m].subscribed_topic_ids:
                if t in topics:
                    subscribers.setdefault(t, []).append(m)
        owner: dict[TopicPartitionId, str] = {}
        # 1. Stickiness: keep what each member is assigned today, if still valid.
        for m in ids:
            for t, ps in members[m].assignment.items():
                if t not in subscribers or m not in subscribers[t]:
                    continue
                for p in sorted(ps):
                    if p < topics[t] and (t, p) not in owner:
                        owner[(t, p)] = m
                        owned[m].add((t, p))
        homogeneous = len({frozenset(members[m].subscribed_topic_ids & topics.keys()) for m in ids}) == 1
        if homogeneous:
            # Quotas: total // n each, the first `extra` members (most loaded first, to keep them) one more.
            total = sum(topics[t] for t in subscribers)
            quota, extra = divmod(total, len(ids))
            order = sorted(ids, key=lambda m: (-len(owned[m]), m))
            caps = {m: quota + (1 if i < extra else 0) for i, m in enumerate(order)}
            for m in ids:
                while len(owned[m]) > caps[m]:
                    tp = max(owned[m])
                    owned[m].discard(tp)
                    del owner[tp]
        # 2. Unassigned partitions go to the least loaded member that subscribes to their topic.
        for t in sorted(subscribers):
            for p in range(topics[t]):
                if (t, p) in owner:
                    continue
                m = min(subscribers[t], key=lambda x: (len(owned[x]), x))
                owner[(t, p)] = m
                owned[m].add((t, p))
        # 3. Balance: move partitions from a member to an eligible one with two or more fewer partitions.
        # Terminates: each move lowers the sum of squared loads.
        moved = True
        while moved:
            moved = False
            for m in sorted(ids, key=lambda x: (-len(owned[x]), x)):
                for tp in sorted(owned[m], reverse=True):
                    target = min(subscribers[tp[0]], key=lambda x: (len(owned[x]), x))
                    if len(owned[m]) - len(owned[target]) > 1:
                        owned[m].discard(tp)
                        owned[target].add(tp)
                        owner[tp] = target
                        moved = True
        return {m: _as_assignment(owned[m]) for m in ids}


class RangeAssignor:
    """Per topic, the subscribed members in member id order get consecutive ranges of partitions, the first
    `partitions % members` one partition more (Kafka's RangeAssignor; co-partitioned topics land together)."""

    name = "range"

    def assign(self, members: dict[str, MemberSubscription], topics: dict[bytes, int]) -> dict[str, Assignment]:
        out: dict[str, Assignment] = {m: {} for m in sorted(members)}
        for t in sorted(topics):
            subs = sorted(m for m in members if t in members[m].subscribed_topic_ids)
            if not subs:
                continue
            quota, extra = divmod(topics[t], len(subs))
            start = 0
            for i, m in enumerate(subs):
                n = quota + (1 if i < extra else 0)
                if n:
                    out[m][t] = set(range(start, start + n))
                start += n
        return out


ASSIGNORS: dict[str, type[UniformAssignor] | type[RangeAssignor]] = {"uniform": UniformAssignor,
                                                                     "range": RangeAssignor}
# group.consumer.assignors also takes Kafka's class names.
CLASS_NAMES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}


def assignor_named(name: str) -> ConsumerGroupPartitionAssignor:
    return ASSIGNORS[CLASS_NAMES.get(name, name)]()


@dataclass
class TargetAssignmentResult:
    assignment: dict[str, Assignment]  # every member's new target
    changed: dict[str, Assignment]     # only the members whose target differs from before


class TargetAssignmentBuilder:
    """Kafka's TargetAssignmentBuilder: run the assignor over the group's members as they will be after this
    heartbeat (one member added, updated or removed) and say which members' targets changed."""

    def __init__(self, assignor: ConsumerGroupPartitionAssignor, topics_by_name: dict[str, tuple[bytes, int]]):
        self.assignor = assignor
        self.topics_by_name = topics_by_name

    def build(self, subscriptions: dict[str, list[str]], current_targets: dict[str, Assignment]
              ) -> TargetAssignmentResult:
        """subscriptions: member id -> subscribed topic names (members after the change)."""
        topics = {tid: n for tid, n in self.topics_by_name.values()}
        specs = {
            m: MemberSubscription(
                frozenset(self.topics_by_name[n][0] for n in names if n in self.topics_by_name),
                current_targets.get(m, {}))
            for m, names in subscriptions.items()
        }
        result = self.assignor.assign(specs, topics)
        changed = {}
        for m in subscriptions:
            new = {t: ps for t, ps in result.get(m, {}).items() if ps}
            result[m] = new
            if new != {t: ps for t, ps in current_targets.get(m, {}).items() if ps}:
                changed[m] = new
        return TargetAssignmentResult(result, changed)
