"""SharePartitionManager: share sessions, share-partitions and their lock timers on one loop (Kafka's
SharePartitionManager with the share-group coordinator beside it).

Every share structure lives on the group coordinator's loop: a ShareFetch from any network processor hops there
with `call()`, so acquisitions, acknowledgements and lock expiry never race and need no lock. Reads of the log
happen on that loop too; they are reads of the page cache of whole batches, bounded by the request's byte limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kbroker.broker.group_config import (
    SHARE_AUTO_OFFSET_RESET,
    SHARE_HEARTBEAT_INTERVAL_MS,
    SHARE_ISOLATION_LEVEL,
    SHARE_RECORD_LOCK_DURATION_MS,
    SHARE_SESSION_TIMEOUT_MS,
)
from kbroker.broker.purgatory import HIGH_WATERMARK
from kbroker.broker.share_partition import SharePartition
from kbroker.coordinator.group_coordinator import ShareGroupHooks, partition_for
from kbroker.coordinator.share_coordinator import HeartbeatResult, ShareCoordinator, ShareGroup
from kbroker.coordinator.share_group_records import ShareGroupRecord, TopicPartitions
from kbroker.coordinator.share_records import (
    SHARE_STATE_TOPIC,
    Snapshot,
    StateBatch,
    coordinator_key,
    load_snapshots,
    snapshot_key,
    snapshot_value,
)
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import (
    DeleteShareGroupStateRequest,
    InitializeShareGroupStateRequest,
    ReadShareGroupStateRequest,
    ReadShareGroupStateSummaryRequest,
    WriteShareGroupStateRequest,
)
from kbroker.protocol.records import build_batch
from kbroker.storage.errors import StorageError

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

T = TypeVar("T")
log = logging.getLogger("kbroker.share")
_SWEEP_S = 0.1
# how long a state write is retried while the share coordinator is away: about as long as Kafka's persister
# takes over its 5 attempts backing off 1, 2, 4 and 8 s (PersisterStateManager), below a client's
# request.timeout.ms (30 s)
_WRITE_RETRY_S = 15.0
_RETRIABLE_WRITE = (
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.BROKER_NOT_AVAILABLE,
)
# how long a new share-partition leader keeps asking the share coordinator before its fetch answers without it
_READ_RETRY_S = 5.0
# a state write refused because the share coordinator's state of the share-partition changed since it was read
# a write refused because the state changed (FENCED_STATE_EPOCH) or is gone (INVALID_REQUEST: an uninitialized
# share-partition): the leader drops its share-partition and reads the state again
_FENCED_STATE = (ErrorCode.FENCED_STATE_EPOCH, ErrorCode.INVALID_REQUEST)
# Kafka's ShareCoordinatorShard messages for a share-partition with no state
READ_UNINITIALIZED = "Read operation on uninitialized share partition not allowed."
WRITE_UNINITIALIZED = "Write operation on uninitialized share partition not allowed."
_DONE_STATES = (2, 4)  # a state batch's Acknowledged and Archived
# how often an idle share-partition's leader checks its state epoch at the share coordinator
_IDLE_CHECK_S = 2.0
_DURATION = re.compile(r"p(?:(\d+)d)?(?:t(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?)?")


@dataclass
class ShareSession:
    epoch: int
    partitions: set[tuple[bytes, int]] = field(default_factory=set)
    # the connection that opened the session: its close releases what the member holds (Kafka 4.1+)
    conn: Any = None


def duration_ms(text: str) -> int:
    m = _DURATION.fullmatch(text.lower())
    if m is None:
        return 0
    d, h, mi, s = (float(x) if x else 0.0 for x in m.groups())
    return int((((d * 24 + h) * 60 + mi) * 60 + s) * 1000)


# a write to __consumer_offsets that failed: what a share-group request answers (Kafka's GroupCoordinatorService)
class _Unset:
    """No snapshot given: a failed write keeps the change (the sweeper's member expiry, retried anyway)."""


_UNSET = _Unset()

_GROUP_WRITE_ERRORS = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    # records too large for __consumer_offsets (Kafka's GroupCoordinatorService.handleOperationException)
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}
# the share coordinator's answer when its own append to __share_group_state fails (Kafka's
# CoordinatorOperationExceptionHelper, the same mapping with NETWORK_EXCEPTION as a coordinator still loading)
_STATE_WRITE_ERRORS = {**_GROUP_WRITE_ERRORS, ErrorCode.NETWORK_EXCEPTION: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}


