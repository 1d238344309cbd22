"""GroupCoordinator: the classic consumer group protocol, as Kafka's GroupCoordinator, and (mixed in from
consumer_group_manager) KIP-848 consumer groups.

All group state lives on one event loop (coordinator_loop: in the broker, the first network
processor's; standalone, a thread of its own); handlers call in with `call()` (a task on that loop,
from another loop a thread hop), so the state machine needs no locks. Committed offsets and group
metadata are appended to the compacted __consumer_offsets topic (Kafka's record schemas) and
reloaded from it at startup.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kbroker.coordinator import consumer_group_records as cgr
from kbroker.coordinator import group_records as records
from kbroker.coordinator import streams_group_records as sgr
from kbroker.coordinator.consumer_group_migration import ConsumerGroupMigration
from kbroker.coordinator.coordinator_loop import CoordinatorLoop
from kbroker.coordinator.group_loader import LoadedEntry, LoadedMarker, LoadedRecord, read_entries
from kbroker.coordinator.group_metadata import GroupMetadata, GroupState, MemberMetadata
from kbroker.coordinator.group_offsets import GroupOffsets, validate_current_member
from kbroker.coordinator.share_group_records import ShareGroupRecord
from kbroker.coordinator.streams_group_manager import StreamsGroupManager
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, build_batch
from kbroker.storage.errors import NotLeaderOrFollowerError

log = logging.getLogger("kbroker.group")

OFFSETS_TOPIC = "__consumer_offsets"


@functools.lru_cache(maxsize=8192)
def java_string_hash(s: str) -> int:
    # Cached: the same group and transactional ids come back on every request (produce verification asks for
    # the transactional id's partition per request), and the loop below is per UTF-16 unit.
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's Utils.abs(groupId.hashCode) % offsets.topic.num.partitions."""
    h = java_string_hash(group_id)
    return (0 if h == -(2**31) else abs(h)) % partitions


class CoordinatorHost(Protocol):
    """What the coordinator needs from the broker it runs in."""

    def offsets_log(self, partition: int) -> Any: ...  # storage Log of __consumer_offsets-partition (we lead it)

    def leads_offsets_partition(self, partition: int) -> bool: ...

    def topic_partition_exists(self, topic: str, partition: int) -> bool: ...

    def flush_log(self, lg: Any, offset: int) -> Awaitable[None]: ...

    def wait_replicated(self, lg: Any, offset: int) -> Awaitable[ErrorCode]: ...  # high watermark >= offset

    def consumer_group_topics(self) -> Any: ...  # topic name -> record with topic_id, num_partitions (copy-on-write)

    def consumer_group_config(self, group_id: str) -> Mapping[str, str]: ...  # the group's config overrides


@dataclass
class GroupConfig:
    num_partitions: int = 50
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_ms: int = 600000
    offset_metadata_max_bytes: int = 4096
    # KIP-848 consumer groups (group.consumer.*)
    consumer_session_timeout_ms: int = 45000
    consumer_heartbeat_interval_ms: int = 5000
    consumer_max_size: int = 2**31 - 1
    consumer_assignors: list[str] = field(default_factory=lambda: ["uniform", "range"])
    # group.consumer.migration.policy: disabled, upgrade, downgrade or bidirectional
    consumer_migration_policy: str = "bidirectional"
    # KIP-1071 streams groups (group.streams.*)
    streams_session_timeout_ms: int = 45000
    streams_heartbeat_interval_ms: int = 5000
    streams_max_size: int = 2**31 - 1
    streams_num_standby_replicas: int = 0
    streams_initial_rebalance_delay_ms: int = 3000


@dataclass
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False


def _now_ms() -> int:
    return int(time.time() * 1000)


class ShareGroupHooks:
    """Where KIP-932 share groups' records go at load: the broker's share coordinator (made on first use, in
    broker.share_partition_manager) plugs itself in; without share groups these do nothing."""

    def replay(self, record: ShareGroupRecord) -> None: ...

    def loaded(self, partition: int) -> None: ...

    def unloaded(self, partition: int) -> None: ...


