"""KIP-1071 streams groups on the group coordinator: StreamsGroupHeartbeat (topology registration, internal
topics, task assignment and reconciliation, member epochs), leave and session timeouts, StreamsGroupDescribe and
the member-epoch checks of offset commits (after Kafka 4.x's GroupMetadataManager.streamsGroupHeartbeat).

Mixed into GroupCoordinator like ConsumerGroupManager: a heartbeat computes the group's records without awaiting,
appends them to __consumer_offsets, replays them, then awaits their flush before answering.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kbroker.coordinator import streams_group_records as sgr
from kbroker.coordinator.consumer_group_manager import ConsumerGroupError
from kbroker.coordinator.group_metadata import GroupMetadata, GroupState
from kbroker.coordinator.group_metadata_hash import rack_lookup
from kbroker.coordinator.streams_group import (
    ASSIGNMENT_DELAYED,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    SHUTDOWN_APPLICATION,
    STALE_TOPOLOGY,
    ConfiguredTopology,
    MemberState,
    StreamsGroup,
    StreamsGroupMember,
    assign_tasks,
    configure_topology,
    tasks_and,
    tasks_minus,
)
from kbroker.coordinator.streams_group_records import StreamsGroupRecord, TasksTuple
from kbroker.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.coordinator.group_coordinator import CoordinatorHost, GroupConfig

log = logging.getLogger("kbroker.group")


class StreamsGroupError(ConsumerGroupError):
    """A streams-group heartbeat refused with Kafka's code (the consumer group's error, caught apart)."""


@dataclass
class StreamsHeartbeat:
    """One StreamsGroupHeartbeat request (the generated request object) and its client."""

    req: Any
    client_id: str = ""
    client_host: str = ""


@dataclass
class StreamsHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str = ""
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: TasksTuple | None = None
    status: list[tuple[int, str]] = field(default_factory=list)
    # Internal topics the broker creates for the group: name -> (partitions, replication factor, configs)
    to_create: dict[str, tuple[int, int, dict[str, str]]] = field(default_factory=dict)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _owned(lst: Any) -> sgr.Tasks | None:
    return None if lst is None else {t.subtopology_id: set(t.partitions) for t in lst if t.partitions}


class StreamsGroupManager:
    if TYPE_CHECKING:
        host: CoordinatorHost
        config: GroupConfig
        groups: dict[str, GroupMetadata]
        loop: asyncio.AbstractEventLoop

        def coordinator_error(self, group_id: str) -> ErrorCode | None: ...
        def offsets_partition(self, group_id: str) -> int: ...
        def _write(
            self,
            group_id: str,
            entries: Sequence[tuple[bytes, bytes | None]],
            *,
            producer_id: int = -1,
            producer_epoch: int = -1,
        ) -> tuple[Any, Any]: ...
        async def _flush_if_needed(self, lg: Any, last_offset: int) -> None: ...

    def _rack_of(self, broker_id: int) -> str | None:
        """A broker's rack for the group metadata hash."""
        return rack_lookup(self.host)(broker_id)

    # ------------------------------------------------------------ heartbeat

    async def streams_group_heartbeat(self, hb: StreamsHeartbeat) -> StreamsHeartbeatResult:
        try:
            self._validate_streams_heartbeat(hb.req)
            err = self.coordinator_error(hb.req.group_id)
            if err is not None:
                raise StreamsGroupError(err)
            if hb.req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                return await self._streams_group_leave(hb.req)
            return await self._streams_join_or_heartbeat(hb)
        except StreamsGroupError as e:
            return StreamsHeartbeatResult(e.code, e.message)

    @staticmethod
    def _validate_streams_heartbeat(req: Any) -> None:
        """Kafka's throwIfStreamsGroupHeartbeatRequestIsInvalid and throwIfInvalidTopology."""

        def invalid(msg: str) -> StreamsGroupError:
            return StreamsGroupError(ErrorCode.INVALID_REQUEST, msg)

        if not req.member_id:
            raise invalid("MemberId can't be empty.")
        if not req.group_id:
            raise invalid("GroupId can't be empty.")
        if req.instance_id is not None and not req.instance_id:
            raise invalid("InstanceId can't be empty.")
        if req.rack_id is not None and not req.rack_id:
            raise invalid("RackId can't be empty.")
        if req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if req.active_tasks is None or req.active_tasks:
                raise invalid("ActiveTasks must be empty when (re-)joining.")
            if req.standby_tasks is None or req.standby_tasks:
                raise invalid("StandbyTasks must be empty when (re-)joining.")
            if req.warmup_tasks is None or req.warmup_tasks:
                raise invalid("WarmupTasks must be empty when (re-)joining.")
            if req.topology is None:
                raise invalid("Topology must be non-null when (re-)joining.")
            _validate_topology(req.topology)
        elif req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if req.instance_id is None:
                raise invalid("InstanceId can't be null.")
        elif req.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise invalid(f"MemberEpoch is {req.member_epoch}, but must be greater than or equal to -2.")
        tasks = (req.active_tasks, req.standby_tasks, req.warmup_tasks)
        if any(t is None for t in tasks) and not all(t is None for t in tasks):
            raise invalid("If one task-type is non-null, all must be non-null.")

    def _streams_group(self, group_id: str, create: bool) -> StreamsGroup:
        holder = self.groups.get(group_id)
        if holder is not None and holder.streams is not None:
            return holder.streams
        if holder is not None and (
            holder.consumer is not None or holder.members or holder.state is not GroupState.EMPTY
        ):
            raise StreamsGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a streams group.")
        if not create:
            raise StreamsGroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"Streams group {group_id} not found.")
        return StreamsGroup(group_id)

    def _streams_config_int(self, group_id: str, name: str, default: int) -> int:
        raw = self.host.consumer_group_config(group_id).get(name)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            return default

    def _streams_heartbeat_interval_ms(self, gid: str) -> int:
        return self._streams_config_int(
            gid, "streams.heartbeat.interval.ms", self.config.streams_heartbeat_interval_ms
        )

    def _streams_session_timeout_ms(self, gid: str) -> int:
        return self._streams_config_int(
            gid, "streams.session.timeout.ms", self.config.streams_session_timeout_ms
        )

    async def _streams_join_or_heartbeat(self, hb: StreamsHeartbeat) -> StreamsHeartbeatResult:
        req = hb.req
        gid = req.group_id
        sg = self._streams_group(gid, create=req.member_epoch == 0)
        records: list[StreamsGroupRecord] = []
        status: list[tuple[int, str]] = []
        member = sg.members.get(req.member_id)
        new_member = member is None
        if member is None:
            if req.member_epoch != 0:
                raise StreamsGroupError(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group {gid}."
                )
            if len(sg.members) >= self.config.streams_max_size:
                raise StreamsGroupError(
                    ErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"The streams group has reached its maximum capacity of {self.config.streams_max_size} members.",
                )
            member = StreamsGroupMember(req.member_id)
        elif req.member_epoch != 0:
            self._check_streams_member_epoch(member, req.member_epoch, _owned(req.active_tasks))
        before = replace(
            member,
            assigned=member.assigned.copy(),
            pending=member.pending.copy(),
            active_epochs=dict(member.active_epochs),
        )
        if req.member_epoch == 0 and not new_member:
            # A known member rejoining owns nothing now.
            member = replace(
                member,
                member_epoch=0,
                previous_member_epoch=-1,
                state=MemberState.STABLE,
                assigned=TasksTuple(),
                pending=TasksTuple(),
                active_epochs={},
            )

        bump = new_member
        if req.topology is not None:
            offered = _topology_value(req.topology)
            # The first member of an empty group (re)initializes the topology: a redeployed application may
            # bring a changed one.
            if sg.topology is None or (not sg.members and offered != sg.topology):
                records.append(sgr.topology_record(gid, offered))
                log.info(
                    "Streams group %s: member %s initialized the topology with epoch %d (%d subtopologies)",
                    gid,
                    req.member_id,
                    req.topology.epoch,
                    len(req.topology.subtopologies),
                )
                bump = True
            elif req.topology.epoch > sg.topology.epoch:
                raise StreamsGroupError(
                    ErrorCode.STREAMS_INVALID_TOPOLOGY_EPOCH, "Topology updates are not supported yet."
                )
        topology_epoch = req.topology.epoch if req.topology is not None else member.topology_epoch
        endpoint = member.user_endpoint
        if req.user_endpoint is not None:
            endpoint = (req.user_endpoint.host, req.user_endpoint.port)
        updated = replace(
            member,
            instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
            rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=req.rebalance_timeout_ms
            if req.rebalance_timeout_ms != -1
            else member.rebalance_timeout_ms,
            topology_epoch=topology_epoch,
            process_id=req.process_id if req.process_id is not None else member.process_id,
            user_endpoint=endpoint,
            client_tags={kv.key: kv.value for kv in req.client_tags}
            if req.client_tags is not None
            else member.client_tags,
            client_id=hb.client_id,
            client_host=hb.client_host,
        )
        if new_member or updated.metadata_key() != before.metadata_key():
            records.append(updated.metadata_record(gid))

        # The topology against the topics as of now: a change of the topics it reads or creates bumps the epoch.
        topics = self.host.consumer_group_topics()
        topology = records[0].value if records and records[0].type is sgr.RecordType.TOPOLOGY else sg.topology
        configured = sg.configured
        if configured is None or sg.configured_for is not topics or topology is not sg.topology:
            configured = configure_topology(topology, topics, self._rack_of)
        if configured.metadata_hash != sg.metadata_hash:
            bump = True
        group_epoch = sg.group_epoch
        if bump:
            group_epoch += 1
            records.append(sgr.group_epoch_record(gid, group_epoch, configured.metadata_hash, topology.epoch))

        target_epoch = sg.assignment_epoch
        target = sg.target.get(updated.member_id, TasksTuple())
        if new_member and not sg.members and self.config.streams_initial_rebalance_delay_ms > 0:
            # Kafka's group.streams.initial.rebalance.delay.ms: the first member of an empty group waits for the
            # others before tasks are assigned; the assignment is computed at a new epoch when the delay ends.
            sg.delay_until = self.loop.time() + self.config.streams_initial_rebalance_delay_ms / 1000
            self.loop.call_at(sg.delay_until, self._streams_delay_ended, sg)
        delayed = sg.delay_until is not None and self.loop.time() < sg.delay_until
        if delayed:
            # Nothing changes hands meanwhile: the member moves to the group's epoch with what it has.
            target_epoch, target = group_epoch, updated.assigned.copy()
            status.append(
                (ASSIGNMENT_DELAYED, "Assignment delayed due to the configured initial rebalance delay.")
            )
        elif group_epoch > sg.assignment_epoch:
            members = {m.member_id: m for m in sg.members.values()}
            members[updated.member_id] = updated
            result = self._target_records(sg, members, configured, group_epoch, records)
            target_epoch, target = group_epoch, result[updated.member_id]

        reconciled = self._reconcile(sg, updated, target_epoch, target, req)
        if new_member or reconciled.assignment_key() != before.assignment_key():
            records.append(reconciled.assignment_record(gid))
        await self._streams_apply_and_flush(gid, sg, records)
        sg.configured, sg.configured_for = configured, topics
        if new_member:
            log.info(
                "Member %s joins streams group %s (client %s, process %s)",
                req.member_id,
                gid,
                hb.client_id,
                updated.process_id,
            )
        self._schedule_streams_session_timeout(sg, reconciled.member_id)
        self._maybe_schedule_streams_rebalance_timeout(sg, before, reconciled)
        if configured.status is not None:
            status.append(configured.status)
        if sg.topology is not None and req.topology is not None and req.topology.epoch < sg.topology.epoch:
            status.append(
                (
                    STALE_TOPOLOGY,
                    f"The member's topology epoch {req.topology.epoch} is behind the group's "
                    f"topology epoch {sg.topology.epoch}.",
                )
            )
        if req.shutdown_application:
            sg.shutdown_requested = req.member_id
        if sg.shutdown_requested:
            status.append(
                (
                    SHUTDOWN_APPLICATION,
                    f"Streams group member {sg.shutdown_requested} encountered a fatal error and requested a "
                    "shutdown for the entire application.",
                )
            )
        return StreamsHeartbeatResult(
            ErrorCode.NONE,
            None,
            reconciled.member_id,
            reconciled.member_epoch,
            self._streams_heartbeat_interval_ms(gid),
            reconciled.assigned.copy(),
            status,
            dict(configured.to_create),
        )

    def _target_records(
        self,
        sg: StreamsGroup,
        members: dict[str, StreamsGroupMember],
        configured: ConfiguredTopology,
        group_epoch: int,
        records: list[StreamsGroupRecord],
    ) -> dict[str, TasksTuple]:
        """A new target assignment at group_epoch (Kafka's TargetAssignmentBuilder): its changed member records and
        the assignment epoch are appended to records. Nothing is assigned while the topology is not ready."""
        gid = sg.group_id
        if configured.ready:
            num_standby = self._streams_config_int(
                gid, "streams.num.standby.replicas", self.config.streams_num_standby_replicas
            )
            result = assign_tasks(configured.tasks, members, sg.target, num_standby)
        else:
            result = {m: TasksTuple() for m in members}
        for mid, t in sorted(result.items()):
            if mid not in sg.target or sg.target[mid].clean() != t.clean():
                records.append(sgr.target_assignment_record(gid, mid, t))
        records.append(sgr.target_epoch_record(gid, group_epoch, _now_ms()))
        log.info(
            "Streams group %s: epoch %d, new target assignment of %d tasks over %d members",
            gid,
            group_epoch,
            sum(len(ps) for t in result.values() for ps in t.active.values()),
            len(members),
        )
        return result

    def _streams_delay_ended(self, sg: StreamsGroup) -> None:
        sg.delay_until = None
        holder = self.groups.get(sg.group_id)
        if holder is None or holder.streams is not sg:
            return
        if not sg.members:
            log.info(
                "Streams group %s: skipping the delayed target assignment, the group is empty", sg.group_id
            )
            return
        self.loop.create_task(self._compute_delayed_assignment(sg))

    async def _compute_delayed_assignment(self, sg: StreamsGroup) -> None:
        """The end of the initial rebalance delay: a new group epoch and its target assignment; members reconcile
        on their next heartbeats."""
        try:
            if sg.topology is None:
                return
            configured = configure_topology(sg.topology, self.host.consumer_group_topics(), self._rack_of)
            epoch = sg.group_epoch + 1
            records = [
                sgr.group_epoch_record(sg.group_id, epoch, configured.metadata_hash, sg.topology.epoch)
            ]
            self._target_records(sg, dict(sg.members), configured, epoch, records)
            await self._streams_apply_and_flush(sg.group_id, sg, records)
        except Exception:
            log.exception("Could not compute the delayed target assignment of streams group %s", sg.group_id)

    @staticmethod
    def _check_streams_member_epoch(
        member: StreamsGroupMember, received: int, owned: sgr.Tasks | None
    ) -> None:
        if received > member.member_epoch:
            raise StreamsGroupError(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The streams group member has a greater member epoch ({received}) than the one known by the "
                f"group coordinator ({member.member_epoch}). The member must abandon all its partitions and rejoin.",
            )
        if received < member.member_epoch:
            subset = owned is not None and not tasks_minus(owned, member.assigned.active)
            if received != member.previous_member_epoch or not subset:
                raise StreamsGroupError(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The streams group member has a smaller member epoch ({received}) than the one known by the "
                    f"group coordinator ({member.member_epoch}). The member must abandon all its partitions and "
                    "rejoin.",
                )

    @staticmethod
    def _reconcile(
        sg: StreamsGroup, m: StreamsGroupMember, target_epoch: int, target: TasksTuple, req: Any
    ) -> StreamsGroupMember:
        """Kafka's streams CurrentAssignmentBuilder: tasks leaving the member are revoked first (the member keeps
        its epoch until it reports them gone), then it moves to the target epoch; an active task still owned by
        another member is withheld until that member released it."""
        if m.state is MemberState.UNREVOKED_TASKS:
            reported = [_owned(req.active_tasks), _owned(req.standby_tasks), _owned(req.warmup_tasks)]
            if any(r is None for r in reported):
                return m
            if any(tasks_and(r, p) for r, p in zip(reported, m.pending.parts(), strict=True)):  # type: ignore[arg-type]
                return m
            m = replace(m, pending=TasksTuple(), active_epochs=_epochs_of(m.active_epochs, m.assigned.active))
        elif m.member_epoch == target_epoch and m.state is MemberState.STABLE:
            return m
        revoke = [tasks_minus(a, t) for a, t in zip(m.assigned.parts(), target.parts(), strict=True)]
        if any(revoke):
            kept = TasksTuple(
                *(tasks_and(a, t) for a, t in zip(m.assigned.parts(), target.parts(), strict=True))
            )
            return replace(
                m,
                state=MemberState.UNREVOKED_TASKS,
                assigned=kept,
                pending=TasksTuple(*revoke),
                active_epochs=dict(m.active_epochs),
            )
        active = {
            s: {p for p in ps if sg.active_owners.get((s, p), m.member_id) == m.member_id}
            for s, ps in target.active.items()
        }
        active = {s: ps for s, ps in active.items() if ps}
        withheld = tasks_minus(target.active, active)
        return replace(
            m,
            state=MemberState.UNRELEASED_TASKS if withheld else MemberState.STABLE,
            previous_member_epoch=m.member_epoch,
            member_epoch=target_epoch,
            assigned=TasksTuple(
                active,
                {s: set(ps) for s, ps in target.standby.items()},
                {s: set(ps) for s, ps in target.warmup.items()},
            ),
            pending=TasksTuple(),
            # A task the member keeps keeps its assignment epoch; a new one is assigned at the target epoch.
            active_epochs={
                (s, p): m.active_epochs.get((s, p), target_epoch)
                if p in m.assigned.active.get(s, ())
                else target_epoch
                for s, ps in active.items()
                for p in ps
            },
        )

    # ------------------------------------------------------------ leave and fencing

    async def _streams_group_leave(self, req: Any) -> StreamsHeartbeatResult:
        gid = req.group_id
        sg = self._streams_group(gid, create=False)
        member = sg.members.get(req.member_id)
        if member is None:
            raise StreamsGroupError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group {gid}."
            )
        await self._fence_streams_member(sg, member, "left")
        return StreamsHeartbeatResult(
            ErrorCode.NONE, None, member.member_id, req.member_epoch, self._streams_heartbeat_interval_ms(gid)
        )

    async def _fence_streams_member(self, sg: StreamsGroup, member: StreamsGroupMember, why: str) -> None:
        gid = sg.group_id
        records = sgr.member_tombstones(gid, member.member_id)
        topology_epoch = sg.topology.epoch if sg.topology is not None else -1
        records.append(sgr.group_epoch_record(gid, sg.group_epoch + 1, sg.metadata_hash, topology_epoch))
        await self._streams_apply_and_flush(gid, sg, records)
        self._cancel_streams_session_timeout(sg, member.member_id)
        self._cancel_streams_rebalance_timeout(sg, member.member_id)
        log.info(
            "Member %s %s streams group %s; group epoch %d, %d members left",
            member.member_id,
            why,
            gid,
            sg.group_epoch,
            len(sg.members),
        )

    async def _streams_apply_and_flush(
        self, gid: str, sg: StreamsGroup, records: list[StreamsGroupRecord]
    ) -> None:
        if records:
            lg, info = self._write(gid, [r.entry() for r in records])
        for r in records:
            self.replay_streams_record(r, sg)
        if records:
            await self._flush_if_needed(lg, info.last_offset)

    def replay_streams_record(self, r: StreamsGroupRecord, sg: StreamsGroup | None = None) -> None:
        """Apply one record (live or at load): the group is registered on its first record and dropped with its
        metadata tombstone (its committed offsets stay)."""
        holder = self.groups.get(r.group_id)
        if r.type is sgr.RecordType.METADATA and r.value is None:
            if holder is not None and holder.streams is not None:
                for mid in list(holder.streams.rebalance_timers):
                    self._cancel_streams_rebalance_timeout(holder.streams, mid)
                for mid in list(holder.streams.session_timers):
                    self._cancel_streams_session_timeout(holder.streams, mid)
                holder.streams = None
                holder.protocol_type = None
                if not holder.offsets and not holder.pending_txn_offsets:
                    self.groups.pop(r.group_id, None)
            return
        if holder is None:
            holder = self.groups[r.group_id] = GroupMetadata(r.group_id, state_timestamp_ms=_now_ms())
        if holder.streams is None:
            if r.value is None:
                return
            holder.streams = sg if sg is not None and sg.group_id == r.group_id else StreamsGroup(r.group_id)
        holder.protocol_type = "streams"
        holder.streams.replay(r)
        empty = not holder.streams.members
        if empty:
            holder.streams.shutdown_requested = None
        if empty != (holder.state is GroupState.EMPTY):
            holder.state = GroupState.EMPTY if empty else GroupState.STABLE
            holder.state_timestamp_ms = _now_ms()

    async def convert_empty_streams_group(self, group_id: str) -> None:
        """A classic JoinGroup for an empty streams group: its records go and it becomes an empty classic group
        keeping its offsets (Kafka: "Converted the empty streams group to a classic group.")."""
        holder = self.groups.get(group_id)
        if holder is None or holder.streams is None or holder.streams.members:
            return
        await self._streams_apply_and_flush(group_id, holder.streams, sgr.group_tombstones(group_id, []))
        if group_id not in self.groups:
            self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=_now_ms())
        log.info("Converted the empty streams group %s to a classic group", group_id)

    def streams_group_tombstones(self, g: GroupMetadata) -> list[tuple[bytes, bytes | None]]:
        if g.streams is None:
            return []
        return [r.entry() for r in sgr.group_tombstones(g.group_id, list(g.streams.members))]

    # ------------------------------------------------------------ timers

    def _schedule_streams_session_timeout(self, sg: StreamsGroup, member_id: str) -> None:
        deadline = self.loop.time() + self._streams_session_timeout_ms(sg.group_id) / 1000
        sg.session_deadlines[member_id] = deadline
        timer = sg.session_timers.get(member_id)
        if timer is not None and timer.when() > deadline:
            timer.cancel()
            timer = None
        if timer is None:
            sg.session_timers[member_id] = self.loop.call_at(
                deadline, self._streams_session_expired, sg, member_id
            )

    def _streams_session_expired(self, sg: StreamsGroup, member_id: str) -> None:
        sg.session_timers.pop(member_id, None)
        deadline = sg.session_deadlines.get(member_id)
        holder = self.groups.get(sg.group_id)
        if deadline is None or holder is None or holder.streams is not sg or member_id not in sg.members:
            return
        if deadline > self.loop.time():
            sg.session_timers[member_id] = self.loop.call_at(
                deadline, self._streams_session_expired, sg, member_id
            )
            return
        sg.session_deadlines.pop(member_id, None)
        self.loop.create_task(self._fence_streams_quietly(sg, member_id))

    async def _fence_streams_quietly(
        self, sg: StreamsGroup, member_id: str, why: str = "session timeout"
    ) -> None:
        m = sg.members.get(member_id)
        holder = self.groups.get(sg.group_id)
        if m is None or holder is None or holder.streams is not sg:
            return
        try:
            await self._fence_streams_member(sg, m, f"fenced ({why}) from")
        except Exception:
            log.exception("Could not fence member %s of streams group %s", member_id, sg.group_id)

    def _maybe_schedule_streams_rebalance_timeout(
        self, sg: StreamsGroup, before: StreamsGroupMember, after: StreamsGroupMember
    ) -> None:
        """Kafka: a member asked to revoke tasks must do so within its rebalance timeout, or be fenced."""
        if after.state is not MemberState.UNREVOKED_TASKS:
            self._cancel_streams_rebalance_timeout(sg, after.member_id)
            return
        if (
            before.state is MemberState.UNREVOKED_TASKS
            and before.member_epoch == after.member_epoch
            and after.member_id in sg.rebalance_timers
        ):
            return
        self._cancel_streams_rebalance_timeout(sg, after.member_id)
        sg.rebalance_timers[after.member_id] = self.loop.call_later(
            max(after.rebalance_timeout_ms, 0) / 1000,
            self._streams_rebalance_expired,
            sg,
            after.member_id,
            after.member_epoch,
        )

    def _streams_rebalance_expired(self, sg: StreamsGroup, member_id: str, epoch: int) -> None:
        sg.rebalance_timers.pop(member_id, None)
        m = sg.members.get(member_id)
        holder = self.groups.get(sg.group_id)
        if holder is None or holder.streams is not sg or m is None:
            return
        if m.state is MemberState.UNREVOKED_TASKS and m.member_epoch == epoch:
            log.info(
                "Member %s of streams group %s did not revoke its tasks within %d ms",
                member_id,
                sg.group_id,
                m.rebalance_timeout_ms,
            )
            self.loop.create_task(self._fence_streams_quietly(sg, member_id, "rebalance timeout"))

    def _cancel_streams_rebalance_timeout(self, sg: StreamsGroup, member_id: str) -> None:
        timer = sg.rebalance_timers.pop(member_id, None)
        if timer is not None:
            timer.cancel()

    def _cancel_streams_session_timeout(self, sg: StreamsGroup, member_id: str) -> None:
        sg.session_deadlines.pop(member_id, None)
        timer = sg.session_timers.pop(member_id, None)
        if timer is not None:
            timer.cancel()

    def streams_groups_loaded(self, partition: int) -> None:
        """After a load: every member's session starts now (Kafka's onLoaded)."""
        for gid, holder in self.groups.items():
            if holder.streams is not None and self.offsets_partition(gid) == partition:
                for mid in holder.streams.members:
                    self._schedule_streams_session_timeout(holder.streams, mid)
                log.info(
                    "Loaded streams group %s: epoch %d, %d members",
                    gid,
                    holder.streams.group_epoch,
                    len(holder.streams.members),
                )

    # ------------------------------------------------------------ describe and offsets

    async def streams_group_describe(
        self, group_ids: list[str]
    ) -> list[tuple[str, ErrorCode, str | None, StreamsGroup | None]]:
        out: list[tuple[str, ErrorCode, str | None, StreamsGroup | None]] = []
        for gid in group_ids:
            err = self.coordinator_error(gid)
            if err is not None:
                out.append((gid, err, None, None))
                continue
            holder = self.groups.get(gid)
            if holder is None or holder.streams is None:
                out.append((gid, ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} not found.", None))
                continue
            sg = holder.streams
            if sg.configured is None and sg.topology is not None:
                sg.configured = configure_topology(sg.topology, self.host.consumer_group_topics(), self._rack_of)
            out.append((gid, ErrorCode.NONE, None, sg))
        return out

    def validate_streams_offset_commit(
        self,
        sg: StreamsGroup,
        member_id: str,
        member_epoch: int,
        transactional: bool,
        api_version: int,
        partitions: Iterable[tuple[str, int]] = (),
    ) -> ErrorCode | None:
        err = self.validate_streams_offset_commit_static(
            sg, member_id, member_epoch, transactional, api_version, partitions
        )
        if err is None and member_id in sg.members:
            self._schedule_streams_session_timeout(sg, member_id)
        return err

    @staticmethod
    def validate_streams_offset_commit_static(
        sg: StreamsGroup,
        member_id: str,
        member_epoch: int,
        transactional: bool = True,
        api_version: int = 9,
        partitions: Iterable[tuple[str, int]] = (),
    ) -> ErrorCode | None:
        """Kafka's StreamsGroup.validateOffsetCommit: epoch -1 only on an empty group, a known member, OffsetCommit
        v9+ outside transactions, and the member's epoch. An older epoch is accepted (Kafka 4.4) when every
        partition committed belongs to an active task the member still owns (assigned or being revoked) since that
        epoch or before: its commit raced a heartbeat that moved it to a new epoch, not the task to another
        member."""
        if member_epoch < 0 and not sg.members:
            return None
        member = sg.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not transactional and api_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        if member_epoch == member.member_epoch:
            return None
        if member_epoch > member.member_epoch or member_epoch < 0 or sg.topology is None:
            return ErrorCode.STALE_MEMBER_EPOCH
        subtopology_of: dict[str, str] = {}
        for s in sg.topology.subtopologies:
            for t in [*s.source_topics, *(ti.name for ti in s.repartition_source_topics)]:
                subtopology_of[t] = s.subtopology_id
        wanted = list(partitions)
        for topic, p in wanted:
            sub = subtopology_of.get(topic)
            if sub is None or not (
                p in member.assigned.active.get(sub, ()) or p in member.pending.active.get(sub, ())
            ):
                return ErrorCode.STALE_MEMBER_EPOCH
            if member.active_epochs.get((sub, p), member.member_epoch) > member_epoch:
                return ErrorCode.STALE_MEMBER_EPOCH
        return None if wanted else ErrorCode.STALE_MEMBER_EPOCH

    @staticmethod
    def validate_streams_offset_fetch(
        sg: StreamsGroup, member_id: str | None, member_epoch: int
    ) -> ErrorCode | None:
        if member_epoch < 0 and member_id is None:
            return None
        member = sg.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return None


def _epochs_of(epochs: dict[tuple[str, int], int], tasks: sgr.Tasks) -> dict[tuple[str, int], int]:
    return {(s, p): e for (s, p), e in epochs.items() if p in tasks.get(s, ())}


def _validate_topology(topology: Any) -> None:
    """Kafka's throwIfInvalidTopology: unique subtopology ids, source topics present, no regex (not supported),
    changelog topics without a partition count, copartition indexes within range."""

    def bad(msg: str) -> StreamsGroupError:
        return StreamsGroupError(ErrorCode.STREAMS_INVALID_TOPOLOGY, msg)

    if topology.epoch < 0:
        raise StreamsGroupError(ErrorCode.INVALID_REQUEST, "Topology epoch must be non-negative.")
    seen: set[str] = set()
    for s in topology.subtopologies:
        if s.subtopology_id in seen:
            raise bad(f"Duplicate subtopology id {s.subtopology_id}.")
        seen.add(s.subtopology_id)
        if s.source_topic_regex:
            raise StreamsGroupError(
                ErrorCode.INVALID_REQUEST, "Regular expressions for source topics are not supported yet."
            )
        if not s.source_topics and not s.repartition_source_topics:
            raise bad(f"Subtopology {s.subtopology_id} does not contain any source topics.")
        for ti in s.state_changelog_topics:
            if ti.partitions != 0:
                raise bad(
                    f"Changelog topic {ti.name} must have an undefined partition count, but it is set to "
                    f"{ti.partitions}."
                )
        for cg in s.copartition_groups:
            if any(i < 0 or i >= len(s.source_topics) for i in cg.source_topics) or any(
                i < 0 or i >= len(s.repartition_source_topics) for i in cg.repartition_source_topics
            ):
                raise bad(f"Copartition group of subtopology {s.subtopology_id} refers to an unknown topic.")
    sources = {t for s in topology.subtopologies for t in s.source_topics}
    repartition = {ti.name for s in topology.subtopologies for ti in s.repartition_source_topics}
    if sources & repartition:
        raise bad(f"Topics {sorted(sources & repartition)} are both source and repartition topics.")


def _topology_value(t: Any) -> Any:
    from kbroker.protocol.messages import StreamsGroupTopologyValue as V

    def info(ti: Any) -> Any:
        return V.TopicInfo(
            name=ti.name,
            partitions=ti.partitions,
            replication_factor=ti.replication_factor,
            topic_configs=[V.TopicConfig(key=c.key, value=c.value) for c in ti.topic_configs],
        )

    return V(
        epoch=t.epoch,
        subtopologies=[
            V.Subtopology(
                subtopology_id=s.subtopology_id,
                source_topics=list(s.source_topics),
                source_topic_regex=list(s.source_topic_regex),
                state_changelog_topics=[info(x) for x in s.state_changelog_topics],
                repartition_sink_topics=list(s.repartition_sink_topics),
                repartition_source_topics=[info(x) for x in s.repartition_source_topics],
                copartition_groups=[
                    V.CopartitionGroup(
                        source_topics=list(c.source_topics),
                        source_topic_regex=list(c.source_topic_regex),
                        repartition_source_topics=list(c.repartition_source_topics),
                    )
                    for c in s.copartition_groups
                ],
            )
            for s in sorted(t.subtopologies, key=lambda s: s.subtopology_id)
        ],
    )