def persister_error(code: int) -> int:
    """The error a share-partition answers an acknowledgement with when its state write failed with `code` (Kafka's
    SharePartition.fetchPersisterError, the exception then mapped back to its error code)."""
    if code in (
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
        return code
    if code in (ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.FENCED_STATE_EPOCH):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.UNKNOWN_SERVER_ERROR


class ShareGroupLoading(ShareGroupHooks):
    """The group coordinator's load of __consumer_offsets hands share-group records to the share coordinator
    (made then if no share-group request made it yet)."""

    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self._seen: set[int] = set()  # partitions whose load replayed share-group records

    def replay(self, record: ShareGroupRecord) -> None:
        spm = SharePartitionManager.of(self.server)
        spm.coordinator.replay(record)
        self._seen.add(self.server.group_coordinator.offsets_partition(record.group_id))

    def _groups(self, spm: SharePartitionManager, partition: int) -> list[str]:
        gc = self.server.group_coordinator
        return [gid for gid in spm.coordinator.groups if gc.offsets_partition(gid) == partition]

    def loaded(self, partition: int) -> None:
        spm = SharePartitionManager.existing(self.server)
        if spm is None or partition not in self._seen:
            return
        self._seen.discard(partition)
        groups = self._groups(spm, partition)
        spm.coordinator.loaded(groups)
        if groups:
            spm.ensure_sweeper()
            log.info("Loaded %d share groups of __consumer_offsets-%d", len(groups), partition)

    def unloaded(self, partition: int) -> None:
        self._seen.discard(partition)
        spm = SharePartitionManager.existing(self.server)
        if spm is not None:
            spm.coordinator.unload(self._groups(spm, partition))


class SharePartitionManager:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self.loop = server.group_coordinator.loop
        cfg = server.config
        self.coordinator = ShareCoordinator(
            self._topics_view,
            lambda g: self._group_int(g, SHARE_SESSION_TIMEOUT_MS, "group.share.session.timeout.ms"),
            lambda g: self._group_int(g, SHARE_HEARTBEAT_INTERVAL_MS, "group.share.heartbeat.interval.ms"),
            cfg["group.share.max.size"],
            server.group_metadata_hash,
        )
        self.coordinator.on_member_removed = self._member_removed
        self.partitions: dict[tuple[str, str, int], SharePartition] = {}
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self._topics_cache: tuple[Any, dict[str, tuple[bytes, int]]] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._idle_check: asyncio.Task[None] | None = None
        # __share_group_state partition -> (its leader epoch when read, the latest snapshot of each
        # share-partition in it): read once per leadership, as another leader may have written it meanwhile
        self._snapshots: dict[int, tuple[int, dict[bytes, Snapshot]]] = {}
        # share-partition snapshot key -> the highest leader epoch that wrote or read it through this broker
        self._writer_epochs: dict[bytes, int] = {}
        # (group, topic, partition) -> its state as the share coordinator on another broker answered it
        self._read: dict[tuple[str, str, int], Snapshot | None] = {}
        # ShareFetches waiting for records (Kafka's delayed share fetch): woken by records made available again
        # (a release, a lock expiring, a session closing), by a start offset moving (room under the in-flight
        # limit) and, through the fetch purgatory, by new records under the high watermark
        self._fetch_waiters: set[asyncio.Future[None]] = set()
        self.changes = 0  # moves on every wake_fetches: a fetch that looked before it moved looks again

    @staticmethod
    def existing(server: KafkaServer) -> SharePartitionManager | None:
        """The server's manager if a share-group request ever made one (then share groups may exist)."""
        return getattr(server, "_share_partition_manager", None)

    async def list_groups(self) -> list[tuple[str, str]]:
        return [(g.group_id, g.state) for g in self.coordinator.groups.values()]

    async def delete_groups(self, group_ids: list[str]) -> dict[str, int]:
        """DeleteGroups of share groups: an empty group goes with the state of its share-partitions, tombstoned
        in __share_group_state by their share coordinators (Kafka's group coordinator deletes it through the
        persister, DeleteShareGroupState, before the group): a new group of the same name starts afresh by
        share.auto.offset.reset. A failed deletion answers its error and keeps the group, to be deleted again."""
        out: dict[str, int] = {}
        for gid in group_ids:
            group = self.coordinator.groups.get(gid)
            if group is None:
                continue
            if group.members:
                out[gid] = ErrorCode.NON_EMPTY_GROUP
                continue
            topics = group.topics | {k[1] for k in self.partitions if k[0] == gid}
            code = ErrorCode.NONE
            for name in sorted(topics):
                rec = self.server.metadata.topics.get(name)
                if rec is not None:
                    deleted = await self.delete_state(gid, name, rec.num_partitions)
                    code = code or deleted
            before = self.coordinator.snapshot(gid)
            out[gid] = code or self.coordinator.delete(gid)
            if out[gid] == ErrorCode.NONE:
                out[gid] = await self.write_group(gid, before)
        return out

    async def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed: list[str] | None,
        client_id: str,
        client_host: str,
    ) -> HeartbeatResult:
        """ShareGroupHeartbeat on the group coordinator: the change is answered once its records are in
        __consumer_offsets (replicated), as Kafka's coordinator runtime answers a write operation."""
        self.ensure_sweeper()
        before = self.coordinator.snapshot(group_id)
        r = self.coordinator.heartbeat(
            group_id, member_id, member_epoch, rack_id, subscribed, client_id, client_host
        )
        code = await self.write_group(group_id, before)
        if code:
            return HeartbeatResult(code, f"The share group's records were not written: {code.name}")
        if r.initialize:
            await self.initialize_state(group_id, r.initialize, r.state_epoch, -1)
            before = self.coordinator.snapshot(group_id)
            self.coordinator.catch_up(group_id, member_id, r)
            code = await self.write_group(group_id, before)
            if code:
                return HeartbeatResult(code, f"The share group's records were not written: {code.name}")
        return r

    async def write_group(self, group_id: str, before: ShareGroup | None | _Unset = _UNSET) -> ErrorCode:
        """Append the records of a share group's changes to its __consumer_offsets partition and wait until they
        are replicated; the error a share-group request answers when that fails. When the append itself fails,
        the group goes back to `before` (its snapshot taken before the changes), as Kafka's coordinator runtime
        reverts its state to the last written offset; records appended but not replicated in time stay, as in
        Kafka (they commit later, or the partition moves and the group is loaded again from the log)."""
        records = self.coordinator.drain(group_id)
        if not records:
            return ErrorCode.NONE
        gc = self.server.group_coordinator
        try:
            try:
                lg, info = gc._write(group_id, [r.entry() for r in records])
            except Exception:
                if not isinstance(before, _Unset):
                    self.coordinator.revert(group_id, before)
                    log.info("Share group %s: the change is rolled back", group_id)
                raise
            await gc._flush_if_needed(lg, info.last_offset)
        except KafkaError as e:
            log.warning("Share group %s: writing %d records failed: %s", group_id, len(records), e)
            return _GROUP_WRITE_ERRORS.get(e.code, e.code)
        except StorageError as e:  # refused by the log: a record too large, a storage failure
            log.warning("Share group %s: writing %d records failed: %r", group_id, len(records), e)
            return _GROUP_WRITE_ERRORS.get(e.error_code, ErrorCode.UNKNOWN_SERVER_ERROR)
        except Exception as e:  # noqa: BLE001 - the log went away (a move): the group is another broker's
            log.warning("Share group %s: writing %d records failed: %r", group_id, len(records), e)
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    async def initialize_state(
        self,
        group_id: str,
        tps: TopicPartitions,
        state_epoch: int,
        start_offset: int | dict[tuple[bytes, int], int],
    ) -> dict[tuple[bytes, int], int]:
        """The group coordinator initializes share-partitions' state (Kafka's persister initializeState): each
        share coordinator, this broker or another through InitializeShareGroupState (83), writes a snapshot with
        the state epoch and start offset (one for all, or per (topic id, partition)). The share-partitions it
        answered are recorded as initialized, the others go back to uninitialized (the next heartbeat tries
        again). Returns the error per (topic id, partition)."""
        errors: dict[tuple[bytes, int], int] = {}
        remote: dict[int, dict[bytes, list[tuple[int, int]]]] = {}
        for tid, (name, partitions) in tps.items():
            for index in partitions:
                start = start_offset if isinstance(start_offset, int) else start_offset[(tid, index)]
                try:
                    place = self._state_place(SharePartition(group_id, name, index, 0))
                    if place is None:
                        errors[(tid, index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    elif self._state_here(place[0]):
                        errors[(tid, index)] = await self.initialize_state_of(
                            group_id, tid, index, state_epoch, start
                        )
                    else:
                        leader = self._state_leader(place[0])
                        remote.setdefault(leader, {}).setdefault(tid, []).append((index, start))
                except KafkaError as e:
                    errors[(tid, index)] = e.code
        Q = InitializeShareGroupStateRequest
        for leader, topics in remote.items():
            req = Q(
                group_id=group_id,
                topics=[
                    Q.InitializeStateData(
                        topic_id=tid,
                        partitions=[
                            Q.PartitionData(partition=i, state_epoch=state_epoch, start_offset=o)
                            for i, o in ps
                        ],
                    )
                    for tid, ps in topics.items()
                ],
            )
            try:
                r = await self.server.inter_broker.send(leader, 83, 0, req)
                for t in r.results:
                    for p in t.partitions:
                        errors[(bytes(t.topic_id), p.partition)] = p.error_code
            except (KafkaError, OSError) as e:
                code = getattr(e, "code", ErrorCode.COORDINATOR_NOT_AVAILABLE)
                for tid, ps in topics.items():
                    for i, _ in ps:
                        errors[(tid, i)] = code
        done: TopicPartitions = {}
        failed: TopicPartitions = {}
        for tid, (name, partitions) in tps.items():
            for index in partitions:
                into = failed if errors.get((tid, index), ErrorCode.UNKNOWN_SERVER_ERROR) else done
                into.setdefault(tid, (name, []))[1].append(index)
        if failed:
            log.info("Share group %s: initializing the state of %s failed: %s", group_id, failed, errors)
        before = self.coordinator.snapshot(group_id)
        self.coordinator.initialized(group_id, done, failed)
        code = await self.write_group(group_id, before)
        if code:  # the share-partitions stay initializing: the next heartbeat initializes them again
            for tid, (_, partitions) in done.items():
                for index in partitions:
                    errors[(tid, index)] = code
        return errors

    @classmethod
    def of(cls, server: KafkaServer) -> SharePartitionManager:
        """The server's manager, made on first use: a broker without share consumers carries none of it."""
        spm = getattr(server, "_share_partition_manager", None)
        if spm is None:
            spm = cls(server)
            server._share_partition_manager = spm  # type: ignore[attr-defined]
        return spm

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> Awaitable[T]:
        return self.server.group_coordinator.call(fn, *args)

    # ------------------------------------------------------------ configs

    @property
    def delivery_limit(self) -> int:
        return int(self.server.config["group.share.delivery.count.limit"])

    @property
    def max_locks(self) -> int:
        return int(self.server.config["group.share.partition.max.record.locks"])

    def _group_int(self, group_id: str, name: str, broker_key: str) -> int:
        raw = self.server.consumer_group_config(group_id).get(name)
        return int(raw) if raw is not None else int(self.server.config[broker_key])

    def lock_ms(self, group_id: str) -> int:
        return self._group_int(group_id, SHARE_RECORD_LOCK_DURATION_MS, "group.share.record.lock.duration.ms")

    def read_committed(self, group_id: str) -> bool:
        return self.server.consumer_group_config(group_id).get(SHARE_ISOLATION_LEVEL) == "read_committed"

    def _topics_view(self) -> Mapping[str, tuple[bytes, int]]:
        topics = self.server.metadata.topics
        cache = self._topics_cache
        if cache is None or cache[0] is not topics:
            cache = self._topics_cache = (
                topics,
                {
                    n: (rec.topic_id, rec.num_partitions)
                    for n, rec in topics.items()
                    if not n.startswith("__")
                },
            )
        return cache[1]

    # ------------------------------------------------------------ timers

    def ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = self.loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        last_members = last_idle = 0.0
        while True:
            await asyncio.sleep(_SWEEP_S)
            now = time.monotonic()
            limit = self.delivery_limit
            self.drop_stale()
            expired = False
            for sp in self.partitions.values():
                expired = sp.expire_locks(now, limit) or expired
            if expired:
                self.wake_fetches()
            await self.persist()
            if now - last_idle >= _IDLE_CHECK_S and (self._idle_check is None or self._idle_check.done()):
                last_idle = now
                # its own task: reading state epochs from other brokers never holds up lock expiry
                self._idle_check = self.loop.create_task(self._check_idle())
            if now - last_members >= 1.0:
                last_members = now
                for gid in self.coordinator.expire_members():
                    code = await self.write_group(gid)
                    if code:
                        log.warning(
                            "Share group %s: removing expired members not written: %s", gid, code.name
                        )

    async def _check_idle(self) -> None:
        """A busy share-partition learns that its state changed at the share coordinator (AlterShareGroupOffsets
        or DeleteShareGroupOffsets and DeleteGroups reached another broker) from its next write, fenced by the
        state epoch; an idle one writes nothing, so it reads the state epoch (ReadShareGroupStateSummary) and
        is dropped when it differs or its state was deleted: the next fetch reads the state again."""
        for key, sp in list(self.partitions.items()):
            await self._check_state(key, sp)

    async def check_states(self, group_id: str, partitions: set[tuple[bytes, int]]) -> None:
        """A share session opening (a new consumer; after AlterShareGroupOffsets or DeleteShareGroupOffsets the
        group had none): its idle share-partitions check their state epoch before they deliver anything."""
        names = self.server.topic_names_by_id()
        for topic_id, index in partitions:
            key = (group_id, names.get(topic_id, ""), index)
            sp = self.partitions.get(key)
            if sp is not None:
                await self._check_state(key, sp)

    async def _check_state(self, key: tuple[str, str, int], sp: SharePartition) -> None:
        if sp.dirty or sp.locks_held() or (sp.writing is not None and not sp.writing.done()):
            return
        try:
            epoch, start = await self._state_epoch(sp)
        except (KafkaError, OSError):
            return
        if self.partitions.get(key) is not sp or sp.dirty or sp.locks_held():
            return  # in use meanwhile: its own write will tell
        deleted = epoch == 0 and start < 0 and sp.snapshot_epoch > 0
        if epoch != sp.state_epoch or deleted:
            self._fenced(sp, f"state epoch {epoch} at the share coordinator, {sp.state_epoch} here")

    async def _state_epoch(self, sp: SharePartition) -> tuple[int, int]:
        """(state epoch, start offset) of sp's state at its share coordinator; (0, -1) when there is none."""
        place = self._state_place(sp)
        if place is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, sp.topic)
        part, key = place
        if self._state_here(part):
            saved = self._state_snapshots(part).get(key)
            return (saved[3], saved[1]) if saved is not None else (0, -1)
        Q = ReadShareGroupStateSummaryRequest
        rec = self.server.metadata.topics[sp.topic]
        r = await self.server.inter_broker.send(
            self._state_leader(part),
            87,
            1,
            Q(
                group_id=sp.group_id,
                topics=[
                    Q.ReadStateSummaryData(
                        topic_id=rec.topic_id,
                        partitions=[Q.PartitionData(partition=sp.partition, leader_epoch=-1)],
                    )
                ],
            ),
        )
        p = r.results[0].partitions[0]
        if p.error_code:
            raise KafkaError(p.error_code, "ReadShareGroupStateSummary")
        return p.state_epoch, p.start_offset

    def wake_fetches(self) -> None:
        """Something a waiting ShareFetch may acquire now: every waiter looks again (they are few: one per
        member with nothing to fetch, and looking costs little)."""
        self.changes += 1
        waiters, self._fetch_waiters = self._fetch_waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def waiting_fetches(self) -> int:
        return len(self._fetch_waiters)

    async def wait_for_records(
        self, keys: list[tuple[str, int]], until: float, seen: tuple[int, int]
    ) -> None:
        """Until the share state changes (wake_fetches), a watched partition's high watermark moves, or until;
        at once if either moved since `seen` (this manager's and the purgatory's generations when the fetch
        last looked)."""
        purgatory = self.server.replica_manager.purgatory
        left = until - time.monotonic()
        if left <= 0 or purgatory.closing:
            return
        fut: asyncio.Future[None] = self.loop.create_future()
        waiter = purgatory.watch(keys, HIGH_WATERMARK)
        try:
            if (self.changes, purgatory.generation) != seen:
                return
            self._fetch_waiters.add(fut)
            waiter.future.add_done_callback(lambda _f: fut.done() or fut.set_result(None))
            timer = self.loop.call_later(left, lambda: fut.done() or fut.set_result(None))
            try:
                await fut
            finally:
                timer.cancel()
        finally:
            purgatory.unwatch(waiter)
            self._fetch_waiters.discard(fut)

    def _member_removed(self, group_id: str, member_id: str) -> None:
        """As Kafka: the share coordinator does not reach into share-partitions (they live on the partition
        leaders). What the member holds stays acquired under its locks; a member fenced on a slow machine
        rejoins with the same id and its acknowledgements still count. The member's connection closing or
        its final-epoch request releases them sooner."""

    # ------------------------------------------------------------ share-partitions

    def leads(self, sp: SharePartition) -> bool:
        """Whether this broker still leads sp's partition. A new leader epoch while it stays the leader (the
        controller shrinking the ISR bumps it) keeps sp: this broker's view is the newest there is."""
        rm = self.server.replica_manager
        if rm.leads(sp.topic, sp.partition) is False:
            return False
        sp.leader_epoch = rm.leader_epoch(sp.topic, sp.partition)
        return True

    def drop_stale(self) -> None:
        """Forget share-partitions whose leadership moved: their state is the new leader's now, and writing this
        broker's stale view would overwrite it (a lock expiring here, an acknowledgement applied here). One
        dropped with changes never written is marked lost: acknowledgements applied to it are not confirmed."""
        for key in [k for k, sp in self.partitions.items() if not self.leads(sp)]:
            sp = self.partitions.pop(key)
            sp.lost = sp.dirty

    def drop(self, group_id: str, topic: str, partition: int) -> None:
        """Forget this broker's share-partition (its state changed at the share coordinator): the next fetch
        reads it again."""
        sp = self.partitions.pop((group_id, topic, partition), None)
        if sp is not None:
            sp.lost = True

    def share_partition(self, group_id: str, topic: str, partition: int, lg: Any) -> SharePartition:
        key = (group_id, topic, partition)
        sp = self.partitions.get(key)
        epoch = self.server.replica_manager.leader_epoch(topic, partition)
        if sp is not None and not self.leads(sp):
            sp = None
        if sp is None:
            sp = SharePartition(group_id, topic, partition, 0)
            sp.leader_epoch = epoch
            saved = self._saved_state(sp, fresh=True)
            if saved is None:
                # nobody initialized it (the group coordinator does, on the heartbeat that first subscribes to
                # it): Kafka's share coordinator refuses the read with INVALID_REQUEST, which its SharePartition
                # turns into an UnknownServerException for the fetch
                raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, READ_UNINITIALIZED)
            sp.state_epoch = saved[3]
            if saved[1] < 0:  # initialized without a start offset
                sp.reset(self._initial_offset(group_id, lg))
            else:
                sp.snapshot_epoch, start, batches, _ = saved
                sp.load(max(start, int(lg.log_start_offset)), batches)
                log.info(
                    "Share-partition %s %s-%d loaded from %s: start offset %d, %d in-flight batches",
                    group_id,
                    topic,
                    partition,
                    SHARE_STATE_TOPIC,
                    sp.start,
                    len(batches),
                )
            self.partitions[key] = sp
            self.ensure_sweeper()  # lock expiry and state checks run where share-partitions live
        return sp

    # ------------------------------------------------------------ __share_group_state

    def _state_place(self, sp: SharePartition) -> tuple[int, bytes] | None:
        rec = self.server.metadata.topics.get(sp.topic)
        if rec is None:
            return None
        state = self.server.metadata.topics.get(SHARE_STATE_TOPIC)
        if state is None:
            cfg = self.server.config
            try:
                state = self.server.admin.create_topic(
                    SHARE_STATE_TOPIC,
                    cfg["share.coordinator.state.topic.num.partitions"],
                    self.server._internal_rf("share.coordinator.state.topic.replication.factor"),
                    {"cleanup.policy": "compact", "compression.type": "producer"},
                )
            except KafkaError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise
                state = self.server._created_elsewhere(SHARE_STATE_TOPIC)
        ck = coordinator_key(sp.group_id, rec.topic_id, sp.partition)
        return partition_for(ck, state.num_partitions), snapshot_key(sp.group_id, rec.topic_id, sp.partition)

    def _saved_state(self, sp: SharePartition, fresh: bool = False) -> Snapshot | None:
        """The last snapshot of sp in this broker's replica of its __share_group_state partition (read again when
        fresh: after a leader change another broker wrote it)."""
        place = self._state_place(sp)
        if place is None:
            return None
        part, key = place
        if fresh and not self._state_here(part):
            read_key = (sp.group_id, sp.topic, sp.partition)
            if read_key in self._read:
                return self._read.pop(read_key)
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"reading {read_key} from its share coordinator"
            )
        return self._state_snapshots(part, fresh).get(key)

    def _state_snapshots(self, part: int, fresh: bool = False) -> dict[bytes, Snapshot]:
        """The latest snapshots in this broker's replica of a __share_group_state partition: cached while its
        leader epoch stays the same (this broker's own writes keep the cache current), read again when fresh
        or after a leadership change (records written through another leader came by replication)."""
        epoch = self.server.replica_manager.leader_epoch(SHARE_STATE_TOPIC, part)
        cached = self._snapshots.get(part)
        if cached is not None and not fresh and cached[0] == epoch:
            return cached[1]
        snaps = load_snapshots(self._state_log(part))
        self._snapshots[part] = (epoch, snaps)
        return snaps

    def _coordinated(self, group_id: str, topic_id: bytes, partition: int, invalid: bool = False) -> tuple[int, int]:
        """The share coordinator's checks, in Kafka's order, before a state RPC is served here: (error, the
        __share_group_state partition holding the share-partition's state). `invalid`: the request's other
        fields are out of range (INVALID_REQUEST, as a negative partition)."""
        state = self.server.metadata.topics.get(SHARE_STATE_TOPIC)
        if state is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1
        if partition < 0 or invalid:
            return ErrorCode.INVALID_REQUEST, -1
        part = partition_for(coordinator_key(group_id, topic_id, partition), state.num_partitions)
        if not self._state_here(part):
            return ErrorCode.NOT_COORDINATOR, part
        name = self.server.topic_names_by_id().get(topic_id)
        rec = self.server.metadata.topics.get(name) if name is not None else None
        if rec is None or partition >= rec.num_partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, part
        return ErrorCode.NONE, part

    def _state_here(self, part: int) -> bool:
        """Whether this broker is the share coordinator of a __share_group_state partition: its leader, or the
        single node (no controller) where every partition is local."""
        leads = self.server.replica_manager.leads(SHARE_STATE_TOPIC, part)
        return leads is True or (leads is None and self.server.controller is None)

    def _state_leader(self, part: int) -> int:
        leaders = self.server.metadata.topics[SHARE_STATE_TOPIC].leaders
        leader = leaders[part] if 0 <= part < len(leaders) else -1
        if leader is None or leader < 0:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{SHARE_STATE_TOPIC}-{part} has no leader")
        return int(leader)

    async def prepare(self, group_id: str, topic: str, partition: int, until: float | None = None) -> None:
        """Before a share-partition is made here: when the share coordinator of its state is another broker, ask
        it with ReadShareGroupState (Kafka's persister reads the same way), so a leader without a replica of
        __share_group_state resumes from the saved state. A retriable error leaves the share-partition
        loading; the next fetch asks again."""
        key = (group_id, topic, partition)
        sp = self.partitions.get(key)
        if sp is not None and self.leads(sp):
            return
        # an answer read before and never used is stale by now: never load from it
        self._read.pop(key, None)
        probe = SharePartition(group_id, topic, partition, 0)
        place = self._state_place(probe)
        if place is None or self._state_here(place[0]):
            return
        rec = self.server.metadata.topics[topic]
        epoch = self.server.replica_manager.leader_epoch(topic, partition)
        # retried for a few seconds, or until the fetch that needs it must answer (then its next one asks again)
        deadline = time.monotonic() + _READ_RETRY_S if until is None else until
        while True:
            try:
                self._read[key] = await self._read_remote(group_id, rec.topic_id, partition, place[0], epoch)
                return
            except (KafkaError, OSError) as e:
                code = getattr(e, "code", None)
                if code == ErrorCode.INVALID_REQUEST:
                    self._read[key] = None  # uninitialized: the fetch answers for it rather than waiting
                    return
                if (code is not None and code not in _RETRIABLE_WRITE) or time.monotonic() >= deadline:
                    log.info("Could not read the state of share-partition %s: %s", key, e)
                    return
                await asyncio.sleep(0.2)

    async def _read_remote(
        self, group_id: str, topic_id: bytes, partition: int, state_partition: int, leader_epoch: int
    ) -> Snapshot | None:
        Q = ReadShareGroupStateRequest
        leader = self._state_leader(state_partition)
        r = await self.server.inter_broker.send(
            leader,
            84,
            0,
            Q(
                group_id=group_id,
                topics=[
                    Q.ReadStateData(
                        topic_id=topic_id,
                        partitions=[Q.PartitionData(partition=partition, leader_epoch=leader_epoch)],
                    )
                ],
            ),
        )
        p = r.results[0].partitions[0]
        if p.error_code:
            raise KafkaError(p.error_code, f"ReadShareGroupState from broker {leader}: {p.error_message}")
        return (
            0,
            p.start_offset,
            [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in p.state_batches],
            p.state_epoch,
        )

    async def read_state(
        self, group_id: str, topic_id: bytes, partition: int, leader_epoch: int
    ) -> tuple[int, int, int, list[StateBatch]]:
        """The share coordinator's side of ReadShareGroupState: (error, state epoch, start offset, batches);
        INVALID_REQUEST for a share-partition nobody initialized (or whose state was deleted), as Kafka's. A read
        with a newer leader epoch fences the former leader's writes, as Kafka's
        readStateAndMaybeUpdateLeaderEpoch."""
        code, part = self._coordinated(group_id, topic_id, partition)
        if code:
            return code, 0, -1, []
        key = snapshot_key(group_id, topic_id, partition)
        try:
            # read again: a write through a former leader of this partition may have come by replication
            snaps = self._state_snapshots(part, fresh=True)
        except KafkaError as e:
            return e.code, 0, -1, []
        saved = snaps.get(key)
        if saved is None:
            return ErrorCode.INVALID_REQUEST, 0, 0, []
        if leader_epoch < self._writer_epochs.get(key, -1):
            return ErrorCode.FENCED_LEADER_EPOCH, 0, -1, []
        if leader_epoch >= 0:
            self._writer_epochs[key] = leader_epoch
        return ErrorCode.NONE, saved[3], saved[1], saved[2]

    async def read_summary(
        self, group_id: str, topic_id: bytes, partition: int
    ) -> tuple[int, int, int, int, int]:
        """The share coordinator's side of ReadShareGroupStateSummary: (error, state epoch, leader epoch, start
        offset, delivery complete count); start offset -1 when nothing was written. Fences nothing (Kafka's
        summary is a plain read)."""
        code, part = self._coordinated(group_id, topic_id, partition)
        if code:
            return code, 0, -1, -1, -1
        key = snapshot_key(group_id, topic_id, partition)
        try:
            snaps = self._state_snapshots(part, fresh=True)
        except KafkaError as e:
            return e.code, 0, -1, -1, -1
        saved = snaps.get(key)
        if saved is None:
            return ErrorCode.NONE, 0, -1, -1, -1
        done = sum(la - f + 1 for f, la, st, _ in saved[2] if st in _DONE_STATES)
        return ErrorCode.NONE, saved[3], self._writer_epochs.get(key, -1), saved[1], done

    async def summary(self, group_id: str, topic: str, partition: int) -> tuple[int, int, int]:
        """(error, start offset, records acknowledged or archived past it) of a share-partition's saved state, from
        the share coordinator: this broker's log, or another broker through ReadShareGroupStateSummary (87)."""
        sp = SharePartition(group_id, topic, partition, 0)
        try:
            place = self._state_place(sp)
            if place is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, 0
            if self._state_here(place[0]):
                saved = self._saved_state(sp)
                if saved is None:
                    return ErrorCode.NONE, -1, 0
                return (
                    ErrorCode.NONE,
                    saved[1],
                    sum(la - f + 1 for f, la, st, _ in saved[2] if st in _DONE_STATES),
                )
            Q = ReadShareGroupStateSummaryRequest
            rec = self.server.metadata.topics[topic]
            leader = self._state_leader(place[0])
            r = await self.server.inter_broker.send(
                leader,
                87,
                1,
                Q(
                    group_id=group_id,
                    topics=[
                        Q.ReadStateSummaryData(
                            topic_id=rec.topic_id,
                            partitions=[Q.PartitionData(partition=partition, leader_epoch=-1)],
                        )
                    ],
                ),
            )
        except KafkaError as e:
            return e.code, -1, 0
        except OSError:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, 0
        p = r.results[0].partitions[0]
        return p.error_code, p.start_offset, max(p.delivery_complete_count, 0)

    def _state_log(self, part: int) -> Any:
        """This broker's replica of a __share_group_state partition, leader or follower: a share-partition's new
        leader reads its state there (every broker holds a replica with the default replication factor 3 on
        three brokers; a broker without one finds no state)."""
        rm = self.server.replica_manager
        replica = rm.partitions.get((SHARE_STATE_TOPIC, part))
        if replica is not None:
            return replica.log
        if self.server.controller is None:
            return rm.get_log(SHARE_STATE_TOPIC, part)
        # a replica whose LeaderAndIsr has not come yet: retriable, as a coordinator still loading answers
        raise KafkaError(
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{SHARE_STATE_TOPIC}-{part} is not here yet"
        )

    async def persist(self) -> dict[tuple[str, str, int], int]:
        """Write a ShareSnapshot of every share-partition changed since its last one to the leader of its
        __share_group_state partition (this broker, or another through WriteShareGroupState) and wait until it
        is replicated: an acknowledgement is answered once it survives the loss of this broker. Returns the
        share-partitions (group, topic, partition) whose write failed, with the error code: their
        acknowledgements must not be confirmed."""
        writes = []
        failed: dict[tuple[str, str, int], int] = {}
        self.drop_stale()
        for sp in self.partitions.values():
            if not sp.dirty:
                if sp.writing is not None and not sp.writing.done():
                    # another request's write holds this request's changes too: answer once it is replicated
                    writes.append((sp, self._settled(sp.writing)))
                continue
            try:
                place = self._state_place(sp)
                if place is None:
                    continue
                rec = self.server.metadata.topics[sp.topic]
            except Exception as e:  # noqa: BLE001 - kept dirty: the next sweep tries again
                self._write_failed(sp, e)
                failed[(sp.group_id, sp.topic, sp.partition)] = ErrorCode.COORDINATOR_NOT_AVAILABLE
                continue
            sp.dirty = False
            sp.snapshot_epoch += 1
            # a task: the snapshot is taken now, written after the one before it (or skipped for a newer one),
            # awaited by later requests too
            sp.writing = self.loop.create_task(
                self._write_in_turn(
                    sp,
                    sp.writing,
                    sp.snapshot_epoch,
                    (
                        sp.group_id,
                        rec.topic_id,
                        sp.partition,
                        place[0],
                        sp.start,
                        sp.state_batches(),
                        sp.leader_epoch,
                        sp.state_epoch,
                    ),
                )
            )
            sp.writing.add_done_callback(lambda t, sp=sp: self._written(sp, t))
            writes.append((sp, self._settled(sp.writing)))
        for sp, write in writes:
            try:
                await write
            except Exception as e:  # noqa: BLE001 - logged once, by _written
                # a write that never got an answer (the share coordinator's broker gone) is Kafka's persister
                # failing to find the coordinator
                if isinstance(e, KafkaError):
                    code = e.code
                elif isinstance(e, OSError):
                    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
                else:  # Kafka's persister failing outright: an IllegalStateException for the acknowledgement
                    code = ErrorCode.UNKNOWN_SERVER_ERROR
                failed[(sp.group_id, sp.topic, sp.partition)] = persister_error(code)
        return failed

    @staticmethod
    async def _settled(task: asyncio.Task[Any]) -> None:
        """Until the snapshot written by task, or by the newer write that superseded it, is replicated: a
        skipped write is not a durable one, so its waiters follow the write that carries their changes."""
        while task is not None:
            task = await asyncio.shield(task)

    def _written(self, sp: SharePartition, task: asyncio.Task[Any]) -> None:
        e = None if task.cancelled() else task.exception()
        if e is None:
            return
        if isinstance(e, KafkaError) and e.code in _FENCED_STATE:
            self._fenced(sp, e)
            return
        sp.dirty = True  # the next sweep tries again
        self._write_failed(sp, e)

    def _fenced(self, sp: SharePartition, why: object) -> None:
        """The share coordinator holds a newer state of sp than this leader (AlterShareGroupOffsets or
        DeleteShareGroupOffsets initialized or deleted it, Kafka's state epoch): drop sp, so the next fetch
        reads the state again, as Kafka's SharePartitionManager drops a fenced share-partition."""
        key = (sp.group_id, sp.topic, sp.partition)
        if self.partitions.get(key) is sp:
            del self.partitions[key]
            sp.lost = True
            log.info("Share-partition %s %s-%d dropped, its state changed: %s", *key, why)

    def persist_dirty(self) -> None:
        """persist() in the background, for callers that need not wait."""
        self.loop.create_task(self.persist())

    @staticmethod
    def _write_failed(sp: SharePartition, e: BaseException) -> None:
        log.warning(
            "Could not write the state of share-partition %s %s-%d to %s: %s",
            sp.group_id,
            sp.topic,
            sp.partition,
            SHARE_STATE_TOPIC,
            e,
        )

    async def _write_in_turn(
        self, sp: SharePartition, before: asyncio.Task[Any] | None, epoch: int, args: tuple[Any, ...]
    ) -> asyncio.Task[Any] | None:
        """One snapshot write of sp, in order; retried while the __share_group_state leader is away (Kafka's
        persister retries the same way), so an acknowledgement waits for a failover rather than being lost.
        Returns None once written, or the newer write that superseded this one without writing it: the
        changes are durable only when that one is (`_settled` follows it)."""
        if before is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(before)
        deadline = time.monotonic() + _WRITE_RETRY_S
        while True:
            newer = sp.writing
            if sp.snapshot_epoch > epoch and newer is not None and not newer.done():
                return newer  # a newer snapshot of sp is queued behind this one: it carries these changes
            try:
                await self._write_state(*args)
                return None
            except (KafkaError, OSError) as e:
                code = getattr(e, "code", None)
                if (code is not None and code not in _RETRIABLE_WRITE) or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _write_state(
        self,
        group_id: str,
        topic_id: bytes,
        partition: int,
        state_partition: int,
        start: int,
        batches: list[StateBatch],
        leader_epoch: int,
        state_epoch: int,
    ) -> None:
        if not self._state_here(state_partition):
            leader = self._state_leader(state_partition)
            W = WriteShareGroupStateRequest
            r = await self.server.inter_broker.send(
                leader,
                85,
                0,
                W(
                    group_id=group_id,
                    topics=[
                        W.WriteStateData(
                            topic_id=topic_id,
                            partitions=[
                                W.PartitionData(
                                    partition=partition,
                                    state_epoch=state_epoch,
                                    leader_epoch=leader_epoch,
                                    start_offset=start,
                                    state_batches=[
                                        W.StateBatch(
                                            first_offset=f,
                                            last_offset=la,
                                            delivery_state=st,
                                            delivery_count=c,
                                        )
                                        for f, la, st, c in batches
                                    ],
                                )
                            ],
                        )
                    ],
                ),
            )
            code = r.results[0].partitions[0].error_code
            if code:
                raise KafkaError(code, f"WriteShareGroupState to broker {leader}")
            return
        code = await self.write_state(
            group_id, topic_id, partition, start, batches, leader_epoch, state_epoch
        )
        if code:
            raise KafkaError(code, "WriteShareGroupState")

    async def write_state(
        self,
        group_id: str,
        topic_id: bytes,
        partition: int,
        start: int,
        batches: list[StateBatch],
        leader_epoch: int,
        state_epoch: int = 0,
    ) -> int:
        """The share coordinator's side of WriteShareGroupState: a snapshot appended to this broker's
        __share_group_state partition and replicated (acks=all) before the answer. A state epoch below the
        saved one (InitializeShareGroupState changed the state since the writer read it) is fenced,
        FENCED_STATE_EPOCH, as Kafka's; a share-partition nobody initialized, or whose state was deleted since
        (DeleteShareGroupState), is INVALID_REQUEST, as Kafka's write to an uninitialized share-partition."""
        state = self.server.metadata.topics.get(SHARE_STATE_TOPIC)
        if state is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        part = partition_for(coordinator_key(group_id, topic_id, partition), state.num_partitions)
        if not self._state_here(part):
            return ErrorCode.NOT_COORDINATOR
        key = snapshot_key(group_id, topic_id, partition)
        try:
            snaps = self._state_snapshots(part)
        except KafkaError as e:
            return e.code
        saved = snaps.get(key)
        if saved is None:
            return ErrorCode.INVALID_REQUEST
        if leader_epoch < self._writer_epochs.get(key, -1):
            # a former leader of the share-partition still writing its stale view (Kafka's share coordinator
            # fences it the same way)
            return ErrorCode.FENCED_LEADER_EPOCH
        if saved[3] > state_epoch:
            return ErrorCode.FENCED_STATE_EPOCH
        self._writer_epochs[key] = leader_epoch
        epoch = saved[0] + 1
        value = snapshot_value(epoch, leader_epoch, start, batches, state_epoch)
        return await self._append_state(
            part, key, value, lambda: snaps.__setitem__(key, (epoch, start, batches, state_epoch))
        )

    async def initialize_state_of(
        self, group_id: str, topic_id: bytes, partition: int, state_epoch: int, start: int
    ) -> int:
        """The share coordinator's side of InitializeShareGroupState (Kafka's ShareCoordinatorShard.initializeState):
        a snapshot with the new state epoch and start offset (-1: the leader applies share.auto.offset.reset)
        and no in-flight batches, replicated before the answer; a state epoch below the saved one is
        FENCED_STATE_EPOCH. Initializing without a start offset a share-partition that has state already (the
        group coordinator retrying after a restart or a failed answer) keeps that state and its epoch."""
        code, part = self._coordinated(group_id, topic_id, partition, invalid=state_epoch < 0)
        if code:
            return code
        key = snapshot_key(group_id, topic_id, partition)
        try:
            snaps = self._state_snapshots(part, fresh=True)
        except KafkaError as e:
            return e.code
        saved = snaps.get(key)
        if saved is not None and saved[3] > state_epoch:
            return ErrorCode.FENCED_STATE_EPOCH
        if saved is not None and start < 0:
            return ErrorCode.NONE  # initialized already (a group coordinator retrying): nothing to fence
        batches: list[StateBatch] = []
        epoch = saved[0] + 1 if saved is not None else 1
        leader_epoch = self._writer_epochs.get(key, -1)
        value = snapshot_value(epoch, leader_epoch, start, batches, state_epoch)
        return await self._append_state(
            part, key, value, lambda: snaps.__setitem__(key, (epoch, start, batches, state_epoch))
        )

    async def _append_state(
        self, part: int, key: bytes, value: bytes | None, appended: Callable[[], object]
    ) -> int:
        """Append a snapshot (or its tombstone) to __share_group_state; `appended` updates the cache once the log
        took it; on a leader, the answer waits until it is replicated (acks=all)."""
        rm = self.server.replica_manager
        leads = rm.leads(SHARE_STATE_TOPIC, part)
        try:
            lg, info = rm.append(
                SHARE_STATE_TOPIC,
                part,
                build_batch([(key, value, [], int(time.time() * 1000))]),
                -1 if leads else 1,
            )
        except KafkaError as e:
            return _STATE_WRITE_ERRORS.get(e.code, e.code)
        except StorageError as e:  # refused by the log: a record too large, a failed log dir
            return _STATE_WRITE_ERRORS.get(e.error_code, ErrorCode.UNKNOWN_SERVER_ERROR)
        appended()
        if leads:
            code = int(await self.server.wait_replicated(lg, info.last_offset + 1))
            return _STATE_WRITE_ERRORS.get(code, code)
        return ErrorCode.NONE

    async def delete_state(self, group_id: str, topic: str, num_partitions: int) -> int:
        """DeleteShareGroupOffsets: drop the share-partitions of topic and have their share coordinators tombstone
        their snapshots (this broker, or another through DeleteShareGroupState, 86), so neither this broker nor
        a new leader finds them again. Returns the first error."""
        rec = self.server.metadata.topics.get(topic)
        if rec is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        first = ErrorCode.NONE
        for index in range(num_partitions):
            code = await self.delete_partition_state(group_id, rec.topic_id, topic, index)
            if code and not first:
                first = code
        return first

    async def delete_partition_state(self, group_id: str, topic_id: bytes, topic: str, index: int) -> int:
        """Drop one share-partition here and have its share coordinator (this broker or another, through
        DeleteShareGroupState) tombstone its snapshot. Returns the error."""
        sp = self.partitions.pop((group_id, topic, index), None)
        if sp is not None and sp.writing is not None and not sp.writing.done():
            # a snapshot still on its way would land after the tombstone and bring the state back
            with contextlib.suppress(Exception):
                await self._settled(sp.writing)
        sp = sp or SharePartition(group_id, topic, index, 0)
        try:
            place = self._state_place(sp)
            if place is None:
                return ErrorCode.NONE
            if self._state_here(place[0]):
                code = await self.delete_state_of(group_id, topic_id, index)
            else:
                Q = DeleteShareGroupStateRequest
                r = await self.server.inter_broker.send(
                    self._state_leader(place[0]),
                    86,
                    0,
                    Q(
                        group_id=group_id,
                        topics=[
                            Q.DeleteStateData(
                                topic_id=topic_id, partitions=[Q.PartitionData(partition=index)]
                            )
                        ],
                    ),
                )
                code = r.results[0].partitions[0].error_code
        except KafkaError as e:
            code = e.code
        except OSError:
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        return code

    async def delete_state_of(self, group_id: str, topic_id: bytes, partition: int) -> int:
        """The share coordinator's side of DeleteShareGroupState: the snapshot tombstoned and replicated before
        the answer; a share-partition never written is nothing to delete."""
        code, part = self._coordinated(group_id, topic_id, partition)
        if code:
            return code
        key = snapshot_key(group_id, topic_id, partition)
        try:
            snaps = self._state_snapshots(part, fresh=True)
        except KafkaError as e:
            return e.code
        if key not in snaps:
            return ErrorCode.NONE
        return await self._append_state(part, key, None, lambda: snaps.pop(key, None))

    def _initial_offset(self, group_id: str, lg: Any) -> int:
        """Kafka's share.auto.offset.reset, applied when a share-partition is first read."""
        reset = (
            self.server.consumer_group_config(group_id).get(SHARE_AUTO_OFFSET_RESET, "latest").strip().lower()
        )
        if reset == "earliest":
            return int(lg.log_start_offset)
        if reset.startswith("by_duration:"):
            ts = int(time.time() * 1000) - duration_ms(reset.removeprefix("by_duration:"))
            found = lg.offset_for_timestamp(ts)
            return int(found[0]) if found is not None else int(lg.high_watermark)
        return int(lg.high_watermark)

    @staticmethod
    def knows_member(group_id: str, member_id: str) -> bool:
        """ShareFetch's and ShareAcknowledge's member check: a member id is required, but, as in Kafka, the
        share-partition leader does not ask the group coordinator whether it is a member (only the share
        session binds it). Checking it here where this broker coordinates the group raced the group's own
        creation: a broker that had not yet heard of __consumer_offsets took itself for the coordinator and
        refused a member the real coordinator had just admitted."""
        return bool(member_id)

    def connection_closed(self, conn: Any) -> None:
        """Kafka 4.1+'s connection-disconnect listener: the sessions this connection opened end, and what
        their members hold is available again at once rather than when the locks expire."""
        for (group_id, member_id), s in list(self.sessions.items()):
            if s.conn is conn:
                self.release_session(group_id, member_id)
        self.persist_dirty()

    def release_session(self, group_id: str, member_id: str) -> None:
        self.sessions.pop((group_id, member_id), None)
        limit = self.delivery_limit
        released = False
        for (g, _, _), sp in self.partitions.items():
            if g == group_id:
                released = sp.release_member(member_id, limit) or released
        if released:
            self.wake_fetches()

    def session_for(
        self, group_id: str, member_id: str, epoch: int, conn: Any = None
    ) -> tuple[ShareSession | None, int]:
        """Kafka's ShareSessionCache rules: epoch 0 opens (replacing any), -1 closes, otherwise the next epoch.

        Replacing a session releases nothing (Kafka's newContext only removes the old one from the cache): a
        client that restarts its session after an error keeps its acquired records and can still acknowledge
        them."""
        key = (group_id, member_id)
        if epoch == 0:
            s = self.sessions[key] = ShareSession(1, conn=conn)
            if conn is not None and not getattr(conn, "_share_close_hooked", False):
                conn._share_close_hooked = True
                conn.close_hooks.append(lambda: self.loop.call_soon_threadsafe(self.connection_closed, conn))
            return s, ErrorCode.NONE
        s = self.sessions.get(key)
        if s is None:
            return None, ErrorCode.SHARE_SESSION_NOT_FOUND
        if epoch == -1:
            return s, ErrorCode.NONE
        if epoch != s.epoch:
            return None, ErrorCode.INVALID_SHARE_SESSION_EPOCH
        s.epoch = epoch + 1 if epoch < 2**31 - 1 else 1
        return s, ErrorCode.NONE
