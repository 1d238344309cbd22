"""StreamsGroup and StreamsGroupMember: the state of one KIP-1071 streams group (Kafka's StreamsGroup).

State changes only by replay() of the group's records (streams_group_records), on the coordinator loop, live
and at load, as for consumer groups. The topology's configuration against the cluster's topics (Kafka's
InternalTopicManager: task counts, repartition and changelog partition counts, missing topics) lives here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from kbroker.coordinator import streams_group_records as sgr
from kbroker.coordinator.group_metadata_hash import topics_hash
from kbroker.coordinator.streams_group_records import RecordType, StreamsGroupRecord, Tasks, TasksTuple

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(IntEnum):
    """Kafka's streams MemberState, with its byte values in StreamsGroupCurrentMemberAssignmentValue.state."""

    STABLE = 0
    UNREVOKED_TASKS = 1
    UNRELEASED_TASKS = 2
    UNKNOWN = 127


class StreamsGroupState(Enum):
    EMPTY = "Empty"
    NOT_READY = "NotReady"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class StreamsGroupMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    client_id: str = ""
    client_host: str = ""
    topology_epoch: int = 0
    process_id: str = ""
    user_endpoint: tuple[str, int] | None = None
    client_tags: dict[str, str] = field(default_factory=dict)
    assigned: TasksTuple = field(default_factory=TasksTuple)
    pending: TasksTuple = field(default_factory=TasksTuple)
    # (subtopology, partition) -> the epoch its active task was assigned to this member at
    active_epochs: dict[tuple[str, int], int] = field(default_factory=dict)

    def metadata_key(self) -> tuple[Any, ...]:
        return (
            self.instance_id,
            self.rack_id,
            self.rebalance_timeout_ms,
            self.client_id,
            self.client_host,
            self.topology_epoch,
            self.process_id,
            self.user_endpoint,
            sorted(self.client_tags.items()),
        )

    def metadata_record(self, group_id: str) -> StreamsGroupRecord:
        from kbroker.protocol.messages import StreamsGroupMemberMetadataValue as V

        return sgr.member_metadata_record(
            group_id,
            self.member_id,
            V(
                instance_id=self.instance_id,
                rack_id=self.rack_id,
                client_id=self.client_id,
                client_host=self.client_host,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                topology_epoch=self.topology_epoch,
                process_id=self.process_id,
                user_endpoint=None
                if self.user_endpoint is None
                else V.Endpoint(host=self.user_endpoint[0], port=self.user_endpoint[1]),
                client_tags=[V.KeyValue(key=k, value=v) for k, v in sorted(self.client_tags.items())],
            ),
        )

    def assignment_key(self) -> tuple[Any, ...]:
        return (
            self.member_epoch,
            self.previous_member_epoch,
            self.state,
            self.assigned.clean(),
            self.pending.clean(),
            sorted(self.active_epochs.items()),
        )

    def assignment_record(self, group_id: str) -> StreamsGroupRecord:
        return sgr.current_assignment_record(
            group_id,
            self.member_id,
            member_epoch=self.member_epoch,
            previous_member_epoch=self.previous_member_epoch,
            state=int(self.state),
            assigned=self.assigned,
            pending=self.pending,
            active_epochs=self.active_epochs,
        )


@dataclass
class ConfiguredTopology:
    """The topology against the current topics (Kafka's ConfiguredTopology): tasks per subtopology, the internal
    topics to create, and why the group cannot be assigned yet (status code, detail)."""

    tasks: dict[str, int] = field(default_factory=dict)
    to_create: dict[str, tuple[int, int, dict[str, str]]] = field(
        default_factory=dict
    )  # name: (parts, rf, cfg)
    status: tuple[int, str] | None = None
    metadata_hash: int = 0
    # subtopology id -> its source topics (external and repartition), for the IQ endpoint partitions
    source_topics: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status is None


MISSING_SOURCE_TOPICS = 1
INCORRECTLY_PARTITIONED_TOPICS = 2
MISSING_INTERNAL_TOPICS = 3
STALE_TOPOLOGY = 0
SHUTDOWN_APPLICATION = 4
ASSIGNMENT_DELAYED = 5


