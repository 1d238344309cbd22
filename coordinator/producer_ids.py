"""ProducerIdManager: hands out producer ids from blocks of 1000, never reusing an id.

The block source decides durability: the embedded default keeps the latest block in a local
file that is fsynced before any id of the block is handed out; with ZooKeeper the block is
claimed by a conditional write of /latest_producer_id_block.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Protocol

from storage.atomic_file import write_atomically

log = logging.getLogger("kbroker.producer_ids")

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1


class ProducerIdsExhausted(RuntimeError):
    pass


class BlockSource(Protocol):
    def next_block(self) -> tuple[int, int]:
        """Claim the next block; returns (first id, last id), both inclusive."""
        ...


def block_json(broker_id: int, start: int, end: int) -> bytes:
    return json.dumps(
        {"version": 1, "broker": broker_id, "block_start": str(start), "block_end": str(end)}
    ).encode()


def next_block_after(latest: bytes | None, broker_id: int) -> tuple[int, int]:
    """The block that follows the stored latest block (Kafka's ProducerIdBlock JSON), or the first one."""
    start = 0
    if latest:
        data = json.loads(latest)
        start = int(data["block_end"]) + 1
    end = start + BLOCK_SIZE - 1
    if end > MAX_PRODUCER_ID or start < 0:
        raise ProducerIdsExhausted("producer ids exhausted: no block of 1000 ids is left below 2^63-1")
    return start, end


class LocalBlockSource:
    """Embedded mode: /latest_producer_id_block kept as a file in the first log dir."""

    FILE = "latest_producer_id_block"

    def __init__(self, log_dir: str, broker_id: int) -> None:
        self.path = Path(log_dir) / self.FILE
        self.broker_id = broker_id

    def next_block(self) -> tuple[int, int]:
        latest = self.path.read_bytes() if self.path.exists() else None
        start, end = next_block_after(latest, self.broker_id)
        write_atomically(self.path, block_json(self.broker_id, start, end))
        return start, end


class ProducerIdManager:
    def __init__(self, source: BlockSource) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._next = 0
        self._end = -1  # inclusive end of the current block; -1: no block yet

    def generate(self) -> int:
        """A fresh producer id (blocking: may claim a new block from disk or ZooKeeper)."""
        with self._lock:
            if self._next > self._end:
                start, end = self.source.next_block()
                log.info("Claimed producer id block [%d, %d]", start, end)
                self._next, self._end = start, end
            pid = self._next
            self._next += 1
            return pid