class GroupCoordinator(GroupOffsets, ConsumerGroupMigration, StreamsGroupManager, CoordinatorLoop):
    def __init__(self, host: CoordinatorHost, config: GroupConfig,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """loop: an event loop run by someone else (coordinator_loop); without one, a loop of its own."""
        self.host = host
        self.config = config
        self.groups: dict[str, GroupMetadata] = {}
        self.txn_groups: dict[int, set[str]] = {}
        self.loading: set[int] = set()
        self.resigned = False  # the broker is stopping: no group is coordinated here any more (resign)
        self.share_hooks: ShareGroupHooks = ShareGroupHooks()
        self._init_loop(loop, "group-coordinator")

    # ------------------------------------------------------------ lifecycle

    def start(self, partitions: list[int]) -> None:
        """Start the loop (when it is the coordinator's own) and load the given __consumer_offsets partitions in the
        background."""
        self._start_own_loop()
        self.loading = set(partitions)
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._load_all(partitions)))
        self.loop.call_soon_threadsafe(self._schedule_sweeps)

    def load_partition(self, p: int) -> None:
        """This broker became leader of __consumer_offsets-p: load its groups (Kafka's onElection).
        Callable from any thread; requests for its groups answer COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        def begin() -> None:
            if p in self.loading:
                return
            self.loading.add(p)
            self.loop.create_task(self._load_all([p]))
        self.loop.call_soon_threadsafe(begin)

    def unload_partition(self, p: int) -> None:
        """This broker is no longer leader of __consumer_offsets-p: forget its groups (Kafka's onResignation);
        their members find the new coordinator with NOT_COORDINATOR."""
        self.loop.call_soon_threadsafe(self._unload, p)

    def _unload(self, p: int) -> None:
        self.loading.discard(p)
        self.share_hooks.unloaded(p)
        gone = [g for gid, g in self.groups.items() if self.offsets_partition(gid) == p]
        for g in gone:
            del self.groups[g.group_id]
            if g.rebalance_timer is not None:
                g.rebalance_timer.cancel()
            g.clear_pending_sync()
            for m in g.members.values():
                if m.heartbeat_timer is not None:
                    m.heartbeat_timer.cancel()
                for fut in (m.join_future, m.sync_future):
                    if fut is not None and not fut.done():
                        fut.set_result(JoinResult(ErrorCode.NOT_COORDINATOR, m.member_id)
                                       if fut is m.join_future else (ErrorCode.NOT_COORDINATOR, b""))
        names = {g.group_id for g in gone}
        for pid in list(self.txn_groups):
            self.txn_groups[pid] -= names
            if not self.txn_groups[pid]:
                del self.txn_groups[pid]
        if gone:
            log.info("Unloaded %d groups of %s-%d", len(gone), OFFSETS_TOPIC, p)

    def resign(self) -> None:
        """The broker is stopping: members waiting in JoinGroup or SyncGroup are answered NOT_COORDINATOR now, and
        so is every group request after, instead of the waits holding the broker's shutdown for the network
        processors' grace period (5 s). After a controlled shutdown the groups have moved already; on a single
        node the members look for the coordinator until it is back. Callable from any thread."""
        def resign() -> None:
            self.resigned = True
            for p in sorted({self.offsets_partition(gid) for gid in self.groups}):
                self._unload(p)
        self.loop.call_soon_threadsafe(resign)

    def stop(self) -> None:
        """End the coordinator's own loop; a borrowed loop ends with its owner (the broker stops its network
        processors first). Groups are in __consumer_offsets already."""
        if not self._owns_loop:
            return
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._join_own_loop()

    def _schedule_sweeps(self) -> None:
        self.loop.call_later(self.config.offsets_retention_check_ms / 1000, self._expire_offsets_tick)

    # ------------------------------------------------------------ loading

    async def _load_all(self, partitions: list[int]) -> None:
        for p in partitions:
            t0 = time.monotonic()
            try:
                n = await self._load_partition(p)
            except Exception:
                log.exception("Loading %s-%d failed", OFFSETS_TOPIC, p)
                n = 0
            self._drop_offsetless_groups(p)
            self.loading.discard(p)
            self.consumer_groups_loaded(p)
            self.streams_groups_loaded(p)
            self.share_hooks.loaded(p)
            if n:
                log.info("Loaded %d records of %s-%d in %.3f s", n, OFFSETS_TOPIC, p, time.monotonic() - t0)

    def _drop_offsetless_groups(self, p: int) -> None:
        """A group only used to store offsets (generation 0) whose offsets were all deleted has no tombstone of its
        own (Kafka writes none for generation 0): as Kafka's loader, it is not a group once its offsets are gone."""
        for gid, g in list(self.groups.items()):
            if (self.offsets_partition(gid) == p and g.generation_id == 0 and not g.members and not g.offsets
                    and not g.pending_txn_offsets and g.consumer is None and g.streams is None):
                del self.groups[gid]

    async def _load_partition(self, p: int) -> int:
        """Replay the partition up to its end. Markers written meanwhile (their complete_txn is ignored while
        the partition loads) are read too: the log end is checked again on this loop before loading ends."""
        lg = self.host.offsets_log(p)
        name = f"{OFFSETS_TOPIC}-{p}"
        start, n = lg.log_start_offset, 0
        while True:
            end = lg.log_end_offset
            if start >= end:
                return n
            entries = await self.loop.run_in_executor(None, read_entries, lg, start, end, name)
            for e in entries:
                self._replay(p, e)
            n += len(entries)
            start = end

    def _replay(self, p: int, e: LoadedEntry) -> None:
        try:
            if isinstance(e, LoadedMarker):
                self._complete_txn(e.producer_id, p, e.commit)
            elif isinstance(e.record, records.OffsetRecord):
                self._replay_offset(e)
            elif isinstance(e.record, cgr.ConsumerGroupRecord):
                self.replay_consumer_record(e.record)
            elif isinstance(e.record, sgr.StreamsGroupRecord):
                self.replay_streams_record(e.record)
            elif isinstance(e.record, ShareGroupRecord):
                self.share_hooks.replay(e.record)
            else:
                self._apply_loaded(e)
        except Exception:
            log.exception("Could not apply the record at offset %d of %s-%d, skipping it", e.offset, OFFSETS_TOPIC, p)

    def _apply_loaded(self, e: LoadedRecord) -> None:
        r = e.record
        assert isinstance(r, records.GroupRecord)
        if r.value is None:
            g = self.groups.get(r.group)
            if g is not None and g.consumer is None:
                # Offsets read before the tombstone stay (Kafka keeps them apart from the group).
                if g.offsets or g.pending_txn_offsets:
                    g.members, g.static_members, g.state = {}, {}, GroupState.EMPTY
                else:
                    self.groups.pop(r.group, None)
            return
        v = r.value
        g = self._group(r.group, create=True)
        assert g is not None
        if g.consumer is not None:
            log.warning("Classic group record for consumer group %s ignored", r.group)
            return
        g.protocol_type = v.protocol_type or None
        g.generation_id = v.generation
        g.protocol_name = v.protocol
        g.leader_id = v.leader
        g.state_timestamp_ms = v.current_state_timestamp
        for old in g.members.values():
            if old.heartbeat_timer is not None:
                old.heartbeat_timer.cancel()
        g.members = {}
        g.static_members = {}
        for m in v.members:
            member = MemberMetadata(
                m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout,
                m.session_timeout, v.protocol_type, [(v.protocol or "", m.subscription)], m.assignment,
            )
            g.members[m.member_id] = member
            if m.group_instance_id is not None:
                g.static_members[m.group_instance_id] = m.member_id
            self._touch_member(g, m.member_id)
        g.state = GroupState.STABLE if g.members else GroupState.EMPTY

    # ------------------------------------------------------------ helpers

    def _group(self, group_id: str, create: bool = False) -> GroupMetadata | None:
        g = self.groups.get(group_id)
        if g is None and create:
            g = self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=_now_ms())
        return g

    def offsets_partition(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    def coordinator_error(self, group_id: str) -> ErrorCode | None:
        p = self.offsets_partition(group_id)
        if self.resigned or not self.host.leads_offsets_partition(p):
            return ErrorCode.NOT_COORDINATOR
        if p in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return None

    def _write(self, group_id: str, entries: Sequence[tuple[bytes, bytes | None]], *,
               producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH) -> tuple[Any, Any]:
        """Append one batch of records for a group to its __consumer_offsets partition: transactional when
        producer_id is given (a TxnOffsetCommit; base sequence -1 as Kafka's coordinator writes it).
        Returns (log, LogAppendInfo); the caller awaits _flush_if_needed once its state is updated."""
        lg = self.host.offsets_log(self.offsets_partition(group_id))
        now = _now_ms()
        batch = build_batch([(k, v, [], now) for k, v in entries], producer_id=producer_id,
                            producer_epoch=producer_epoch, is_transactional=producer_id != NO_PRODUCER_ID)
        info = lg.append_as_leader(batch, now, leader_epoch=lg.leader_epoch, from_client=False)
        return lg, info

    async def _flush_if_needed(self, lg: Any, last_offset: int) -> None:
        """Wait until durable per the log's flush policy."""
        if lg.unflushed_messages >= lg.config.flush_messages:
            await self.host.flush_log(lg, last_offset)
        if lg.high_watermark <= last_offset:
            # A replicated __consumer_offsets partition: the write counts once the ISR has it (acks=all).
            code = await self.host.wait_replicated(lg, last_offset + 1)
            if code != ErrorCode.NONE:
                raise KafkaError(code, f"{lg.name} did not replicate offset {last_offset}: {code.name}")

    async def _store_group(self, g: GroupMetadata) -> None:
        lg, info = self._write(g.group_id, [(records.group_key(g.group_id), records.group_value(g))])
        await self._flush_if_needed(lg, info.last_offset)

    # ------------------------------------------------------------ join

    async def join_group(self, group_id: str, member_id: str, instance_id: str | None, require_known_member: bool,
                         client_id: str, client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
                         protocol_type: str, protocols: list[tuple[str, bytes]],
                         supports_skip_assignment: bool = True) -> JoinResult:
        """supports_skip_assignment: the request is JoinGroup v9+ (KIP-814), so a rejoining static leader can be
        told it leads while skipping the assignment."""
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id)
        err = self.coordinator_error(group_id)
        if err is not None:
            return JoinResult(err, member_id)
        c = self.config
        if not c.min_session_timeout_ms <= session_timeout_ms <= c.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        g = self.groups.get(group_id)
        if g is not None and g.streams is not None and not g.streams.members:
            # An empty streams group becomes a classic group keeping its offsets (an application going back to
            # group.protocol=classic), as Kafka converts it.
            await self.convert_empty_streams_group(group_id)
            g = self.groups.get(group_id)
        if g is not None and g.streams is not None:
            # A streams group (KIP-1071) with members takes no classic member, as Kafka answers.
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if g is not None and g.consumer is not None:
            # A KIP-848 consumer group with members serves the classic member (online migration); an empty one
            # becomes a classic group, keeping its offsets.
            if g.consumer.members:
                return await self.classic_join_to_consumer_group(
                    g, member_id, instance_id, require_known_member, client_id, client_host, rebalance_timeout_ms,
                    session_timeout_ms, protocol_type, protocols)
            await self.convert_empty_consumer_group(group_id)
            g = self.groups.get(group_id)
            if g is None or g.consumer is not None:
                return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if g is None:
            if member_id:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            g = self._group(group_id, create=True)
            assert g is not None
        if g.state is GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not g.supports_protocols(protocol_type, [n for n, _ in protocols]):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        args = (instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols)
        if not member_id:
            return await self._unknown_member_join(g, require_known_member, *args,
                                                   supports_skip_assignment=supports_skip_assignment)
        return await self._known_member_join(g, member_id, *args)

    async def _unknown_member_join(self, g: GroupMetadata, require_known_member: bool, instance_id: str | None,
                                   client_id: str, client_host: str, rebalance_timeout_ms: int,
                                   session_timeout_ms: int, protocol_type: str,
                                   protocols: list[tuple[str, bytes]], supports_skip_assignment: bool = True
                                   ) -> JoinResult:
        new_id = f"{client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            old_id = g.static_members.get(instance_id)
            if old_id is not None:
                return await self._static_member_rejoin(g, instance_id, old_id, new_id, protocols,
                                                        rebalance_timeout_ms, session_timeout_ms,
                                                        supports_skip_assignment)
        elif require_known_member:
            g.pending_members.add(new_id)
            self.loop.call_later(session_timeout_ms / 1000, self._expire_pending, g.group_id, new_id)
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id)
        if len(g.members) >= self.config.max_size:
            return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, new_id)
        member = MemberMetadata(new_id, instance_id, client_id, client_host, rebalance_timeout_ms,
                                session_timeout_ms, protocol_type, protocols)
        return await self._add_member_and_rebalance(g, member)

    async def _static_member_rejoin(self, g: GroupMetadata, instance_id: str, old_id: str, new_id: str,
                                    protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
                                    session_timeout_ms: int, supports_skip_assignment: bool) -> JoinResult:
        """Kafka's updateStaticMemberAndRebalance: a known group.instance.id joins with a fresh member id."""
        current_leader = g.leader_id
        member = g.replace_static_member(instance_id, old_id, new_id)
        log.info("Static member %s of group %s rejoined as %s", instance_id, g.group_id, new_id)
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        self._touch_member(g, new_id)
        if g.state is GroupState.STABLE and g.protocol_name == g.select_protocol():
            # The selected protocol does not change: hand back the current generation, no rebalance (KIP-345).
            # The subscription bytes may differ (owned partitions, generation in cooperative metadata): Kafka does
            # not compare them either.
            await self._store_group(g)
            if supports_skip_assignment:
                is_leader = g.leader_id == new_id
                return JoinResult(
                    ErrorCode.NONE, new_id, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id or "",
                    self._member_list(g) if is_leader else [], skip_assignment=is_leader,
                )
            # Before JoinGroup v9 the old leader id is returned, so a rejoining leader does not run a trivial
            # assignment that a Stable group would ignore anyway.
            return JoinResult(ErrorCode.NONE, new_id, g.generation_id, g.protocol_type, g.protocol_name,
                              current_leader or "")
        return await self._update_member_and_rebalance(g, member)

    async def _known_member_join(self, g: GroupMetadata, member_id: str, instance_id: str | None,
                                 client_id: str, client_host: str, rebalance_timeout_ms: int,
                                 session_timeout_ms: int, protocol_type: str,
                                 protocols: list[tuple[str, bytes]]) -> JoinResult:
        if member_id in g.pending_members:
            g.pending_members.discard(member_id)
            if len(g.members) >= self.config.max_size:
                return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, member_id)
            member = MemberMetadata(member_id, instance_id, client_id, client_host, rebalance_timeout_ms,
                                    session_timeout_ms, protocol_type, protocols)
            return await self._add_member_and_rebalance(g, member)
        fenced = self._fenced(g, member_id, instance_id)
        if fenced is not None:
            return JoinResult(fenced, member_id)
        member = g.members[member_id]
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if g.state is GroupState.PREPARING_REBALANCE:
            member.protocols = protocols
            return await self._update_member_and_rebalance(g, member)
        if g.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                return self._current_generation(g, member_id)
            member.protocols = protocols
            return await self._update_member_and_rebalance(g, member)
        if g.state is GroupState.STABLE:
            if g.leader_id == member_id or not member.matches(protocols):
                member.protocols = protocols
                return await self._update_member_and_rebalance(g, member)
            return self._current_generation(g, member_id)
        return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)

    @staticmethod
    def _fenced(g: GroupMetadata, member_id: str, instance_id: str | None) -> ErrorCode | None:
        return validate_current_member(g, member_id, instance_id)

    def _member_list(self, g: GroupMetadata) -> list[tuple[str, str | None, bytes]]:
        assert g.protocol_name is not None
        return [(m.member_id, m.group_instance_id, m.metadata_for(g.protocol_name)) for m in g.members.values()]

    def _current_generation(self, g: GroupMetadata, member_id: str) -> JoinResult:
        return JoinResult(
            ErrorCode.NONE, member_id, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id or "",
            self._member_list(g) if g.leader_id == member_id else [],
        )

    async def _add_member_and_rebalance(self, g: GroupMetadata, member: MemberMetadata) -> JoinResult:
        member.join_future = self.loop.create_future()
        g.add_member(member)
        g.new_member_added = True
        log.info("Member %s joins group %s (%s)", member.member_id, g.group_id, g.state.value)
        self._maybe_prepare_rebalance(g, f"adding member {member.member_id}")
        return await self._await_join(g, member)

    async def _update_member_and_rebalance(self, g: GroupMetadata, member: MemberMetadata) -> JoinResult:
        member.join_future = self.loop.create_future()
        self._maybe_prepare_rebalance(g, f"updating member {member.member_id}")
        return await self._await_join(g, member)

    async def _await_join(self, g: GroupMetadata, member: MemberMetadata) -> JoinResult:
        assert member.join_future is not None
        fut = member.join_future
        if g.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(g)
        result = await fut
        if result == "FENCED":
            return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member.member_id)
        return result  # type: ignore[no-any-return]

    def _maybe_prepare_rebalance(self, g: GroupMetadata, reason: str) -> None:
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(g, reason)

    def _prepare_rebalance(self, g: GroupMetadata, reason: str) -> None:
        if g.state is GroupState.COMPLETING_REBALANCE:
            for m in g.members.values():
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result((ErrorCode.REBALANCE_IN_PROGRESS, b""))
                m.sync_future = None
        initial = g.state is GroupState.EMPTY
        g.in_initial_delay = False
        g.transition(GroupState.PREPARING_REBALANCE, _now_ms())
        log.info("Preparing to rebalance group %s in state PreparingRebalance with old generation %d (%s)",
                 g.group_id, g.generation_id, reason)
        g.clear_pending_sync()  # Kafka's removeSyncExpiration
        if g.rebalance_timer is not None:
            g.rebalance_timer.cancel()
        timeout = g.max_rebalance_timeout_ms() / 1000
        if initial and self.config.initial_rebalance_delay_ms > 0:
            delay = min(self.config.initial_rebalance_delay_ms / 1000, timeout)
            g.new_member_added = False
            g.in_initial_delay = True
            g.rebalance_timer = self.loop.call_later(delay, self._initial_delay_expired, g, timeout - delay)
        else:
            g.rebalance_timer = self.loop.call_later(timeout, self._complete_join, g)

    def _initial_delay_expired(self, g: GroupMetadata, remaining: float) -> None:
        """Kafka's InitialDelayedJoin: keep waiting while new members keep arriving, up to the rebalance timeout."""
        g.rebalance_timer = None
        if g.state is not GroupState.PREPARING_REBALANCE or not g.in_initial_delay:
            return
        if g.new_member_added and remaining > 0:
            g.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms / 1000, remaining)
            g.rebalance_timer = self.loop.call_later(delay, self._initial_delay_expired, g, remaining - delay)
            return
        g.in_initial_delay = False
        if g.all_members_joined() or remaining <= 0:
            self._complete_join(g)
        else:
            g.rebalance_timer = self.loop.call_later(remaining, self._complete_join, g)

    def _maybe_complete_join(self, g: GroupMetadata) -> None:
        if g.state is not GroupState.PREPARING_REBALANCE or not g.all_members_joined():
            return
        if g.in_initial_delay:
            return  # the initial delay decides
        self._complete_join(g)

    def _complete_join(self, g: GroupMetadata) -> None:
        if g.state is not GroupState.PREPARING_REBALANCE:
            return
        if g.rebalance_timer is not None:
            g.rebalance_timer.cancel()
            g.rebalance_timer = None
        g.in_initial_delay = False
        for m in g.not_yet_rejoined():
            if m.group_instance_id is None:
                log.info("Removing member %s of group %s: it did not rejoin in time", m.member_id, g.group_id)
                g.remove_member(m.member_id)
        g.pending_members.clear()
        g.generation_id += 1
        now = _now_ms()
        if not g.members:
            # Kafka keeps the protocol type of an empty group: clients tell consumer groups from simple ones by it.
            g.protocol_name = None
            g.leader_id = None
            g.transition(GroupState.EMPTY, now)
            log.info("Group %s with generation %d is now empty", g.group_id, g.generation_id)
            self.loop.create_task(self._store_quietly(g))
            return
        g.protocol_name = g.select_protocol()
        if g.leader_id not in g.members or g.members[g.leader_id].join_future is None:
            joined = [m for m in g.members.values() if m.join_future is not None]
            g.leader_id = (joined[0] if joined else next(iter(g.members.values()))).member_id
        g.transition(GroupState.COMPLETING_REBALANCE, now)
        log.info("Stabilized group %s generation %d (protocol %s) with %d members",
                 g.group_id, g.generation_id, g.protocol_name, len(g.members))
        for m in g.members.values():
            fut, m.join_future = m.join_future, None
            self._touch_member(g, m.member_id)
            if fut is not None and not fut.done():
                fut.set_result(self._current_generation(g, m.member_id))
        # Kafka's schedulePendingSync: members that do not send SyncGroup within the rebalance timeout are removed.
        g.clear_pending_sync()
        g.pending_sync.update(g.members)
        g.sync_timer = self.loop.call_later(g.max_rebalance_timeout_ms() / 1000, self._sync_expired, g,
                                            g.generation_id)

    def _sync_expired(self, g: GroupMetadata, generation_id: int) -> None:
        """Kafka's onExpirePendingSync: the members of this generation that never synced leave, and the group
        rebalances (empty at once when no member is left)."""
        g.sync_timer = None
        if self.groups.get(g.group_id) is not g or generation_id != g.generation_id or not g.pending_sync:
            return
        if g.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        expired = list(g.pending_sync)
        for member_id in expired:
            member = g.remove_member(member_id)
            if member is not None:
                self._cancel_member_futures(member)
        g.pending_sync.clear()
        log.info("Group %s removed members that did not send SyncGroup in time: %s", g.group_id, expired)
        self._prepare_rebalance(g, "pending sync expired")
        self._maybe_complete_join(g)

    async def _store_quietly(self, g: GroupMetadata) -> None:
        try:
            await self._store_group(g)
        except Exception as e:  # noqa: BLE001 - logged by _store_failed
            _store_failed("metadata", g.group_id, e)

    def _expire_pending(self, group_id: str, member_id: str) -> None:
        g = self.groups.get(group_id)
        if g is not None and member_id in g.pending_members:
            g.pending_members.discard(member_id)
            self._maybe_complete_join(g)

    # ------------------------------------------------------------ sync

    async def sync_group(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
                         protocol_type: str | None, protocol_name: str | None,
                         assignments: dict[str, bytes]) -> tuple[ErrorCode, bytes, str | None, str | None]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, b"", None, None
        err = self.coordinator_error(group_id)
        if err is not None:
            # Loading lost the rebalance in flight: the member rejoins without looking for its coordinator again
            # (older clients do not expect COORDINATOR_LOAD_IN_PROGRESS here; Kafka's handleSyncGroup).
            return (ErrorCode.REBALANCE_IN_PROGRESS if err == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else err,
                    b"", None, None)
        g = self.groups.get(group_id)
        if g is not None and g.streams is not None:
            # A streams group (KIP-1071) has no classic members, as Kafka answers.
            return ErrorCode.UNKNOWN_MEMBER_ID, b"", None, None
        if g is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, b"", None, None
        if g.consumer is not None:
            return self.classic_sync_to_consumer_group(g, generation_id, member_id, instance_id, protocol_type,
                                                       protocol_name)
        if g.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, b"", None, None
        fenced = self._fenced(g, member_id, instance_id)
        if fenced is not None:
            return fenced, b"", None, None
        if generation_id != g.generation_id:
            return ErrorCode.ILLEGAL_GENERATION, b"", None, None
        if (protocol_type is not None and protocol_type != g.protocol_type) or (
            protocol_name is not None and protocol_name != g.protocol_name
        ):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL, b"", None, None
        member = g.members[member_id]
        self._touch_member(g, member_id)
        if g.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS, b"", None, None
        if g.state is GroupState.STABLE:
            self._synced(g, member_id)
            return ErrorCode.NONE, member.assignment, g.protocol_type, g.protocol_name
        if g.state is not GroupState.COMPLETING_REBALANCE:
            return ErrorCode.UNKNOWN_MEMBER_ID, b"", None, None
        self._synced(g, member_id)
        fut: asyncio.Future[Any] = self.loop.create_future()
        member.sync_future = fut
        if member_id == g.leader_id:
            gen = g.generation_id
            for m in g.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            try:
                await self._store_group(g)
                error = ErrorCode.NONE
            except Exception as e:  # noqa: BLE001 - logged by _store_failed
                _store_failed("the assignment", g.group_id, e)
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            if g.state is GroupState.COMPLETING_REBALANCE and g.generation_id == gen:
                if error is ErrorCode.NONE:
                    g.transition(GroupState.STABLE, _now_ms())
                    log.info("Assignment received from leader %s for group %s for generation %d",
                             member_id, g.group_id, gen)
                for m in g.members.values():
                    if m.sync_future is not None and not m.sync_future.done():
                        m.sync_future.set_result((error, m.assignment if error is ErrorCode.NONE else b""))
                    m.sync_future = None
                    if error is ErrorCode.NONE:
                        self._touch_member(g, m.member_id)  # Kafka's propagateAssignment
                if error is not ErrorCode.NONE:
                    self._prepare_rebalance(g, "failed to store the assignment")
        result = await fut
        if result == "FENCED":
            return ErrorCode.FENCED_INSTANCE_ID, b"", None, None
        code, assignment = result
        return code, assignment, g.protocol_type, g.protocol_name

    @staticmethod
    def _synced(g: GroupMetadata, member_id: str) -> None:
        g.pending_sync.discard(member_id)
        if not g.pending_sync and g.sync_timer is not None:
            g.sync_timer.cancel()
            g.sync_timer = None

    # ------------------------------------------------------------ heartbeat / leave

    async def heartbeat(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> ErrorCode:
        if not group_id:  # Kafka's validateGroupStatus: only offset and describe/delete APIs accept ""
            return ErrorCode.INVALID_GROUP_ID
        err = self.coordinator_error(group_id)
        if err is not None:
            # Kafka's handleHeartbeat answers a loading coordinator's heartbeats blindly with NONE.
            return ErrorCode.NONE if err == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else err
        g = self.groups.get(group_id)
        if g is not None and g.streams is not None:
            # A streams group (KIP-1071) has no classic members, as Kafka answers.
            return ErrorCode.UNKNOWN_MEMBER_ID
        if g is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if g.consumer is not None:
            return self.classic_heartbeat_to_consumer_group(g, generation_id, member_id, instance_id)
        if g.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if g.state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        fenced = self._fenced(g, member_id, instance_id)
        if fenced is not None:
            return fenced
        if generation_id != g.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        self._touch_member(g, member_id)
        if g.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    async def leave_group(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, []
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, []
        g = self.groups.get(group_id)
        if g is not None and g.streams is not None:
            # A streams group (KIP-1071) has no classic members, as Kafka answers.
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID for _ in leaving]
        if g is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID for _ in leaving]
        if g.consumer is not None:
            return await self.classic_leave_to_consumer_group(g, leaving)
        results = []
        removed = False
        for member_id, instance_id in leaving:
            if instance_id is not None:
                current = g.static_members.get(instance_id)
                if current is None:
                    results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != current:
                    results.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                member_id = current
            if member_id in g.pending_members:
                g.pending_members.discard(member_id)
                results.append(ErrorCode.NONE)
                removed = True
                continue
            member = g.remove_member(member_id)
            if member is None:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            log.info("Member %s has left group %s", member_id, g.group_id)
            self._cancel_member_futures(member)
            results.append(ErrorCode.NONE)
            removed = True
        if removed:
            self._after_member_removed(g, "member left")
        return ErrorCode.NONE, results

    def _cancel_member_futures(self, member: MemberMetadata) -> None:
        for fut in (member.join_future, member.sync_future):
            if fut is not None and not fut.done():
                fut.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id)
                               if fut is member.join_future else (ErrorCode.UNKNOWN_MEMBER_ID, b""))

    def _after_member_removed(self, g: GroupMetadata, reason: str) -> None:
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(g, reason)
            # Kafka's prepareRebalance tries to complete the join at once: with no member left the group is Empty.
            self._maybe_complete_join(g)
        elif g.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(g)

    def _touch_member(self, g: GroupMetadata, member_id: str) -> None:
        """The member's session restarts now; it expires exactly at its deadline (Kafka's
        completeAndScheduleNextHeartbeatExpiration and DelayedHeartbeat).

        A timer armed for an earlier deadline is kept: it fires, sees the later deadline and re-arms, so
        heartbeats do not churn timer handles.
        """
        m = g.members[member_id]
        deadline = self.loop.time() + m.session_timeout_ms / 1000
        m.heartbeat_deadline = deadline
        if m.heartbeat_timer is not None:
            if m.heartbeat_timer_at <= deadline:
                return
            m.heartbeat_timer.cancel()
        m.heartbeat_timer_at = deadline
        m.heartbeat_timer = self.loop.call_at(deadline, self._heartbeat_expired, g, m)

    def _heartbeat_expired(self, g: GroupMetadata, m: MemberMetadata) -> None:
        m.heartbeat_timer = None
        if self.groups.get(g.group_id) is not g or g.members.get(m.member_id) is not m:
            return
        now = self.loop.time()
        if m.heartbeat_deadline > now or m.join_future is not None or m.sync_future is not None:
            # Heartbeated since, or waiting in a rebalance, which counts as alive (Kafka's hasSatisfiedHeartbeat):
            # check again at the deadline.
            at = m.heartbeat_deadline if m.heartbeat_deadline > now else now + m.session_timeout_ms / 1000
            m.heartbeat_timer_at = at
            m.heartbeat_timer = self.loop.call_at(at, self._heartbeat_expired, g, m)
            return
        log.info("Member %s in group %s has failed (session timeout %d ms), removing it",
                 m.member_id, g.group_id, m.session_timeout_ms)
        g.remove_member(m.member_id)
        self._after_member_removed(g, "session timeout")

    # ------------------------------------------------------------ admin

    async def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupMetadata | None]:
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, None
        return ErrorCode.NONE, self.groups.get(group_id)

    async def list_groups(self) -> tuple[ErrorCode, list[GroupMetadata]]:
        if self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        return ErrorCode.NONE, [g for g in self.groups.values() if g.state is not GroupState.DEAD]


def _store_failed(what: str, group_id: str, e: Exception) -> None:
    """A group write that did not replicate (the partition moved or lost its ISR) is expected while brokers come and
    go: one line. Anything else comes with its traceback."""
    if isinstance(e, (KafkaError, NotLeaderOrFollowerError)):
        log.warning("Could not store %s of group %s: %s", what, group_id, e)
    else:
        log.error("Could not store %s of group %s", what, group_id, exc_info=e)
