"""TxnMarkerChannel: writes a transaction's COMMIT/ABORT markers to its partitions (Kafka's
TransactionMarkerChannelManager plus the partition side of KafkaApis.handleWriteTxnMarkersRequest).

Partitions this broker leads get the control batch appended here, on a network processor's loop; the others
get a WriteTxnMarkers request to their leader over the inter-broker channel. A marker written to
__consumer_offsets completes the producer's pending transactional offset commits in the group
coordinator, as Kafka's handleTxnCompletion does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from kbroker.broker.inter_broker import TXN_MARKERS, partitions_by_topic
from kbroker.broker.replica_manager import error_of
from kbroker.coordinator.group_coordinator import OFFSETS_TOPIC
from kbroker.protocol.control_records import EndTxnMarker, build_end_txn_marker_batch
from kbroker.protocol.errors import ErrorCode, KafkaError
from kbroker.protocol.messages import WriteTxnMarkersRequest, WriteTxnMarkersResponse
from kbroker.storage.manager import TopicPartition

if TYPE_CHECKING:
    from kbroker.broker.server import KafkaServer

log = logging.getLogger("kbroker.txn_markers")

WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSION = 1


class TxnMarkerChannel:
    def __init__(self, server: KafkaServer) -> None:
        self.server = server

    # ------------------------------------------------------------ coordinator side

    async def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                                partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """Write one transaction's markers wherever its partitions are led; per-partition errors."""
        server = self.server
        results: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        topics = server.metadata.topics
        for topic, partition in partitions:
            rec = topics.get(topic)
            if rec is None or not 0 <= partition < rec.num_partitions:
                results[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            by_leader[rec.leaders[partition]].append((topic, partition))
        pending = []
        for leader, tps in by_leader.items():
            if leader == server.broker_id:
                pending.append(self._write_here(producer_id, producer_epoch, coordinator_epoch, commit, tps))
            else:
                pending.append(self._write_remote(leader, producer_id, producer_epoch, coordinator_epoch, commit, tps))
        if len(pending) == 1:  # one leader (a single broker's every transaction): no task for gather to run it in
            results.update(await pending[0])
            return results
        for part in await asyncio.gather(*pending):
            results.update(part)
        return results

    async def _write_here(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                          tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        return await self.append_markers_replicated(producer_id, producer_epoch, coordinator_epoch, commit, tps)

    async def append_markers_replicated(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                                        commit: bool, tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """append_markers, answered once replicated partitions' ISRs have the markers (Kafka writes them with
        acks=all): a marker lost in a leader change would leave the transaction open there."""
        required: dict[TopicPartition, int] = {}
        # Appended on the caller's loop, a network processor's: the transaction coordinator runs on the first one,
        # WriteTxnMarkers on the one serving it. On the io pool every short syscall of the marker writes traded the
        # GIL with the processor serving the producer's next requests (commit every 1,000 records: 106-110k ->
        # 132-140k msg/s). Only an fsync the flush policy asks for goes to the pool.
        results, to_flush = self.append_markers(producer_id, producer_epoch, coordinator_epoch, commit, tps, required)
        if to_flush:
            await asyncio.get_running_loop().run_in_executor(self.server.io_pool, self._flush, to_flush, results)
        self._complete_offsets(producer_id, commit, results)
        if required:
            codes = await self.server.replica_manager.wait_for_replication(
                [(t, p, offset) for (t, p), offset in required.items()], self.server.config["request.timeout.ms"])
            for tp, code in codes.items():
                if code != ErrorCode.NONE:
                    results[tp] = code
        return results

    async def _write_remote(self, leader: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                            commit: bool, tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        req = WriteTxnMarkersRequest(markers=[WriteTxnMarkersRequest.WritableTxnMarker(
            producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
            coordinator_epoch=coordinator_epoch,
            topics=[WriteTxnMarkersRequest.WritableTxnMarkerTopic(name=t, partition_indexes=ps)
                    for t, ps in partitions_by_topic(tps).items()],
        )])
        try:
            resp: WriteTxnMarkersResponse = await self.server.inter_broker.send(
                leader, WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, req, TXN_MARKERS)
        except (ConnectionError, KafkaError) as e:
            log.warning("WriteTxnMarkers for producer %d to broker %d failed: %s", producer_id, leader, e)
            return {tp: ErrorCode.NOT_LEADER_OR_FOLLOWER for tp in tps}
        out: dict[TopicPartition, ErrorCode] = {tp: ErrorCode.UNKNOWN_SERVER_ERROR for tp in tps}
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    if (t.name, p.partition_index) in out:
                        out[(t.name, p.partition_index)] = ErrorCode(p.error_code)
        return out

    # ------------------------------------------------------------ partition side

    def append_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                       tps: list[TopicPartition], required: dict[TopicPartition, int] | None = None,
                       ) -> tuple[dict[TopicPartition, ErrorCode], list[tuple[Any, int]]]:
        """Append the control batch to each local partition: per-partition errors, and the logs whose flush
        policy wants an fsync now, with the marker's offset (the caller has them flushed off its loop). required
        collects, for partitions whose high watermark is not past the marker yet, the offset it must reach."""
        rm = self.server.replica_manager
        results: dict[TopicPartition, ErrorCode] = {}
        to_flush: list[tuple[Any, int]] = []
        now = int(time.time() * 1000)
        # One marker batch for all the partitions (Log.append_control copies it and sets its offset and leader
        # epoch, which the CRC does not cover): built and checksummed once per transaction, not per partition.
        template = build_end_txn_marker_batch(producer_id, producer_epoch, coordinator_epoch, commit, now)
        marker = EndTxnMarker(commit, coordinator_epoch)
        for topic, partition in tps:
            try:
                lg = rm.get_log(topic, partition)
                info = lg.append_control(producer_id, producer_epoch, coordinator_epoch, commit, now,
                                         leader_epoch=lg.leader_epoch, template=template, marker=marker)
            except Exception as e:  # noqa: BLE001 - each partition answers with its own error code
                code = error_of(e)
                if code == ErrorCode.UNKNOWN_SERVER_ERROR:
                    log.exception("Writing the %s marker of producer %d to %s-%d failed",
                                  "COMMIT" if commit else "ABORT", producer_id, topic, partition)
                results[(topic, partition)] = code
                continue
            rm.purgatory.notify((topic, partition))
            if required is not None and lg.high_watermark <= info.last_offset:
                required[(topic, partition)] = info.last_offset + 1
            if rm.needs_flush(lg):
                to_flush.append((lg, info.last_offset))
            results[(topic, partition)] = ErrorCode.NONE
        return results, to_flush

    @staticmethod
    def _flush(to_flush: list[tuple[Any, int]], results: dict[TopicPartition, ErrorCode]) -> None:
        """fsync the logs the flush policy names (blocking: run on the io pool)."""
        for lg, offset in to_flush:
            try:
                lg.flush(offset + 1)
            except Exception as e:  # noqa: BLE001 - the marker is not durable: the coordinator retries
                log.error("fsync of %s after a transaction marker failed: %s", lg.name, e)
                results[(lg.topic, lg.partition)] = ErrorCode.KAFKA_STORAGE_ERROR

    def _complete_offsets(self, producer_id: int, commit: bool, results: dict[TopicPartition, ErrorCode]) -> None:
        """A marker written to __consumer_offsets completes the producer's pending transactional offset commits
        there (Kafka's handleTxnCompletion), once it is durable per the flush policy."""
        gc = self.server.group_coordinator
        for (topic, p), code in results.items():
            if topic == OFFSETS_TOPIC and code == ErrorCode.NONE:
                gc.loop.call_soon_threadsafe(gc.complete_txn, producer_id, p, commit)