def configure_topology(
    topology: Any, topics: Mapping[str, Any], rack_of: Callable[[int], str | None] = lambda broker: None
) -> ConfiguredTopology:
    """Kafka's InternalTopicManager.configureTopics: repartition topics take their partition count from the
    request or from the subtopologies writing into them, changelog topics from their subtopology's task count.
    The metadata hash is Kafka's StreamsGroup.computeMetadataHash: the group hash (KIP-1101) of the topology's
    required topics (source, repartition source and changelog topics) that exist."""
    out = ConfiguredTopology()

    def parts(name: str) -> int | None:
        rec = topics.get(name)
        return None if rec is None else len(rec.partitions)

    subs = list(topology.subtopologies)
    required = {t for s in subs for t in s.source_topics}
    required |= {ti.name for s in subs for ti in (*s.repartition_source_topics, *s.state_changelog_topics)}
    out.metadata_hash = topics_hash(required, topics, rack_of)
    missing = sorted({t for s in subs for t in s.source_topics if parts(t) is None})
    if missing:
        out.status = (MISSING_SOURCE_TOPICS, f"Source topics {', '.join(missing)} are missing.")
        return out
    repartition: dict[str, int] = {}
    for s in subs:
        for ti in s.repartition_source_topics:
            if ti.partitions > 0:
                repartition[ti.name] = ti.partitions
    # Unset repartition counts: the largest source count of the subtopologies writing into the topic, until no
    # more can be resolved (Kafka's RepartitionTopics).
    for _ in range(len(subs) + 1):
        changed = False
        for s in subs:
            counts = [parts(t) or 0 for t in s.source_topics]
            counts += [repartition.get(ti.name, 0) for ti in s.repartition_source_topics]
            n = max(counts, default=0)
            if n <= 0:
                continue
            for sink in s.repartition_sink_topics:
                if repartition.get(sink, 0) < n and not any(
                    ti.name == sink and ti.partitions > 0 for x in subs for ti in x.repartition_source_topics
                ):
                    repartition[sink] = n
                    changed = True
        if not changed:
            break
    for s in subs:
        counts = [parts(t) or 0 for t in s.source_topics] + [
            repartition.get(ti.name, 0) for ti in s.repartition_source_topics
        ]
        n = max(counts, default=0)
        out.tasks[s.subtopology_id] = n
        out.source_topics[s.subtopology_id] = [
            *s.source_topics,
            *(ti.name for ti in s.repartition_source_topics),
        ]
        for ti in s.repartition_source_topics:
            out.to_create[ti.name] = (
                repartition.get(ti.name, 0),
                ti.replication_factor,
                {c.key: c.value for c in ti.topic_configs},
            )
        for ti in s.state_changelog_topics:
            out.to_create[ti.name] = (n, ti.replication_factor, {c.key: c.value for c in ti.topic_configs})
    unresolved = sorted(t for t, (n, _, _) in out.to_create.items() if n <= 0)
    if unresolved:
        out.status = (
            INCORRECTLY_PARTITIONED_TOPICS,
            f"Failed to compute number of partitions for all repartition topics: {', '.join(unresolved)}.",
        )
    wrong = sorted(t for t, (n, _, _) in out.to_create.items() if parts(t) is not None and parts(t) != n)
    if wrong and out.status is None:
        out.status = (
            INCORRECTLY_PARTITIONED_TOPICS,
            f"Internal topics {', '.join(wrong)} do not have the expected number of partitions.",
        )
    out.to_create = {t: v for t, v in out.to_create.items() if parts(t) is None and v[0] > 0}
    if out.to_create and out.status is None:
        out.status = (MISSING_INTERNAL_TOPICS, f"Internal topics are missing: {sorted(out.to_create)}")
    return out


