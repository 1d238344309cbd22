"""ReplicaManager: the partitions this broker leads, appends, reads and the flush policy."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from broker.purgatory import FetchPurgatory
from protocol.errors import ErrorCode, KafkaError
from storage.errors import KafkaStorageError

if TYPE_CHECKING:
    from broker.server import KafkaServer
    from storage.log import Log

log = logging.getLogger("kbroker.replica")

# Leader epoch of every partition: one replica, never re-elected.
LEADER_EPOCH = 0


def error_of(exc: Exception) -> ErrorCode:
    code = getattr(exc, "error_code", None)
    if isinstance(exc, KafkaError):
        return exc.code
    if code is not None:
        return ErrorCode(code)
    return ErrorCode.UNKNOWN_SERVER_ERROR


class ReplicaManager:
    def __init__(self, server: KafkaServer, io_pool: Executor) -> None:
        self.server = server
        self.io_pool = io_pool
        self.purgatory = FetchPurgatory()

    # ------------------------------------------------------------ lookup

    def get_log(self, topic: str, partition: int) -> Log:
        """The local log of a partition this broker leads, or KafkaError with Kafka's code."""
        rec = self.server.metadata.topics.get(topic)
        if rec is None or not 0 <= partition < rec.num_partitions:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if rec.leaders[partition] != self.server.broker_id:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        lg = self.server.log_manager.get_log(topic, partition)
        if lg is None:
            lg = self.server.admin.ensure_log(topic, partition)
        return lg

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch as the controller last said (0 on the embedded single node)."""
        rec = self.server.metadata.topics.get(topic)
        if rec is None or not 0 <= partition < rec.num_partitions:
            return LEADER_EPOCH
        return rec.partitions[partition].leader_epoch

    # ------------------------------------------------------------ produce

    def append(self, topic: str, partition: int, records: Any, required_acks: int) -> Any:
        lg = self.get_log(topic, partition)
        if required_acks == -1:
            rec = self.server.metadata.topics[topic]
            min_isr = int(rec.configs.get("min.insync.replicas", self.server.config["min.insync.replicas"]))
            if min_isr > 1:
                # One replica is the whole ISR, so acks=all cannot meet a larger minimum.
                raise KafkaError(
                    ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"The size of the current ISR 1 is insufficient to satisfy the min.isr requirement of {min_isr}",
                )
        try:
            info = lg.append_as_leader(records, int(time.time() * 1000), leader_epoch=LEADER_EPOCH)
        except KafkaStorageError as e:
            log.error("Append to %s-%d at offset %d failed (KAFKA_STORAGE_ERROR): %s",
                      topic, partition, lg.log_end_offset, e)
            raise
        self.purgatory.notify((topic, partition))
        return lg, info

    def needs_flush(self, lg: Log) -> bool:
        return bool(lg.unflushed_messages >= lg.config.flush_messages)

    async def flush(self, logs: Iterable[tuple[Log, int]]) -> None:
        """fsync logs up to the given offsets off the event loop; the log shares one fsync among waiters."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.io_pool, lg.flush, offset + 1) for lg, offset in logs))

    def flush_in_background(self, logs: Iterable[tuple[Log, int]]) -> None:
        for lg, offset in logs:
            self.io_pool.submit(lg.flush, offset + 1)
