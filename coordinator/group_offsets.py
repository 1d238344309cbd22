"""Committed offsets of the group coordinator: OffsetCommit, TxnOffsetCommit and its markers, OffsetFetch,
offset expiry, DeleteGroups and OffsetDelete (Kafka's GroupCoordinator / OffsetMetadataManager offset paths).

GroupOffsets is mixed into GroupCoordinator and runs on its loop like the rest of it. Transactional offset
commits (KIP-98, KIP-447) are written as one transactional batch of the producer and stay pending per producer
id until the broker writes the transaction's marker to the group's __consumer_offsets partition and calls
complete_txn. A plain tombstone (DeleteGroups, OffsetDelete, expiry) removes pending transactional offsets of
the partition too, live and on reload, as Kafka's new group coordinator does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kbroker.coordinator import consumer_group_records as cgr
from kbroker.coordinator import group_records as records
from kbroker.coordinator import streams_group_records as sgr
from kbroker.coordinator.consumer_group_manager import ConsumerGroupManager
from kbroker.coordinator.group_loader import LoadedRecord
from kbroker.coordinator.group_metadata import GroupMetadata, GroupState, OffsetAndMetadata, TopicPartition
from kbroker.coordinator.streams_group_manager import StreamsGroupManager
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.records import NO_PRODUCER_ID

if TYPE_CHECKING:
    from kbroker.coordinator.consumer_group import ConsumerGroup
    from kbroker.coordinator.group_coordinator import CoordinatorHost, GroupConfig

log = logging.getLogger("kbroker.group")


def _now_ms() -> int:
    return int(time.time() * 1000)


def append_error(e: BaseException) -> ErrorCode:
    """Kafka's mapping of a failed __consumer_offsets append to the commit's error (GroupMetadataManager)."""
    code = ErrorCode(getattr(e, "error_code", ErrorCode.COORDINATOR_NOT_AVAILABLE))
    if isinstance(e, KafkaError):
        code = e.code
    if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return code


def validate_current_member(g: GroupMetadata, member_id: str, instance_id: str | None) -> ErrorCode | None:
    """Kafka's GroupCoordinator.validateCurrentMember: a static instance must be known and mapped to this member id,
    and the member must belong to the group."""
    if instance_id is not None:
        current = g.static_members.get(instance_id)
        if current is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if current != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
    return None if member_id in g.members else ErrorCode.UNKNOWN_MEMBER_ID


class GroupOffsets:
    if TYPE_CHECKING:
        host: CoordinatorHost
        config: GroupConfig
        groups: dict[str, GroupMetadata]
        loading: set[int]
        loop: asyncio.AbstractEventLoop
        # producer id -> groups holding its pending transactional offsets (Kafka's openGroupsForProducer)
        txn_groups: dict[int, set[str]]

        def coordinator_error(self, group_id: str) -> ErrorCode | None: ...
        def offsets_partition(self, group_id: str) -> int: ...
        def _group(self, group_id: str, create: bool = False) -> GroupMetadata | None: ...
        def _write(self, group_id: str, entries: Sequence[tuple[bytes, bytes | None]], *,
                   producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1) -> tuple[Any, Any]: ...
        async def _flush_if_needed(self, lg: Any, last_offset: int) -> None: ...
        def _touch_member(self, g: GroupMetadata, member_id: str) -> None: ...
        def _schedule_session_timeout(self, cg: ConsumerGroup, member_id: str) -> None: ...
        def replay_consumer_record(self, r: cgr.ConsumerGroupRecord, cg: ConsumerGroup | None = None) -> None: ...
        def replay_streams_record(self, r: sgr.StreamsGroupRecord, sg: Any = None) -> None: ...
        def validate_streams_offset_commit(self, sg: Any, member_id: str, member_epoch: int, transactional: bool,
                                           api_version: int, partitions: Any = ()) -> ErrorCode | None: ...
        @staticmethod
        def validate_consumer_offset_commit(cg: ConsumerGroup, member_id: str, member_epoch: int,
                                            transactional: bool, api_version: int) -> ErrorCode | None: ...

    # ------------------------------------------------------------ OffsetCommit

    async def commit_offsets(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
                             offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = 9
                             ) -> dict[TopicPartition, ErrorCode]:
        """generation_id is the member epoch for a KIP-848 consumer group (OffsetCommit v9+)."""
        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {tp: code for tp in offsets}

        # An empty group id is allowed here (Kafka's isValidGroupId keeps it for OffsetCommit, OffsetFetch,
        # DescribeGroups and DeleteGroups, for old clients that commit without a group).
        err = self.coordinator_error(group_id)
        if err is not None:
            return all_(err)
        g = self.groups.get(group_id)
        if g is not None and g.streams is not None:
            err = self.validate_streams_offset_commit(g.streams, member_id, generation_id, False, api_version,
                                                      list(offsets))
            if err is not None:
                return all_(err)
        elif g is not None and g.consumer is not None:
            err = self.validate_consumer_offset_commit(g.consumer, member_id, generation_id, False, api_version)
            if err is not None:
                return all_(err)
            if member_id in g.consumer.members:
                self._schedule_session_timeout(g.consumer, member_id)
        elif g is None:
            if generation_id >= 0:
                return all_(ErrorCode.ILLEGAL_GENERATION)
            g = self._group(group_id, create=True)
            assert g is not None
        else:
            err = self._validate_offset_commit(g, generation_id, member_id, instance_id)
            if err is not None:
                return all_(err)
            if g.state is GroupState.COMPLETING_REBALANCE:
                # A valid member of the new generation that has not synced yet (Kafka's doCommitOffsets).
                return all_(ErrorCode.REBALANCE_IN_PROGRESS)
            if g.state is not GroupState.EMPTY:
                self._touch_member(g, member_id)
        results, accepted = self._check_offsets(offsets)
        if accepted:
            entries = [(records.offset_key(group_id, t, p), records.offset_value(o)) for (t, p), o in accepted.items()]
            try:
                lg, info = self._write(group_id, entries)
            except Exception as e:  # noqa: BLE001 - every append failure becomes the commit's error code
                log.error("Offset commit for group %s failed: %s", group_id, e)
                return {**results, **{tp: append_error(e) for tp in accepted}}
            for i, o in enumerate(accepted.values()):
                o.record_offset = info.first_offset + i
            try:
                await self._flush_if_needed(lg, info.last_offset)
            except Exception as e:  # noqa: BLE001
                # Not replicated (the partition moved, or its ISR fell below min.insync.replicas): the client
                # retries; an error only when the disk failed.
                (log.warning if isinstance(e, KafkaError) else log.error)(
                    "Offset commit for group %s failed: %s", group_id, e)
                return {**results, **{tp: append_error(e) for tp in accepted}}
            g.offsets.update(accepted)
        results.update({tp: ErrorCode.NONE for tp in accepted})
        return results

    def _check_offsets(self, offsets: dict[TopicPartition, OffsetAndMetadata]
                       ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, OffsetAndMetadata]]:
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        for (topic, partition), o in offsets.items():
            if len(o.metadata.encode()) > self.config.offset_metadata_max_bytes:
                results[(topic, partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif not self.host.topic_partition_exists(topic, partition):
                results[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                accepted[(topic, partition)] = o
        return results, accepted

    # ------------------------------------------------------------ TxnOffsetCommit

    async def open_txn_commit(self, group_id: str) -> ErrorCode | None:
        """Kafka's handleTxnCommitOffsets before the transaction is verified: the group id and this coordinator's
        ownership are checked, and a missing group is created empty (it stays whatever the commit's outcome)."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        err = self.coordinator_error(group_id)
        if err is not None:
            return err
        self._group(group_id, create=True)
        return None

    async def txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int, generation_id: int,
                                 member_id: str, instance_id: str | None,
                                 offsets: dict[TopicPartition, OffsetAndMetadata]
                                 ) -> dict[TopicPartition, ErrorCode]:
        """Kafka's handleTxnCommitOffsets: one transactional batch, pending until the transaction's marker."""
        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {tp: code for tp in offsets}

        if not group_id:
            return all_(ErrorCode.INVALID_GROUP_ID)
        err = self.coordinator_error(group_id)
        if err is not None:
            return all_(err)
        g = self.groups.get(group_id)
        # A transactional commit creates a missing group as an empty ("simple") one, as Kafka does; it is
        # only registered once the commit is accepted.
        candidate = g if g is not None else GroupMetadata(group_id, state_timestamp_ms=_now_ms())
        err = self._validate_txn_member(candidate, generation_id, member_id, instance_id, list(offsets))
        if err is not None:
            return all_(err)
        results, accepted = self._check_offsets(offsets)
        if not accepted:
            return results
        # The log refuses a fenced producer's epoch (INVALID_PRODUCER_EPOCH), as Kafka's ProducerAppendInfo.
        entries = [(records.offset_key(group_id, t, q), records.offset_value(o)) for (t, q), o in accepted.items()]
        try:
            lg, info = self._write(group_id, entries, producer_id=producer_id, producer_epoch=producer_epoch)
        except Exception as e:  # noqa: BLE001
            log.error("Transactional offset commit of producer %d for group %s failed: %s", producer_id, group_id, e)
            return {**results, **{tp: append_error(e) for tp in accepted}}
        for i, o in enumerate(accepted.values()):
            o.record_offset = info.first_offset + i
        if g is None:
            g = self.groups.setdefault(group_id, candidate)
        # Pending from the moment the batch is in the log: the marker may follow before the flush returns.
        g.add_pending_txn_offsets(producer_id, accepted)
        self.txn_groups.setdefault(producer_id, set()).add(group_id)
        try:
            await self._flush_if_needed(lg, info.last_offset)
        except Exception as e:  # noqa: BLE001
            log.error("Transactional offset commit of producer %d for group %s failed: %s", producer_id, group_id, e)
            return {**results, **{tp: append_error(e) for tp in accepted}}
        results.update({tp: ErrorCode.NONE for tp in accepted})
        return results

    @staticmethod
    def _validate_offset_commit(g: GroupMetadata, generation_id: int, member_id: str,
                                instance_id: str | None) -> ErrorCode | None:
        """Kafka's validateOffsetCommit, before the group's state is looked at: member, then generation, so an
        old generation gets ILLEGAL_GENERATION (harmless to clients) even while the group completes a rebalance."""
        if g.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and g.state is GroupState.EMPTY:
            return None  # an admin client or a consumer assigning itself, and nobody in the group
        if generation_id >= 0 or member_id or instance_id is not None:
            fenced = validate_current_member(g, member_id, instance_id)
            if fenced is not None:
                return fenced
            return ErrorCode.ILLEGAL_GENERATION if generation_id != g.generation_id else None
        # Without a member only a group nobody belongs to takes commits (consumers that assign themselves).
        return None if g.state is GroupState.EMPTY else ErrorCode.UNKNOWN_MEMBER_ID

    @staticmethod
    def _validate_txn_member(g: GroupMetadata, generation_id: int, member_id: str,
                             instance_id: str | None, partitions: list[TopicPartition] | None = None
                             ) -> ErrorCode | None:
        """Kafka's validateOffsetCommit for transactional commits (KIP-447): without a generation, member id
        or instance id the commit is not tied to a member and skips the checks."""
        if g.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if g.streams is not None:
            return StreamsGroupManager.validate_streams_offset_commit_static(g.streams, member_id, generation_id,
                                                                             partitions=partitions or ())
        if g.consumer is not None:
            return ConsumerGroupManager.validate_consumer_offset_commit(g.consumer, member_id, generation_id, True, 9)
        if generation_id < 0 and (g.state is GroupState.EMPTY or (not member_id and instance_id is None)):
            return None
        fenced = validate_current_member(g, member_id, instance_id)
        if fenced is not None:
            return fenced
        return ErrorCode.ILLEGAL_GENERATION if generation_id != g.generation_id else None

    def complete_txn(self, producer_id: int, offsets_partition: int, commit: bool) -> None:
        """The marker of the producer's transaction is in __consumer_offsets-<offsets_partition>: its pending
        offsets in the groups of that partition become committed or vanish (Kafka's handleTxnCompletion).

        Runs on the coordinator loop. While the partition loads this does nothing: the marker is in the log
        already, and the loader replays it in order.
        """
        if offsets_partition in self.loading:
            return
        self._complete_txn(producer_id, offsets_partition, commit)

    def _complete_txn(self, producer_id: int, offsets_partition: int, commit: bool) -> None:
        group_ids = self.txn_groups.get(producer_id)
        if not group_ids:
            return
        for gid in [gid for gid in group_ids if self.offsets_partition(gid) == offsets_partition]:
            group_ids.discard(gid)
            g = self.groups.get(gid)
            if g is None:
                continue
            applied = g.complete_pending_txn(producer_id, commit)
            log.debug("Transaction of producer %d %s in group %s (%d offsets applied)", producer_id,
                      "committed" if commit else "aborted", gid, applied)
        if not group_ids:
            self.txn_groups.pop(producer_id, None)

    # ------------------------------------------------------------ loading

    def _replay_offset(self, e: LoadedRecord) -> None:
        r = e.record
        assert isinstance(r, records.OffsetRecord)
        tp = (r.topic, r.partition)
        if r.value is None:
            g = self.groups.get(r.group)
            if g is None:
                return
            if e.producer_id == NO_PRODUCER_ID:
                g.remove_offsets([tp])
            else:
                pending = g.pending_txn_offsets.get(e.producer_id)
                if pending is not None:
                    pending.pop(tp, None)
            return
        g = self._group(r.group, create=True)
        assert g is not None
        r.value.record_offset = e.offset
        if e.producer_id == NO_PRODUCER_ID:
            g.offsets[tp] = r.value
        else:
            g.add_pending_txn_offsets(e.producer_id, {tp: r.value})
            self.txn_groups.setdefault(e.producer_id, set()).add(r.group)

    # ------------------------------------------------------------ OffsetFetch

    async def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None, require_stable: bool = False,
                            member_id: str | None = None, member_epoch: int = -1
                            ) -> tuple[ErrorCode, dict[TopicPartition, OffsetAndMetadata | ErrorCode | None]]:
        """Committed offsets (None: nothing committed). With require_stable, a partition with a pending
        transactional offset answers UNSTABLE_OFFSET_COMMIT instead (KIP-447), as Kafka's getOffsets.
        member_id / member_epoch (OffsetFetch v9) are checked for KIP-848 consumer groups."""
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, {}
        g = self.groups.get(group_id)
        if g is not None and g.streams is not None:
            err = StreamsGroupManager.validate_streams_offset_fetch(g.streams, member_id, member_epoch)
            if err is not None:
                return err, {}
        if g is not None and g.consumer is not None:
            err = ConsumerGroupManager.validate_consumer_offset_fetch(g.consumer, member_id, member_epoch)
            if err is not None:
                return err, {}
        offsets = g.offsets if g is not None else {}
        wanted = list(offsets) if partitions is None else partitions
        unstable = g.pending_txn_partitions() if g is not None and require_stable else set()
        return ErrorCode.NONE, {
            tp: ErrorCode.UNSTABLE_OFFSET_COMMIT if tp in unstable else offsets.get(tp) for tp in wanted
        }

    # ------------------------------------------------------------ expiry and deletion

    def _expire_offsets_tick(self) -> None:
        self.loop.create_task(self._expire_offsets())
        self.loop.call_later(self.config.offsets_retention_check_ms / 1000, self._expire_offsets_tick)

    async def _expire_offsets(self) -> None:
        """offsets.retention.minutes: an empty group's offsets expire that long after it became empty. An offset
        with a pending transactional commit stays, and so does its group."""
        now = _now_ms()
        for g in list(self.groups.values()):
            if g.state is GroupState.EMPTY and _classic(g) and not g.offsets and not g.pending_txn_offsets:
                # Kafka's cleanupGroupMetadata: an empty group with no offsets left is removed at each check.
                try:
                    await self._delete_group_data(g, [])
                except Exception:
                    log.exception("Could not remove empty group %s", g.group_id)
                continue
            if g.state is not GroupState.EMPTY or not g.offsets:
                continue
            if now - max(g.state_timestamp_ms, max(o.commit_timestamp for o in g.offsets.values())) < (
                self.config.offsets_retention_ms
            ):
                continue
            expired = [tp for tp in g.offsets if not g.has_pending_txn_offset(tp)]
            if not expired:
                continue
            try:
                await self._delete_group_data(g, expired)
            except Exception:
                log.exception("Could not remove the expired offsets of group %s", g.group_id)
                continue
            log.info("Removed %d expired offsets of empty group %s", len(expired), g.group_id)

    async def _delete_group_data(self, g: GroupMetadata, tps: list[TopicPartition], group_too: bool = True) -> None:
        """Tombstones for the offsets (committed or pending) of tps, and for the group itself when group_too
        and nothing is left of it."""
        gone = set(tps)
        drop_group = (group_too and g.state is GroupState.EMPTY and set(g.offsets) <= gone
                      and g.pending_txn_partitions() <= gone)
        entries: list[tuple[bytes, bytes | None]] = [(records.offset_key(g.group_id, t, p), None) for t, p in tps]
        if not entries and not drop_group:
            return
        consumer_tombstones = []
        streams_tombstones: list[sgr.StreamsGroupRecord] = []
        if drop_group:
            if g.consumer is not None:
                consumer_tombstones = cgr.group_tombstones(g.group_id, list(g.consumer.members))
                entries += [r.entry() for r in consumer_tombstones]
            elif g.streams is not None:
                streams_tombstones = sgr.group_tombstones(g.group_id, list(g.streams.members))
                entries += [r.entry() for r in streams_tombstones]
            elif g.generation_id > 0:
                # Kafka writes no group tombstone for generation 0: a group used only to store offsets never had
                # its metadata written.
                entries.append((records.group_key(g.group_id), None))
        if not entries:
            g.transition(GroupState.DEAD, _now_ms())
            if self.groups.get(g.group_id) is g:
                del self.groups[g.group_id]
            return
        lg, info = self._write(g.group_id, entries)
        for r in consumer_tombstones:
            self.replay_consumer_record(r)
        for sr in streams_tombstones:
            self.replay_streams_record(sr)
        g.remove_offsets(tps)
        if drop_group:
            g.transition(GroupState.DEAD, _now_ms())
            if self.groups.get(g.group_id) is g:
                del self.groups[g.group_id]
        await self._flush_if_needed(lg, info.last_offset)

    async def on_partitions_deleted(self, tps: list[TopicPartition]) -> None:
        """A deleted topic's partitions leave every group's offsets, and each empty classic group left without
        offsets is removed (Kafka's onPartitionsDeleted: cleanupGroupMetadata over every group)."""
        gone = set(tps)
        for g in list(self.groups.values()):
            if g.state is GroupState.DEAD or self.coordinator_error(g.group_id) is not None:
                continue
            removed = sorted((set(g.offsets) | g.pending_txn_partitions()) & gone)
            if not removed and not (_classic(g) and g.state is GroupState.EMPTY):
                continue
            try:
                await self._delete_group_data(g, removed, group_too=_classic(g))
            except Exception:
                log.exception("Could not remove the offsets of deleted partitions from group %s", g.group_id)

    async def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        out: dict[str, ErrorCode] = {}
        for gid in group_ids:
            err = self.coordinator_error(gid)
            g = self.groups.get(gid)
            if err is not None:
                out[gid] = err
            elif g is None:
                out[gid] = ErrorCode.GROUP_ID_NOT_FOUND
            elif g.state is not GroupState.EMPTY:
                out[gid] = ErrorCode.NON_EMPTY_GROUP
            else:
                # Pending transactional offsets go with the group (Kafka's deleteAllOffsets).
                tps = list(g.offsets) + sorted(g.pending_txn_partitions() - set(g.offsets))
                try:
                    await self._delete_group_data(g, tps)
                except Exception as e:  # noqa: BLE001
                    log.error("Could not delete group %s: %s", gid, e)
                    out[gid] = append_error(e)
                    continue
                self.groups.pop(gid, None)
                log.info("Deleted group %s", gid)
                out[gid] = ErrorCode.NONE
        return out

    async def delete_offsets(self, group_id: str, tps: list[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, {}
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        if g.state is not GroupState.EMPTY and g.protocol_type != "consumer":
            return ErrorCode.NON_EMPTY_GROUP, {}
        subscribed = g.subscribed_topics() if g.state is not GroupState.EMPTY else set()
        results: dict[TopicPartition, ErrorCode] = {}
        doomed = []
        for tp in tps:
            if subscribed is None or tp[0] in subscribed:
                results[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                results[tp] = ErrorCode.NONE
                if tp in g.offsets or g.has_pending_txn_offset(tp):
                    doomed.append(tp)
        if doomed:
            try:
                # An empty group left without offsets goes too (Kafka's cleanupGroupMetadata).
                await self._delete_group_data(g, doomed)
            except Exception as e:  # noqa: BLE001
                log.error("Could not delete offsets of group %s: %s", group_id, e)
                return append_error(e), {}
        return ErrorCode.NONE, results


def _classic(g: GroupMetadata) -> bool:
    return g.consumer is None and g.streams is None