def assign_tasks(
    tasks: dict[str, int],
    members: Mapping[str, StreamsGroupMember],
    previous: Mapping[str, TasksTuple],
    num_standby: int,
) -> dict[str, TasksTuple]:
    """A sticky task assignor (after Kafka's StickyTaskAssignor): active tasks stay with their previous owner while
    it is not above its share, the rest go to the least loaded members; standbys go to members of another process
    than the task's active, least loaded first."""
    out = {m: TasksTuple() for m in members}
    if not members:
        return out
    all_tasks = [(s, p) for s, n in sorted(tasks.items()) for p in range(n)]
    cap = -(-len(all_tasks) // len(members))
    load = dict.fromkeys(members, 0)
    owner: dict[tuple[str, int], str] = {}
    for mid in sorted(members):
        prev = previous.get(mid)
        if prev is None:
            continue
        for s, ps in sorted(prev.active.items()):
            for p in sorted(ps):
                if p < tasks.get(s, 0) and (s, p) not in owner and load[mid] < cap:
                    owner[(s, p)] = mid
                    load[mid] += 1
    for t in all_tasks:
        if t not in owner:
            mid = min(sorted(members), key=lambda m: load[m])
            owner[t] = mid
            load[mid] += 1
    for (s, p), mid in owner.items():
        out[mid].active.setdefault(s, set()).add(p)
    if num_standby > 0:
        sload = {m: load[m] for m in members}
        for t in all_tasks:
            active_proc = members[owner[t]].process_id
            used = {active_proc}
            for _ in range(num_standby):
                candidates = [m for m in sorted(members) if members[m].process_id not in used]
                if not candidates:
                    break
                prev_standby = [
                    m for m in candidates if t[1] in previous.get(m, TasksTuple()).standby.get(t[0], ())
                ]
                mid = prev_standby[0] if prev_standby else min(candidates, key=lambda m: sload[m])
                out[mid].standby.setdefault(t[0], set()).add(t[1])
                sload[mid] += 1
                used.add(members[mid].process_id)
    return out


@dataclass
class StreamsGroup:
    group_id: str
    group_epoch: int = 0
    metadata_hash: int = 0
    validated_topology_epoch: int = -1
    assignment_epoch: int = 0
    topology: Any | None = None  # StreamsGroupTopologyValue
    members: dict[str, StreamsGroupMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    target: dict[str, TasksTuple] = field(default_factory=dict)
    # (subtopology, partition) -> member owning the active task (assigned or pending revocation)
    active_owners: dict[tuple[str, int], str] = field(default_factory=dict)
    # Not persisted: the last configuration of the topology and the topics map it was computed from.
    configured: ConfiguredTopology | None = None
    configured_for: object = None
    # The member that asked the whole application to shut down (Kafka keeps it until the group is empty).
    shutdown_requested: str | None = None
    # Loop time the initial rebalance delay ends (not persisted: a restarted coordinator assigns at once).
    delay_until: float | None = None
    session_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    session_deadlines: dict[str, float] = field(default_factory=dict)
    rebalance_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    @property
    def state(self) -> StreamsGroupState:
        """Kafka's StreamsGroup.maybeUpdateGroupState."""
        if not self.members:
            return StreamsGroupState.EMPTY
        if self.topology is None or self.configured is None or not self.configured.ready:
            return StreamsGroupState.NOT_READY
        if self.group_epoch > self.assignment_epoch:
            return StreamsGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return StreamsGroupState.RECONCILING
        return StreamsGroupState.STABLE

    def replay(self, r: StreamsGroupRecord) -> None:
        v = r.value
        if r.type is RecordType.METADATA:
            if v is not None:
                self.group_epoch = v.epoch
                self.metadata_hash = v.metadata_hash
                self.validated_topology_epoch = v.validated_topology_epoch
        elif r.type is RecordType.TOPOLOGY:
            self.topology = v
            self.configured = None
        elif r.type is RecordType.TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = -1 if v is None else v.assignment_epoch
        elif r.type is RecordType.TARGET_ASSIGNMENT_MEMBER:
            assert r.member_id is not None
            if v is None:
                self.target.pop(r.member_id, None)
            else:
                self.target[r.member_id] = TasksTuple(
                    sgr.to_tasks(v.active_tasks), sgr.to_tasks(v.standby_tasks), sgr.to_tasks(v.warmup_tasks)
                )
        elif r.type is RecordType.MEMBER_METADATA:
            assert r.member_id is not None
            self._replay_member_metadata(r.member_id, v)
        elif r.type is RecordType.CURRENT_MEMBER_ASSIGNMENT:
            assert r.member_id is not None
            self._replay_current_assignment(r.member_id, v)

    def _replay_member_metadata(self, member_id: str, v: Any | None) -> None:
        old = self.members.get(member_id)
        if v is None:
            if old is not None:
                self._set_owned(old, TasksTuple(), TasksTuple())
                del self.members[member_id]
                if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
                    del self.static_members[old.instance_id]
            return
        m = old if old is not None else StreamsGroupMember(member_id)
        m.instance_id = v.instance_id
        m.rack_id = v.rack_id
        m.client_id = v.client_id
        m.client_host = v.client_host
        m.rebalance_timeout_ms = v.rebalance_timeout_ms
        m.topology_epoch = v.topology_epoch
        m.process_id = v.process_id
        m.user_endpoint = None if v.user_endpoint is None else (v.user_endpoint.host, v.user_endpoint.port)
        m.client_tags = {kv.key: kv.value for kv in v.client_tags}
        self.members[member_id] = m
        if m.instance_id is not None:
            self.static_members[m.instance_id] = member_id

    def _replay_current_assignment(self, member_id: str, v: Any | None) -> None:
        m = self.members.get(member_id)
        if m is None:
            if v is None:
                return
            m = self.members[member_id] = StreamsGroupMember(member_id)
        if v is None:
            m.member_epoch = m.previous_member_epoch = LEAVE_GROUP_MEMBER_EPOCH
            m.state = MemberState.STABLE
            m.active_epochs = {}
            self._set_owned(m, TasksTuple(), TasksTuple())
            return
        m.member_epoch = v.member_epoch
        m.previous_member_epoch = v.previous_member_epoch
        try:
            m.state = MemberState(v.state)
        except ValueError:
            m.state = MemberState.UNKNOWN
        m.active_epochs = sgr.to_epochs(v.active_tasks, v.member_epoch) | sgr.to_epochs(
            v.active_tasks_pending_revocation, v.member_epoch
        )
        self._set_owned(
            m,
            TasksTuple(
                sgr.to_tasks(v.active_tasks), sgr.to_tasks(v.standby_tasks), sgr.to_tasks(v.warmup_tasks)
            ),
            TasksTuple(
                sgr.to_tasks(v.active_tasks_pending_revocation),
                sgr.to_tasks(v.standby_tasks_pending_revocation),
                sgr.to_tasks(v.warmup_tasks_pending_revocation),
            ),
        )

    def _set_owned(self, m: StreamsGroupMember, assigned: TasksTuple, pending: TasksTuple) -> None:
        for t in (m.assigned.active, m.pending.active):
            for s, ps in t.items():
                for p in ps:
                    if self.active_owners.get((s, p)) == m.member_id:
                        del self.active_owners[(s, p)]
        m.assigned, m.pending = assigned, pending
        for t in (assigned.active, pending.active):
            for s, ps in t.items():
                for p in ps:
                    self.active_owners[(s, p)] = m.member_id

    def owns_task(self, member: StreamsGroupMember, subtopology: str, partition: int) -> bool:
        return any(
            partition in t.get(subtopology, ()) for t in (*member.assigned.parts(), *member.pending.parts())
        )


def tasks_minus(a: Tasks, b: Tasks) -> Tasks:
    return {s: ps - b.get(s, set()) for s, ps in a.items() if ps - b.get(s, set())}


def tasks_and(a: Tasks, b: Tasks) -> Tasks:
    return {s: ps & b.get(s, set()) for s, ps in a.items() if ps & b.get(s, set())}
